"""Latency rollups: every terminal intent's latency figures, merged into HdrHistograms per minute and per
hour, per dimension and key, in the database (docs/usage.md, "Latency").

- The sketch is HdrHistogram (`hdrhistogram`): mergeable, serialised with its own compressed codec, values
  1 ms to 24 h at 2 significant digits, so a percentile read from a rollup is within 1 % of the exact one
  (`RELATIVE_ERROR`). Percentiles are always read from rollups, never from raw rows.
- One singleton worker (`LatencyRollup`, role `latency-rollup`) feeds them off the relay hot path: in one
  write transaction it takes a batch of terminal usage rows not yet counted (finalized, or dead), merges
  them into the rollup rows and marks them `rolled_up`. Whichever host leads, each intent is counted once.
- Retention: minute rollups 49 h, hour rollups 91 days.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import multiprocessing
import os
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import structlog
from hdrh.histogram import HdrHistogram
from sqlalchemy import Connection, and_, bindparam, delete, func, select, tuple_, update
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.core.workers import cancel_and_wait
from gasless.db.engine import (
    create_engine,
    dialect_insert,
    run_read,
    run_read_off_loop,
    run_write,
    shared_by_url,
)
from gasless.db.tables import latency_rollups, service_meta, usage_ledger
from gasless.relay.intents import latency

log = structlog.get_logger("gasless.rollups")

LOWEST_MS, HIGHEST_MS, SIGNIFICANT_DIGITS = 1, 86_400_000, 2
RELATIVE_ERROR = 0.01  # 2 significant digits: a recorded value is known within 1 %
METRICS = ("added", "inclusion", "finality", "total")
MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
GRANULARITIES = {"m": MINUTE_MS, "h": HOUR_MS}
RETENTION_MS = {"m": 49 * HOUR_MS, "h": 91 * DAY_MS}
BATCH = 500
MERGE_TIMEOUT_S = 60.0  # a batch merges in well under a second; a child stuck this long is replaced
ROLLUP_ROLE = "latency-rollup"
SYNTHETIC_ROUTE = "probe"  # the synthetic probe's intents (status/probe.py)
# Account-scoped dimensions (`<account>|<value>` keys) and the public ones.
ACCOUNT_DIMENSIONS = {
    "shard": "acct_shard",
    "relayer": "acct_relayer",
    "sender": "acct_sender",
    "gateway": "acct_gateway",
}
UNKNOWN_GATEWAY = "unrecorded"
# A counter every write to the rollups raises (service_meta): a merge checks it has not moved since its read.
WRITES_KEY = "latency-rollup.writes"


# The sketch ------------------------------------------------------------------------------------------------
def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_MS, HIGHEST_MS, SIGNIFICANT_DIGITS)


def record(histogram: HdrHistogram, value_ms: int) -> None:
    histogram.record_value(min(max(int(value_ms), 0), HIGHEST_MS))


def encode(histogram: HdrHistogram) -> str:
    return base64.b64encode(histogram.encode()).decode("ascii")


def decode(text: str) -> HdrHistogram:
    return HdrHistogram.decode(base64.b64decode(text))


def merged(encoded: Iterable[str]) -> HdrHistogram:
    total = new_histogram()
    for text in encoded:
        total.add(decode(text))
    return total


def percentile(histogram: HdrHistogram, q: float) -> int | None:
    if histogram.get_total_count() == 0:
        return None
    return int(histogram.get_value_at_percentile(q))


def bins(histogram: HdrHistogram, edges: Sequence[int]) -> list[tuple[int | None, int]]:
    """Counts of values up to each edge (exclusive of the previous one); the last bin (`None`) overflows."""
    counts = [0] * (len(edges) + 1)
    for item in histogram.get_recorded_iterator():
        value, count = int(item.value_iterated_to), int(item.count_at_value_iterated_to)
        index = next((i for i, edge in enumerate(edges) if value <= edge), len(edges))
        counts[index] += count
    return [(edge, counts[i]) for i, edge in enumerate(edges)] + [(None, counts[-1])]


# What one usage row contributes -------------------------------------------------------------------------
def figures(row: Any, round_ms: int) -> dict[str, int]:
    figures_ = latency(
        received=row.received_at_ms,
        cosigned=row.cosigned_at_ms,
        broadcast=row.broadcast_at_ms,
        executed=row.executed_block_ts_ms,
        finalized=row.finalized_at_ms,
        round_ms=round_ms,
    )
    values = {
        "added": figures_.addedMs,
        "inclusion": figures_.inclusionMs,
        "finality": figures_.finalityMs,
        "total": figures_.totalMs,
    }
    return {name: int(v) for name, v in values.items() if v is not None and v >= 0}


def dimensions(row: Any) -> list[tuple[str, str]]:
    gateway = row.first_ack_gateway or UNKNOWN_GATEWAY
    shard = str(int(row.sender_shard))
    account = row.account or row.sender
    return [
        ("all", ""),
        ("shard", shard),
        ("relayer", row.relayer),
        ("gateway", gateway),
        ("acct_shard", f"{account}|{shard}"),
        ("acct_relayer", f"{account}|{row.relayer}"),
        ("acct_sender", f"{account}|{row.sender}"),
        ("acct_gateway", f"{account}|{gateway}"),
    ]


RollupKey = tuple[str, int, str, str, str]  # granularity, bucket_ms, dimension, key, metric


class RollupRaced(Exception):
    """The rows or the stored rollups moved between the read and the write (another leader wrote)."""


def contributions(row: Any, round_ms: int) -> list[tuple[RollupKey, int]]:
    """The (rollup key, value) pairs one usage row records."""
    values = figures(row, round_ms)
    if not values or row.route == SYNTHETIC_ROUTE:
        return []  # synthetic probe traffic never reaches a figure (it is marked counted all the same)
    out = []
    for granularity, size in GRANULARITIES.items():
        bucket = int(row.terminal_at_ms) // size * size
        for dimension, key in dimensions(row):
            for metric, value in values.items():
                out.append(((granularity, bucket, dimension, key, metric), value))
    return out


def rollup_keys(rows: Iterable[Any]) -> set[RollupKey]:
    # The keys do not depend on the round duration (only the values do).
    return {key for row in rows for key, _ in contributions(row, 1)}


def merge_rows(
    rows: Sequence[Any], existing: dict[RollupKey, tuple[int, str]], round_ms: int
) -> dict[RollupKey, tuple[int, str]]:
    """The merged histograms (count, encoded) of every key the rows touch, the stored ones included."""
    fresh: dict[RollupKey, HdrHistogram] = {}
    for row in rows:
        for key, value in contributions(row, round_ms):
            histogram = fresh.get(key)
            if histogram is None:  # not setdefault: a histogram is dear to make
                histogram = fresh[key] = new_histogram()
            record(histogram, value)
    merged_: dict[RollupKey, tuple[int, str]] = {}
    for key, histogram in fresh.items():
        if key in existing:
            histogram.add(decode(existing[key][1]))
        merged_[key] = (int(histogram.get_total_count()), encode(histogram))
    return merged_


@dataclass(frozen=True)
class RollupRow:
    granularity: str
    bucket_ms: int
    dimension: str
    key: str
    metric: str
    count: int
    histogram: str


ROLLUP_KEY_COLUMNS = (
    latency_rollups.c.granularity,
    latency_rollups.c.bucket_ms,
    latency_rollups.c.dimension,
    latency_rollups.c.key,
    latency_rollups.c.metric,
)
# What a usage row contributes is read from these columns alone (never the wire transaction).
USAGE_FIGURE_COLUMNS = (
    usage_ledger.c.tx_hash,
    usage_ledger.c.route,
    usage_ledger.c.account,
    usage_ledger.c.sender,
    usage_ledger.c.sender_shard,
    usage_ledger.c.relayer,
    usage_ledger.c.first_ack_gateway,
    usage_ledger.c.received_at_ms,
    usage_ledger.c.cosigned_at_ms,
    usage_ledger.c.broadcast_at_ms,
    usage_ledger.c.executed_block_ts_ms,
    usage_ledger.c.finalized_at_ms,
    usage_ledger.c.terminal_at_ms,
)
_UNCOUNTED = (
    usage_ledger.c.rolled_up.is_(False),
    (usage_ledger.c.finalized_at_ms.is_not(None)) | (usage_ledger.c.status == "dead"),
)


@dataclass(frozen=True)
class ReadBatch:
    """Terminal usage rows not yet counted, the stored histograms they merge into, and the rollups' write
    counter as it was before either was read."""

    rows: list[Any]
    existing: dict[RollupKey, tuple[int, str]]
    writes: int


@dataclass(frozen=True)
class PreparedBatch:
    """One merged batch, ready for the short guarded write: the usage rows it counts, the rollups' write
    counter its read saw, and the rows to upsert, as plain tuples (built before the write, which passes
    them to the driver as they are)."""

    hashes: list[str]
    writes: int
    rows: list[tuple[Any, ...]]  # in `latency_rollups` column order: the key's five, count, histogram, time


def _stored(conn: Connection, keys: list[RollupKey]) -> dict[RollupKey, tuple[int, str]]:
    """Each stored key's count and encoded histogram."""
    found: dict[RollupKey, tuple[int, str]] = {}
    for start in range(0, len(keys), 200):
        chunk = keys[start : start + 200]
        statement = select(*ROLLUP_KEY_COLUMNS, latency_rollups.c.count, latency_rollups.c.histogram).where(
            tuple_(*ROLLUP_KEY_COLUMNS).in_(chunk)
        )
        for row in conn.execute(statement):
            found[tuple(row[:5])] = (int(row[5]), row[6])  # type: ignore[assignment]
    return found


