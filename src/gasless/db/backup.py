"""Backups that restore: a consistent copy of the service database taken while it serves (docs/operations.md,
"Backups and restore"); the restore itself is gasless.db.restore.

- SQLite: the online backup API (`sqlite3.Connection.backup`) copies the database in one step, under one
  read transaction: a snapshot of one instant, taken while the host keeps writing (WAL readers never block
  the writer). The copy is checked (`PRAGMA quick_check`) and stored as one file, `gasless.db`.
- PostgreSQL: `pg_dump --format=custom` into `gasless.dump`, run on a snapshot exported by a repeatable-read
  transaction that also reads the manifest's facts, so the facts and the dump describe the same instant.

A backup directory holds the copy and `manifest.json`: the format, the copy's size and SHA-256, when the
snapshot was taken, the schema revision, the chain the database belongs to with the highest final
hyperblock it had seen (the recovery point: every relay acknowledged after the snapshot executed in a later
hyperblock), how many intents were in flight, and the last settlement batch it knew.

Also here, for gasless.db.restore: the manifest, the PostgreSQL client tools, `service_meta` writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection

import gasless
from gasless.db.engine import create_engine, dialect_insert
from gasless.db.tables import service_meta

FORMAT = "gasless-backup/1"
MANIFEST = "manifest.json"
SQLITE_FILE = "gasless.db"
PG_FILE = "gasless.dump"
IN_FLIGHT = ("COSIGNED", "BROADCAST", "EXECUTED")


class BackupRefused(Exception):
    """Nothing was done: a usage problem (a target that exists, a directory that is not a backup...)."""


class BackupFailed(Exception):
    """The operation was tried and failed (a copy that does not check, pg_dump's error...)."""


class Progress(Protocol):
    """What long-running steps report: a stage (with its total, when known) and how far it is."""

    def stage(self, description: str, total: float | None = None) -> None: ...

    def advance(self, completed: float) -> None: ...


class NoProgress:
    def stage(self, description: str, total: float | None = None) -> None:
        pass

    def advance(self, completed: float) -> None:
        pass


def now_ms() -> int:
    return int(time.time() * 1000)


def without_password(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def dialect_of(url: str) -> str:
    driver = make_url(url).drivername
    if driver == "sqlite+aiosqlite":
        return "sqlite"
    if driver == "postgresql+asyncpg":
        return "postgresql"
    raise BackupRefused(f"unsupported database URL {driver!r}: use sqlite+aiosqlite or postgresql+asyncpg")


def sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise BackupRefused("the SQLite URL names no file")
    return Path(database)


# Facts about a database (the manifest's), read the same way on both dialects ------------------------------
_STATES = ", ".join(f"'{state}'" for state in IN_FLIGHT)
FACT_QUERIES = {
    "revision": "SELECT version_num FROM alembic_version",
    # Absent from a database older than the chain identity (migration 0009).
    "chain": "SELECT chain_id, start_time_ms, final_nonce, final_hash, updated_at_ms FROM chain_identity WHERE id = 1",
    "intents": "SELECT count(*), coalesce(max(pk), 0) FROM intents",
    "in_flight": f"SELECT count(*) FROM intents WHERE state IN ({_STATES})",
    "settlement": "SELECT coalesce(max(batch_id), 0) FROM settlement_batches",
}


def _facts(answers: dict[str, list[tuple[Any, ...]]]) -> dict[str, Any]:
    """The manifest's facts from the answers to FACT_QUERIES (a query that failed answers no row)."""
    chain: dict[str, Any] | None = None
    if answers.get("chain"):
        chain_id, start_ms, final_nonce, final_hash, updated_ms = answers["chain"][0]
        chain = {
            "chainId": chain_id,
            "startTimeMs": int(start_ms),
            "finalHyperblock": int(final_nonce),
            "finalHash": final_hash,
            "recordedAtMs": int(updated_ms),
        }
    total, max_pk = (answers.get("intents") or [(0, 0)])[0]
    in_flight = (answers.get("in_flight") or [(0,)])[0][0]
    revision = answers.get("revision")
    settlement = answers.get("settlement")
    return {
        "revision": revision[0][0] if revision else None,
        "chain": chain,
        "intents": {"total": int(total), "inFlight": int(in_flight), "maxPk": int(max_pk)},
        # The last batch the snapshot knew: the restored host reconciles the batches after it with the chain.
        "settlement": {"lastBatch": int(settlement[0][0])} if settlement else None,
    }


def _sqlite_facts(conn: sqlite3.Connection) -> dict[str, Any]:
    answers: dict[str, list[tuple[Any, ...]]] = {}
    for name, sql in FACT_QUERIES.items():
        try:
            answers[name] = list(conn.execute(sql).fetchall())
        except sqlite3.Error:
            answers[name] = []
    return _facts(answers)


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BackupRefused(f"{directory} is not a gasless backup (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise BackupRefused(f"{path} cannot be read: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupRefused(f"{path} is not a {FORMAT} manifest")
    return manifest


def _check_empty_dir(directory: Path) -> None:
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise BackupRefused(f"{directory} exists and is not an empty directory: back up into a new one")


def sha256_of(path: Path, progress: Progress) -> tuple[str, int]:
    size = path.stat().st_size
    progress.stage(f"checksum of {path.name}", size)
    digest = hashlib.sha256()
    done = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            done += len(chunk)
            progress.advance(done)
    return digest.hexdigest(), size


# Backup ---------------------------------------------------------------------------------------------------
async def backup(url: str, directory: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Back the database at `url` up into `directory` (new or empty); returns the manifest."""
    progress = progress or NoProgress()
    dialect = dialect_of(url)
    _check_empty_dir(directory)
    if dialect == "sqlite":
        source = sqlite_path(url)
        if not source.is_file():
            raise BackupRefused(f"{source}: no such database file")
    else:
        require_tool("pg_dump")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if dialect == "sqlite":
            manifest = await _backup_sqlite(sqlite_path(url).resolve(), directory, progress)
        else:
            manifest = await _backup_postgresql(url, directory, progress)
    except BaseException:
        for name in (SQLITE_FILE, PG_FILE, MANIFEST):
            with contextlib.suppress(OSError):
                (directory / name).unlink()
        raise
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


async def _backup_sqlite(source: Path, directory: Path, progress: Progress) -> dict[str, Any]:
    target = directory / SQLITE_FILE
    taken_at = now_ms()

    def copy() -> None:
        src = sqlite3.connect(source, timeout=30)
        dst = sqlite3.connect(target)
        try:
            # One step (pages=-1): one read transaction over the whole copy, so it is one instant's snapshot.
            # A copy in several steps starts over whenever another connection writes in between, which
            # under load is every step.
            src.backup(dst)
            # One file for the artifact: the copy would otherwise keep the source's WAL mode.
            dst.execute("PRAGMA journal_mode=DELETE")
        finally:
            dst.close()
            src.close()

    with contextlib.closing(sqlite3.connect(source, timeout=30)) as probe:
        page_size = probe.execute("PRAGMA page_size").fetchone()[0]
        pages = probe.execute("PRAGMA page_count").fetchone()[0]
    total = int(page_size) * int(pages)
    progress.stage(f"copying a snapshot of {source.name}", total)
    task = asyncio.create_task(asyncio.to_thread(copy))
    while not task.done():
        await asyncio.wait({task}, timeout=0.1)
        with contextlib.suppress(OSError):
            progress.advance(min(total, target.stat().st_size))
    task.result()
    progress.advance(total)
    progress.stage("checking the copy")
    conn = sqlite3.connect(f"file:{target.as_posix()}?mode=ro", uri=True)
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise BackupFailed(f"the copy does not check: {check}")
        facts = _sqlite_facts(conn)
    finally:
        conn.close()
    digest, size = sha256_of(target, progress)
    return _manifest("sqlite", SQLITE_FILE, digest, size, taken_at, str(source), facts)


def _manifest(
    kind: str, file: str, digest: str, size: int, taken_at: int, source: str, facts: dict[str, Any]
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "backupId": f"b-{uuid.uuid4().hex[:12]}",
        "kind": kind,
        "file": file,
        "bytes": size,
        "sha256": digest,
        "takenAtMs": taken_at,
        "completedAtMs": now_ms(),
        "source": source,
        "gasless": gasless.__version__,
        **facts,
    }


@dataclass(frozen=True)
class LibpqTarget:
    """A database URL as the PostgreSQL client tools take it: a URI without the password (which goes
    through PGPASSWORD, never the command line) and asyncpg's DSN."""

    uri: str
    env: dict[str, str]
    asyncpg_dsn: str
    database: str


def libpq_target(url: str, database: str | None = None) -> LibpqTarget:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    query = dict(parsed.query)
    ssl = query.pop("ssl", None)
    if ssl is not None:
        query["sslmode"] = str(ssl)
    plain = URL.create(
        "postgresql",
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=query,
    )
    env = dict(os.environ)
    if parsed.password:
        env["PGPASSWORD"] = str(parsed.password)
    with_password = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    return LibpqTarget(plain.render_as_string(), env, with_password, str(parsed.database or ""))


def require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupRefused(
            f"{name} not found: install the PostgreSQL client tools (Debian: apt-get install postgresql-client) "
            "of the server's major version or newer"
        )
    return found


async def _run_tool(
    command: Sequence[str], env: dict[str, str], on_line: Callable[[str], None]
) -> tuple[int, list[str]]:
    """Run a PostgreSQL client tool, feeding its stderr lines (its --verbose output) to `on_line`; its exit
    status and last lines."""
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    tail: list[str] = []
    try:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            tail = [*tail[-19:], line]
            on_line(line)
        return await proc.wait(), tail
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_pg_tool(
    command: Sequence[str], env: dict[str, str], *, counted: re.Pattern[str], total: int, progress: Progress
) -> None:
    """Run pg_dump or pg_restore (--verbose), advancing `progress` on each stderr line `counted` matches (a
    table dumped or restored, out of `total`); BackupFailed with its last error lines when it fails."""
    done = 0

    def on_line(line: str) -> None:
        nonlocal done
        if counted.search(line):
            done += 1
            progress.advance(min(done, total))

    status, tail = await _run_tool(command, env, on_line)
    if status != 0:
        errors = [line for line in tail if "error" in line.lower() or "fatal" in line.lower()] or tail[-3:]
        name = Path(command[0]).name
        raise BackupFailed(f"{name} exited with status {status}: {' | '.join(errors[-3:])}")


USER_TABLES = "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
_DUMPING = re.compile(r'dumping contents of table "?([^"]+)"?')


async def _backup_postgresql(url: str, directory: Path, progress: Progress) -> dict[str, Any]:
    import asyncpg

    target = libpq_target(url)
    dump = directory / PG_FILE
    conn = await asyncpg.connect(target.asyncpg_dsn, timeout=10)
    try:
        transaction = conn.transaction(isolation="repeatable_read", readonly=True)
        await transaction.start()
        taken_at = now_ms()
        # The dump and the facts below read the same snapshot: the manifest describes the dump exactly.
        snapshot = await conn.fetchval("SELECT pg_export_snapshot()")

        answers: dict[str, list[tuple[Any, ...]]] = {}
        for name, sql in FACT_QUERIES.items():
            try:
                async with conn.transaction():  # a savepoint: a missing table must not end the snapshot
                    answers[name] = [tuple(row) for row in await conn.fetch(sql)]
            except asyncpg.PostgresError:
                answers[name] = []
        facts = _facts(answers)
        tables = int(await conn.fetchval(USER_TABLES))
        progress.stage(f"pg_dump of {target.database} (custom format)", max(1, tables))
        command = [
            require_tool("pg_dump"), "--format=custom", f"--snapshot={snapshot}", "--verbose",
            f"--file={dump}", f"--dbname={target.uri}",
        ]  # fmt: skip
        await run_pg_tool(command, target.env, counted=_DUMPING, total=tables, progress=progress)
        await transaction.rollback()
    finally:
        await conn.close()
    digest, size = sha256_of(dump, progress)
    return _manifest("postgresql", PG_FILE, digest, size, taken_at, without_password(url), facts)


# service_meta ---------------------------------------------------------------------------------------------
async def upsert_meta(conn: AsyncConnection, key: str, value: dict[str, Any], stamp: int) -> None:
    insert = dialect_insert(conn)(service_meta).values(key=key, value=value, updated_at_ms=stamp)
    await conn.execute(
        insert.on_conflict_do_update(
            index_elements=[service_meta.c.key], set_={"value": value, "updated_at_ms": stamp}
        )
    )


async def read_meta(url: str, key: str) -> dict[str, Any] | None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            value = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == key))
    finally:
        await engine.dispose()
    return dict(value) if isinstance(value, dict) else None
