"""`gasless admin incident ...`: an operator declares, updates, resolves and lists public incidents.

The commands write to the service database of the settings (`--config`, `GASLESS_*` variables,
`--database-url`), the one the API hosts serve `GET /v1/incidents` from; the hosts publish each change to
their account streams within a second. The database must have been migrated (start the service once).
Human output goes to stderr (rich), the incident as JSON to stdout (for scripts). Exit 0 on success,
1 when the change was refused (unknown incident, resolved is final, ...), 2 on invalid settings.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from gasless.cli.common import invalid_settings
from gasless.cli.output import CliConsole

incident_app = typer.Typer(
    help="Declare, update, resolve and list public incidents (in the service database).",
    no_args_is_help=True,
)
console = CliConsole(stderr=True)
T = TypeVar("T")

STATUSES = ("investigating", "identified", "monitoring", "resolved")
IMPACTS = ("none", "minor", "major", "critical")

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
DatabaseOption = Annotated[str | None, typer.Option("--database-url", help="The service database.")]


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        console.print(f"[red]{name} must be one of: {', '.join(allowed)}[/red]")
        raise typer.Exit(2)


def _run(config: Path | None, database_url: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(service)` against the configured database; ApiError and database errors exit 1."""
    from sqlalchemy.exc import SQLAlchemyError

    from gasless.db import create_engine
    from gasless.errors import ApiError
    from gasless.incidents.repository import IncidentRepository
    from gasless.incidents.service import IncidentService
    from gasless.settings import Settings

    overrides: dict[str, Any] = {"database_url": database_url} if database_url else {}
    try:
        settings = Settings.load(config_file=config, **overrides)
    except ValueError as exc:
        invalid_settings(exc)

    async def main() -> T:
        engine = create_engine(settings.effective_database_url)
        try:
            return await work(IncidentService(IncidentRepository(engine)))
        finally:
            await engine.dispose()

    try:
        return asyncio.run(main())
    except ApiError as exc:
        console.print(f"[red]refused:[/red] [bold]{exc.code}[/bold] {escape(exc.detail or '')}")
        raise typer.Exit(1) from None
    except SQLAlchemyError as exc:
        console.print(
            f"[red]database error:[/red] {escape(str(exc.orig if hasattr(exc, 'orig') else exc))[:300]} "
            "(is this the service database, migrated by a host that has started?)"
        )
        raise typer.Exit(1) from None


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _show(incident: Any) -> None:
    table = Table(title=f"incident {incident.id}", show_header=False)
    for key, value in (
        ("title", incident.title),
        ("status", incident.status),
        ("impact", incident.impact),
        ("shard", "-" if incident.shard is None else str(incident.shard)),
        ("source", incident.source if incident.kind is None else f"{incident.source} ({incident.kind})"),
        ("created", _when(incident.createdAtMs)),
        ("resolved", _when(incident.resolvedAtMs)),
    ):
        table.add_row(key, escape(value))
    for update in incident.updates:
        table.add_row(f"update {update.seq}", escape(f"{_when(update.atMs)} {update.status}: {update.body}"))
    console.print(table)
    typer.echo(json.dumps(incident.model_dump(mode="json"), separators=(",", ":")))


@incident_app.command("open")
def open_incident(
    title: Annotated[str, typer.Option("--title", help="What is affected, in a line.")],
    body: Annotated[str, typer.Option("--body", help="The first update: what is known now.")],
    impact: Annotated[str, typer.Option("--impact", help="none, minor, major or critical.")] = "minor",
    shard: Annotated[
        int | None, typer.Option("--shard", min=0, max=2, help="0, 1 or 2 when one shard is concerned.")
    ] = None,
    status: Annotated[
        str, typer.Option("--status", help="investigating, identified or monitoring.")
    ] = "investigating",
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Declare a new public incident (source `operator`)."""
    _choice("--impact", impact, IMPACTS)
    _choice("--status", status, STATUSES)
    incident = _run(
        config,
        database_url,
        lambda service: service.declare(title=title, body=body, impact=impact, shard=shard, status=status),
    )
    console.print(f"[green]incident opened[/green]: {incident.id}")
    _show(incident)


@incident_app.command("update")
def update_incident(
    incident_id: Annotated[str, typer.Argument(help="The incident (inc_...).")],
    status: Annotated[
        str, typer.Option("--status", help="investigating, identified, monitoring or resolved (final).")
    ],
    body: Annotated[str, typer.Option("--body", help="What the update says.")],
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """Append an update to an open incident; `--status resolved` resolves it (resolved is final)."""
    _choice("--status", status, STATUSES)
    incident = _run(
        config, database_url, lambda service: service.post_update(incident_id, status=status, body=body)
    )
    console.print(
        f"[green]update {incident.updates[-1].seq} appended[/green]: {incident.id} is {incident.status}"
    )
    _show(incident)


@incident_app.command("list")
def list_incidents(
    status: Annotated[str | None, typer.Option("--status", help="Only incidents in this status.")] = None,
    shard: Annotated[
        int | None, typer.Option("--shard", min=0, max=2, help="Only incidents of this shard.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200, help="How many, newest first.")] = 50,
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """The newest incidents (open and resolved) as a table."""
    from gasless.incidents.service import to_incident

    _choice("--status", status, STATUSES)

    async def read(service: Any) -> list[Any]:
        rows = await service.repo.page(
            shard=shard,
            status=status,
            from_ms=None,
            to_ms=None,
            now_ms=service.now_ms(),
            after=None,
            limit=limit,
        )
        return [to_incident(row) for row in rows]

    incidents = _run(config, database_url, read)
    table = Table(title=f"incidents ({len(incidents)}, newest first)")
    for column in ("id", "status", "impact", "shard", "source", "created", "resolved", "updates", "title"):
        table.add_column(column)
    for incident in incidents:
        table.add_row(
            incident.id,
            incident.status,
            incident.impact,
            "-" if incident.shard is None else str(incident.shard),
            incident.source if incident.kind is None else incident.kind,
            _when(incident.createdAtMs),
            _when(incident.resolvedAtMs),
            str(len(incident.updates)),
            escape(incident.title),
        )
    console.print(table)
    for incident in incidents:
        typer.echo(json.dumps(incident.model_dump(mode="json"), separators=(",", ":")))
