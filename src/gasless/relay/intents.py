"""Intent documents from stored rows, with the derived latency figures."""

from __future__ import annotations

import math
from typing import Any

from gasless.billing.policy import CONTRACT_FAILURES
from gasless.relay.schemas import Intent, IntentFailure, IntentLatency

TERMINAL = ("FINALIZED", "DEAD", "REJECTED")


def _diff(later: int | None, earlier: int | None) -> int | None:
    return None if later is None or earlier is None else int(later - earlier)


def latency(
    *,
    received: int | None,
    cosigned: int | None,
    broadcast: int | None,
    executed: int | None,
    finalized: int | None,
    round_ms: int,
) -> IntentLatency:
    inclusion = _diff(executed, received)
    return IntentLatency(
        acceptToCosignMs=_diff(cosigned, received),
        cosignToBroadcastMs=_diff(broadcast, cosigned),
        addedMs=_diff(broadcast, received),
        inclusionMs=inclusion,
        finalityMs=_diff(finalized, executed),
        totalMs=_diff(finalized, received),
        # An unknown round duration (a host that has not reached the network yet) gives null, never a guess.
        roundsToInclusion=None
        if inclusion is None or round_ms <= 0
        else max(0, math.ceil(inclusion / round_ms)),
    )


def intent_from_row(row: Any, round_ms: int) -> Intent:
    return Intent(
        id=f"{row.sender}:{row.nonce}",
        sender=row.sender,
        nonce=int(row.nonce),
        txHash=row.tx_hash,
        state=row.state,
        final=row.state in TERMINAL,
        receivedAtMs=row.received_at_ms,
        cosignedAtMs=row.cosigned_at_ms,
        broadcastAtMs=row.broadcast_at_ms,
        executedBlockTsMs=row.executed_block_ts_ms,
        finalizedAtMs=row.finalized_at_ms,
        latency=latency(
            received=row.received_at_ms,
            cosigned=row.cosigned_at_ms,
            broadcast=row.broadcast_at_ms,
            executed=row.executed_block_ts_ms,
            finalized=row.finalized_at_ms,
            round_ms=round_ms,
        ),
        crossShard=bool(row.cross_shard),
        receiver=row.receiver,
        relayer=row.relayer,
        gasLimit=int(row.gas_limit),
        gasPrice=int(row.gas_price),
        outcome=row.outcome,
        deadReason=row.dead_reason,
        failure=failure_of(getattr(row, "failure", None)),
        replacedBy=row.replaced_by,
    )


def failure_of(message: str | None) -> IntentFailure | None:
    if not message:
        return None
    return IntentFailure(code=CONTRACT_FAILURES.get(message), message=message)


def rejected_intent(row: Any, round_ms: int) -> Intent:
    return Intent(
        id=f"{row.sender}:{row.nonce}",
        sender=row.sender,
        nonce=int(row.nonce),
        txHash=row.tx_hash,
        state="REJECTED",
        final=True,
        receivedAtMs=row.received_at_ms,
        cosignedAtMs=None,
        broadcastAtMs=None,
        executedBlockTsMs=None,
        finalizedAtMs=None,
        latency=latency(
            received=row.received_at_ms,
            cosigned=None,
            broadcast=None,
            executed=None,
            finalized=None,
            round_ms=round_ms,
        ),
        crossShard=False,
        rejection={"code": row.code, "status": row.status, "detail": row.detail},
    )
