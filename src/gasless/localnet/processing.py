"""Transaction validation (as the node's interceptor and tx validator do) and execution.

Error strings are the node's (mx-chain-go process/errors.go) so that clients see what a real gateway says.
Execution is split like the real network: the sender shard charges the fee, takes the value and the nonce;
the receiver shard credits the value, runs built-in functions and contracts, and refunds unused gas.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from multiversx_sdk import Transaction
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.chain.codec import signing_bytes
from gasless.chain.gas import GasRules, is_guarded, is_relayed_v3
from gasless.localnet.state import WorldState
from gasless.localnet.vm import EGLD, CallContext, ContractError, LogEvent, Payment, Transfer

if TYPE_CHECKING:
    from gasless.localnet.vm import Contract

NONCE_WINDOW = 100
ESDT_TRANSFER_GAS = 200_000  # gas schedule BuiltInCost.ESDTTransfer
MAX_DATA_BYTES = 256 * 1024
NOT_PAYABLE = "sending value to non payable contract"


class NodeError(Exception):
    """A transaction refused before it enters the pool; `message` is the node's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Outcome:
    """What execution produced, in the shapes the gateway reports."""

    status: str  # success | fail | invalid | dropped
    gas_used: int
    fee: int
    events: list[LogEvent] = field(default_factory=list)
    results: list[dict[str, object]] = field(default_factory=list)  # smart contract results (SCRs)
    fail_reason: str = ""
    return_data: list[bytes] = field(default_factory=list)


def _verify(pubkey: bytes, message: bytes, signature: bytes) -> bool:
    try:
        VerifyKey(pubkey).verify(message, signature)
        return True
    except (BadSignatureError, ValueError):
        return False


def check_static(tx: Transaction, *, chain_id: str, rules: GasRules, min_version: int = 1) -> None:
    """Integrity checks that need no state (interceptedTransaction.CheckValidity)."""
    if tx.chain_id != chain_id:
        raise NodeError("invalid chain ID")
    if tx.version < min_version or (tx.version == 1 and tx.options != 0):
        raise NodeError("invalid transaction version")
    if tx.options & ~0b11:
        raise NodeError("invalid transaction version")
    if tx.gas_price < rules.min_gas_price:
        raise NodeError("insufficient gas price in tx")
    if len(tx.data) > MAX_DATA_BYTES:
        raise NodeError("transaction data too big")
    if tx.gas_limit < rules.movement_gas_of(tx):
        raise NodeError("insufficient gas limit in tx")
    if tx.gas_limit > rules.max_gas_per_tx:
        raise NodeError("more gas was provided than gas limit per block")
    relayed = is_relayed_v3(tx)
    if relayed:
        if tx.relayer is None or tx.relayer.is_empty() or len(tx.relayer_signature) != 64:
            raise NodeError("invalid relayed transaction")
        if shard_of_pubkey(tx.relayer.get_public_key()) != shard_of_pubkey(tx.sender.get_public_key()):
            raise NodeError("shard ID missmatch")
        if tx.guardian is not None and tx.guardian == tx.relayer:
            raise NodeError("relayed by guardian not allowed")
    if is_guarded(tx):
        if tx.guardian is None or tx.guardian.is_empty():
            raise NodeError("missing guardian address")
        if len(tx.guardian_signature) != 64:
            raise NodeError("missing guardian signature")
    else:
        if tx.guardian is not None and not tx.guardian.is_empty():
            raise NodeError("guardian address not expected")
        if tx.guardian_signature:
            raise NodeError("guardian signature not expected")


def check_signatures(tx: Transaction) -> None:
    """Sender, relayer and guardian all sign the same bytes (GetDataForSigning)."""
    message = signing_bytes(tx)
    if not _verify(tx.sender.get_public_key(), message, tx.signature):
        raise NodeError("ed25519: invalid signature")
    if is_relayed_v3(tx) and tx.relayer is not None:
        if not _verify(tx.relayer.get_public_key(), message, tx.relayer_signature):
            raise NodeError("ed25519: invalid signature")
    if is_guarded(tx) and tx.guardian is not None:
        if not _verify(tx.guardian.get_public_key(), message, tx.guardian_signature):
            raise NodeError("ed25519: invalid signature when checking the guardian's signature")


def fee_payer(tx: Transaction) -> bytes:
    if is_relayed_v3(tx) and tx.relayer is not None:
        return tx.relayer.get_public_key()
    return tx.sender.get_public_key()


