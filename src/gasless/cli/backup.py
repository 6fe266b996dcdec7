"""`gasless admin backup`, `restore`, `restore-report`, `restore-hold` and `migrate`: the service database's
backups, their restore into a new place, what a restored host recovered from the chain (relays and settlement
batches), the usage it held out of settlement, and the schema migrations run ahead of a rolling upgrade (docs/operations.md, "Backups and restore" and "Rolling upgrades")."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gasless.cli.common import EXIT_FAILED, fail, invalid_settings
from gasless.cli.output import CliConsole, key_value_table, print_records

console = CliConsole(stderr=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
DatabaseOption = Annotated[
    str | None, typer.Option("--database-url", help="The service database (default: the settings').")
]


def _settings(config: Path | None, database_url: str | None = None) -> Any:
    from gasless.core.settings import Settings

    try:
        return Settings.load(config_file=config, **({"database_url": database_url} if database_url else {}))
    except ValueError as exc:
        invalid_settings(exc)


class RichProgress:
    """gasless.db.backup.Progress on stderr: one bar per stage."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish()
        self.progress.stop()

    def _finish(self) -> None:
        if self.task is not None:
            task = self.progress.tasks[self.task]
            self.progress.update(
                self.task, completed=task.total if task.total is not None else 1, total=task.total or 1
            )

    def stage(self, description: str, total: float | None = None) -> None:
        self._finish()
        self.task = self.progress.add_task(description, total=total)

    def advance(self, completed: float) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=completed)


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _run(work: Any, what: str) -> Any:
    from gasless.db.backup import BackupFailed, BackupRefused

    try:
        return asyncio.run(work)
    except BackupRefused as exc:
        fail(str(exc), label=f"{what} refused")
    except BackupFailed as exc:
        fail(str(exc), EXIT_FAILED, label=f"{what} failed")
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename or ''}", EXIT_FAILED, label=f"{what} failed")
    except Exception as exc:  # noqa: BLE001 - a database's refusal (authentication...): the reason, one line
        fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED, label=f"{what} failed")


