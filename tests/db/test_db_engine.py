"""Engines: SQLite connection settings, transactions, readiness ping, dialect upserts."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_mock_engine, event, inspect, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import begin_write, create_engine, dialect_insert, ping, service_meta
from gasless.db.engine import _writer_gate, run_read, run_write, transactional
from gasless.db.migrate import upgrade


async def test_sqlite_engine_creates_directory_and_sets_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "deeper" / "gasless.db"
    engine = create_engine(f"sqlite+aiosqlite:///{path.as_posix()}")
    try:
        async with engine.connect() as conn:
            pragmas = {
                name: (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar_one()
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
    finally:
        await engine.dispose()
    assert path.is_file()
    # synchronous: 1 is NORMAL.
    assert pragmas == {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1, "busy_timeout": 5000}


async def test_rolled_back_transaction_undoes_ddl_and_writes(db_engine: AsyncEngine) -> None:
    async with db_engine.begin() as conn:
        await conn.execute(text("CREATE TABLE kept (x INTEGER)"))
    async with db_engine.connect() as conn:
        conn = await transactional(conn)
        await conn.execute(text("INSERT INTO kept (x) VALUES (1)"))
        await conn.execute(text("CREATE TABLE dropped (x INTEGER)"))
        await conn.rollback()
    async with db_engine.connect() as conn:
        names = await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
        count = (await conn.execute(text("SELECT count(*) FROM kept"))).scalar_one()
    assert names == {"kept"}
    assert count == 0


@pytest.mark.postgres
async def test_postgresql_reads_run_alone_and_writes_in_one_transaction(postgres_url: str) -> None:
    """A read's statement is its own transaction (no BEGIN before it, no ROLLBACK after); every write path
    (`begin_write`, `run_write`, and `transactional`) is one transaction, its statements committed or
    rolled back together. Two statements of one transaction share its id; two taken alone have two."""
    engine = create_engine(postgres_url)
    xid = text("SELECT pg_current_xact_id()::text")
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(xid)).scalar_one() != (await conn.execute(xid)).scalar_one()
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        async with begin_write(engine) as conn:
            assert (await conn.execute(xid)).scalar_one() == (await conn.execute(xid)).scalar_one()

        def one_id(sync: Connection) -> bool:
            return bool(sync.execute(xid).scalar_one() == sync.execute(xid).scalar_one())

        assert await run_write(engine, one_id) is True
        assert await run_read(engine, one_id) is False

        def half_then_fail(sync: Connection) -> None:
            sync.execute(text("INSERT INTO t (x) VALUES (1)"))
            raise RuntimeError("after the first statement")

        with pytest.raises(RuntimeError):
            await run_write(engine, half_then_fail)
        with pytest.raises(RuntimeError):
            async with begin_write(engine) as conn:
                await conn.execute(text("INSERT INTO t (x) VALUES (2)"))
                raise RuntimeError("after the first statement")
        async with engine.connect() as conn:  # back from the pool in autocommit again
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar_one() == 0
            assert (await conn.execute(xid)).scalar_one() != (await conn.execute(xid)).scalar_one()
    finally:
        await engine.dispose()


def connections_opened(engine: AsyncEngine) -> Callable[[], int]:
    """How many connections the engine's pool has opened so far."""
    opened = 0

    def count(*_: object) -> None:
        nonlocal opened
        opened += 1

    event.listen(engine.sync_engine, "connect", count)
    return lambda: opened


async def burst(engine: AsyncEngine, size: int) -> None:
    """`size` connections checked out at once, each running a statement."""
    everyone_in = asyncio.Barrier(size)

    async def hold() -> None:
        async with engine.connect() as conn:
            await everyone_in.wait()  # all of them checked out at once
            await conn.execute(text("SELECT 1"))

    await asyncio.gather(*(hold() for _ in range(size)))


