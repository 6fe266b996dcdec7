"""A small stand-in for localnet's chain engine, to test the contract models before the engine exists.

It follows the engine contract the models are written against:
- a call's payments move from the caller to the contract before the call (as the ESDTTransfer builtin does)
  and move back if the call fails;
- every contract's `state` is deep-copied before the call and restored when `ContractError` escapes;
- nested synchronous calls (`ctx.call`) run the target with caller = the calling contract; their payments
  and the target's transfers and events go into the one buffer of the whole call tree, so a contract sees
  what a nested call sent it (`ctx.balance`) as soon as the call returns;
- transfers and events are applied only when the whole call succeeds.
Gas is reported (`gas_cost` of the called function) but not enforced.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from multiversx_sdk import Address, TransactionEvent, TransactionEventsParser
from multiversx_sdk.abi import Abi

from gasless.chain.abi import decode_outputs, encode_args, load_billing_abi, load_pair_abi, load_wrapper_abi
from gasless.chain.addresses import shard_of_pubkey
from gasless.localnet.contracts import LOCALNET_WEGLD_TOKEN, BillingContract, PairContract, WrapperContract
from gasless.localnet.contracts.seed import seed_config
from gasless.localnet.state import WorldState
from gasless.localnet.vm import EGLD, CallContext, Contract, ContractError, LogEvent, Payment, Transfer

USDC = "USDC-c0ffee"
WEGLD = LOCALNET_WEGLD_TOKEN
ONE_USDC = 1_000_000
ONE_EGLD = 10**18
GENESIS_MS = 1_760_000_000_000
SHARD = 1


def user_pubkey(name: str, shard: int = SHARD) -> bytes:
    """A deterministic user public key in `shard`."""
    key = hashlib.sha256(name.encode()).digest()[:31] + bytes([shard])
    assert shard_of_pubkey(key) == shard
    return key


def contract_pubkey(name: str, shard: int = SHARD) -> bytes:
    """A deterministic smart-contract address (8 zero bytes, VM type 0500) in `shard`."""
    key = bytes(8) + b"\x05\x00" + hashlib.sha256(name.encode()).digest()[:21] + bytes([shard])
    assert shard_of_pubkey(key) == shard
    return key


@dataclass
class Receipt:
    ok: bool
    error: str | None
    returned: list[bytes] = field(default_factory=list)
    events: list[LogEvent] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    gas: int = 0

    def names(self) -> list[str]:
        return [e.topics[0].decode() for e in self.events]


def transaction_events(events: list[LogEvent]) -> list[TransactionEvent]:
    """LogEvents as the SDK sees them on a transaction fetched from a gateway."""
    return [
        TransactionEvent(
            raw={},
            address=Address(e.address, "erd"),
            identifier=e.identifier,
            topics=list(e.topics),
            data=e.data[0] if e.data else b"",
            additional_data=list(e.data),
        )
        for e in events
    ]


def decode_events(abi: Abi, events: list[LogEvent]) -> list[tuple[str, SimpleNamespace]]:
    """(name, fields) of each event, decoded by the SDK's TransactionEventsParser."""
    parser = TransactionEventsParser(abi, first_topic_as_identifier=True)
    return [
        (e.topics[0].decode(), parser.parse_event(te))
        for e, te in zip(events, transaction_events(events), strict=True)
    ]


class Chain:
    """A world state with contracts, executing calls and queries with engine semantics."""

    def __init__(self, now_ms: int = GENESIS_MS) -> None:
        self.world = WorldState()
        self.now_ms = now_ms
        self.round = 1

    def deploy(self, pubkey: bytes, contract: Any, owner: bytes) -> None:
        account = self.world.get(pubkey)
        account.contract = contract
        account.owner = owner

    def fund(self, pubkey: bytes, egld: int = 0, **esdt: int) -> None:
        account = self.world.get(pubkey)
        account.balance += egld
        for token, amount in esdt.items():
            account.esdt[token] = account.esdt.get(token, 0) + amount

    def balance(self, pubkey: bytes, token: str) -> int:
        account = self.world.peek(pubkey)
        if account is None:
            return 0
        return account.balance if token == EGLD else account.esdt.get(token, 0)

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.round += 1

    def call(
        self,
        caller: bytes,
        contract: bytes,
        function: str,
        args: list[bytes] | None = None,
        payments: list[Payment] | None = None,
    ) -> Receipt:
        target = self._contract_at(contract)
        payments = payments or []
        for p in payments:
            assert self.balance(caller, p.token) >= p.amount, "the harness only sends what the caller holds"
        snapshots = {
            pk: copy.deepcopy(a.contract.state) for pk, a in self.world.accounts.items() if a.contract
        }
        for p in payments:
            self.world.move(caller, contract, p.token, p.amount)
        ctx = self._context(caller, contract, function, args or [], payments, caller)
        try:
            returned = target.call(ctx)
        except ContractError as exc:
            for pk, state in snapshots.items():
                self._contract_at(pk).state = state
            for p in reversed(payments):
                self.world.move(contract, caller, p.token, p.amount)
            return Receipt(ok=False, error=exc.message, gas=target.gas_cost(function))
        for t in ctx.transfers:
            self.world.move(t.sender, t.receiver, t.token, t.amount)
        self.round += 1
        return Receipt(True, None, returned, ctx.events, ctx.transfers, target.gas_cost(function))

    def _contract_at(self, pubkey: bytes) -> Contract:
        target = self.world.get(pubkey).contract
        if target is None:
            raise LookupError("no contract at that address")
        return target

    def query(self, contract: bytes, function: str, args: list[bytes] | None = None) -> list[bytes]:
        target = self._contract_at(contract)
        return target.query(function, args or [], None, self.now_ms)

    def _context(
        self,
        caller: bytes,
        contract: bytes,
        function: str,
        args: list[bytes],
        payments: list[Payment],
        original_caller: bytes,
    ) -> CallContext:
        ctx = CallContext(
            world=self.world,
            caller=caller,
            contract=contract,
            function=function,
            args=args,
            payments=payments,
            block_timestamp_ms=self.now_ms,
            block_round=self.round,
            epoch=self.round // 100,
            gas_available=600_000_000,
            tx_hash=hashlib.sha256(f"{self.round}:{function}".encode()).digest(),
            original_caller=original_caller,
        )
        ctx._nested = self._nested
        return ctx

    def _nested(
        self, parent: CallContext, contract: bytes, function: str, args: list[bytes], payments: list[Payment]
    ) -> list[bytes]:
        account = self.world.peek(contract)
        if account is None or account.contract is None:
            raise ContractError("invalid contract code (not found)")
        for p in payments:
            if parent.balance(p.token) < p.amount:
                raise ContractError("insufficient funds")
        for p in payments:
            parent.transfers.append(Transfer(parent.contract, contract, p.token, p.amount))
        child = self._context(parent.contract, contract, function, args, payments, parent.original_caller)
        child.block_timestamp_ms = parent.block_timestamp_ms
        child.transfers = parent.transfers
        child.events = parent.events
        return account.contract.call(child)


