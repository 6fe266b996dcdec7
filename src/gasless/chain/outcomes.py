"""What a transaction's execution came to, read as the real network reports it.

The node's `status` is `pending`, `success` or `invalid` (and `fail` only for a failed cross-shard token
transfer): a reverted contract call reads `success`, its failure is in the logs (`signalError`,
`internalVMErrors`), and one still inside an asynchronous call reads `success` too. The proxy's
`GET /transaction/{h}/process-status` works the outcome out from the logs and results, as `multiversx-sdk`'s
`ProxyNetworkProvider` does (docs/chain.md cites the sources).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

FAILURE_EVENTS = ("signalError", "internalVMErrors")
MAX_REASON = 64


def _text(raw: Any) -> str | None:
    if not raw:
        return None
    try:
        return base64.b64decode(str(raw), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return str(raw)


def contract_failure(chain_tx: dict[str, Any]) -> str | None:
    """The error a failed execution signalled: the `signalError` event's second topic (the message), else
    an `internalVMErrors` event's data, else the first smart-contract result's return message; None when
    the transaction's logs and results say nothing."""
    events = (chain_tx.get("logs") or {}).get("events") or []
    for event in events:
        if event.get("identifier") == "signalError":
            topics = event.get("topics") or []
            message = _text(topics[1]) if len(topics) > 1 else None
            if message:
                return message[:MAX_REASON]
    for event in events:
        if event.get("identifier") == "internalVMErrors":
            message = _text(event.get("data"))
            if message:
                return message.strip()[:MAX_REASON]
    for result in chain_tx.get("smartContractResults") or []:
        message = result.get("returnMessage")
        if message and message != "gas refund for relayer":
            return str(message)[:MAX_REASON]
    return None


def has_failure_event(chain_tx: dict[str, Any]) -> bool:
    events = (chain_tx.get("logs") or {}).get("events") or []
    return any(event.get("identifier") in FAILURE_EVENTS for event in events)


def process_reason(reason: Any) -> str | None:
    """process-status's `reason` is the failure event's data as text: for a VM error that is `@` and the
    hex of the return code (`@75736572206572726f72`, "user error"); decoded where it is that form."""
    if not reason:
        return None
    text = str(reason)
    if text.startswith("@"):
        try:
            return bytes.fromhex(text[1:].split("@")[0]).decode("utf-8", "replace")[:MAX_REASON] or None
        except ValueError:
            pass
    return text[:MAX_REASON]


def is_move_balance(chain_tx: dict[str, Any]) -> bool:
    """A transaction without data moves balance only: its node status is its outcome (mx-chain-go
    process/coordinator/transactionType.go: no data -> MoveBalance on both shards)."""
    return not chain_tx.get("data")
