"""The contract interface of localnet's simulated VM.

A contract is a Python object bound to an address. The chain calls `call` for a transaction (or a nested
call from another contract) and `query` for `POST /vm-values/query`. A contract raises `ContractError` to
fail: the chain then restores the contract's `state` from a snapshot taken before the call, moves no
funds, and reports the message as the node does (`signalError` event, status `fail`). Token movements out
of a contract and events are requested through the `CallContext` and applied only when the whole call
(nested calls included) succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gasless.localnet.state import ContractCode, WorldState

EGLD = "EGLD"


class ContractError(Exception):
    """A contract-level failure; `message` is what `signalError` carries (e.g. `ERR_PAUSED`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OutOfGas(ContractError):
    def __init__(self) -> None:
        super().__init__("not enough gas")


@dataclass(frozen=True)
class Payment:
    token: str  # EGLD or an ESDT identifier such as USDC-c0ffee
    amount: int


@dataclass
class LogEvent:
    address: bytes  # emitting contract
    identifier: str  # the endpoint (or builtin) that emitted it
    topics: list[bytes]  # topics[0] is the event name for contract events
    data: list[bytes] = field(default_factory=list)  # additionalData parts


@dataclass
class Transfer:
    sender: bytes
    receiver: bytes
    token: str
    amount: int


class CallContext:
    """What a contract sees and may do during one call. Effects are buffered until the call succeeds."""

    def __init__(
        self,
        *,
        world: WorldState,
        caller: bytes,
        contract: bytes,
        function: str,
        args: list[bytes],
        payments: list[Payment],
        block_timestamp_ms: int,
        block_round: int,
        epoch: int,
        gas_available: int,
        tx_hash: bytes,
        original_caller: bytes,
    ) -> None:
        self.world = world
        self.caller = caller
        self.contract = contract
        self.function = function
        self.args = args
        self.payments = payments
        self.block_timestamp_ms = block_timestamp_ms
        self.block_round = block_round
        self.epoch = epoch
        self.gas_available = gas_available
        self.gas_used = 0
        self.tx_hash = tx_hash
        self.original_caller = original_caller
        self.events: list[LogEvent] = []
        self.transfers: list[Transfer] = []
        self._nested: NestedCaller | None = None

    # Payments ---------------------------------------------------------------------------------------
    @property
    def egld_value(self) -> int:
        return sum(p.amount for p in self.payments if p.token == EGLD)

    def esdt_payments(self) -> list[Payment]:
        return [p for p in self.payments if p.token != EGLD]

    def single_esdt(self, token: str) -> int:
        """The amount of `token` paid with the call; fails unless exactly that one ESDT payment came."""
        esdt = self.esdt_payments()
        if len(esdt) != 1 or esdt[0].token != token or self.egld_value:
            raise ContractError("ERR_BAD_PAYMENT_TOKEN")
        return esdt[0].amount

    def require_no_payment(self) -> None:
        if self.payments:
            raise ContractError("function does not accept payment")

    # Effects ----------------------------------------------------------------------------------------
    def use_gas(self, amount: int) -> None:
        self.gas_used += amount
        if self.gas_used > self.gas_available:
            raise OutOfGas()

    def emit(self, name: str, topics: list[bytes], data: list[bytes] | None = None) -> None:
        """A contract event: topics[0] is the event name, as the VM writes it."""
        self.events.append(
            LogEvent(
                address=self.contract,
                identifier=self.function,
                topics=[name.encode(), *topics],
                data=data or [],
            )
        )

    def balance(self, token: str) -> int:
        """The contract's balance of `token` as it will be after the buffered transfers."""
        account = self.world.get(self.contract)
        have = account.balance if token == EGLD else account.esdt.get(token, 0)
        for t in self.transfers:
            if t.token == token:
                if t.sender == self.contract:
                    have -= t.amount
                if t.receiver == self.contract:
                    have += t.amount
        return have

    def transfer(self, receiver: bytes, token: str, amount: int) -> None:
        """Send `amount` of `token` from this contract to `receiver` (applied when the call succeeds)."""
        if amount < 0:
            raise ContractError("negative transfer")
        if amount == 0:
            return
        if self.balance(token) < amount:
            raise ContractError("insufficient funds")
        self.transfers.append(Transfer(self.contract, receiver, token, amount))

    def call(self, contract: bytes, function: str, args: list[bytes], payments: list[Payment]) -> list[bytes]:
        """A synchronous call to another contract of the same shard (execute on destination context)."""
        if self._nested is None:
            raise ContractError("nested calls are not available here")
        return self._nested(self, contract, function, args, payments)


class NestedCaller(Protocol):
    def __call__(
        self, parent: CallContext, contract: bytes, function: str, args: list[bytes], payments: list[Payment]
    ) -> list[bytes]: ...


class Contract(ContractCode, Protocol):
    """A contract model executed by localnet; its `state` is deep-copied before each call and restored on
    failure."""

    def gas_cost(self, function: str) -> int:
        """Processing gas the call consumes beyond the movement gas (fails with `not enough gas` if short)."""
        ...

    def call(self, ctx: CallContext) -> list[bytes]:
        """Execute `ctx.function`; return the return-data parts; raise ContractError to fail."""
        ...

    def query(self, function: str, args: list[bytes], caller: bytes | None, now_ms: int) -> list[bytes]:
        """A read-only view for `vm-values/query`; raise ContractError for `user error`."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of the contract state, for the admin snapshot."""
        ...