async def backend_pid(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


@pytest.mark.postgres
async def test_postgresql_pool_keeps_every_connection_and_reuses_the_latest(postgres_url: str) -> None:
    """Thirty requests at once, twice: the second burst reuses the first burst's connections. Connections
    beyond the kept ones (a pool of 10, later 20 plus 10 of overflow) were closed at every return and opened
    again at the next burst: under load a new backend (and TLS handshake) every few relays, which doubled
    the CPU per relay on PostgreSQL (docs/performance.md, PostgreSQL). Then one
    request at a time: each takes the connection returned last, so a quiet spell leaves the others idle
    instead of rotating through all of them."""
    engine = create_engine(postgres_url)
    opened = connections_opened(engine)
    try:
        await burst(engine, 30)
        await burst(engine, 30)
        one_at_a_time = [await backend_pid(engine) for _ in range(5)]
    finally:
        await engine.dispose()
    assert opened() == 30
    assert len(set(one_at_a_time)) == 1


@pytest.mark.postgres
async def test_postgresql_pool_closes_connections_idle_past_the_timeout(postgres_url: str) -> None:
    """A burst opens ten connections; then one request at a time: the one it keeps using stays open and
    the nine left idle are closed on the server, so the pool's backends follow the load instead of its
    slowest spell's high-water mark (the soak's backends rose in steps and stayed). A new burst opens
    connections again."""
    engine = create_engine(postgres_url, close_idle_after_s=0.4)
    admin = create_engine(postgres_url)
    opened = connections_opened(engine)
    backends = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )

    try:
        await burst(engine, 10)
        async with admin.connect() as conn:
            assert (await conn.execute(backends)).scalar_one() == 10
        used: set[int] = set()
        deadline = time.monotonic() + 30
        while True:  # the condition waited for: nine backends gone
            used.add(await backend_pid(engine))
            async with admin.connect() as conn:
                left = (await conn.execute(backends)).scalar_one()
            if left == 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)  # one request at a time, as a quiet service makes them
        assert left == 1
        assert len(used) == 1  # the connection in use was never the one closed
        assert opened() == 10
        await burst(engine, 10)
        assert opened() == 19
        assert engine.sync_engine.pool.checkedin() == 10
    finally:
        await engine.dispose()
        await admin.dispose()


@pytest.mark.postgres
async def test_postgresql_pings_only_connections_idle_past_the_window(postgres_url: str) -> None:
    """A connection back in use within the window goes out without a ping: its backend's last statement is
    still the one it ran. Past the window it is pinged first; and a connection killed while idle in the
    pool is found dead by that ping and replaced, so the request that takes it succeeds. With no ping (a
    window nothing is idle past), the request that takes the dead connection fails, and that failure
    invalidates the pool: the next request succeeds."""
    backend = text("SELECT pg_backend_pid()")
    admin = create_engine(postgres_url)

    async def last_statement(pid: int) -> str:
        async with admin.connect() as conn:
            query = text("SELECT query FROM pg_stat_activity WHERE pid = :pid")
            return str((await conn.execute(query, {"pid": pid})).scalar_one())

    async def kill(pid: int) -> None:
        async with admin.connect() as conn:
            assert (await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})).scalar_one()
            gone = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            while (await conn.execute(gone, {"pid": pid})).scalar_one():
                await asyncio.sleep(0.01)  # the condition waited for: the backend has exited

    hot = create_engine(postgres_url, ping_after_idle_s=3600)
    always = create_engine(postgres_url, ping_after_idle_s=0)
    try:
        for engine, pinged in ((hot, False), (always, True)):
            async with engine.connect() as conn:
                pid = (await conn.execute(backend)).scalar_one()
            async with engine.connect() as conn:  # the same pooled connection, checked out again
                assert (await last_statement(pid) == ";") is pinged
                assert (await conn.execute(backend)).scalar_one() == pid
        # Killed while idle in the pool.
        killed = {}
        for engine in (hot, always):
            async with engine.connect() as conn:
                killed[engine] = (await conn.execute(backend)).scalar_one()
            await kill(killed[engine])
        async with always.connect() as conn:  # the ping found it dead: a new connection
            assert (await conn.execute(backend)).scalar_one() != killed[always]
        with pytest.raises(DBAPIError) as failed:
            async with hot.connect() as conn:
                await conn.execute(backend)
        assert failed.value.connection_invalidated
        async with hot.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        for engine in (hot, always, admin):
            await engine.dispose()


