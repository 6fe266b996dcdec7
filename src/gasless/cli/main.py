"""The `gasless` command."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gasless.cli.admin import register as register_admin
from gasless.cli.relay import relay_app
from gasless.logs import configure_logging

app = typer.Typer(
    help="gasless: the gasless relaying service for MultiversX.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

app.add_typer(relay_app, name="relay")
register_admin(app)  # gasless admin ..., gasless verify-proof


def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Long-running servers run on uvloop (uvicorn's standard loop) where it exists."""
    # The database threads hand the GIL back and forth with the event loop many times per transaction;
    # at the default 5 ms switch interval each hand-over can wait that long behind a busy loop.
    sys.setswitchinterval(0.0005)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        asyncio.run(main)
        return
    uvloop.run(main)


DataDir = Annotated[Path, typer.Option("--data-dir", help="Where wallets, the database and secrets live.")]


def cannot_start(reason: str) -> typer.Exit:
    """One line on stderr saying why and what to do; exit status 2."""
    console.print(f"[red]cannot start:[/red] {escape(reason)}", soft_wrap=True)
    return typer.Exit(2)


def refused(reason: str, database: str, *, embedded: bool) -> typer.Exit:
    """A host refused its chain (gasless.chain.identity): what differs, and what to do."""
    if embedded:
        advice = (
            "start over with `gasless up --fresh` (a new chain and a new database), or point --database-url "
            "at another database"
        )
    else:
        advice = "point GASLESS_DATABASE_URL at this chain's database or an empty one"
    return cannot_start(f"{reason} (database {_without_password(database)}): {advice}")


def _print_embedded(hosts, localnet) -> None:  # type: ignore[no-untyped-def]
    first = hosts[0]
    storage = "SQLite" if first.effective_database_url.startswith("sqlite") else "PostgreSQL"
    title = f"gasless is up (localnet + {storage}, {len(hosts)} API host{'s' if len(hosts) > 1 else ''})"
    table = Table(title=title, show_lines=False)
    table.add_column("what")
    table.add_column("where")
    for settings in hosts:
        base = settings.network.api_base_url
        table.add_row(f"API (host {settings.host_id})", base)
        table.add_row(f"health (host {settings.host_id})", f"{base}/healthz  {base}/readyz")
        if settings.metrics_port:
            table.add_row(
                f"metrics (host {settings.host_id})",
                f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
            )
    for url in localnet.urls:
        table.add_row("localnet gateway", url)
    table.add_row("localnet admin", f"{localnet.urls[0]}/localnet/info")
    table.add_row("chain id", first.network.chain_id)
    table.add_row("database", _without_password(first.effective_database_url))
    if first.redis_url:
        table.add_row("redis", _without_password(first.redis_url))
    info = localnet.info
    table.add_row("billing contract", str(info.get("contract")))
    table.add_row("owner wallet", info["ownerPem"])
    for relayer in info["relayers"]:
        table.add_row(f"relayer (shard {relayer['shard']})", relayer["pem"])
    for user in info["users"]:
        table.add_row(f"demo user (shard {user['shard']})", user["pem"])
    console.print(table)
    console.print("Press Ctrl-C to stop.")


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a database URL shape (e.g. redis): mask by pattern instead
        from gasless.logs import Redactor

        return Redactor().text(url)


@app.command()
def up(
    port: Annotated[int, typer.Option("--port", help="API port (host b: port + 1).")] = 8080,
    localnet_port: Annotated[int, typer.Option("--localnet-port", help="localnet gateway port.")] = 7950,
    data_dir: DataDir = Path("var"),
    round_ms: Annotated[int, typer.Option("--round-ms", help="localnet round duration.")] = 600,
    hosts: Annotated[
        int, typer.Option("--hosts", help="API hosts: 1, or 2 (a and b; needs PostgreSQL).")
    ] = 1,
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", help="postgresql+asyncpg://... (default: SQLite in --data-dir)."),
    ] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", help="redis://host:6379/0")] = None,
    metrics_port: Annotated[
        int, typer.Option("--metrics-port", help="Admin port for /metrics (host b: + 1); 0 turns it off.")
    ] = 9108,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start over: a new chain and a new SQLite database (wallets and the master secret stay). "
            "Without it, a second start resumes both.",
        ),
    ] = False,
) -> None:
    """Start the embedded default: localnet and the API host(s) on loopback, data under --data-dir."""
    import os

    from gasless.embedded import (
        EmbeddedConfigError,
        EmbeddedOptions,
        ServiceRefused,
        check_embedded,
        local_master_secret,
        run_embedded,
    )
    from gasless.localnet.persist import SavedChainError

    options = EmbeddedOptions(
        data_dir=data_dir,
        api_port=port,
        localnet_port=localnet_port,
        round_ms=round_ms,
        hosts=hosts,
        database_url=database_url,
        redis_url=redis_url,
        metrics_port=metrics_port,
        fresh=fresh,
    )
    try:
        check_embedded(options)
    except EmbeddedConfigError as exc:
        raise cannot_start(str(exc)) from None
    secret = os.environ.get("GASLESS_MASTER_SECRET") or local_master_secret(data_dir)
    configure_logging(json_lines=False, level="WARNING", secrets=[secret])
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_service(run_embedded(options, on_ready=_print_embedded))
    except (EmbeddedConfigError, SavedChainError) as exc:
        raise cannot_start(str(exc)) from None
    except ServiceRefused as exc:
        raise refused(exc.reason, exc.database_url, embedded=True) from None


