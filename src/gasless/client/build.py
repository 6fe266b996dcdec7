"""Building Relayed-V3 transactions for an assignment (unsigned; the flow has the sender sign once).

Gas: at least the movement gas `50 000 + 1 500 x len(data)`, +50 000 relayed, +50 000 guarded; a contract
call adds its processing gas on top (the service refuses more than 1.9 x the simulated processing gas).

A *builder* is any callable `builder(ctx: BuildContext) -> Transaction`; `Transfer` and `Call` are the
ready-made ones. The flow calls it again with a new context when it has to re-sign (new relayer, pinned
nonce, higher minimum gas price); the nonce must stay the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from multiversx_sdk import (
    Address,
    SmartContractTransactionsFactory,
    TokenTransfer,
    Transaction,
    TransactionsFactoryConfig,
)
from multiversx_sdk.abi import Abi

from gasless.chain.gas import OPTION_GUARDED, GasRules

MIN_GAS_PRICE = 1_000_000_000
TX_VERSION = 2
_RULES = GasRules()


def movement_gas(data_len: int, *, guarded: bool = False, relayed: bool = True) -> int:
    """The gas a transaction needs before any processing (what the node and the service check)."""
    return _RULES.movement_gas(data_len=data_len, guarded=guarded, relayed=relayed)


def _address(value: str | Address) -> Address:
    return value if isinstance(value, Address) else Address.new_from_bech32(value)


def _data(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def build_transfer(
    *,
    sender: str | Address,
    receiver: str | Address,
    relayer: str | Address,
    nonce: int,
    chain_id: str,
    value: int = 0,
    data: bytes | str = b"",
    gas_limit: int | None = None,
    gas_price: int = MIN_GAS_PRICE,
    guardian: str | Address | None = None,
) -> Transaction:
    """A native transfer (optionally with a data field) relayed by `relayer`; gas = movement gas."""
    payload = _data(data)
    guarded = guardian is not None
    return Transaction(
        sender=_address(sender),
        receiver=_address(receiver),
        gas_limit=gas_limit if gas_limit is not None else movement_gas(len(payload), guarded=guarded),
        chain_id=chain_id,
        nonce=nonce,
        value=value,
        data=payload,
        gas_price=gas_price,
        version=TX_VERSION,
        options=OPTION_GUARDED if guarded else 0,
        guardian=_address(guardian) if guardian is not None else None,
        relayer=_address(relayer),
    )


def build_call(
    *,
    sender: str | Address,
    contract: str | Address,
    function: str,
    relayer: str | Address,
    nonce: int,
    chain_id: str,
    arguments: Sequence[Any] = (),
    abi: Abi | None = None,
    value: int = 0,
    token_transfers: Sequence[TokenTransfer] = (),
    processing_gas: int | None = None,
    gas_limit: int | None = None,
    gas_price: int = MIN_GAS_PRICE,
) -> Transaction:
    """A contract call relayed by `relayer`, made by the SDK's `SmartContractTransactionsFactory`.

    `arguments` are native values when `abi` is given, else SDK typed values (`BigUIntValue`, ...) or
    already encoded `bytes`.

    Gas is `gas_limit` when given, else movement gas + `processing_gas`; one of them is required, because
    only the caller knows what the endpoint costs (and the service refuses gross over-provisioning).
    """
    if gas_limit is None and processing_gas is None:
        raise ValueError("a contract call needs gas_limit or processing_gas")
    factory = SmartContractTransactionsFactory(TransactionsFactoryConfig(chain_id), abi=abi)
    tx = factory.create_transaction_for_execute(
        sender=_address(sender),
        contract=_address(contract),
        function=function,
        gas_limit=1,  # replaced below, once the data length is known
        arguments=list(arguments),
        native_transfer_amount=value,
        token_transfers=list(token_transfers),
    )
    tx.gas_limit = (
        gas_limit if gas_limit is not None else movement_gas(len(tx.data)) + int(processing_gas or 0)
    )
    tx.nonce = nonce
    tx.gas_price = gas_price
    tx.version = TX_VERSION
    tx.relayer = _address(relayer)
    return tx


def tx_wire(tx: Transaction) -> dict[str, Any]:
    """The gateway JSON form of a transaction, without empty optional members."""
    return {k: v for k, v in tx.to_dictionary().items() if v not in ("", None) or k == "value"}


@dataclass(frozen=True)
class BuildContext:
    """What a builder gets: who signs, for which relayer and chain, and any floor on the gas price."""

    sender: str
    chain_id: str
    assignment: Mapping[str, Any]
    min_gas_price: int | None = None
    nonce: int | None = None  # set when re-building: the nonce the new transaction must carry

    @property
    def relayer(self) -> str:
        return str(self.assignment["relayer"])

    def gas_price(self, wanted: int | None) -> int:
        price = wanted if wanted is not None else MIN_GAS_PRICE
        return max(price, self.min_gas_price or 0)


TxBuilder = Callable[[BuildContext], Transaction]


@dataclass(frozen=True)
class Transfer:
    """Builder of a native transfer with a fixed nonce."""

    receiver: str
    nonce: int
    value: int = 0
    data: bytes | str = b""
    gas_limit: int | None = None
    gas_price: int | None = None

    def __call__(self, ctx: BuildContext) -> Transaction:
        return build_transfer(
            sender=ctx.sender,
            receiver=self.receiver,
            relayer=ctx.relayer,
            nonce=self.nonce,
            chain_id=ctx.chain_id,
            value=self.value,
            data=self.data,
            gas_limit=self.gas_limit,
            gas_price=ctx.gas_price(self.gas_price),
        )


@dataclass(frozen=True)
class Call:
    """Builder of a contract call with a fixed nonce."""

    contract: str
    function: str
    nonce: int
    arguments: Sequence[Any] = field(default_factory=tuple)
    abi: Abi | None = None
    value: int = 0
    token_transfers: Sequence[TokenTransfer] = field(default_factory=tuple)
    processing_gas: int | None = None
    gas_limit: int | None = None
    gas_price: int | None = None

    def __call__(self, ctx: BuildContext) -> Transaction:
        return build_call(
            sender=ctx.sender,
            contract=self.contract,
            function=self.function,
            relayer=ctx.relayer,
            nonce=self.nonce,
            chain_id=ctx.chain_id,
            arguments=self.arguments,
            abi=self.abi,
            value=self.value,
            token_transfers=self.token_transfers,
            processing_gas=self.processing_gas,
            gas_limit=self.gas_limit,
            gas_price=ctx.gas_price(self.gas_price),
        )
