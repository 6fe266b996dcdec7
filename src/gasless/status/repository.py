"""SQL of the status figures: relay outcomes per UTC day (availability) and incidents touching each day."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db.tables import incidents, intents, rejections

DAY_MS = 86_400_000


# A day's outcomes are final once it ended this long ago (a co-signed intent is broadcast, or found never
# broadcast by recovery, within minutes); such days are counted once per host and kept.
SETTLED_AFTER_MS = DAY_MS


class StatusRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # {day start: [good, bad]} of the days that can no longer change, for the window and senders in the key.
        self._settled: dict[int, list[int]] = {}
        self._settled_key: tuple[int, int, tuple[str, ...]] | None = None

    async def outcomes_by_day(
        self, from_ms: int, exclude_senders: tuple[str, ...] = (), now_ms: int | None = None
    ) -> dict[int, list[int]]:
        """day start -> [good, bad]: co-signed intents that were broadcast (good) or never were (bad), and
        refusals before the commit point: a 4xx is a correct answer (good), a 5xx is not (bad).

        With `now_ms`, the days that ended more than SETTLED_AFTER_MS before it are read once and kept; each
        later call reads only the days since, a range of the co-signature time's index, so a database holding
        millions of intents costs the status page what its last two days hold."""
        if now_ms is None:
            return await self._count(from_ms, None, exclude_senders)
        settled_until = max(from_ms, (now_ms - SETTLED_AFTER_MS) // DAY_MS * DAY_MS)
        key = (from_ms, settled_until, exclude_senders)
        if self._settled_key != key:  # once a day: the window moved
            self._settled = await self._count(from_ms, settled_until, exclude_senders)
            self._settled_key = key
        days = {day: list(counts) for day, counts in self._settled.items()}
        for day, (good, bad) in (await self._count(settled_until, None, exclude_senders)).items():
            totals = days.setdefault(day, [0, 0])
            totals[0] += good
            totals[1] += bad
        return days

    async def _count(
        self, from_ms: int, to_ms: int | None, exclude_senders: tuple[str, ...]
    ) -> dict[int, list[int]]:
        days: dict[int, list[int]] = {}
        # Literal constants: PostgreSQL matches a GROUP BY expression to the select list's only when they are
        # the same text (two bind parameters of the same value are not).
        day_ms = literal_column(str(DAY_MS))
        intent_day = (intents.c.cosigned_at_ms / day_ms).cast(type_=intents.c.nonce.type)
        reject_day = (rejections.c.received_at_ms / day_ms).cast(type_=rejections.c.nonce.type)
        correct = rejections.c.status < literal_column("500")
        intent_range = [intents.c.cosigned_at_ms >= from_ms]
        reject_range = [rejections.c.received_at_ms >= from_ms]
        if to_ms is not None:
            intent_range.append(intents.c.cosigned_at_ms < to_ms)
            reject_range.append(rejections.c.received_at_ms < to_ms)
        async with self.engine.connect() as conn:
            intent_rows = await conn.execute(
                select(intent_day, intents.c.broadcast_at_ms.is_not(None), func.count())
                .where(*intent_range, intents.c.sender.not_in(exclude_senders))
                .group_by(intent_day, intents.c.broadcast_at_ms.is_not(None))
            )
            for day, broadcast, count in intent_rows:
                days.setdefault(int(day) * DAY_MS, [0, 0])[0 if broadcast else 1] += int(count)
            reject_rows = await conn.execute(
                select(reject_day, correct, func.count())
                .where(*reject_range, rejections.c.sender.not_in(exclude_senders))
                .group_by(reject_day, correct)
            )
            for day, correct, count in reject_rows:
                days.setdefault(int(day) * DAY_MS, [0, 0])[0 if correct else 1] += int(count)
        return days

    async def first_activity_ms(self) -> int | None:
        async with self.engine.connect() as conn:
            first_intent = await conn.scalar(select(func.min(intents.c.cosigned_at_ms)))
            first_reject = await conn.scalar(select(func.min(rejections.c.received_at_ms)))
        found = [int(v) for v in (first_intent, first_reject) if v is not None]
        return min(found) if found else None

    async def incidents_between(self, from_ms: int, to_ms: int) -> list[Any]:
        async with self.engine.connect() as conn:
            return list(
                (
                    await conn.execute(
                        select(incidents.c.id, incidents.c.created_at_ms, incidents.c.resolved_at_ms).where(
                            and_(
                                incidents.c.created_at_ms < to_ms,
                                or_(
                                    incidents.c.resolved_at_ms.is_(None),
                                    incidents.c.resolved_at_ms >= from_ms,
                                ),
                            )
                        )
                    )
                ).all()
            )


async def account_relayers(engine: AsyncEngine, account: str, from_ms: int, to_ms: int) -> list[Any]:
    """relayer -> counts of the account's terminal intents in the window, with the relayer's row."""
    from sqlalchemy import case

    from gasless.db.tables import relayers, usage_ledger

    query = (
        select(
            usage_ledger.c.relayer,
            relayers.c.shard,
            relayers.c.state,
            func.count(),
            func.sum(case((usage_ledger.c.status == "success", 1), else_=0)),
            func.sum(case((usage_ledger.c.status == "failed", 1), else_=0)),
            func.sum(case((usage_ledger.c.status == "dead", 1), else_=0)),
            func.max(usage_ledger.c.terminal_at_ms),
        )
        .join(relayers, relayers.c.address == usage_ledger.c.relayer)
        .where(
            usage_ledger.c.account == account,
            usage_ledger.c.terminal_at_ms >= from_ms,
            usage_ledger.c.terminal_at_ms <= to_ms,
        )
        .group_by(usage_ledger.c.relayer, relayers.c.shard, relayers.c.state)
        .order_by(func.count().desc(), usage_ledger.c.relayer)
    )
    async with engine.connect() as conn:
        return list((await conn.execute(query)).all())


async def account_traffic(engine: AsyncEngine, account: str, from_ms: int, to_ms: int) -> tuple[int, int]:
    """(relays, failures) of the account's terminal intents in [from, to]."""
    from sqlalchemy import case

    from gasless.db.tables import usage_ledger

    query = select(func.count(), func.sum(case((usage_ledger.c.status != "success", 1), else_=0))).where(
        usage_ledger.c.account == account,
        usage_ledger.c.terminal_at_ms >= from_ms,
        usage_ledger.c.terminal_at_ms <= to_ms,
    )
    async with engine.connect() as conn:
        relays, failures = (await conn.execute(query)).one()
    return int(relays or 0), int(failures or 0)
