"""Backups that restore: a consistent copy of the service database taken while it serves, and its restore
into a new data directory or database, marked as a restore (docs/operations.md, "Backups and restore").

- SQLite: the online backup API (`sqlite3.Connection.backup`) copies the database in one step, under one
  read transaction: a snapshot of one instant, taken while the host keeps writing (WAL readers never block
  the writer). The copy is checked (`PRAGMA quick_check`) and stored as one file, `gasless.db`.
- PostgreSQL: `pg_dump --format=custom` into `gasless.dump`, run on a snapshot exported by a repeatable-read
  transaction that also reads the manifest's facts, so the facts and the dump describe the same instant.

A backup directory holds the copy and `manifest.json`: the format, the copy's size and SHA-256, when the
snapshot was taken, the schema revision, the chain the database belongs to with the highest final
hyperblock it had seen (the recovery point: every relay acknowledged after the snapshot executed in a later
hyperblock), and how many intents were in flight.

A restore never writes over a database: the target must not exist (SQLite) or hold no table (PostgreSQL).
It marks the restored database (`service_meta` key `restore`, state `pending`): the first host to start on it
reconciles it with the chain before co-signing (`gasless.relay.restored`). And unless told to leave it, it
retires the database the backup was taken from when it can reach it: every signer identity there is claimed
for good by the restore (`signer_fences`), so a host still serving on it stops co-signing at its next claim
renewal and a host started on it never co-signs; the restore waits until every claim that was live there
has lapsed.
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

from sqlalchemy import delete, select
from sqlalchemy.engine import URL, make_url

import gasless
from gasless.db.engine import begin_write, create_engine, dialect_insert
from gasless.db.tables import service_meta, signer_fences

FORMAT = "gasless-backup/1"
MANIFEST = "manifest.json"
SQLITE_FILE = "gasless.db"
PG_FILE = "gasless.dump"
RESTORE_KEY = "restore"  # service_meta of a restored database (gasless.relay.restored reads it)
RETIRED_KEY = "retired"  # service_meta of a database a restore retired
RETIRED_HOLDER = "retired-by-restore:"  # signer_fences.holder of an identity a restore claimed for good
RETIRED_UNTIL_MS = 253_402_300_799_000  # 9999-12-31: a claim that never lapses
HOST_IDS = ("a", "b")
MAX_WORKERS = 16  # gasless.settings.MAX_WORKERS: worker k of `--workers` signs as `<env>:<host>.<k>`
FENCE_MARGIN_MS = (
    500  # past a claim's end: the signer stops SAFETY_MARGIN_MS before it (gasless.signer.fence)
)
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


def _dialect(url: str) -> str:
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
    return {
        "revision": revision[0][0] if revision else None,
        "chain": chain,
        "intents": {"total": int(total), "inFlight": int(in_flight), "maxPk": int(max_pk)},
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


def _sha256(path: Path, progress: Progress) -> tuple[str, int]:
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
    dialect = _dialect(url)
    _check_empty_dir(directory)
    if dialect == "sqlite":
        source = sqlite_path(url)
        if not source.is_file():
            raise BackupRefused(f"{source}: no such database file")
    else:
        _require_tool("pg_dump")
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
    digest, size = _sha256(target, progress)
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


def _require_tool(name: str) -> str:
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


def _tool_error(name: str, status: int, tail: list[str]) -> BackupFailed:
    errors = [line for line in tail if "error" in line.lower() or "fatal" in line.lower()] or tail[-3:]
    return BackupFailed(f"{name} exited with status {status}: {' | '.join(errors[-3:])}")


_DUMPING = re.compile(r'dumping contents of table "?([^"]+)"?')
_RESTORING = re.compile(r'processing data for table "?([^"]+)"?')


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
        tables = int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
            )
        )
        progress.stage(f"pg_dump of {target.database} (custom format)", max(1, tables))
        dumped = 0

        def on_line(line: str) -> None:
            nonlocal dumped
            if _DUMPING.search(line):
                dumped += 1
                progress.advance(min(dumped, tables))

        command = [
            _require_tool("pg_dump"), "--format=custom", f"--snapshot={snapshot}", "--verbose",
            f"--file={dump}", f"--dbname={target.uri}",
        ]  # fmt: skip
        status, tail = await _run_tool(command, target.env, on_line)
        if status != 0:
            raise _tool_error("pg_dump", status, tail)
        await transaction.rollback()
    finally:
        await conn.close()
    digest, size = _sha256(dump, progress)
    return _manifest("postgresql", PG_FILE, digest, size, taken_at, without_password(url), facts)


# Restore --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceFence:
    """What the restore did to the database the backup was taken from."""

    state: str  # retired | unreachable | left
    detail: str
    waited_ms: int = 0


async def restore(
    directory: Path,
    target_url: str,
    progress: Progress | None = None,
    *,
    key_env: str,
    leave_source: bool = False,
    source_url: str | None = None,
) -> dict[str, Any]:
    """Restore the backup in `directory` into `target_url` (a database that does not exist yet, or an empty
    PostgreSQL one), mark it as a restore, and retire the source database (unless `leave_source`); returns
    the restore marker written into the restored database."""
    from gasless.db.migrate import known_revision

    progress = progress or NoProgress()
    manifest = read_manifest(directory)
    dialect = _dialect(target_url)
    if manifest.get("kind") != dialect:
        raise BackupRefused(
            f"the backup is of a {manifest.get('kind')} database and the target is {dialect}: restore it into "
            f"a {manifest.get('kind')} database"
        )
    revision = manifest.get("revision")
    if revision is not None and not known_revision(str(revision)):
        raise BackupRefused(
            f"the backup's schema revision {revision} is newer than this release knows: restore it with the "
            "release that took it, or a newer one"
        )
    copy = directory / str(manifest["file"])
    if not copy.is_file():
        raise BackupRefused(f"{copy}: the backup's {manifest['kind']} file is missing")
    if dialect == "sqlite":
        target = sqlite_path(target_url)
        _check_new_sqlite(target)
    else:
        _require_tool("pg_restore")
        await _check_new_postgresql(target_url)
    digest, _ = _sha256(copy, progress)
    if digest != manifest.get("sha256"):
        raise BackupFailed(f"{copy} does not match the manifest's SHA-256: the backup is damaged")
    if dialect == "sqlite":
        await _restore_sqlite(copy, sqlite_path(target_url), progress)
    else:
        await _restore_postgresql(copy, target_url, progress)
    restore_id = f"r-{uuid.uuid4().hex[:12]}"
    fence = SourceFence("left", "left as it was (--leave-source)")
    if not leave_source:
        fence = await retire_source(
            source_url or _source_url(manifest),
            restore_id,
            key_env=key_env,
            target=without_password(target_url),
            progress=progress,
        )
    marker = {
        "restoreId": restore_id,
        "state": "pending",
        "backupId": manifest.get("backupId"),
        "backupTakenAtMs": manifest.get("takenAtMs"),
        "restoredAtMs": now_ms(),
        "recoveryPoint": manifest.get("chain"),
        "revision": revision,
        "inFlightAtBackup": (manifest.get("intents") or {}).get("inFlight"),
        "source": manifest.get("source"),
        "sourceFence": {"state": fence.state, "detail": fence.detail, "waitedMs": fence.waited_ms},
    }
    await _mark_restored(target_url, marker)
    return marker


async def _mark_restored(url: str, marker: dict[str, Any]) -> None:
    """The restore marker, in the restored database; a copy of a database a restore had retired is
    servable again (its retired claims go: it is a new database now)."""
    engine = create_engine(url)
    try:
        async with begin_write(engine) as conn:
            await conn.execute(delete(signer_fences).where(signer_fences.c.holder.startswith(RETIRED_HOLDER)))
            await conn.execute(delete(service_meta).where(service_meta.c.key == RETIRED_KEY))
            stamp = now_ms()
            insert = dialect_insert(conn)(service_meta).values(
                key=RESTORE_KEY, value=marker, updated_at_ms=stamp
            )
            await conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[service_meta.c.key], set_={"value": marker, "updated_at_ms": stamp}
                )
            )
    finally:
        await engine.dispose()


def _source_url(manifest: dict[str, Any]) -> str:
    source = str(manifest.get("source") or "")
    if manifest.get("kind") == "sqlite":
        return f"sqlite+aiosqlite:///{source}"
    return source


def _check_new_sqlite(target: Path) -> None:
    for path in (target, Path(f"{target}-wal"), Path(f"{target}-journal")):
        if path.exists():
            raise BackupRefused(
                f"{path} exists: a restore never writes over a database; restore into a new --data-dir or "
                "--database-url"
            )


async def _check_new_postgresql(url: str) -> None:
    """The target database exists and holds no table, or does not exist (then it is created)."""
    import asyncpg

    target = libpq_target(url)
    try:
        conn = await asyncpg.connect(target.asyncpg_dsn, timeout=10)
    except asyncpg.InvalidCatalogNameError:
        maintenance = libpq_target(url, database="postgres")
        admin = await asyncpg.connect(maintenance.asyncpg_dsn, timeout=10)
        try:
            await admin.execute(f'CREATE DATABASE "{target.database}"')
        finally:
            await admin.close()
        return
    except (OSError, asyncpg.PostgresError) as exc:
        raise BackupRefused(f"the target database {without_password(url)} cannot be reached: {exc}") from None
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        )
    finally:
        await conn.close()
    if tables:
        raise BackupRefused(
            f"the target database {without_password(url)} is not empty ({tables} tables): a restore never "
            "writes over a database; create a new, empty one"
        )


async def _restore_sqlite(copy: Path, target: Path, progress: Progress) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(f"file:{copy.as_posix()}?mode=ro", uri=True)) as probe:
        pages = int(probe.execute("PRAGMA page_count").fetchone()[0])
    progress.stage(f"restoring into {target}", max(1, pages))

    def step(_status: int, remaining: int, total: int) -> None:
        progress.advance(total - remaining)

    def copy_pages() -> None:
        src = sqlite3.connect(f"file:{copy.as_posix()}?mode=ro", uri=True)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst, pages=256, progress=step)  # nothing else writes the copy: steps never restart
            dst.execute("PRAGMA journal_mode=WAL")
        finally:
            dst.close()
            src.close()

    try:
        await asyncio.to_thread(copy_pages)
    except BaseException:
        for path in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
            with contextlib.suppress(OSError):
                path.unlink()
        raise


async def _restore_postgresql(copy: Path, url: str, progress: Progress) -> None:
    target = libpq_target(url)
    tool = _require_tool("pg_restore")
    listing = await asyncio.create_subprocess_exec(
        tool, "--list", str(copy), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await listing.communicate()
    if listing.returncode != 0:
        raise BackupFailed(f"pg_restore --list: {err.decode(errors='replace').strip()[:300]}")
    tables = sum(1 for line in out.decode(errors="replace").splitlines() if " TABLE DATA " in line)
    progress.stage(f"pg_restore into {target.database}", max(1, tables))
    restored = 0

    def on_line(line: str) -> None:
        nonlocal restored
        if _RESTORING.search(line):
            restored += 1
            progress.advance(min(restored, tables))

    command = [
        tool, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--verbose",
        f"--dbname={target.uri}", str(copy),
    ]  # fmt: skip
    status, tail = await _run_tool(command, target.env, on_line)
    if status != 0:
        raise _tool_error("pg_restore", status, tail)


async def read_meta(url: str, key: str) -> dict[str, Any] | None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            value = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == key))
    finally:
        await engine.dispose()
    return dict(value) if isinstance(value, dict) else None


# Retiring the source --------------------------------------------------------------------------------------
def signer_identities(key_envs: set[str]) -> list[str]:
    """Every signer identity a host of these environments can take: `<env>:<host>` and, for the workers of
    `gasless serve --workers`, `<env>:<host>.<k>`."""
    ids = []
    for env in sorted(key_envs):
        for host in HOST_IDS:
            ids.append(f"{env}:{host}")
            ids.extend(f"{env}:{host}.{k}" for k in range(MAX_WORKERS))
    return ids


async def retire_source(
    url: str, restore_id: str, *, key_env: str, target: str, progress: Progress
) -> SourceFence:
    """Claim every signer identity of the source database for good, then wait until every claim that was
    live there has lapsed: from then on no host on the source co-signs. A source that cannot be reached is
    reported (its hosts cannot renew their claims either, while it stays so)."""
    if not url:
        return SourceFence("unreachable", "the manifest names no source database")
    if _dialect(url) == "sqlite" and not sqlite_path(url).is_file():
        return SourceFence("unreachable", f"{sqlite_path(url)} does not exist any more")
    progress.stage(f"retiring the source database {without_password(url)}")
    try:
        async with asyncio.timeout(30):
            live_until = await _retire(url, restore_id, key_env, target)
    except Exception as exc:  # noqa: BLE001 - reported in the marker and by the command
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        return SourceFence("unreachable", f"{without_password(url)} could not be reached: {reason}")
    waited = 0
    wait_ms = live_until + FENCE_MARGIN_MS - now_ms() if live_until else 0
    if wait_ms > 0:
        progress.stage("waiting for the source's signer claims to lapse", wait_ms / 1000)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) * 1000 < wait_ms:
            progress.advance(elapsed)
            await asyncio.sleep(min(0.1, wait_ms / 1000 - elapsed))
        progress.advance(wait_ms / 1000)
        waited = wait_ms
    return SourceFence(
        "retired",
        f"{without_password(url)}: every signer identity claimed by {restore_id}"
        + (f"; waited {waited} ms for the live claims to lapse" if waited else "; no live claim"),
        waited,
    )


async def _retire(url: str, restore_id: str, key_env: str, target: str) -> int:
    """The retiring write; the end of the last claim that was live, in ms (0: none)."""
    engine = create_engine(url, connect_timeout=10)
    holder = f"{RETIRED_HOLDER}{restore_id}"[:64]
    try:
        async with begin_write(engine) as conn:
            now = now_ms()
            rows = (await conn.execute(select(signer_fences))).all()
            live_until = max(
                (
                    int(row.expires_at_ms)
                    for row in rows
                    if not str(row.holder).startswith(RETIRED_HOLDER) and int(row.expires_at_ms) >= now
                ),
                default=0,
            )
            envs = {key_env} | {
                str(row.signer_id).split(":", 1)[0] for row in rows if ":" in str(row.signer_id)
            }
            tokens = {str(row.signer_id): int(row.token) for row in rows}
            for signer_id in sorted(set(signer_identities(envs)) | set(tokens)):
                values = {
                    "holder": holder,
                    "token": tokens.get(signer_id, 0) + 1,
                    "expires_at_ms": RETIRED_UNTIL_MS,
                    "updated_at_ms": now,
                }
                insert = dialect_insert(conn)(signer_fences).values(signer_id=signer_id, **values)
                await conn.execute(
                    insert.on_conflict_do_update(index_elements=[signer_fences.c.signer_id], set_=values)
                )
            record = {"restoreId": restore_id, "retiredAtMs": now, "restoredInto": target}
            insert = dialect_insert(conn)(service_meta).values(
                key=RETIRED_KEY, value=record, updated_at_ms=now
            )
            await conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[service_meta.c.key], set_={"value": record, "updated_at_ms": now}
                )
            )
    finally:
        await engine.dispose()
    return live_until
