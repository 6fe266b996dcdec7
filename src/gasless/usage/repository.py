"""SQL of the usage reads: ledger rows (keyset pages), in-flight intents, REJECTED submissions, batches.

Order everywhere is docs/usage.md's: the ordering time descending (`terminal_at_ms`: the executing block's
time, else the terminal time; a rejection's time is when it was received), then the transaction hash descending.
A REJECTED submission can share a hash with a ledger row (refused first, accepted later), so the full sort
key is (time, hash, kind, pk) with kind 1 for ledger rows and 0 for rejections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, and_, false, func, literal, or_, select, type_coerce
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from gasless.db import intents, rejections, settlement_batches, usage_ledger

IN_FLIGHT_STATES = ("COSIGNED", "BROADCAST")
REJECTION_RETENTION_MS = 30 * 86_400_000
SortKey = tuple[int, str, int, int]


@dataclass(frozen=True)
class UsageFilters:
    """The `GET /v1/usage` query, validated."""

    account: str
    sender: str | None = None
    relayer: str | None = None
    statuses: tuple[str, ...] | None = None
    states: tuple[str, ...] | None = None
    shards: tuple[int, ...] | None = None
    min_inclusion_ms: int | None = None
    q: str | None = None
    billing_class: str | None = None
    period_id: int | None = None
    api_key_id: str | None = None
    include_in_flight: bool = False

    def binding(self) -> dict[str, Any]:
        """What a cursor is bound to (every filter)."""
        return {
            "account": self.account,
            "sender": self.sender,
            "relayer": self.relayer,
            "status": list(self.statuses) if self.statuses is not None else None,
            "state": list(self.states) if self.states is not None else None,
            "shard": list(self.shards) if self.shards is not None else None,
            "minInclusionMs": self.min_inclusion_ms,
            "q": self.q,
            "billingClass": self.billing_class,
            "periodId": self.period_id,
            "apiKeyId": self.api_key_id,
            "includeInFlight": self.include_in_flight,
        }

    @property
    def billing_filtered(self) -> bool:
        return self.billing_class is not None or self.period_id is not None or self.api_key_id is not None


def _like_prefix(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}%"


def _before(columns: Sequence[Any], key: Sequence[Any]) -> ColumnElement[bool]:
    """Lexicographic `columns < key` (a keyset page boundary for a descending order)."""
    head, *rest = columns
    if not rest:
        return head < key[0]  # type: ignore[no-any-return]
    return or_(head < key[0], and_(head == key[0], _before(rest, key[1:])))


def account_of_ledger(account: str) -> ColumnElement[bool]:
    """Rows the account paid for, or would have paid for (dead), or its own unattributed free relays."""
    return or_(
        usage_ledger.c.account == account,
        and_(usage_ledger.c.account.is_(None), usage_ledger.c.sender == account),
    )


def _ledger_state_condition(states: Sequence[str]) -> ColumnElement[bool]:
    parts: list[ColumnElement[bool]] = []
    if "DEAD" in states:
        parts.append(usage_ledger.c.status == "dead")
    if "EXECUTED" in states:
        parts.append(and_(usage_ledger.c.status != "dead", usage_ledger.c.finalized_at_ms.is_(None)))
    if "FINALIZED" in states:
        parts.append(and_(usage_ledger.c.status != "dead", usage_ledger.c.finalized_at_ms.is_not(None)))
    return or_(*parts) if parts else false()


class UsageRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def ledger_page(
        self, filters: UsageFilters, after: SortKey | None, limit: int
    ) -> list[tuple[SortKey, Any]]:
        c = usage_ledger.c
        where: list[ColumnElement[bool]] = [account_of_ledger(filters.account)]
        if filters.sender is not None:
            where.append(c.sender == filters.sender)
        if filters.relayer is not None:
            where.append(c.relayer == filters.relayer)
        if filters.statuses is not None:
            where.append(c.status.in_(filters.statuses))
        if filters.states is not None:
            where.append(_ledger_state_condition(filters.states))
        if filters.shards is not None:
            where.append(c.sender_shard.in_(filters.shards))
        if filters.min_inclusion_ms is not None:
            where.append(c.executed_block_ts_ms - c.received_at_ms >= filters.min_inclusion_ms)
        if filters.q is not None:
            where.append(
                or_(
                    type_coerce(c.tx_hash, String).like(_like_prefix(filters.q.lower()), escape="\\"),
                    c.sender.like(_like_prefix(filters.q), escape="\\"),
                    c.receiver.like(_like_prefix(filters.q), escape="\\"),
                    c.function.like(_like_prefix(filters.q), escape="\\"),
                )
            )
        if filters.billing_class is not None:
            where.append(c.billing_class == filters.billing_class)
        if filters.period_id is not None:
            where.append(c.period_id == filters.period_id)
        if filters.api_key_id is not None:
            where.append(and_(c.billed, c.api_key_id == filters.api_key_id))
        if after is not None:
            where.append(
                _before([c.terminal_at_ms, type_coerce(c.tx_hash, String), literal(1), c.intent_pk], after)
            )
        query = (
            select(usage_ledger)
            .where(*where)
            .order_by(c.terminal_at_ms.desc(), c.tx_hash.desc(), c.intent_pk.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [((int(r.terminal_at_ms), str(r.tx_hash), 1, int(r.intent_pk)), r) for r in rows]

    async def rejection_page(
        self,
        filters: UsageFilters,
        senders: Sequence[str],
        since_ms: int,
        after: SortKey | None,
        limit: int,
    ) -> list[tuple[SortKey, Any]]:
        c = rejections.c
        hash_key = func.coalesce(type_coerce(c.tx_hash, String), "")
        where: list[ColumnElement[bool]] = [c.sender.in_(list(senders)), c.received_at_ms >= since_ms]
        if filters.q is not None:
            where.append(
                or_(
                    type_coerce(c.tx_hash, String).like(_like_prefix(filters.q.lower()), escape="\\"),
                    c.sender.like(_like_prefix(filters.q), escape="\\"),
                )
            )
        if after is not None:
            where.append(_before([c.received_at_ms, hash_key, literal(0), c.pk], after))
        query = (
            select(rejections)
            .where(*where)
            .order_by(c.received_at_ms.desc(), hash_key.desc(), c.pk.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [((int(r.received_at_ms), str(r.tx_hash or ""), 0, int(r.pk)), r) for r in rows]

    async def in_flight(self, sender: str | None) -> list[Any]:
        """Intents not yet terminal (the caller keeps those of one account: few by the in-flight limits)."""
        query = select(intents).where(intents.c.state.in_(IN_FLIGHT_STATES))
        if sender is not None:
            query = query.where(intents.c.sender == sender)
        async with self.engine.connect() as conn:
            return list((await conn.execute(query)).all())

    async def ledger_row(self, tx_hash: str) -> Any | None:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(usage_ledger).where(usage_ledger.c.tx_hash == tx_hash))).first()

    async def intent_by_hash(self, tx_hash: str) -> Any | None:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(intents).where(intents.c.tx_hash == tx_hash))).first()

    async def batch(self, batch_id: int) -> Any | None:
        async with self.engine.connect() as conn:
            return (
                await conn.execute(
                    select(settlement_batches).where(settlement_batches.c.batch_id == batch_id)
                )
            ).first()

    async def period_rows(self, account: str, period_id: int, period_end_ms: int) -> list[Any]:
        """The summary's rows: billed into the period, or (PAYG, unbilled) ending inside its window."""
        c = usage_ledger.c
        in_window = and_(c.terminal_at_ms >= period_id, c.terminal_at_ms < period_end_ms)
        query = select(
            c.sender,
            c.receiver,
            c.status,
            c.billed,
            c.billing_class,
            c.ru,
            c.payg_micro,
            c.terminal_at_ms,
            c.received_at_ms,
            c.executed_block_ts_ms,
        ).where(
            account_of_ledger(account),
            or_(c.period_id == period_id, and_(c.period_id.is_(None), in_window)),
        )
        async with self.engine.connect() as conn:
            return list((await conn.execute(query)).all())

    async def rejected_count(self, senders: Sequence[str], from_ms: int, to_ms: int) -> int:
        c = rejections.c
        query = select(func.count()).where(
            c.sender.in_(list(senders)), c.received_at_ms >= from_ms, c.received_at_ms < to_ms
        )
        async with self.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())
