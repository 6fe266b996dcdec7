"""Async engines for SQLite (embedded default) and PostgreSQL, plus readiness ping and upsert helper."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, event, exc, literal_column, text
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry
from sqlalchemy.util import queue as sqla_queue
from sqlalchemy.util.concurrency import in_greenlet

SQLITE_BUSY_TIMEOUT_MS = 5_000
# A pooled PostgreSQL connection back in use within this many seconds of its return is handed out without
# a ping (HikariCP's alive-bypass window, 500 ms, is the precedent). Under load every connection is back
# within milliseconds, and a ping at every checkout was a quarter of the service's round trips to
# PostgreSQL (docs/performance.md, PostgreSQL). One idle for longer, as after a server restart in a quiet
# hour, is pinged first and, when dead, replaced along with every connection older than it.
PING_AFTER_IDLE_S = 0.5
_RETURNED_AT = "gasless_returned_at"
# A pooled PostgreSQL connection nobody took for this long is closed (HikariCP's idleTimeout; 10 min there):
# the pool then holds what the last minute's load needed, not the high-water mark of its slowest spell
# (docs/performance.md, the soak). One burst a minute at the same depth keeps its connections.
CLOSE_IDLE_AFTER_S = 60.0
_IDLE_SINCE = "gasless_idle_since"
# Execution options read by the SQLite "begin" listener (ignored on PostgreSQL).
BEGIN_MODE_OPTION = "gasless_sqlite_begin"
PRE_BEGIN_OPTION = "gasless_sqlite_pre_begin"

Bind = AsyncEngine | AsyncConnection | Engine | Connection
T = TypeVar("T")


def create_engine(
    url: str,
    *,
    connect_timeout: float = 10.0,
    echo: bool = False,
    ping_after_idle_s: float = PING_AFTER_IDLE_S,
    close_idle_after_s: float = CLOSE_IDLE_AFTER_S,
) -> AsyncEngine:
    """An AsyncEngine for `sqlite+aiosqlite://` or `postgresql+asyncpg://` URLs. A PostgreSQL connection
    idle in the pool for more than `ping_after_idle_s` seconds is pinged before it is handed out, and one
    idle for more than `close_idle_after_s` seconds is closed."""
    parsed = make_url(url)
    if parsed.drivername == "sqlite+aiosqlite":
        return _create_sqlite_engine(url, connect_timeout=connect_timeout, echo=echo)
    if parsed.drivername == "postgresql+asyncpg":
        # Connections are in autocommit unless a transaction is asked for (`transactional`: every write
        # path does). A read then costs its statement alone, not BEGIN, the statement and the ROLLBACK on
        # return: three statements on the server and three round trips for one (docs/performance.md,
        # PostgreSQL). Under READ COMMITTED each statement of a transaction takes its own snapshot anyway,
        # so a read of several statements sees nothing different outside one.
        engine = create_async_engine(
            url,
            echo=echo,
            isolation_level="AUTOCOMMIT",
            # A connection is kept at its return: an overflow connection was closed there and opened again
            # at the next burst (a new backend and TLS handshake every few relays; with 20 kept and 10 of
            # overflow, 60-100 sessions in a 1 536-relay run against 40 now). Last in, first out: a burst
            # opens what it needs and a quiet spell leaves the rest idle at the bottom, instead of
            # rotating through all of them, and those idle past `close_idle_after_s` are closed. The cap
            # stays 30 a host: two hosts stay below PostgreSQL's default 100 connections
            # (docs/performance.md, PostgreSQL).
            poolclass=IdleClosingQueuePool,
            pool_size=30,
            max_overflow=0,
            pool_use_lifo=True,
            pool_timeout=30,
            pool_recycle=1_800,
            connect_args={"timeout": connect_timeout},
        )
        pool = engine.sync_engine.pool
        assert isinstance(pool, IdleClosingQueuePool)
        pool.close_idle_after_s = close_idle_after_s
        _ping_after_idle(engine.sync_engine, ping_after_idle_s)
        return engine
    raise ValueError(
        f"unsupported database URL scheme {parsed.drivername!r}: use sqlite+aiosqlite or postgresql+asyncpg"
    )


async def autovacuum_off(engine: AsyncEngine) -> bool:
    """True on a PostgreSQL server whose autovacuum is off (SQLite has none to turn off)."""
    if engine.dialect.name != "postgresql":
        return False
    async with engine.connect() as conn:
        return str((await conn.exec_driver_sql("SHOW autovacuum")).scalar()) != "on"


class IdleClosingQueuePool(AsyncAdaptedQueuePool):
    """SQLAlchemy's asyncio queue pool, closing the connections nobody took for `close_idle_after_s`
    seconds. The pool has no idle timeout of its own: every connection a slow spell opened stayed open to
    the end (the soak's backends rose in steps at slow spells and never came down). The check runs at a
    connection's return, at most four times a window: the idle ones are taken out of the queue before
    they are closed, so no checkout can be handed one that is closing."""

    close_idle_after_s = CLOSE_IDLE_AFTER_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checked_idle_at = time.monotonic()

    def recreate(self) -> IdleClosingQueuePool:
        pool = super().recreate()
        assert isinstance(pool, IdleClosingQueuePool)
        pool.close_idle_after_s = self.close_idle_after_s
        return pool

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()
        super()._do_return_conn(record)
        now = time.monotonic()
        # Closing awaits the server, which needs the greenlet SQLAlchemy runs a checkin in; a connection
        # returned from elsewhere (the garbage collector's finalizer) leaves the check to the next return.
        if now - self._checked_idle_at >= self.close_idle_after_s / 4 and in_greenlet():
            self._checked_idle_at = now
            self._close_idle(now - self.close_idle_after_s)

    def _close_idle(self, idle_since: float) -> None:
        taken: list[ConnectionPoolEntry] = []
        with contextlib.suppress(sqla_queue.Empty):
            while True:
                taken.append(self._pool.get(False))  # the latest returned first
        kept = [record for record in taken if record.info.get(_IDLE_SINCE, idle_since) >= idle_since]
        for record in reversed(kept):  # back in their order: the latest returned on top
            self._pool.put(record, False)
        for record in taken:
            if record.info.get(_IDLE_SINCE, idle_since) < idle_since:
                try:
                    record.close()
                finally:
                    self._dec_overflow()  # its place is free: a burst may open a new one


def _ping_after_idle(engine: Engine, idle_s: float) -> None:
    """The pool's pre-ping, skipped for a connection returned less than `idle_s` seconds ago. A dead one
    found at checkout invalidates the pool as SQLAlchemy's own pre-ping does: every connection older than it
    is replaced at its next checkout, and this checkout gets a new one. A connection that died while hot
    fails its statement instead, which invalidates the pool the same way (SQLAlchemy's disconnect handling)."""
    dialect = engine.dialect

    def returned_now(_dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get(_RETURNED_AT, -idle_s - 1) <= idle_s:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                raise exc.InvalidatePoolError() from error
            raise

    event.listen(engine, "connect", returned_now)  # a new connection needs no ping
    event.listen(engine, "checkin", returned_now)
    event.listen(engine, "checkout", ping_if_idle)


def _create_sqlite_engine(url: str, *, connect_timeout: float, echo: bool) -> AsyncEngine:
    database = make_url(url).database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, echo=echo, connect_args={"timeout": connect_timeout})
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # sqlite3's legacy mode skips BEGIN for SELECT and DDL; SQLAlchemy emits BEGIN itself instead
    # (see _sqlite_on_begin) so transactions, including DDL in migrations, are real.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching to WAL needs a lock another connection may hold.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL is persistent: switch only a database not in it yet (the switch waits for a writer that may
        # hold the lock for a whole migration, longer than busy_timeout).
        cursor.execute("PRAGMA journal_mode")
        if str(cursor.fetchone()[0]).lower() != "wal":
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    options = conn.get_execution_options()
    if options.get("isolation_level") == "AUTOCOMMIT":
        return
    mode = options.get(BEGIN_MODE_OPTION, "DEFERRED")
    if mode not in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
        raise ValueError(f"invalid SQLite begin mode {mode!r}")
    # Straight on the driver's cursor: every transaction, read or write, begins here, and a BEGIN through
    # `exec_driver_sql` (an execution context, its events, a result) cost a third of an empty write
    # transaction (docs/performance.md).
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for statement in options.get(PRE_BEGIN_OPTION, ()):
            cursor.execute(statement)
        cursor.execute(f"BEGIN {mode}")
    finally:
        cursor.close()


@dataclass
class _WriterGate:
    """Who may write a SQLite file of this process, and when. SQLite has one writer; the writers of this
    process queue here instead of in SQLite's busy handler, whose back-off sleeps (up to 100 ms per try)
    would dominate latency under load (busy_timeout still arbitrates between processes).

    Units of work for the writer thread (`run_write`) go straight into its queue: the thread runs them one
    after another, in the order they were handed over, with no trip through the event loop between two of
    them (under load that trip, waiting behind every ready task of the loop, left the writer idle for a
    third of a slow commit point's wait; docs/performance.md). A transaction on an async connection
    (`begin_write`) takes `exclusive`, then waits until the writer thread has nothing left; units of work
    arriving meanwhile wait behind it."""

    exclusive: asyncio.Lock
    idle: asyncio.Event  # set while no unit of work is queued for or running on the writer thread
    queued: int = 0


_writer_gates: weakref.WeakKeyDictionary[Any, _WriterGate] = weakref.WeakKeyDictionary()


def _writer_gate(engine: AsyncEngine) -> _WriterGate:
    gate = _writer_gates.get(engine.sync_engine)
    if gate is None:
        gate = _writer_gates[engine.sync_engine] = _WriterGate(asyncio.Lock(), asyncio.Event())
        gate.idle.set()
    return gate


async def transactional(conn: AsyncConnection) -> AsyncConnection:
    """`conn`, whose `begin()` starts a real transaction: a PostgreSQL connection leaves the engine's
    autocommit for READ COMMITTED until it goes back to the pool (no round trip: asyncpg's BEGIN carries
    the level). SQLite connections are transactional already."""
    if conn.dialect.name == "postgresql":
        return await conn.execution_options(isolation_level="READ COMMITTED")
    return conn


@asynccontextmanager
async def begin_write(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction meant to write: on SQLite it takes the write lock up front (BEGIN IMMEDIATE)."""
    if engine.dialect.name != "sqlite":
        async with engine.connect() as conn:
            conn = await transactional(conn)
            async with conn.begin():
                yield conn
        return
    gate = _writer_gate(engine)
    async with gate.exclusive:
        await gate.idle.wait()
        async with engine.connect() as conn:
            # A deferred transaction that reads then writes can fail with SQLITE_BUSY without waiting;
            # IMMEDIATE queues writers behind busy_timeout instead.
            conn = await conn.execution_options(**{BEGIN_MODE_OPTION: "IMMEDIATE"})
            async with conn.begin():
                yield conn


# One hop per unit of work ------------------------------------------------------------------------------
# Through aiosqlite every statement costs four round trips between the event loop and the connection's
# thread (cursor, execute, fetch, close), plus BEGIN and the rollback on return; under load each round trip
# waits behind every ready task of the loop, so a write transaction held SQLite's lock for ~10 ms of mostly
# waiting. The hot path's units of work are therefore written as plain functions of a sync Connection and
# run whole: on SQLite writes in one hop to a writer thread and reads inline on the loop, on PostgreSQL
# through `AsyncConnection.run_sync` (asyncpg is truly asynchronous; nothing to gain from a thread).


@dataclass
class _SqliteThreads:
    """The sync engine of a SQLite file, its writer thread, and the two connections the hot path keeps: the
    writer thread's and the loop thread's. A connection checked out of the pool and returned for every unit
    of work cost about 35 us of Python each time (a Connection, the pool's events, its reset), a third of
    the relay's read of the sender's rows (docs/performance.md)."""

    engine: Engine
    writer: ThreadPoolExecutor
    _write_conn: Connection | None = None  # used only on the writer thread
    _read_conn: Connection | None = None  # used only on `_read_thread`, the first to read inline
    _read_thread: int | None = None

    def write(self, work: Callable[[Connection], T]) -> T:
        """`work(conn)` in one write transaction (BEGIN IMMEDIATE); runs on the writer thread."""
        if self._write_conn is None:
            self._write_conn = self.engine.connect()
            self._write_conn.execution_options(**{BEGIN_MODE_OPTION: "IMMEDIATE"})
        conn = self._write_conn
        try:
            with conn.begin():
                return work(conn)
        finally:
            if conn.invalidated:
                self._write_conn = None
                _close_quietly(conn)

    def read_inline(self, work: Callable[[Connection], T]) -> T:
        """`work(conn)` on the loop thread's kept connection (another thread reads on a pooled one); the
        read transaction ends before this returns."""
        thread = threading.get_ident()
        if self._read_thread is None:
            self._read_thread = thread
        elif self._read_thread != thread:
            return _sync_read(self.engine, work)
        if self._read_conn is None:
            self._read_conn = self.engine.connect()
        conn = self._read_conn
        try:
            return work(conn)
        finally:
            # Never left open between reads: an open read transaction would keep reading an old snapshot
            # and hold back WAL checkpoints.
            try:
                conn.rollback()
            finally:
                if conn.invalidated:
                    self._read_conn = None
                    _close_quietly(conn)

    def close(self) -> None:
        # The writer's connection is closed on the writer thread, after a write still under way.
        self.writer.submit(self._close_write_conn)
        self.writer.shutdown(wait=False)
        if self._read_conn is not None:
            _close_quietly(self._read_conn)
            self._read_conn = None
        self.engine.dispose()

    def _close_write_conn(self) -> None:
        if self._write_conn is not None:
            _close_quietly(self._write_conn)
            self._write_conn = None


def _close_quietly(conn: Connection) -> None:
    with contextlib.suppress(Exception):
        conn.close()


_sqlite_threads: weakref.WeakKeyDictionary[Any, _SqliteThreads] = weakref.WeakKeyDictionary()


def _threads(engine: AsyncEngine) -> _SqliteThreads:
    side = _sqlite_threads.get(engine.sync_engine)
    if side is None:
        url = engine.url.set(drivername="sqlite+pysqlite")
        sync = create_sync_engine(
            url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            pool_size=2,  # the writer thread's connection and the loop's read connection
            max_overflow=2,
        )
        event.listen(sync, "connect", _sqlite_on_connect)
        event.listen(sync, "begin", _sqlite_on_begin)
        side = _SqliteThreads(
            engine=sync,
            writer=ThreadPoolExecutor(1, thread_name_prefix="gasless-sqlite-writer"),
        )
        _sqlite_threads[engine.sync_engine] = side
        # Disposing the async engine (shutdown, tests) releases the threads and their connections too.
        event.listen(engine.sync_engine, "engine_disposed", lambda _engine: _close_threads(_engine))
    return side


def _close_threads(sync_engine: Any) -> None:
    side = _sqlite_threads.pop(sync_engine, None)
    if side is not None:
        side.close()


def _sync_read(engine: Engine, work: Callable[[Connection], T]) -> T:
    with engine.connect() as conn:
        return work(conn)


def _threaded(engine: AsyncEngine) -> bool:
    # An in-memory database exists once per connection: a second engine would not see it.
    database = engine.url.database or ""
    return engine.dialect.name == "sqlite" and database not in ("", ":memory:") and "memory" not in database


def shared_by_url(engine: AsyncEngine) -> bool:
    """True when another process can open this database by its URL (not an in-memory SQLite)."""
    return engine.dialect.name != "sqlite" or _threaded(engine)


async def run_write(engine: AsyncEngine, work: Callable[[Connection], T]) -> T:
    """`work(conn)` in one write transaction, committed when it returns (rolled back if it raises)."""
    if not _threaded(engine):
        if engine.dialect.name == "sqlite":
            async with begin_write(engine) as conn:
                return await conn.run_sync(work)
        async with engine.connect() as conn:
            conn = await transactional(conn)
            async with conn.begin():
                return await conn.run_sync(work)
    side = _threads(engine)
    gate = _writer_gate(engine)
    if gate.exclusive.locked():
        async with gate.exclusive:  # behind a transaction on an async connection, held or waiting
            pass
    gate.queued += 1
    gate.idle.clear()
    try:
        job = asyncio.get_running_loop().run_in_executor(side.writer, partial(side.write, work))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            # Counted until the transaction is over, so an async connection's writer never meets SQLITE_BUSY.
            await asyncio.wait([job])
            raise
    finally:
        gate.queued -= 1
        if gate.queued == 0:
            gate.idle.set()


async def run_read(engine: AsyncEngine, work: Callable[[Connection], T]) -> T:
    """`work(conn)` on a read connection (it must fetch what it needs before returning)."""
    if not _threaded(engine):
        async with engine.connect() as conn:
            return await conn.run_sync(work)
    # Inline on the loop: a WAL read never waits for a lock and takes a fraction of a millisecond, less
    # than handing it to a thread and back (measured: bench/relay.py, docs/performance.md).
    return _threads(engine).read_inline(work)


async def run_read_off_loop(engine: AsyncEngine, work: Callable[[Connection], T]) -> T:
    """`work(conn)` on a read connection in a worker thread where the engine allows it (a SQLite file), so
    a large read and what `work` computes from it do not stall the loop; elsewhere as `run_read`. For
    background jobs: the hot path's small reads are cheaper inline (`run_read`)."""
    if not _threaded(engine):
        return await run_read(engine, work)
    return await asyncio.to_thread(_sync_read, _threads(engine).engine, work)


async def ping(engine: AsyncEngine, timeout: float = 2.0) -> bool:
    """True when the database answers `SELECT 1` within `timeout` seconds; never raises."""
    try:
        async with asyncio.timeout(timeout):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


def dialect_insert(bind: Bind) -> Callable[..., postgresql.Insert | sqlite.Insert]:
    """The dialect's `insert` (with ON CONFLICT support) for this engine or connection."""
    name = bind.dialect.name
    if name == "postgresql":
        return postgresql.insert
    if name == "sqlite":
        return sqlite.insert
    raise ValueError(f"no ON CONFLICT insert for dialect {name!r}")


def in_constants(column: ColumnElement[Any], values: tuple[str, ...]) -> ColumnElement[bool]:
    """`column IN ('a', 'b')` with the constants written into the SQL once. A plain `in_()` of a tuple is
    an "expanding" parameter that SQLAlchemy renders again on every execution: on the relay path's read of
    the sender's rows that rendering cost more than running the query (py-spy, docs/performance.md)."""
    for value in values:
        if not value.replace("_", "").isalnum():  # fixed state names only: nothing here is ever quoted
            raise ValueError(f"not a constant name: {value!r}")
    return column.in_([literal_column(f"'{value}'") for value in values])


def padded_to_power_of_two(items: list[T]) -> list[T]:
    """`items` (not empty) lengthened to the next power of two by repeating the last one, so a statement
    with one parameter per item is built and compiled once per size (1, 2, 4, ...) instead of once per
    length. Meant for statements where a repeated item changes nothing (`pk IN (a, b, b)`)."""
    size = 1 << (len(items) - 1).bit_length()
    return [*items, *[items[-1]] * (size - len(items))]