def _writes(conn: Connection, *, lock: bool = False) -> int:
    statement = select(service_meta.c.value).where(service_meta.c.key == WRITES_KEY)
    value = conn.scalar(statement.with_for_update() if lock else statement)
    return int(value["writes"]) if value else 0


def _count_write(conn: Connection, writes: int, now_ms: int) -> None:
    """Raise the write counter from `writes` (locked by `_writes(lock=True)` in this transaction)."""
    document = {"writes": writes + 1}
    conn.execute(
        update(service_meta)
        .where(service_meta.c.key == WRITES_KEY)
        .values(value=document, updated_at_ms=now_ms)
    )


def _locked_writes(conn: Connection, now_ms: int) -> int:
    """The write counter, locked until the transaction ends. The row is made first when missing (a
    concurrent maker waits for this transaction, then finds it: no two writers both see it absent)."""
    conn.execute(
        dialect_insert(conn)(service_meta)
        .values(key=WRITES_KEY, value={"writes": 0}, updated_at_ms=now_ms)
        .on_conflict_do_nothing(index_elements=["key"])
    )
    return _writes(conn, lock=True)


@functools.cache
def _upsert_sql(insert: Any, dialect: Dialect) -> str:
    """The rollup rows' upsert (`insert`: the dialect's, from `dialect_insert`) in the dialect's SQL, its
    positional parameters in column order."""
    upsert = insert(latency_rollups)
    statement = upsert.values({column.name: bindparam(column.name) for column in latency_rollups.c})
    statement = statement.on_conflict_do_update(
        index_elements=list(ROLLUP_KEY_COLUMNS),
        set_={
            "count": upsert.excluded.count,
            "histogram": upsert.excluded.histogram,
            "updated_at_ms": upsert.excluded.updated_at_ms,
        },
    )
    compiled = statement.compile(dialect=dialect)
    # `PreparedBatch.rows` are tuples in column order: the statement must take its parameters so.
    if compiled.positiontup != [column.name for column in latency_rollups.c]:
        raise RuntimeError(f"the rollups' upsert takes its parameters as {compiled.positiontup}")
    return str(compiled)


