"""Singleton workers on PostgreSQL advisory locks: one holder, instant stop on loss, takeover, presence."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gasless.db.leader import LOCK_NAMESPACE, SingletonRunner, asyncpg_dsn, lock_key


class FakeWorker:
    def __init__(self) -> None:
        self.running = False
        self.starts = 0

    async def start(self) -> None:
        self.running = True
        self.starts += 1

    async def stop(self) -> None:
        self.running = False


async def until(predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def runner(url: str, host_id: str, worker: FakeWorker, **kwargs: object) -> SingletonRunner:
    r = SingletonRunner(url, host_id=host_id, scope="test:localnet", retry_ms=200, check_ms=100, **kwargs)  # type: ignore[arg-type]
    r.add("retention", worker)
    return r


@pytest.fixture
def other_database_url(postgres_server_url: str) -> Iterator[str]:
    """A second database on the same server: another deployment sharing the PostgreSQL server."""
    name = f"gasless_other_{uuid.uuid4().hex[:12]}"
    asyncio.run(_exec(postgres_server_url, f'CREATE DATABASE "{name}"'))
    try:
        yield f"{postgres_server_url.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_exec(postgres_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _exec(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_one_holder_then_takeover_when_the_holder_session_ends(
    postgres_url: str, other_database_url: str
) -> None:
    import asyncpg

    # Another deployment on the same server holds the very same advisory key in its own database, from
    # before this test's hosts start: the test must neither find nor terminate its backend.
    scope = "test:localnet"
    other = await asyncpg.connect(asyncpg_dsn(other_database_url))
    await other.execute("SELECT pg_advisory_lock($1, $2)", LOCK_NAMESPACE, lock_key(f"{scope}:retention"))
    other_pid = await other.fetchval("SELECT pg_backend_pid()")

    changes: list[tuple[str, str, bool]] = []
    wa, wb = FakeWorker(), FakeWorker()
    a = runner(postgres_url, "a", wa, on_change=lambda role, leads: changes.append(("a", role, leads)))
    b = runner(postgres_url, "b", wb)
    await a.start()
    await until(lambda: a.leads("retention"))  # advisory locks are per database: the other one is no rival
    await b.start()
    await until(lambda: b.leads("host:b"))  # b is connected and holds its presence lock
    assert a.leadership() == {"retention": True} and b.leadership() == {"retention": False}
    assert wa.running and not wb.running
    assert await b.present(["a", "b", "c"]) == {"a", "b"}
    assert changes == [("a", "retention", True)]

    # The holder's session ends (the server kills it, as when the host dies): its worker stops at once,
    # before any reconnection, and b takes the role over. The holder is looked up in this test's own
    # database only.
    admin = await asyncpg.connect(asyncpg_dsn(postgres_url))
    try:
        holders = await admin.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2",
            LOCK_NAMESPACE,
            lock_key(f"{scope}:retention"),
        )
        assert len(holders) == 1 and holders[0]["pid"] != other_pid
        await admin.execute("SELECT pg_terminate_backend($1)", holders[0]["pid"])
    finally:
        await admin.close()
    await until(lambda: not wa.running)
    assert changes[-1] == ("a", "retention", False)
    await until(lambda: wb.running)
    assert b.leads("retention") and wb.starts == 1
    # a reconnects and stands by; both are present again.
    await until(lambda: a.leads("host:a"))
    assert not a.leads("retention") and not wa.running
    assert await a.present(["a", "b"]) == {"a", "b"}

    await b.stop()
    assert not wb.running
    await until(lambda: a.leads("retention"))
    assert wa.running and await a.present(["a", "b"]) == {"a"}
    await a.stop()
    assert not wa.running
    # The other deployment's session was never touched and still holds its lock.
    assert await other.fetchval("SELECT pg_backend_pid()") == other_pid
    await other.close()


@pytest.mark.postgres
async def test_scopes_do_not_contend(postgres_url: str) -> None:
    live, test = FakeWorker(), FakeWorker()
    first = SingletonRunner(postgres_url, host_id="a", scope="live:1", retry_ms=200)
    second = SingletonRunner(postgres_url, host_id="a", scope="test:D", retry_ms=200)
    first.add("retention", live)
    second.add("retention", test)
    await first.start()
    await second.start()
    try:
        await until(lambda: live.running and test.running)
    finally:
        await first.stop()
        await second.stop()


async def test_sqlite_host_leads_every_role_at_once(tmp_path: Path) -> None:
    worker = FakeWorker()
    r = runner(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "a", worker)
    await r.start()
    assert worker.running and r.leadership() == {"retention": True}
    assert await r.present(["a", "b"]) == {"a"}
    await r.stop()
    assert not worker.running and r.leadership() == {"retention": False}