@dataclass
class Stack:
    """The billing contract with its venue, deployed and seeded on a fresh chain."""

    chain: Chain
    owner: bytes
    gas_tank: bytes
    billing_address: bytes
    pair_address: bytes
    wrapper_address: bytes
    billing: BillingContract
    pair: PairContract
    wrapper: WrapperContract

    def user(self, name: str, usdc: int = 10_000 * ONE_USDC) -> bytes:
        """A funded user account."""
        pubkey = user_pubkey(name)
        self.chain.fund(pubkey, egld=ONE_EGLD, **{USDC: usdc})
        return pubkey

    def tx(
        self, caller: bytes, function: str, *values: Any, usdc: int = 0, payments: list[Payment] | None = None
    ) -> Receipt:
        """Call the billing contract with ABI-encoded `values`, paying `usdc` (or `payments`)."""
        args = encode_args(load_billing_abi(), function, list(values))
        paid = payments if payments is not None else ([Payment(USDC, usdc)] if usdc else [])
        return self.chain.call(caller, self.billing_address, function, args, paid)

    def view(self, function: str, *values: Any) -> list[Any]:
        """A billing view, queried and decoded through the ABI."""
        abi = load_billing_abi()
        return decode_outputs(
            abi,
            function,
            self.chain.query(self.billing_address, function, encode_args(abi, function, list(values))),
        )

    def account(self, pubkey: bytes) -> Any:
        return self.view("getAccount", pubkey)[0]

    def events(self, receipt: Receipt) -> list[tuple[str, SimpleNamespace]]:
        """Every event of the receipt decoded with the ABI of the contract that emitted it."""
        abis = {
            self.billing_address: load_billing_abi(),
            self.pair_address: load_pair_abi(),
            self.wrapper_address: load_wrapper_abi(),
        }
        return [decode_events(abis[e.address], [e])[0] for e in receipt.events]

    def billing_events(self, receipt: Receipt, name: str) -> list[SimpleNamespace]:
        return [fields for n, fields in self.events(receipt) if n == name]


PAIR_WEGLD_RESERVE = 10_000 * ONE_EGLD
PAIR_USDC_RESERVE = 300_000 * ONE_USDC  # 30 USDC per EGLD
WRAPPER_LOCKED_EGLD = 10_000 * ONE_EGLD
WRAPPER_WEGLD_FLOAT = 1_000_000 * ONE_EGLD


def deploy_stack(*, seeded: bool = True, unpaused: bool = True) -> Stack:
    """Deploy pair, wrapper and billing in shard 1, seed the billing contract, unpause it by a transaction."""
    chain = Chain()
    owner = user_pubkey("owner")
    gas_tank = user_pubkey("gas-tank")
    billing_address = contract_pubkey("billing")
    pair_address = contract_pubkey("pair")
    wrapper_address = contract_pubkey("wrapper")
    pair = PairContract(owner, WEGLD, USDC, PAIR_WEGLD_RESERVE, PAIR_USDC_RESERVE)
    wrapper = WrapperContract(owner, WEGLD, WRAPPER_LOCKED_EGLD)
    billing = BillingContract(owner, USDC, pair_address, wrapper_address, gas_tank, WEGLD)
    chain.deploy(pair_address, pair, owner)
    chain.deploy(wrapper_address, wrapper, owner)
    chain.deploy(billing_address, billing, owner)
    chain.fund(pair_address, **{WEGLD: PAIR_WEGLD_RESERVE, USDC: PAIR_USDC_RESERVE})
    chain.fund(wrapper_address, egld=WRAPPER_LOCKED_EGLD, **{WEGLD: WRAPPER_WEGLD_FLOAT})
    chain.fund(owner, egld=100 * ONE_EGLD)
    if seeded:
        seed_config(billing, chain.now_ms, relayers=[user_pubkey("relayer-1")])
    if unpaused:
        receipt = chain.call(owner, billing_address, "setPaused", [b""])
        assert receipt.ok, receipt.error
    return Stack(
        chain, owner, gas_tank, billing_address, pair_address, wrapper_address, billing, pair, wrapper
    )
