"""The restore of a backup (gasless.db.backup) into a new data directory or database, marked as a restore
(docs/operations.md, "Backups and restore").

A restore never writes over a database: the target must not exist (SQLite) or hold no table (PostgreSQL).
It marks the restored database (`service_meta` key `restore`, state `pending`): the first host to start on it
reconciles it with the chain before co-signing or settling (gasless.relay.restored). And unless told to
leave it, it retires the database the backup was taken from when it can reach it: every signer identity
there is claimed for good by the restore (`signer_fences`), so a host still serving on it stops co-signing at
its next claim renewal and a host started on it never co-signs; the restore waits until every claim that
was live there has lapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from gasless.db.backup import (
    USER_TABLES,
    BackupFailed,
    BackupRefused,
    NoProgress,
    Progress,
    dialect_of,
    libpq_target,
    now_ms,
    read_manifest,
    require_tool,
    run_pg_tool,
    sha256_of,
    sqlite_path,
    upsert_meta,
    without_password,
)
from gasless.db.engine import begin_write, create_engine, dialect_insert
from gasless.db.tables import service_meta, signer_fences

RESTORE_KEY = "restore"  # service_meta of a restored database (gasless.relay.restored reads it)
RETIRED_KEY = "retired"  # service_meta of a database a restore retired
RETIRED_HOLDER = "retired-by-restore:"  # signer_fences.holder of an identity a restore claimed for good
RETIRED_UNTIL_MS = 253_402_300_799_000  # 9999-12-31: a claim that never lapses
HOST_IDS = ("a", "b")
MAX_WORKERS = 16  # gasless.core.settings.MAX_WORKERS: worker k of `--workers` signs as `<env>:<host>.<k>`
# Waited past a claim's end: the signer stops SAFETY_MARGIN_MS before it (gasless.signer.fence).
FENCE_MARGIN_MS = 500
_RESTORING = re.compile(r'processing data for table "?([^"]+)"?')


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
    dialect = dialect_of(target_url)
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
        require_tool("pg_restore")
        await _check_new_postgresql(target_url)
    digest, _ = sha256_of(copy, progress)
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
        # The snapshot's bounds the settlement reconciliation starts from (gasless.settlement.restored).
        "maxIntentPkAtBackup": (manifest.get("intents") or {}).get("maxPk"),
        "lastBatchAtBackup": (manifest.get("settlement") or {}).get("lastBatch"),
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
            await upsert_meta(conn, RESTORE_KEY, marker, now_ms())
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
        tables = await conn.fetchval(USER_TABLES)
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
    tool = require_tool("pg_restore")
    listing = await asyncio.create_subprocess_exec(
        tool, "--list", str(copy), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await listing.communicate()
    if listing.returncode != 0:
        raise BackupFailed(f"pg_restore --list: {err.decode(errors='replace').strip()[:300]}")
    tables = sum(1 for line in out.decode(errors="replace").splitlines() if " TABLE DATA " in line)
    progress.stage(f"pg_restore into {target.database}", max(1, tables))
    command = [
        tool, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction", "--verbose",
        f"--dbname={target.uri}", str(copy),
    ]  # fmt: skip
    await run_pg_tool(command, target.env, counted=_RESTORING, total=tables, progress=progress)


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
    if dialect_of(url) == "sqlite" and not sqlite_path(url).is_file():
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
            await upsert_meta(conn, RETIRED_KEY, record, now)
    finally:
        await engine.dispose()
    return live_until