def initially_paid_fee(tx: Transaction, rules: GasRules) -> int:
    """What the fee payer is charged up front: the whole gas limit (unused SC gas is refunded later)."""
    return rules.fee(gas_price=tx.gas_price, movement_gas=rules.movement_gas_of(tx), gas_used=tx.gas_limit)


def check_state(tx: Transaction, world: WorldState, rules: GasRules, *, epoch: int) -> None:
    """The tx validator's account checks: sender account, nonce window, guardian, fee payer funds."""
    sender_pk = tx.sender.get_public_key()
    sender = world.peek(sender_pk)
    relayed = is_relayed_v3(tx)
    if sender is None and not (relayed and tx.value == 0):
        raise NodeError(f"insufficient funds for address {tx.sender.to_bech32()}")
    account_nonce = sender.nonce if sender else 0
    lower, very_high = tx.nonce < account_nonce, tx.nonce > account_nonce + NONCE_WINDOW
    if lower or very_high:
        raise NodeError(
            f"invalid transaction lowerNonceInTx: {str(lower).lower()}, veryHighNonceInTx: {str(very_high).lower()}"
        )
    if sender is not None and sender.guardian is not None and sender.guardian.activation_epoch <= epoch:
        if not is_guarded(tx):
            raise NodeError(
                "transaction is not executable and gas will not be consumed, not allowed to bypass guardian"
            )
        if tx.guardian is None or tx.guardian.get_public_key() != sender.guardian.address:
            raise NodeError("mismatch between transaction guardian and configured account guardian")
    elif is_guarded(tx):
        raise NodeError(
            "transaction is not executable and gas will not be consumed, guarded transaction not expected"
        )
    payer_pk = fee_payer(tx)
    payer = world.peek(payer_pk)
    if payer is None:
        raise NodeError(f"insufficient funds for address {address_of(payer_pk).to_bech32()}")
    fee = initially_paid_fee(tx, rules)
    if payer.balance < fee:
        raise NodeError(
            f"insufficient funds, for address: {address_of(payer_pk).to_bech32()}, wanted {fee}, have {payer.balance}"
        )


# Execution ------------------------------------------------------------------------------------------------


@dataclass
class Call:
    """A parsed data field: a built-in ESDT transfer and/or a contract function with its arguments."""

    function: str = ""
    args: list[bytes] = field(default_factory=list)
    esdt: list[Payment] = field(default_factory=list)


def parse_call(data: bytes) -> Call:
    """`func@hex@hex`, with `ESDTTransfer@token@amount[@func@args...]` unwrapped."""
    if not data:
        return Call()
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return Call()
    parts = text.split("@")
    if not parts[0] or not all(_is_hex(p) for p in parts[1:]):
        return Call()
    function, args = parts[0], [bytes.fromhex(p) for p in parts[1:]]
    if function == "ESDTTransfer" and len(args) >= 2:
        token = args[0].decode("ascii", "replace")
        amount = int.from_bytes(args[1], "big")
        inner = Call(esdt=[Payment(token, amount)])
        if len(args) >= 3:
            inner.function = args[2].decode("ascii", "replace")
            inner.args = args[3:]
        return inner
    return Call(function=function, args=args)


def _is_hex(part: str) -> bool:
    if len(part) % 2:
        return False
    try:
        bytes.fromhex(part)
        return True
    except ValueError:
        return False