def read_batch(conn: Connection, limit: int) -> ReadBatch:
    """Up to `limit` terminal usage rows not yet counted, and the stored histograms they merge into.

    The counter is read first: each statement may see its own snapshot (PostgreSQL's read committed,
    SQLite outside a transaction), so a write landing between the statements leaves the counter read
    behind what was read after it (the write then fails its check and the batch merges again), never
    ahead."""
    writes = _writes(conn)
    rows = conn.execute(
        select(*USAGE_FIGURE_COLUMNS).where(*_UNCOUNTED).order_by(usage_ledger.c.terminal_at_ms).limit(limit)
    ).all()
    return ReadBatch(list(rows), _stored(conn, list(rollup_keys(rows))) if rows else {}, writes)


def count_uncounted(conn: Connection, up_to: int) -> int:
    """How many usage rows wait to be counted, counting no further than `up_to`."""
    waiting = select(usage_ledger.c.tx_hash).where(*_UNCOUNTED).limit(up_to).subquery()
    return int(conn.execute(select(func.count()).select_from(waiting)).scalar_one())


def prepare(read: ReadBatch, round_ms: int, now_ms: int) -> PreparedBatch:
    fresh = merge_rows(read.rows, read.existing, round_ms)
    return PreparedBatch(
        hashes=[row.tx_hash for row in read.rows],
        writes=read.writes,
        rows=[(*key, count, text, now_ms) for key, (count, text) in fresh.items()],
    )