@pytest.mark.parametrize(
    "url", ["sqlite:///x.db", "mysql+aiomysql://u@h/db", "postgresql://postgres@127.0.0.1/x"]
)
def test_create_engine_refuses_other_drivers(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported database URL"):
        create_engine(url)


async def test_ping_is_true_for_a_live_database(db_engine: AsyncEngine) -> None:
    assert await ping(db_engine) is True


async def test_ping_is_false_when_nothing_listens() -> None:
    engine = create_engine("postgresql+asyncpg://postgres@127.0.0.1:1/x", connect_timeout=1.0)
    started = time.monotonic()
    try:
        assert await ping(engine, timeout=2.0) is False
    finally:
        await engine.dispose()
    assert time.monotonic() - started < 3.0


async def test_ping_is_false_when_the_server_never_answers() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = create_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/x", connect_timeout=30.0)
    started = time.monotonic()
    try:
        assert await ping(engine, timeout=0.5) is False
        elapsed = time.monotonic() - started
    finally:
        await engine.dispose()
        server.close()
    assert 0.4 <= elapsed < 3.0


async def test_dialect_insert_upserts_on_conflict(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)

    async def put(value: dict[str, object], at_ms: int) -> None:
        async with db_engine.begin() as conn:
            insert = dialect_insert(conn)
            stmt = insert(service_meta).values(key="genesis", value=value, updated_at_ms=at_ms)
            stmt = stmt.on_conflict_do_update(
                index_elements=[service_meta.c.key],
                set_={"value": stmt.excluded.value, "updated_at_ms": stmt.excluded.updated_at_ms},
            )
            await conn.execute(stmt)

    await put({"round": 1}, 1_000)
    await put({"round": 2}, 2_000)
    async with db_engine.connect() as conn:
        rows = (await conn.execute(select(service_meta))).all()
    assert [tuple(row) for row in rows] == [("genesis", {"round": 2}, 2_000)]


def test_dialect_insert_picks_the_dialect() -> None:
    assert dialect_insert(create_engine("sqlite+aiosqlite:///:memory:")) is sqlite.insert
    assert dialect_insert(create_engine("postgresql+asyncpg://postgres@127.0.0.1:1/x")) is postgresql.insert
    with pytest.raises(ValueError, match="no ON CONFLICT insert"):
        mysql = create_mock_engine("mysql://", executor=lambda *a, **k: None)
        dialect_insert(mysql)  # type: ignore[arg-type]


async def test_sqlite_writers_queue_behind_begin_write(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE counter (n INTEGER NOT NULL)"))
            await conn.execute(text("INSERT INTO counter (n) VALUES (0)"))

        async def increment(hold_s: float) -> None:
            async with begin_write(engine) as conn:
                n = (await conn.execute(text("SELECT n FROM counter"))).scalar_one()
                await asyncio.sleep(hold_s)
                await conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})

        first = asyncio.create_task(increment(0.3))
        await asyncio.sleep(0.05)
        # The read-modify-write of the second writer must wait for the first to commit, not lose its update.
        await asyncio.gather(first, increment(0.0))
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT n FROM counter"))).scalar_one() == 2
    finally:
        await engine.dispose()


