"""`gasless admin incident ...`: an operator declares, updates, resolves and lists public incidents.

The commands write to the service database of the settings (`--config`, `GASLESS_*` variables,
`--database-url`), the one the API hosts serve `GET /v1/incidents` from; the hosts publish each change to
their account streams within a second. The database must have been migrated (start the service once).
The result goes to stdout: a table, or with `--json` the incident as one JSON line (one line per incident
for `list`) and nothing else, for scripts; errors go to stderr. Exit 0 on success, 1 when the change was
refused (unknown incident, resolved is final, ...), 2 on invalid settings.
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

from gasless.cli.common import invalid_settings, refused
from gasless.cli.output import CliConsole, key_value_table, print_records

incident_app = typer.Typer(
    help="Declare, update, resolve and list public incidents (in the service database).",
    no_args_is_help=True,
)
console = CliConsole(stderr=True)  # errors
out = CliConsole()  # results
T = TypeVar("T")

STATUSES = ("investigating", "identified", "monitoring", "resolved")
IMPACTS = ("none", "minor", "major", "critical")

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
DatabaseOption = Annotated[str | None, typer.Option("--database-url", help="The service database.")]
AsJson = Annotated[
    bool, typer.Option("--json", help="Print the incident as one JSON line on stdout, and nothing else.")
]


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        console.print(f"[red]{name} must be one of: {', '.join(allowed)}[/red]")
        raise typer.Exit(2)


def _run(config: Path | None, database_url: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(service)` against the configured database; ApiError and database errors exit 1."""
    from sqlalchemy.exc import SQLAlchemyError

    from gasless.core.errors import ApiError
    from gasless.core.settings import Settings
    from gasless.db import create_engine
    from gasless.incidents.repository import IncidentRepository
    from gasless.incidents.service import IncidentService

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
        refused(exc.code, exc.status, exc.detail or "", exc.details)
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


def _json_line(incident: Any) -> None:
    typer.echo(json.dumps(incident.model_dump(mode="json"), separators=(",", ":")))


def _show(incident: Any, headline: str, as_json: bool) -> None:
    if as_json:
        _json_line(incident)
        return
    out.print(headline)
    rows: list[tuple[str, Any]] = [
        ("id", incident.id),
        ("title", incident.title),
        ("status", incident.status),
        ("impact", incident.impact),
        ("shard", incident.shard),
        ("source", incident.source if incident.kind is None else f"{incident.source} ({incident.kind})"),
        ("created", _when(incident.createdAtMs)),
        ("resolved", _when(incident.resolvedAtMs)),
    ]
    rows += [
        (f"update {update.seq}", f"{_when(update.atMs)} {update.status}: {update.body}")
        for update in incident.updates
    ]
    out.print(key_value_table("incident", rows))


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
    as_json: AsJson = False,
) -> None:
    """Declare a new public incident (source `operator`)."""
    _choice("--impact", impact, IMPACTS)
    _choice("--status", status, STATUSES)
    incident = _run(
        config,
        database_url,
        lambda service: service.declare(title=title, body=body, impact=impact, shard=shard, status=status),
    )
    _show(incident, f"[green]incident opened[/green]: {incident.id}", as_json)


@incident_app.command("update")
def update_incident(
    incident_id: Annotated[str, typer.Argument(help="The incident (inc_...).")],
    status: Annotated[
        str, typer.Option("--status", help="investigating, identified, monitoring or resolved (final).")
    ],
    body: Annotated[str, typer.Option("--body", help="What the update says.")],
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
    as_json: AsJson = False,
) -> None:
    """Append an update to an open incident; `--status resolved` resolves it (resolved is final)."""
    _choice("--status", status, STATUSES)
    incident = _run(
        config, database_url, lambda service: service.post_update(incident_id, status=status, body=body)
    )
    _show(
        incident,
        f"[green]update {incident.updates[-1].seq} appended[/green]: {incident.id} is {incident.status}",
        as_json,
    )


@incident_app.command("list")
def list_incidents(
    status: Annotated[str | None, typer.Option("--status", help="Only incidents in this status.")] = None,
    shard: Annotated[
        int | None, typer.Option("--shard", min=0, max=2, help="Only incidents of this shard.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=200, help="How many, newest first.")] = 50,
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
    as_json: AsJson = False,
) -> None:
    """The newest incidents (open and resolved): a table, or one JSON line each with --json."""
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
    if as_json:
        for incident in incidents:
            _json_line(incident)
        return
    rows = [
        (
            incident.id,
            incident.status,
            incident.impact,
            incident.shard,
            incident.source if incident.kind is None else incident.kind,
            _when(incident.createdAtMs),
            _when(incident.resolvedAtMs),
            len(incident.updates),
            incident.title,
        )
        for incident in incidents
    ]
    columns = ("id", "status", "impact", "shard", "source", "created", "resolved", "updates", "title")
    print_records(out, f"incidents ({len(incidents)}, newest first)", columns, rows)
