"""Schema migrations: Alembic driven programmatically (no alembic.ini), safe to run concurrently.

Migrations are written expand-then-contract (docs/storage.md, "Schema changes"): a release's migrations
never break the release before it, which may still be serving on the same database during a rolling
upgrade. So a host whose database is already at a revision this release does not know (a newer release
migrated it) starts without migrating, and says so, instead of refusing: the newer schema is a superset of
what it needs.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gasless.db.engine import BEGIN_MODE_OPTION, PRE_BEGIN_OPTION, create_engine, transactional

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Key of the PostgreSQL advisory lock serialising migrators across processes and hosts.
MIGRATION_LOCK_KEY = int.from_bytes(hashlib.sha256(b"gasless.db.migrate").digest()[:8], "big", signed=True)
SQLITE_MIGRATION_BUSY_TIMEOUT_MS = 120_000

log = structlog.get_logger("gasless.db")

# Alembic's `context` and `op` are process-wide proxies: two migrations in one process must not interleave.
_ALEMBIC_LOCK = threading.Lock()


def make_config(url: str | None = None) -> Config:
    """An Alembic Config pointing at the packaged migrations (and at `url`, for tooling)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str | None:
    """The newest revision shipped with this package."""
    return ScriptDirectory.from_config(make_config()).get_current_head()


def known_revision(revision: str) -> bool:
    """Whether this package ships `revision` (a database at an unknown one was migrated by a newer release)."""
    script = ScriptDirectory.from_config(make_config())
    try:
        return script.get_revision(revision) is not None
    except Exception:  # noqa: BLE001 - alembic raises ResolutionError / CommandError for unknown ids
        return False


async def upgrade(url_or_engine: str | AsyncEngine, revision: str = "head") -> None:
    """Migrate up to `revision` (a no-op when already there); an engine is used only for its URL."""
    await asyncio.to_thread(_run_exclusive, _url_of(url_or_engine), "upgrade", revision)


async def downgrade(url_or_engine: str | AsyncEngine, revision: str = "base") -> None:
    """Migrate down to `revision` (default: drop everything); an engine is used only for its URL."""
    await asyncio.to_thread(_run_exclusive, _url_of(url_or_engine), "downgrade", revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())


async def is_up_to_date(engine: AsyncEngine) -> bool:
    """True when the database is at the packaged head revision(s)."""
    heads = await asyncio.to_thread(lambda: ScriptDirectory.from_config(make_config()).get_heads())
    async with engine.connect() as conn:
        current = await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_heads())
    return set(current) == set(heads)


def _url_of(url_or_engine: str | AsyncEngine) -> str:
    if isinstance(url_or_engine, AsyncEngine):
        return url_or_engine.url.render_as_string(hide_password=False)
    return url_or_engine


def _run_exclusive(url: str, action: str, revision: str) -> None:
    # Runs in a worker thread with its own event loop and engine: Alembic's file loading and module
    # imports are blocking, and the caller's engine is bound to the caller's loop.
    with _ALEMBIC_LOCK:
        asyncio.run(_run_locked(url, action, revision))


async def _connect(engine: AsyncEngine) -> AsyncConnection:
    """A connection for the migration. Two processes opening a new SQLite database race to switch it to
    WAL (gasless.db.engine): the loser is refused at once, without waiting, while the winner's first
    transaction (its whole migration) runs; it tries again until then, as long as a migration may take."""
    deadline = time.monotonic() + SQLITE_MIGRATION_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return await engine.connect()
        except OperationalError as exc:
            locked = engine.dialect.name == "sqlite" and "database is locked" in str(exc.orig)
            if not locked or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def _run_locked(url: str, action: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        conn = await _connect(engine)
        try:
            await _migrate(conn, action, revision)
        finally:
            await conn.close()
    finally:
        await engine.dispose()


async def _migrate(conn: AsyncConnection, action: str, revision: str) -> None:
    if conn.dialect.name == "sqlite":
        conn = await conn.execution_options(
            **{
                # BEGIN IMMEDIATE takes the write lock before Alembic reads the version table,
                # so a second migrator waits and then finds nothing to do.
                BEGIN_MODE_OPTION: "IMMEDIATE",
                # Batch migrations rebuild tables (drop + rename); with enforcement on, dropping
                # a referenced table fails. The pragma is a no-op inside a transaction: pre-BEGIN.
                PRE_BEGIN_OPTION: (
                    "PRAGMA foreign_keys=OFF",
                    f"PRAGMA busy_timeout={SQLITE_MIGRATION_BUSY_TIMEOUT_MS}",
                ),
            }
        )
    conn = await transactional(conn)
    async with conn.begin():
        if conn.dialect.name == "postgresql":
            # Released at commit; PostgreSQL DDL is transactional, so the whole run is atomic.
            lock = text("SELECT pg_advisory_xact_lock(:key)")
            await conn.execute(lock, {"key": MIGRATION_LOCK_KEY})
        changed = await conn.run_sync(_alembic_command, action, revision)
        # Only after a migration that ran: the check reads every row of every table with a foreign key
        # (1.5 s at 1 M intents), and a start on an up-to-date database changed nothing it could break.
        if changed and conn.dialect.name == "sqlite":
            await _check_sqlite_foreign_keys(conn)


def _alembic_command(connection: Connection, action: str, revision: str) -> bool:
    """Run the Alembic command; whether it moved the database's revision."""
    config = make_config()
    config.attributes["connection"] = connection
    before = set(MigrationContext.configure(connection).get_current_heads())
    if action == "upgrade":
        ahead = sorted(rev for rev in before if not known_revision(rev))
        if ahead:
            # A newer release migrated this database (a rolling upgrade under way): its migrations are
            # expand-only with respect to this release, which serves on it as it is.
            log.warning(
                "database schema newer than this release: not migrating",
                database_revision=",".join(ahead),
                release_head=head_revision(),
            )
            return False
        command.upgrade(config, revision)
    elif action == "downgrade":
        command.downgrade(config, revision)
    else:
        raise ValueError(f"unknown migration action {action!r}")
    return set(MigrationContext.configure(connection).get_current_heads()) != before


async def _check_sqlite_foreign_keys(conn: AsyncConnection) -> None:
    violations = (await conn.exec_driver_sql("PRAGMA foreign_key_check")).all()
    if violations:
        raise RuntimeError(f"migration left foreign key violations: {violations[:5]}")