def backup_command(
    to: Annotated[Path, typer.Option("--to", help="A new (or empty) directory for the backup.")],
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Back the service database up while it serves: SQLite through its online backup API, PostgreSQL with
    pg_dump (custom format). The directory gets the copy and manifest.json (the recovery point)."""
    from gasless.db.backup import backup, without_password

    settings = _settings(config, database_url)
    url = settings.effective_database_url
    with RichProgress() as progress:
        manifest = _run(backup(url, to, progress), "backup")
    chain = manifest.get("chain") or {}
    rows = [
        ("backup", manifest["backupId"]),
        ("database", without_password(url)),
        ("into", f"{to}/{manifest['file']} ({manifest['bytes']} bytes)"),
        ("snapshot taken", _when(manifest["takenAtMs"])),
        ("schema revision", manifest["revision"]),
        (
            "recovery point (final hyperblock)",
            chain.get("finalHyperblock", "none (the chain was never seen)"),
        ),
        ("intents (in flight)", f"{manifest['intents']['total']} ({manifest['intents']['inFlight']})"),
    ]
    console.print(key_value_table("gasless backup", rows))
    typer.echo(json.dumps(manifest, separators=(",", ":")))


def restore_command(
    source: Annotated[Path, typer.Option("--from", help="A backup directory (gasless admin backup --to).")],
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="A new data directory: the database goes to DIR/gasless.db."),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="A new database: a SQLite file that does not exist, or an empty PostgreSQL one.",
        ),
    ] = None,
    source_database_url: Annotated[
        str | None,
        typer.Option(
            "--source-database-url",
            help="How to reach the database the backup was taken from, to retire it (default: the manifest's).",
        ),
    ] = None,
    leave_source: Annotated[
        bool,
        typer.Option(
            "--leave-source",
            help="Do not retire the source database (a restore drill: never start a host on the copy with "
            "the live relayer keys while the source serves).",
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Restore a backup into a new data directory or database (never over one that exists), mark it as a
    restore, and retire the source database's signer identities. The first host started on it reconciles
    it with the chain before co-signing."""
    from gasless.db.backup import without_password
    from gasless.db.restore import restore

    if (data_dir is None) == (database_url is None):
        fail("give exactly one of --data-dir (a new data directory) and --database-url (a new database)")
    url = database_url or f"sqlite+aiosqlite:///{(Path(data_dir or '.') / 'gasless.db').resolve().as_posix()}"
    settings = _settings(config)
    with RichProgress() as progress:
        marker = _run(
            restore(
                source,
                url,
                progress,
                key_env=settings.key_env,
                leave_source=leave_source,
                source_url=source_database_url,
            ),
            "restore",
        )
    point = marker.get("recoveryPoint") or {}
    fence = marker["sourceFence"]
    rows = [
        ("restore", marker["restoreId"]),
        ("into", without_password(url)),
        ("backup", f"{marker['backupId']} (snapshot taken {_when(marker['backupTakenAtMs'])})"),
        ("recovery point (final hyperblock)", point.get("finalHyperblock", "none")),
        ("in flight at the backup", marker.get("inFlightAtBackup")),
        ("source database", f"{fence['state']}: {fence['detail']}"),
        ("next", "start a host on it: it reconciles with the chain before it co-signs"),
    ]
    console.print(key_value_table("gasless restore", rows))
    if fence["state"] == "unreachable":
        console.print(
            "[yellow]the source database could not be retired:[/yellow] make sure no host serves on it; the "
            "restored host also waits for the chain to show no other co-signer"
        )
    typer.echo(json.dumps(marker, separators=(",", ":")))


def restore_report_command(
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """What a restored database's first start found on the chain: the relays beyond the backup's recovery
    point, recovered as intents (unbilled), and any it could not rebuild."""
    from sqlalchemy import select

    from gasless.db import create_engine, intents
    from gasless.db.backup import read_meta, sqlite_path
    from gasless.db.restore import RESTORE_KEY

    settings = _settings(config, database_url)
    url = settings.effective_database_url
    if url.startswith("sqlite") and not sqlite_path(url).is_file():
        fail(f"{sqlite_path(url)}: no such database file")

    async def read() -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
        marker = await read_meta(url, RESTORE_KEY)
        if marker is None:
            return None, [], []
        engine = create_engine(url)
        try:
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(
                            intents.c.sender,
                            intents.c.nonce,
                            intents.c.tx_hash,
                            intents.c.relayer,
                            intents.c.state,
                            intents.c.outcome,
                            intents.c.executed_block_ts_ms,
                        )
                        .where(intents.c.request_id == marker.get("restoreId"))
                        .order_by(intents.c.pk)
                    )
                ).all()
                held = await held_rows(conn, marker)
        finally:
            await engine.dispose()
        return marker, [dict(row._mapping) for row in rows], held

    try:
        marker, recovered, held = asyncio.run(read())
    except Exception as exc:  # noqa: BLE001 - an operator command: the reason, not a traceback
        fail(f"{exc}", EXIT_FAILED, label="cannot read the database")
    if marker is None:
        fail("this database is not a restore (no restore marker)", EXIT_FAILED, label="restore-report")
    point = marker.get("recoveryPoint") or {}
    scanned = marker.get("scanned") or {}
    settlement = marker.get("settlement") or {}
    hold = settlement.get("hold") or {}
    rows = [
        ("restore", marker.get("restoreId")),
        ("state", marker.get("state")),
        ("backup snapshot taken", _when(marker.get("backupTakenAtMs"))),
        ("recovery point (final hyperblock)", point.get("finalHyperblock", "none")),
        ("restored", _when(marker.get("restoredAtMs"))),
        ("reconciled", _when(marker.get("reconciledAtMs"))),
        ("hyperblocks read", f"{scanned.get('fromHyperblock', '-')}..{scanned.get('toHyperblock', '-')}"),
        ("backup's co-signed intents found on chain", marker.get("cosignedFoundOnChain", "-")),
        ("relays beyond the backup, recovered (unbilled)", len(recovered)),
        ("relays beyond the backup, not rebuilt", len(marker.get("notRebuilt") or [])),
        ("source database", (marker.get("sourceFence") or {}).get("state")),
        ("last settlement batch in the backup", settlement.get("lastBatchAtBackup", "-")),
        (
            "settlement batches beyond it on chain",
            ", ".join(str(b["batchId"]) for b in settlement.get("onChain") or []) or "-",
        ),
        (
            "matched (usage rows marked settled)",
            f"{settlement.get('matched', '-')} ({settlement.get('rowsMarkedSettled', 0)} rows)",
        ),
        ("unmatched", settlement.get("unmatched", "-")),
        (
            "usage rows held out of settlement",
            _hold_line(hold, len(held)) if hold else "none",
        ),
    ]
    console.print(key_value_table("gasless restore report", rows))
    if recovered:
        print_records(
            console,
            "relays beyond the backup (recovered from the chain)",
            ("txHash", "sender", "nonce", "relayer", "state", "outcome"),
            [
                (r["tx_hash"], r["sender"], r["nonce"], r["relayer"], r["state"], r["outcome"])
                for r in recovered
            ],
        )
    if held:
        print_records(
            console,
            "usage rows held out of settlement (an unmatched batch on chain may cover them)",
            ("txHash", "account", "billingClass", "ru", "executedBlockTsMs"),
            [
                (r["tx_hash"], r["account"], r["billing_class"], r["ru"], r["executed_block_ts_ms"])
                for r in held
            ],
        )
    if marker.get("state") == "pending":
        console.print("[yellow]not reconciled yet:[/yellow] start a host on this database")
    document = {"restore": marker, "recovered": recovered, "held": held}
    typer.echo(json.dumps(document, separators=(",", ":"), default=str))


