"""SQL of the status figures: relay outcomes per UTC day (availability) and incidents touching each day."""

from __future__ import annotations

import hashlib
from typing import Any

import structlog
from sqlalchemy import Connection, and_, func, literal_column, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db.engine import dialect_insert, run_read, run_write
from gasless.db.tables import incidents, intents, rejections, service_meta

log = structlog.get_logger("gasless.status")

DAY_MS = 86_400_000
AVAILABILITY_DAYS = 90  # the status page's daily availability: the last 90 UTC days, today included


def availability_start(now_ms: int) -> int:
    """The first day of the status page's availability window at `now_ms`."""
    return now_ms // DAY_MS * DAY_MS - (AVAILABILITY_DAYS - 1) * DAY_MS


# An intent's broadcast outcome is final once the tracker has given up on it (GIVE_UP_MS, 15 minutes after
# its co-signature: a gateway acknowledged it, or it never will); refusals never change. Rows older than
# this are counted once and kept. Not covered: a host down for longer than this re-broadcasts its orphans
# when it starts again, and they stay counted as never broadcast (docs/status.md).
STABLE_AFTER_MS = 1_800_000
# The stable days' counts are also kept in the database (`service_meta`, this key), so that a host starting
# on a large database reads them instead of every intent of the 90 days: one document, {senders: digest of
# the excluded senders, from: window start, until: stable bound, days: {day start: [good, bad]}}, a full
# count of [from, until). Any host writes it when its own count reaches further, at most this often.
COUNTS_KEY = "status.availability"
PERSIST_EVERY_MS = 600_000


class StatusRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # {day start: [good, bad]} of the rows that can no longer change (before `_counted_until`), for the
        # senders in `_counted_key`, from the window's start on.
        self._counted: dict[int, list[int]] = {}
        self._counted_from = 0
        self._counted_until: int | None = None
        self._counted_key: tuple[str, ...] = ()
        self._persisted_until = 0  # the `until` of the document as this host last read or wrote it

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
            or stable < self._counted_until  # the clock went back, or counts from a host whose clock is ahead
        ):
            stored = await self._load(exclude_senders, from_ms)
            if stored is None:
                counted = await self._count(from_ms, stable, exclude_senders)
                self._counted, self._counted_until = counted, stable
            else:  # counted before, by this host or another: only the rows stable since then are read
                self._counted, self._counted_until = stored
            self._counted_key = exclude_senders
        else:  # the window moved on: days before it leave
            self._counted = {day: counts for day, counts in self._counted.items() if day >= from_ms}
        if stable > self._counted_until:  # rows stable since the last count join
            since = max(from_ms, self._counted_until)
            _add(self._counted, await self._count(since, stable, exclude_senders))
            self._counted_until = stable
        self._counted_from = from_ms
        if self._counted_until - self._persisted_until >= PERSIST_EVERY_MS:
            await self._persist(exclude_senders, now_ms)
        days = {day: list(counts) for day, counts in self._counted.items()}
        _add(days, await self._count(self._counted_until, None, exclude_senders))
        return days

    async def _load(
        self, exclude_senders: tuple[str, ...], from_ms: int
    ) -> tuple[dict[int, list[int]], int] | None:
        """The stored counts of the window's days from `from_ms` and the time they reach, when the document
        counts the same senders from no later than `from_ms`; None otherwise. A bound ahead of this host's
        own (another host's clock is ahead) is taken as it is: the rows before it are counted there."""

        def read(conn: Connection) -> Any:
            return conn.scalar(select(service_meta.c.value).where(service_meta.c.key == COUNTS_KEY))

        document = await run_read(self.engine, read)
        if not isinstance(document, dict) or document.get("senders") != _senders_digest(exclude_senders):
            return None
        if int(document["from"]) > from_ms:
            return None
        until = self._persisted_until = int(document["until"])
        days = {int(day): [int(good), int(bad)] for day, (good, bad) in document["days"].items()}
        return {day: counts for day, counts in days.items() if day >= from_ms}, until

    async def _persist(self, exclude_senders: tuple[str, ...], now_ms: int) -> None:
        """Store this host's counts unless the stored document already reaches as far. Each document is a
        full count, so whichever host writes last with the furthest bound leaves a correct one."""
        until = self._counted_until
        assert until is not None
        document = {
            "senders": _senders_digest(exclude_senders),
            "from": self._counted_from,
            "until": until,
            "days": {str(day): counts for day, counts in self._counted.items()},
        }

        def write(conn: Connection) -> None:
            conn.execute(
                dialect_insert(conn)(service_meta)
                .values(key=COUNTS_KEY, value={"until": -1}, updated_at_ms=now_ms)
                .on_conflict_do_nothing(index_elements=["key"])
            )
            statement = select(service_meta.c.value).where(service_meta.c.key == COUNTS_KEY)
            stored = conn.scalar(statement.with_for_update())
            if int((stored or {}).get("until", -1)) < until:
                conn.execute(
                    update(service_meta)
                    .where(service_meta.c.key == COUNTS_KEY)
                    .values(value=document, updated_at_ms=now_ms)
                )

        try:
            await run_write(self.engine, write)
        except Exception as exc:  # the page is still answered; the next call tries again
            log.warning("availability counts not stored", error=type(exc).__name__)
            return
        self._persisted_until = until

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


def _senders_digest(exclude_senders: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(sorted(exclude_senders)).encode()).hexdigest()


def _add(days: dict[int, list[int]], more: dict[int, list[int]]) -> None:
    for day, (good, bad) in more.items():
        totals = days.setdefault(day, [0, 0])
        totals[0] += good
        totals[1] += bad
