"""Billing-contract events as the gateway reports them, decoded with the contract's ABI.

A contract event in a transaction's `logs.events` has the emitting contract as `address`, the event name as
its first topic (base64), the indexed fields as the other topics and the remaining fields as
`additionalData` parts. Decoded values are made JSON-plain here: addresses in bech32, byte arrays in hex,
enums by variant name, structs as dicts with camelCase members.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gasless.chain.abi import decode_event, load_billing_abi
from gasless.chain.addresses import address_of

ADDRESS_FIELDS = frozenset(
    {"account", "payer", "sender", "relayer", "gas_tank", "owner", "pair", "wrapper", "address"}
)
TEXT_FIELDS = frozenset({"name", "free_operations"})


@dataclass(frozen=True)
class ContractEvent:
    """One decoded event of the billing contract, placed in the chain's order."""

    name: str
    fields: dict[str, Any]  # JSON-plain, snake_case as in the ABI
    tx_hash: str
    event_index: int  # position among the transaction's events
    hyperblock_nonce: int
    block_ts_ms: int
    seq: int  # global order: hyperblock, transaction position, event position

    @property
    def account(self) -> str | None:
        value = self.fields.get("account")
        return value if isinstance(value, str) else None


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def plain(value: Any, key: str = "", *, camel_case: bool = False) -> Any:
    """A decoded ABI value as JSON-plain data."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "__discriminant__"):  # an enum payload
        return str(value.__name__)
    if isinstance(value, SimpleNamespace):
        value = vars(value)
    if isinstance(value, dict):
        return {(camel(k) if camel_case else k): plain(v, k, camel_case=camel_case) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        if key in ADDRESS_FIELDS and len(raw) == 32:
            return address_of(raw).to_bech32()
        if key in TEXT_FIELDS:
            return raw.decode("utf-8", errors="replace")
        return raw.hex()
    if hasattr(value, "get_public_key"):  # an SDK Address
        return address_of(bytes(value.get_public_key())).to_bech32()
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 256 for v in value):
            if key in ("ref", "usage_root"):  # array32<u8>
                return bytes(value).hex()
        return [plain(v, key, camel_case=camel_case) for v in value]
    return value


def _b64(part: str | None) -> bytes:
    return base64.b64decode(part) if part else b""


def event_seq(hyperblock_nonce: int, tx_position: int, event_index: int) -> int:
    """A sortable int64: 1 000 transactions per hyperblock and 1 000 events per transaction at most."""
    return (hyperblock_nonce * 1_000 + min(tx_position, 999)) * 1_000 + min(event_index, 999)


def decode_transaction_events(
    transaction: dict[str, Any], contract: str, *, hyperblock_nonce: int, tx_position: int, block_ts_ms: int
) -> list[ContractEvent]:
    """The billing contract's events in one transaction (with results), in emission order."""
    abi = load_billing_abi()
    known = {event.identifier for event in abi.definition.events}
    logs = transaction.get("logs") or {}
    decoded: list[ContractEvent] = []
    for index, event in enumerate(logs.get("events") or []):
        if event.get("address") != contract:
            continue
        topics = [_b64(t) for t in event.get("topics") or []]
        if not topics:
            continue
        name = topics[0].decode("utf-8", errors="replace")
        if name not in known:
            continue
        data = event.get("additionalData")
        parts = (
            [_b64(d) for d in data]
            if data is not None
            else ([_b64(event["data"])] if event.get("data") else [])
        )
        fields = plain(decode_event(abi, name, topics[1:], parts))
        decoded.append(
            ContractEvent(
                name=name,
                fields=fields,
                tx_hash=str(transaction["hash"]),
                event_index=index,
                hyperblock_nonce=hyperblock_nonce,
                block_ts_ms=block_ts_ms,
                seq=event_seq(hyperblock_nonce, tx_position, index),
            )
        )
    return decoded
