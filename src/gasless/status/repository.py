"""SQL of the status figures: relay outcomes per UTC day (availability) and incidents touching each day."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db.tables import incidents, intents, rejections

DAY_MS = 86_400_000


# An intent's broadcast outcome is final once the tracker has given up on it (GIVE_UP_MS, 15 minutes after
# its co-signature: a gateway acknowledged it, or it never will); refusals never change. Rows older than
# this are counted once per host and kept. Not covered: a host down for longer than this re-broadcasts its
# orphans when it starts again, and the other hosts keep counting those as never broadcast until they restart.
STABLE_AFTER_MS = 1_800_000


class StatusRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # {day start: [good, bad]} of the rows that can no longer change (before `_counted_until`), for the
        # senders in `_counted_key`, from the window's start on.
        self._counted: dict[int, list[int]] = {}
        self._counted_from = 0
        self._counted_until: int | None = None
        self._counted_key: tuple[str, ...] = ()

    async def outcomes_by_day(
        self, from_ms: int, exclude_senders: tuple[str, ...] = (), now_ms: int | None = None
    ) -> dict[int, list[int]]:
        """day start -> [good, bad]: co-signed intents that were broadcast (good) or never were (bad), and
        refusals before the commit point: a 4xx is a correct answer (good), a 5xx is not (bad).

        With `now_ms` (a day-aligned `from_ms`), the rows older than STABLE_AFTER_MS are counted once and
        kept, and each later call counts only the rows stable since the last call and the rows still fresh,
        ranges of the time indexes: the status page costs what the last half hour holds, however many
        intents the database holds and however far into the day it is."""
        if now_ms is None:
            return await self._count(from_ms, None, exclude_senders)
        stable = max(from_ms, now_ms - STABLE_AFTER_MS)
        if (
            self._counted_until is None
            or self._counted_key != exclude_senders
            or from_ms < self._counted_from
            or stable < self._counted_until  # the clock went back
        ):
            self._counted = await self._count(from_ms, stable, exclude_senders)
            self._counted_key = exclude_senders
        else:  # the window moved on: days before it leave, rows stable since the last call join
            self._counted = {day: counts for day, counts in self._counted.items() if day >= from_ms}
            if stable > self._counted_until:
                since = max(from_ms, self._counted_until)
                _add(self._counted, await self._count(since, stable, exclude_senders))
        self._counted_from, self._counted_until = from_ms, stable
        days = {day: list(counts) for day, counts in self._counted.items()}
        _add(days, await self._count(stable, None, exclude_senders))
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


def _add(days: dict[int, list[int]], more: dict[int, list[int]]) -> None:
    for day, (good, bad) in more.items():
        totals = days.setdefault(day, [0, 0])
        totals[0] += good
        totals[1] += bad