@app.command()
def localnet(
    port: Annotated[int, typer.Option("--port", help="Gateway port.")] = 7950,
    data_dir: DataDir = Path("var"),
    round_ms: Annotated[int, typer.Option("--round-ms", help="Round duration in ms.")] = 600,
    gateways: Annotated[int, typer.Option("--gateways", help="How many gateways (consecutive ports).")] = 1,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh", help="Start a new chain (the wallets stay). Without it, the saved one resumes."
        ),
    ] = False,
) -> None:
    """Run the local network alone (gateway REST API + admin API under /localnet/)."""
    from gasless.localnet.chain import ChainConfig
    from gasless.localnet.persist import SavedChainError
    from gasless.localnet.server import Localnet
    from gasless.settings import LOCALNET_PAYMENT_TOKEN

    configure_logging(json_lines=False)

    async def main() -> None:
        net = Localnet(
            data_dir=data_dir / "localnet",
            payment_token=LOCALNET_PAYMENT_TOKEN,
            config=ChainConfig(round_ms=round_ms),
            fresh=fresh,
        )
        urls = await net.start("127.0.0.1", [port + i if port else 0 for i in range(gateways)])
        for url in urls:
            console.print(f"localnet gateway: {url}  (admin: {url}/localnet/info)")
        console.print(f"owner wallet: {net.info['ownerPem']}")
        state = "resumed" if net.resumed else "new"
        console.print(f"chain: {state}, saved in {data_dir / 'localnet' / 'chain'}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await net.stop()

    try:
        run_service(main())
    except SavedChainError as exc:
        raise cannot_start(str(exc)) from None


@app.command()
def serve(
    host_id: Annotated[str | None, typer.Option("--host-id", help="a or b.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="API port.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML settings file.")] = None,
) -> None:
    """Run the API alone against the configured gateways and database (GASLESS_* settings)."""
    from gasless.embedded import ServiceRefused, local_master_secret, serve_api
    from gasless.settings import Settings

    overrides: dict[str, object] = {}
    if host_id is not None:
        overrides["host_id"] = host_id
    if port is not None:
        overrides["api_port"] = port
    try:
        settings = Settings.load(config_file=config, **overrides)
        if settings.master_secret is None:
            if not settings.effective_database_url.startswith("sqlite"):
                raise ValueError(
                    "hosts sharing a database must share one master secret (a lease minted on one host is "
                    "verified on the other): set GASLESS_MASTER_SECRET (>= 32 characters) on every host"
                )
            # localnet on SQLite: one secret per data directory, so leases survive a restart.
            overrides["master_secret"] = local_master_secret(settings.data_dir)
            settings = Settings.load(config_file=config, **overrides)
    except ValueError as exc:
        console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from None
    assert settings.master_secret is not None
    configure_logging(
        json_lines=True, level=settings.log_level, secrets=[settings.master_secret.get_secret_value()]
    )
    try:
        run_service(serve_api(settings, log_level=settings.log_level.lower()))
    except ServiceRefused as exc:
        raise refused(exc.reason, exc.database_url, embedded=False) from None


@app.command()
def errors(
    docs_url: Annotated[str, typer.Option("--docs-url", help="Base of the error reference pages.")] = (
        "https://docs.gasless.example"
    ),
) -> None:
    """Print the error catalogue as JSON (published as docs/errors.json)."""
    import json

    from gasless.errors import catalogue_document

    typer.echo(json.dumps(catalogue_document(docs_url), indent=2))


def main() -> None:
    app()