def _hold_line(hold: dict[str, Any], count: int) -> str:
    scope = (
        f"{count} now: rows of the backup's intents executed before {_when(hold.get('executedBeforeMs'))} "
        f"(batches {hold.get('batches')} on chain could not be matched)"
    )
    if hold.get("releasedAtMs"):
        return f"released {_when(hold['releasedAtMs'])}; {scope}"
    return f"{scope}; gasless admin restore-hold --release settles them"


async def held_rows(conn: Any, marker: dict[str, Any]) -> list[dict[str, Any]]:
    """The usage rows the restore's settlement hold keeps out of batches now (released or not)."""
    from sqlalchemy import select

    from gasless.db import usage_ledger
    from gasless.settlement.repository import held

    hold = (marker.get("settlement") or {}).get("hold")
    if not hold:
        return []
    rows = await conn.execute(
        select(
            usage_ledger.c.tx_hash,
            usage_ledger.c.account,
            usage_ledger.c.billing_class,
            usage_ledger.c.ru,
            usage_ledger.c.payg_micro,
            usage_ledger.c.executed_block_ts_ms,
        )
        .where(usage_ledger.c.billed.is_(True), usage_ledger.c.batch_id.is_(None), held(hold))
        .order_by(usage_ledger.c.terminal_at_ms, usage_ledger.c.tx_hash)
    )
    return [dict(row._mapping) for row in rows]


def restore_hold_command(
    release: Annotated[
        bool,
        typer.Option(
            "--release",
            help="Lift the hold: the held rows go into the next settlement batch (only once the old hosts' "
            "batches are known not to hold them).",
        ),
    ] = False,
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """The usage rows a restore held out of settlement (the contract holds batches after the backup it could
    not match to them); with --release, settle them in the next batch."""
    from sqlalchemy import update

    from gasless.db import begin_write, create_engine, service_meta
    from gasless.db.backup import sqlite_path
    from gasless.db.restore import RESTORE_KEY
    from gasless.settlement.repository import restore_marker

    settings = _settings(config, database_url)
    url = settings.effective_database_url
    if url.startswith("sqlite") and not sqlite_path(url).is_file():
        fail(f"{sqlite_path(url)}: no such database file")

    async def run() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        engine = create_engine(url)
        try:
            async with begin_write(engine) as conn:
                marker = await restore_marker(conn)
                hold = ((marker or {}).get("settlement") or {}).get("hold")
                if marker is None or not hold:
                    return marker, []
                held = await held_rows(conn, marker)
                if release and not hold.get("releasedAtMs"):
                    hold["releasedAtMs"] = int(datetime.now(UTC).timestamp() * 1000)
                    await conn.execute(
                        update(service_meta)
                        .where(service_meta.c.key == RESTORE_KEY)
                        .values(value=marker, updated_at_ms=hold["releasedAtMs"])
                    )
                return marker, held
        finally:
            await engine.dispose()

    try:
        marker, held = asyncio.run(run())
    except Exception as exc:  # noqa: BLE001 - an operator command: the reason, not a traceback
        fail(f"{exc}", EXIT_FAILED, label="cannot read the database")
    hold = ((marker or {}).get("settlement") or {}).get("hold")
    if marker is None or not hold:
        fail("this database holds no usage out of settlement", EXIT_FAILED, label="restore-hold")
    console.print(key_value_table("gasless restore hold", [("held", _hold_line(hold, len(held)))]))
    typer.echo(json.dumps({"hold": hold, "held": held}, separators=(",", ":"), default=str))


def migrate_command(
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Run the schema migrations this release ships (every host also runs them at start). Migrations are
    expand-only with respect to the previous release, which keeps serving on the migrated database."""
    from gasless.db import create_engine
    from gasless.db.backup import without_password
    from gasless.db.migrate import current_revision, head_revision, upgrade

    settings = _settings(config, database_url)
    url = settings.effective_database_url

    async def run() -> tuple[str | None, str | None]:
        engine = create_engine(url)
        try:
            before = await current_revision(engine)
            with console.status(f"migrating {without_password(url)} to {head_revision()}"):
                await upgrade(engine)
            return before, await current_revision(engine)
        finally:
            await engine.dispose()

    try:
        before, after = asyncio.run(run())
    except Exception as exc:  # noqa: BLE001
        fail(f"{exc}", EXIT_FAILED, label="migration failed")
    rows = [
        ("database", without_password(url)),
        ("revision before", before or "none (empty)"),
        ("revision now", after),
        ("this release's head", head_revision()),
    ]
    console.print(key_value_table("gasless migrate", rows))
    typer.echo(json.dumps({"from": before, "to": after, "head": head_revision()}))


def register(admin_app: typer.Typer) -> None:
    admin_app.command("backup")(backup_command)
    admin_app.command("restore")(restore_command)
    admin_app.command("restore-report")(restore_report_command)
    admin_app.command("restore-hold")(restore_hold_command)
    admin_app.command("migrate")(migrate_command)