def prepare_in_child(database_url: str, round_ms: int, now_ms: int, limit: int) -> PreparedBatch:
    """The read and the merge of one batch, run in the merge process (`MergeProcess`) on its own engine."""

    async def run() -> PreparedBatch:
        engine = create_engine(database_url)
        try:
            read = await run_read_off_loop(engine, lambda conn: read_batch(conn, limit))
        finally:
            await engine.dispose()
        return prepare(read, round_ms, now_ms)

    return asyncio.run(run())


def _exit_with_parent(parent_pid: int) -> None:
    """The merge process's initializer: exit when the host is gone (a SIGKILLed host leaves no orphan: the
    pool's own pipes do not tell an idle worker its parent died)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class MergeProcess:
    """One child process that reads and merges the large batches (`prepare_in_child`).

    Why a process: the merge is pure Python (about 64 histogram records per intent, and a decode and an
    encode per rollup key). In a thread it still held the GIL in bursts of a few hundred milliseconds every
    tick, and every relay in flight on the event loop waited behind it (py-spy --gil, docs/performance.md).
    Started on the first large batch (spawning costs about a second of CPU, so small batches, the common
    case in tests and quiet hours, stay in process), kept for the host's life, replaced if it dies."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._pool: ProcessPoolExecutor | None = None

    @property
    def running(self) -> bool:
        return self._pool is not None

    async def prepare(self, round_ms: int, now_ms: int, limit: int) -> PreparedBatch:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),  # never fork a process running threads
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        job = asyncio.get_running_loop().run_in_executor(
            self._pool, prepare_in_child, self.database_url, round_ms, now_ms, limit
        )
        try:
            async with asyncio.timeout(MERGE_TIMEOUT_S):
                return await job
        except (BrokenProcessPool, TimeoutError):
            self.close()  # a dead or stuck child: the next large batch starts a new one
            raise

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()  # a stuck merge never outlives its host
            pool.shutdown(wait=False, cancel_futures=True)


class RollupRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def database_url(self) -> str | None:
        """The URL a merge process can open (none for an in-memory database: it exists in one process)."""
        if not shared_by_url(self.engine):
            return None
        return self.engine.url.render_as_string(hide_password=False)

    async def uncounted(self, up_to: int) -> int:
        return await run_read(self.engine, lambda conn: count_uncounted(conn, up_to))

    async def roll_up(self, round_ms: int, now_ms: int, *, limit: int = BATCH) -> int:
        """Merge one batch in this process (a small one); the number of rows counted."""
        read = await run_read_off_loop(self.engine, lambda conn: read_batch(conn, limit))
        if not read.rows:
            return 0
        return await self.write(await asyncio.to_thread(prepare, read, round_ms, now_ms))

    async def write(self, batch: PreparedBatch) -> int:
        """Store one merged batch in a short write transaction that first checks nothing moved since the
        read (the rollups' write counter where the read saw it, the rows still uncounted), else writes
        nothing and the next tick merges again.

        One counter, not each stored histogram's count: comparing ~1 100 keys' counts held SQLite's write
        lock 21-39 ms every tick, and every relay's commit point waited behind it (docs/performance.md).

        The merge happens before, outside the transaction: on SQLite a merge inside it held the write lock
        for hundreds of milliseconds every tick, and every relay's commit point waited behind it
        (bench/relay.py --rollups: addedMs p99 at 50% load 439 ms with the rollups on, 113 ms off)."""
        if not batch.hashes:
            return 0
        now_ms = int(time.time() * 1000)

        def write(conn: Connection) -> int:
            if _locked_writes(conn, now_ms) != batch.writes:
                raise RollupRaced
            marked = conn.execute(
                update(usage_ledger)
                .where(usage_ledger.c.tx_hash.in_(batch.hashes), usage_ledger.c.rolled_up.is_(False))
                .values(rolled_up=True)
            ).rowcount
            if marked != len(batch.hashes):
                raise RollupRaced
            if batch.rows:
                # One executemany (a statement per key cost more than the merging) of plain tuples, through
                # the driver: SQLAlchemy's per-row parameter processing was most of this write, which holds
                # SQLite's one writer (and every commit point behind it) while it runs.
                conn.exec_driver_sql(_upsert_sql(dialect_insert(conn), conn.dialect), batch.rows)
            _count_write(conn, batch.writes, now_ms)
            return len(batch.hashes)

        try:
            return await run_write(self.engine, write)
        except RollupRaced:
            log.info("latency rollup raced another writer; merged again next tick")
            return 0

    async def purge(self, now_ms: int) -> None:
        def write(conn: Connection) -> None:
            # A merge read before the purge would write back the rows it deletes: it must see them move.
            _count_write(conn, _locked_writes(conn, now_ms), now_ms)
            for granularity, keep in RETENTION_MS.items():
                conn.execute(
                    delete(latency_rollups).where(
                        latency_rollups.c.granularity == granularity,
                        latency_rollups.c.bucket_ms < now_ms - keep,
                    )
                )

        await run_write(self.engine, write)

    async def read(
        self,
        dimension: str,
        *,
        granularity: str,
        from_ms: int,
        to_ms: int,
        key_prefix: str | None = None,
        keys: Sequence[str] | None = None,
        metrics: Sequence[str] = METRICS,
    ) -> list[RollupRow]:
        conditions = [
            latency_rollups.c.dimension == dimension,
            latency_rollups.c.granularity == granularity,
            latency_rollups.c.bucket_ms >= from_ms // GRANULARITIES[granularity] * GRANULARITIES[granularity],
            latency_rollups.c.bucket_ms < to_ms,
            latency_rollups.c.metric.in_(list(metrics)),
        ]
        if key_prefix is not None:
            conditions.append(latency_rollups.c.key.startswith(key_prefix, autoescape=True))
        if keys is not None:
            conditions.append(latency_rollups.c.key.in_(list(keys)))
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(latency_rollups).where(and_(*conditions)))).all()
        return [
            RollupRow(
                r.granularity, int(r.bucket_ms), r.dimension, r.key, r.metric, int(r.count), r.histogram
            )
            for r in rows
        ]


class LatencyRollup:
    """The singleton feeding the rollups (role `latency-rollup`): a batch every `latency_rollup_ms` (5 s: a
    batch costs by the rollup keys it touches, not by its rows), retention hourly. A batch of at least
    `offload_rows` rows starts a child process (`MergeProcess`) that reads and merges it, and every batch
    after it; until then (a quiet host, most tests) small batches are merged in a thread."""

    def __init__(
        self, repo: RollupRepository, round_ms: Any, *, every_ms: int = 5_000, offload_rows: int = 100
    ) -> None:
        self.repo = repo
        self.round_ms = round_ms  # a callable: the network's round duration
        self.every_ms = every_ms
        self.offload_rows = offload_rows
        url = repo.database_url()
        self.merger = MergeProcess(url) if url is not None else None
        self._task: asyncio.Task[None] | None = None
        self._purged_at = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="latency-rollup")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self.merger is not None:
            self.merger.close()

    async def step(self) -> int:
        now = int(time.time() * 1000)
        round_ms = int(self.round_ms())
        # Once the merge process runs (the host has been busy), every batch goes there: a small batch costs
        # nearly as much as a large one (the merge costs by the rollup keys it touches), and in a thread it
        # still took the GIL from the relays in flight (py-spy --gil of a paced run, docs/performance.md).
        if self.merger is not None and (
            self.merger.running or await self.repo.uncounted(self.offload_rows) >= self.offload_rows
        ):
            counted = await self.repo.write(await self.merger.prepare(round_ms, now, BATCH))
        else:
            counted = await self.repo.roll_up(round_ms, now)
        if now - self._purged_at > HOUR_MS:
            await self.repo.purge(now)
            self._purged_at = now
        return counted

    async def _loop(self) -> None:
        while True:
            try:
                while await self.step() >= BATCH:
                    pass  # a backlog: the next batch at once
            except Exception as exc:  # the next tick retries; nothing was marked
                log.warning("latency rollup failed", error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)
