"""Singleton workers: each runs on whichever host holds its PostgreSQL advisory lock.

A host keeps one dedicated connection (outside the pool) on which it takes session-level advisory locks:
one per singleton role it manages to win, plus its presence lock (`host:<id>`), which tells the others it
is alive. Session locks live exactly as long as the session: when a host dies, PostgreSQL ends its session
and frees its locks, and another host, retrying every few seconds, takes the roles over.

The holder stops a role's worker at once when it can no longer prove it holds the lock: the connection
reports termination, or the periodic check (`SELECT` of its own locks, with a deadline) fails. It never
runs a worker it might not hold. On SQLite there is one host: it leads every role and no lock is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog
from sqlalchemy.engine import make_url

from gasless.core.workers import cancel_and_wait, wait_event

log = structlog.get_logger("gasless.leader")

# First key of every advisory lock this service takes ("gasl"); the second is derived from the lock name.
LOCK_NAMESPACE = 0x6761736C
RETRY_MS = 2_000  # a role not held is tried again this often
CHECK_MS = 1_000  # held locks are proven this often
CHECK_TIMEOUT_MS = 1_500  # a proof that takes longer counts as a lost connection


class SingletonWorker(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def lock_key(name: str) -> int:
    """The advisory lock's second key for `name` (a non-negative int4)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class SingletonRunner:
    """Runs each registered role's worker only while this host holds the role's lock.

    `scope` prefixes every lock name (environment and chain id), so deployments sharing a database never
    contend. `on_change(role, leads)` is called on every change of leadership.
    """

    def __init__(
        self,
        database_url: str,
        *,
        host_id: str,
        scope: str,
        retry_ms: int = RETRY_MS,
        check_ms: int = CHECK_MS,
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.database_url = database_url
        self.host_id = host_id
        self.scope = scope
        self.retry_ms = retry_ms
        self.check_ms = check_ms
        self.on_change = on_change
        self.postgres = make_url(database_url).get_backend_name() == "postgresql"
        self._workers: dict[str, SingletonWorker | None] = {self.presence_role(host_id): None}
        self._held: set[str] = set()
        self._conn: Any = None  # asyncpg.Connection while connected
        self._conn_lock = asyncio.Lock()  # one statement at a time on the dedicated connection
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()

    @staticmethod
    def presence_role(host_id: str) -> str:
        return f"host:{host_id}"

    def add(self, role: str, worker: SingletonWorker) -> None:
        if self._task is not None:
            raise RuntimeError("add roles before start()")
        self._workers[role] = worker

    @property
    def roles(self) -> list[str]:
        return [role for role, worker in self._workers.items() if worker is not None]

    def leads(self, role: str) -> bool:
        return role in self._held

    def leadership(self) -> dict[str, bool]:
        return {role: role in self._held for role in self.roles}

    def _lock_name(self, role: str) -> str:
        return f"{self.scope}:{role}"

    # Life cycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.postgres:
            for role in self._workers:
                await self._take(role)
            return
        self._task = asyncio.create_task(self._run(), name="singletons")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self._release_all()
        await self._close()

    async def _run(self) -> None:
        while True:
            try:
                if self._conn is None:
                    await self._connect()
                await self._acquire_free_roles()
                await self._hold(self.retry_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost or refused: stop everything, then start over
                if self._held:
                    log.error("singleton locks lost; stopping their workers", error=type(exc).__name__)
                else:
                    log.warning("singleton lock connection failed", error=type(exc).__name__)
                await self._release_all()
                await self._close()
                await asyncio.sleep(self.retry_ms / 1000)

    async def _connect(self) -> None:
        import asyncpg

        self._lost.clear()
        conn = await asyncpg.connect(asyncpg_dsn(self.database_url), timeout=CHECK_TIMEOUT_MS / 1000)
        # The server ending the session (crash, restart, pg_terminate_backend) frees our locks: react now.
        conn.add_termination_listener(lambda _conn: self._lost.set())
        self._conn = conn

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.terminate()

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        if self._conn is None:
            raise ConnectionError("no lock connection")
        # asyncio.timeout, not wait_for: a cancellation (the runner's stop) must never be lost (wait_event).
        async with self._conn_lock, asyncio.timeout(CHECK_TIMEOUT_MS / 1000):
            return list(await self._conn.fetch(sql, *args))

    async def _acquire_free_roles(self) -> None:
        for role in self._workers:
            if role in self._held:
                continue
            rows = await self._fetch(
                "SELECT pg_try_advisory_lock($1, $2) AS won", LOCK_NAMESPACE, lock_key(self._lock_name(role))
            )
            if rows[0]["won"]:
                await self._take(role)

    async def _hold(self, duration_ms: int) -> None:
        """Prove the held locks every `check_ms` for `duration_ms`; raise as soon as a proof fails."""
        loop = asyncio.get_running_loop()
        until = loop.time() + duration_ms / 1000
        while loop.time() < until:
            await wait_event(self._lost, self.check_ms / 1000)
            if self._lost.is_set():
                raise ConnectionError("lock connection terminated")
            if self._held:
                await self._prove()

    async def _prove(self) -> None:
        rows = await self._fetch(
            "SELECT objid::bigint AS key FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND classid = $1::bigint::oid AND objsubid = 2",
            LOCK_NAMESPACE,
        )
        keys = {int(row["key"]) for row in rows}
        missing = [role for role in self._held if lock_key(self._lock_name(role)) not in keys]
        for role in missing:
            log.error("singleton lock no longer held", role=role)
            await self._drop(role)

    # Workers ----------------------------------------------------------------------------------------
    async def _take(self, role: str) -> None:
        self._held.add(role)
        worker = self._workers[role]
        if worker is not None:
            log.info("leading singleton", role=role, host_id=self.host_id)
            await worker.start()
            self._changed(role, True)

    async def _drop(self, role: str) -> None:
        self._held.discard(role)
        worker = self._workers[role]
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker.stop()
            log.info("stopped singleton", role=role, host_id=self.host_id)
            self._changed(role, False)

    async def _release_all(self) -> None:
        for role in list(self._held):
            await self._drop(role)

    def _changed(self, role: str, leads: bool) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change(role, leads)

    # Presence ---------------------------------------------------------------------------------------
    async def present(self, host_ids: Iterable[str]) -> set[str]:
        """Which of `host_ids` hold their presence lock (are alive); raises when that cannot be known."""
        wanted = set(host_ids)
        if not self.postgres:
            return wanted & {self.host_id}
        keys = {lock_key(self._lock_name(self.presence_role(h))): h for h in wanted}
        if not keys:
            return set()
        rows = await self._fetch(
            "SELECT DISTINCT objid::bigint AS key FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = $1::bigint::oid AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            LOCK_NAMESPACE,
        )
        return {keys[int(row["key"])] for row in rows if int(row["key"]) in keys}