async def test_a_begin_write_transaction_never_overlaps_units_of_work_of_the_writer_thread(
    sqlite_url: str,
) -> None:
    """A transaction on an async connection (`begin_write`) waits until the writer thread's queued units of
    work are done, and units of work handed over while it waits go after it: SQLite never sees two writers
    of this process at once (the loser would sleep in SQLite's busy handler)."""
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE log (what TEXT NOT NULL)"))
        order: list[str] = []
        release = threading.Event()

        def held(conn: Connection) -> None:
            order.append("held starts")
            assert release.wait(10)
            conn.execute(text("INSERT INTO log VALUES ('held')"))
            order.append("held ends")

        def after(conn: Connection) -> None:
            conn.execute(text("INSERT INTO log VALUES ('after')"))
            order.append("after")

        async def exclusive() -> None:
            async with begin_write(engine) as conn:
                order.append("exclusive starts")
                await conn.execute(text("INSERT INTO log VALUES ('exclusive')"))
                order.append("exclusive ends")

        first = asyncio.create_task(run_write(engine, held))
        while not order:  # the writer thread runs `held`
            await asyncio.sleep(0)
        second = asyncio.create_task(exclusive())
        while not _writer_gate(engine).exclusive.locked():
            await asyncio.sleep(0)
        third = asyncio.create_task(run_write(engine, after))
        for _ in range(20):  # the async writer waits for `held`; `after` waits behind it
            await asyncio.sleep(0)
        assert order == ["held starts"]
        # It waits here, not in SQLite's busy handler: it has not even taken a connection yet.
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        release.set()
        await asyncio.gather(first, second, third)
        assert order == ["held starts", "held ends", "exclusive starts", "exclusive ends", "after"]
    finally:
        await engine.dispose()


async def test_units_of_work_run_one_after_another_without_the_event_loop(sqlite_url: str) -> None:
    """Units of work handed to the writer thread run back to back: the second starts when the first ends,
    even while the event loop is busy (here: blocked) and could not hand it over."""
    engine = create_engine(sqlite_url)
    try:
        await run_write(engine, lambda conn: conn.execute(text("CREATE TABLE log (what TEXT NOT NULL)")))
        release, second_ran = threading.Event(), threading.Event()

        def first(conn: Connection) -> None:
            assert release.wait(10)
            conn.execute(text("INSERT INTO log VALUES ('first')"))

        def second(conn: Connection) -> None:
            conn.execute(text("INSERT INTO log VALUES ('second')"))
            second_ran.set()

        jobs = [asyncio.create_task(run_write(engine, first)), asyncio.create_task(run_write(engine, second))]
        for _ in range(5):
            await asyncio.sleep(0)  # both handed over
        release.set()
        # The loop thread blocks here: nothing on the loop can run until `second` has run on its own.
        assert second_ran.wait(10), "the second unit of work waited for the event loop"
        await asyncio.gather(*jobs)
    finally:
        await engine.dispose()


async def test_units_of_work_on_kept_connections_see_every_commit_and_survive_failures(
    db_engine: AsyncEngine,
) -> None:
    """The hot path's reads and writes (`run_read`, `run_write`) keep their connections between units of
    work (a SQLite file): a read never keeps a snapshot (it sees a commit made meanwhile through another
    connection), and a unit that raises is rolled back and leaves the next one working."""
    async with db_engine.begin() as conn:
        await conn.execute(text("CREATE TABLE counter (n INTEGER NOT NULL)"))
        await conn.execute(text("INSERT INTO counter (n) VALUES (0)"))

    def read(conn: Connection) -> int:
        return int(conn.execute(text("SELECT n FROM counter")).scalar_one())

    def increment(conn: Connection) -> None:
        conn.execute(text("UPDATE counter SET n = n + 1"))

    def increment_then_fail(conn: Connection) -> None:
        increment(conn)
        raise RuntimeError("after the update")

    def fail_reading(conn: Connection) -> None:
        conn.execute(text("SELECT n FROM no_such_table"))

    other = create_engine(db_engine.url.render_as_string(hide_password=False))
    try:
        assert await run_read(db_engine, read) == 0
        async with other.begin() as conn:  # another connection (another host, a CLI) commits
            await conn.execute(text("UPDATE counter SET n = 5"))
        assert await run_read(db_engine, read) == 5
        with pytest.raises(Exception, match="no_such_table"):
            await run_read(db_engine, fail_reading)
        async with other.begin() as conn:
            await conn.execute(text("UPDATE counter SET n = 6"))
        assert await run_read(db_engine, read) == 6
        with pytest.raises(RuntimeError):
            await run_write(db_engine, increment_then_fail)
        assert await run_read(db_engine, read) == 6
        await run_write(db_engine, increment)
        async with other.connect() as conn:
            assert (await conn.execute(text("SELECT n FROM counter"))).scalar_one() == 7
    finally:
        await other.dispose()