class Executor:
    """Applies transactions to the world state, as the sender and receiver shards do."""

    def __init__(self, world: WorldState, rules: GasRules) -> None:
        self.world = world
        self.rules = rules

    # Sender shard -------------------------------------------------------------------------------------
    def execute_source(self, tx: Transaction, *, epoch: int = 0) -> tuple[str, str]:
        """Charge the fee, bump the nonce, take the value and tokens. Returns (status, reason): `success`,
        `fail` (a token transfer the sender cannot cover), `invalid` (fee taken, nonce used, nothing else)
        or `dropped` (not executable: nothing changed, the transaction leaves the pool)."""
        world, rules = self.world, self.rules
        sender = world.get(tx.sender.get_public_key())
        payer_pk = fee_payer(tx)
        payer = world.get(payer_pk)
        fee = initially_paid_fee(tx, rules)
        # "Not executable": the node leaves such a transaction out of the block and drops it from the pool;
        # nobody pays, the nonce is not used (mx-chain-go process/errors.go ErrTransactionNotExecutable).
        if payer.balance < fee:
            return "dropped", f"insufficient balance for fees, has: {payer.balance}, wanted: {fee}"
        if is_relayed_v3(tx) and payer.is_guarded:
            return (
                "dropped",
                "transaction is not executable and gas will not be consumed, guarded relayer not allowed",
            )
        guardian = sender.guardian
        if guardian is not None and guardian.activation_epoch <= epoch:
            if tx.guardian is None or tx.guardian.get_public_key() != guardian.address:
                return (
                    "dropped",
                    "transaction is not executable and gas will not be consumed, "
                    "mismatch between transaction guardian and configured account guardian",
                )
        payer.balance -= fee
        sender.nonce += 1
        call = parse_call(tx.data)
        if sender.balance < tx.value:
            # Invalid: in the block (an invalid miniblock), the fee payer charged, the nonce used.
            return "invalid", f"insufficient funds for value, has: {sender.balance}, wanted: {tx.value}"
        for payment in call.esdt:
            if sender.esdt.get(payment.token, 0) < payment.amount or payment.amount <= 0:
                return "fail", "insufficient funds"
        sender.balance -= tx.value
        for payment in call.esdt:
            sender.esdt[payment.token] -= payment.amount
        return "success", ""

    # Receiver shard -----------------------------------------------------------------------------------
    def execute_destination(
        self, tx: Transaction, tx_hash: bytes, *, now_ms: int, round_: int, epoch: int
    ) -> Outcome:
        """Credit the value, run the built-in function and the contract; refund on failure."""
        world, rules = self.world, self.rules
        movement = rules.movement_gas_of(tx)
        call = parse_call(tx.data)
        receiver_pk = tx.receiver.get_public_key()
        receiver = world.get(receiver_pk)
        contract = receiver.contract
        sender_pk = tx.sender.get_public_key()
        events: list[LogEvent] = []
        builtin_gas = ESDT_TRANSFER_GAS if call.esdt else 0
        sc_processing = bool(call.esdt) or (contract is not None and (call.function or tx.value))

        if not sc_processing:
            # Move balance: the whole gas limit is consumed (processing part at the modified price).
            receiver.balance += tx.value
            return Outcome("success", gas_used=tx.gas_limit, fee=initially_paid_fee(tx, rules))

        available = tx.gas_limit - movement - builtin_gas
        failure: str = ""
        return_data: list[bytes] = []
        used = builtin_gas
        if available < 0:
            failure = "not enough gas"
        elif contract is not None and tx.value and not call.function:
            failure = NOT_PAYABLE
        if not failure:
            # The receiver holds the payment while its code runs (a contract may spend it at once).
            receiver.balance += tx.value
            for payment in call.esdt:
                receiver.esdt[payment.token] = receiver.esdt.get(payment.token, 0) + payment.amount
            for payment in call.esdt:
                events.append(
                    LogEvent(
                        address=sender_pk,
                        identifier="ESDTTransfer",
                        topics=[payment.token.encode(), b"", _int_bytes(payment.amount), receiver_pk],
                    )
                )
            if contract is not None and call.function:
                payments = ([Payment(EGLD, tx.value)] if tx.value else []) + call.esdt
                try:
                    ctx, return_data = self.call_contract(
                        caller=sender_pk,
                        contract_pk=receiver_pk,
                        function=call.function,
                        args=call.args,
                        payments=payments,
                        gas=available,
                        now_ms=now_ms,
                        round_=round_,
                        epoch=epoch,
                        tx_hash=tx_hash,
                        original_caller=sender_pk,
                    )
                    used += ctx.gas_used
                    events.extend(ctx.events)
                except ContractError as exc:
                    failure = exc.message
                    events = []
                    receiver.balance -= tx.value
                    for payment in call.esdt:
                        receiver.esdt[payment.token] -= payment.amount

        payer_pk = fee_payer(tx)
        if failure:
            # Value and tokens go back to the sender; all gas is consumed.
            sender = world.get(sender_pk)
            sender.balance += tx.value
            for payment in call.esdt:
                sender.esdt[payment.token] = sender.esdt.get(payment.token, 0) + payment.amount
            events.append(
                LogEvent(
                    address=receiver_pk,
                    identifier="signalError",
                    # The message is the second topic; the data is the VM's return code ("@" + hex of
                    # "user error"), which is what the proxy's process-status gives as its `reason`.
                    topics=[sender_pk, failure.encode()],
                    data=[b"@" + b"user error".hex().encode()],
                )
            )
            return Outcome(
                "fail",
                gas_used=tx.gas_limit,
                fee=initially_paid_fee(tx, rules),
                events=events,
                fail_reason=failure,
            )

        gas_used = movement + used
        fee = rules.fee(gas_price=tx.gas_price, movement_gas=movement, gas_used=gas_used)
        refund = initially_paid_fee(tx, rules) - fee
        results: list[dict[str, object]] = []
        if contract is not None and call.function:
            results.append(
                {
                    "kind": "return",
                    "sender": receiver_pk,
                    "receiver": sender_pk,
                    "value": 0,
                    "data": "@6f6b" + "".join("@" + part.hex() for part in return_data),
                }
            )
        if refund > 0:
            world.get(payer_pk).balance += refund
            results.append(
                {
                    "kind": "refund",
                    "sender": receiver_pk,
                    "receiver": payer_pk,
                    "value": refund,
                    "data": "",
                    "returnMessage": "gas refund for relayer" if is_relayed_v3(tx) else "",
                }
            )
        events.append(LogEvent(address=sender_pk, identifier="completedTxEvent", topics=[tx_hash]))
        return Outcome(
            "success", gas_used=gas_used, fee=fee, events=events, results=results, return_data=return_data
        )

    # Contracts ----------------------------------------------------------------------------------------
    def call_contract(
        self,
        *,
        caller: bytes,
        contract_pk: bytes,
        function: str,
        args: list[bytes],
        payments: list[Payment],
        gas: int,
        now_ms: int,
        round_: int,
        epoch: int,
        tx_hash: bytes,
        original_caller: bytes,
    ) -> tuple[CallContext, list[bytes]]:
        """Run a contract call with its nested calls; state and transfers apply only if it all succeeds.

        Payments were already taken from the caller and sit with the contract account's credit pending:
        they are credited here for nested calls and by the caller's path for top-level ones.
        """
        saved: dict[int, tuple[Contract, object]] = {}
        contexts: list[CallContext] = []
        applied: list[Transfer] = []  # nested payments, moved early so the callee can spend them

        def run(
            to: bytes, fn: str, call_args: list[bytes], pays: list[Payment], gas_left: int, frm: bytes
        ) -> tuple[CallContext, list[bytes]]:
            account = self.world.get(to)
            target = account.contract
            if target is None:
                raise ContractError("invalid contract code (not found)")
            if id(target) not in saved:
                saved[id(target)] = (target, copy.deepcopy(target.state))
            ctx = CallContext(
                world=self.world,
                caller=frm,
                contract=to,
                function=fn,
                args=call_args,
                payments=pays,
                block_timestamp_ms=now_ms,
                block_round=round_,
                epoch=epoch,
                gas_available=gas_left,
                tx_hash=tx_hash,
                original_caller=original_caller,
            )
            ctx._nested = nested
            contexts.append(ctx)
            ctx.use_gas(target.gas_cost(fn))
            return ctx, target.call(ctx)

        def nested(
            parent: CallContext, to: bytes, fn: str, call_args: list[bytes], pays: list[Payment]
        ) -> list[bytes]:
            for pay in pays:
                if parent.balance(pay.token) < pay.amount:
                    raise ContractError("insufficient funds")
            for pay in pays:
                moved = Transfer(parent.contract, to, pay.token, pay.amount)
                self.world.move(moved.sender, moved.receiver, moved.token, moved.amount)
                applied.append(moved)
            child, result = run(
                to, fn, call_args, pays, parent.gas_available - parent.gas_used, parent.contract
            )
            # Execute-on-destination: the callee's transfers take effect when it returns (undone on failure).
            for moved in child.transfers:
                self.world.move(moved.sender, moved.receiver, moved.token, moved.amount)
                applied.append(moved)
            child.transfers = []
            parent.use_gas(child.gas_used)
            parent.events.extend(child.events)
            child.events = []
            return result

        try:
            ctx, result = run(contract_pk, function, args, payments, gas, caller)
        except ContractError:
            for target, state in saved.values():
                target.state = state
            for moved in reversed(applied):
                self.world.move(moved.receiver, moved.sender, moved.token, moved.amount)
            raise
        for level in contexts:
            for t in level.transfers:
                self.world.move(t.sender, t.receiver, t.token, t.amount)
        return ctx, result


def _int_bytes(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
