"""The `gasless` command."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import click
import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from gasless.cli.admin import register as register_admin
from gasless.cli.agents import register as register_agents
from gasless.cli.auth import auth_app
from gasless.cli.common import EXIT_FAILED, EXIT_USAGE, fail, invalid_settings, one_line
from gasless.cli.keys import register as register_keys
from gasless.cli.output import CliConsole
from gasless.cli.purchases import register as register_purchases
from gasless.cli.relay import relay_app
from gasless.cli.signals import StopRequested, run_until_stopped, stop_exit_code
from gasless.cli.x402 import x402_app
from gasless.core.logs import configure_logging
from gasless.core.loop_watch import settle_heap

# `gasless --help` lists the commands by what they are for, in this order (each command's panel).
PANELS: dict[str, tuple[str, ...]] = {
    "Serving": ("up", "serve", "localnet", "status-site", "mcp"),
    "Paying": ("pricing", "buy", "deposit", "flags", "senders", "x402"),
    "Relaying": ("relay",),
    "Reading": ("auth", "errors", "verify-proof"),
    "Operating": ("admin", "keys"),
}
ORDER = [name for names in PANELS.values() for name in names]


class GroupedCommands(TyperGroup):
    """The top-level command: its subcommands listed in the order of PANELS."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))


app = typer.Typer(
    help="gasless: the gasless relaying service for MultiversX.",
    no_args_is_help=True,
    add_completion=False,
    cls=GroupedCommands,
)
console = CliConsole(stderr=True)

app.add_typer(relay_app, name="relay")
app.add_typer(auth_app, name="auth")
app.add_typer(x402_app, name="x402")
register_admin(app)  # gasless admin ..., gasless verify-proof
register_agents(app)  # gasless mcp
register_purchases(app)  # gasless pricing, buy, deposit, flags, senders
register_keys(app)  # gasless keys ... (docs/keys.md)


def run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a long-running command's coroutine until it returns or a signal stops it (then StopRequested
    is raised, once the coroutine has stopped what it started; see gasless.cli.signals). Servers run on
    uvloop (uvicorn's standard loop) where it exists."""
    # The database threads hand the GIL back and forth with the event loop many times per transaction;
    # at the default 5 ms switch interval each hand-over can wait that long behind a busy loop.
    sys.setswitchinterval(0.0005)
    settle_heap()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        run_until_stopped(main, asyncio.run)
        return
    run_until_stopped(main, uvloop.run)


def _stopped(stop: StopRequested) -> None:
    console.print(f"stopped ({stop})")


def _cannot_start(exc: Exception | str, code: int) -> NoReturn:
    """One line on stderr saying why and what to do, then the exit status."""
    console.print(f"[red]cannot start:[/red] {escape(str(exc))}")
    raise typer.Exit(code) from None


DataDir = Annotated[Path, typer.Option("--data-dir", help="Where wallets, the database and secrets live.")]


def _refused(reason: str, database: str, *, embedded: bool) -> NoReturn:
    """A host refused its chain (gasless.chain.identity): what differs, and what to do."""
    if embedded:
        advice = (
            "start over with `gasless up --fresh` (a new chain and a new database), or point --database-url "
            "at another database"
        )
    else:
        advice = "point GASLESS_DATABASE_URL at this chain's database or an empty one"
    _cannot_start(f"{reason} (database {_without_password(database)}): {advice}", 2)


def _print_embedded(hosts, localnet, status_url=None) -> None:  # type: ignore[no-untyped-def]
    first = hosts[0]
    storage = "SQLite" if first.effective_database_url.startswith("sqlite") else "PostgreSQL"
    title = f"gasless is up (localnet + {storage}, {len(hosts)} API host{'s' if len(hosts) > 1 else ''})"
    table = Table(title=title, show_lines=False)
    table.add_column("what")
    table.add_column("where", overflow="fold")
    for settings in hosts:
        base = settings.network.api_base_url
        table.add_row(f"API (host {settings.host_id})", base)
        table.add_row(f"health (host {settings.host_id})", f"{base}/healthz  {base}/readyz")
        if settings.metrics_port:
            table.add_row(
                f"metrics (host {settings.host_id})",
                f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
            )
    if status_url:
        table.add_row("status site", f"{status_url}  (feeds: {status_url}/feed/status.json)")
    if first.smtp_url is not None:
        table.add_row(
            "mail catcher", f"{first.smtp_url.get_secret_value()}  (mails: {first.data_dir / 'mail'})"
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
        from gasless.core.logs import Redactor

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
        int,
        typer.Option(
            "--metrics-port",
            envvar="GASLESS_METRICS_PORT",
            help="Admin port for /metrics (host b: + 1); 0 turns it off. In use: refused at start.",
        ),
    ] = 9108,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start over: a new chain and a new SQLite database (wallets and the master secret stay). "
            "Without it, a second start resumes both.",
        ),
    ] = False,
    status_port: Annotated[
        int,
        typer.Option(
            "--status-port",
            envvar="GASLESS_STATUS_PORT",
            help="The status site's port (its own process); 0: not started.",
        ),
    ] = 8090,
    mail_port: Annotated[
        int,
        typer.Option(
            "--mail-port",
            envvar="GASLESS_MAIL_PORT",
            help="The local mail catcher's SMTP port (notices and verification links land in "
            "--data-dir/mail, a Maildir); 0: not started (and no mail is sent).",
        ),
    ] = 1025,
) -> None:
    """Start the embedded default: localnet and the API host(s) on loopback, data under --data-dir."""
    from gasless.hosting.embedded import (
        EmbeddedConfigError,
        EmbeddedOptions,
        PortUnavailable,
        ServerFailed,
        ServiceRefused,
        check_embedded,
        embedded_listeners,
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
        # The hosts' settings would read it too; the listener is bound before they exist.
        metrics_host=os.environ.get("GASLESS_METRICS_HOST") or "127.0.0.1",
        fresh=fresh,
        status_port=status_port,
        mail_port=mail_port,
        dedicated_process=True,  # this process only serves
    )
    try:
        check_embedded(options)
        # Every port before anything starts: a clash is one line, not a host running without metrics.
        listeners = embedded_listeners(options)
    except (EmbeddedConfigError, PortUnavailable) as exc:
        _cannot_start(exc, 2)
    secret = os.environ.get("GASLESS_MASTER_SECRET") or local_master_secret(data_dir)
    configure_logging(json_lines=False, level="WARNING", secrets=[secret])
    console.print(f"starting localnet on port {localnet_port}, then the API (Ctrl-C stops at any moment)")
    try:
        run_service(
            lambda: run_embedded(
                options,
                listeners,
                on_ready=lambda hosts_, net: _print_embedded(hosts_, net, options.status_url),
                on_mail=lambda mail: console.print(
                    f"mail caught for {escape(', '.join(mail.envelope_to))}: {escape(mail.subject)} "
                    f"(read it in {escape(str(data_dir / 'mail'))})"
                ),
            )
        )
    except StopRequested as stop:
        _stopped(stop)
        raise
    except (PortUnavailable, EmbeddedConfigError, SavedChainError) as exc:  # found once starting
        _cannot_start(exc, 2)
    except ServiceRefused as exc:
        _refused(exc.reason, exc.database_url, embedded=True)
    except ServerFailed as exc:
        _cannot_start(exc, 1)


@app.command("status-site")
def status_site(
    feed_dir: Annotated[
        Path, typer.Option("--feed-dir", help="The API's feed directory (<data_dir>/status-feed).")
    ] = Path("var/status-feed"),
    port: Annotated[int, typer.Option("--port", help="The site's port.")] = 8090,
    host: Annotated[str, typer.Option("--host", help="The address to listen on.")] = "127.0.0.1",
    site_url: Annotated[str, typer.Option("--site-url", help="Public URL (links in the Atom feed).")] = "",
) -> None:
    """Serve the status site (the page and the feeds) from the published feed files only.

    A separate deployment: it keeps serving the last feeds when the API is down."""
    import uvicorn

    from gasless.hosting.embedded import PortUnavailable, check_port
    from gasless.statussite.app import create_status_site

    try:
        check_port(host, port, "the status site port", "pass --port with a free port")
    except PortUnavailable as exc:
        _cannot_start(exc, 2)
    console.print(f"status site on http://{host}:{port} (feeds from {feed_dir})")
    uvicorn.run(create_status_site(feed_dir, site_url=site_url), host=host, port=port, log_level="warning")


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
    from gasless.core.settings import LOCALNET_PAYMENT_TOKEN
    from gasless.hosting.embedded import PortUnavailable, check_port
    from gasless.localnet.chain import ChainConfig
    from gasless.localnet.persist import SavedChainError
    from gasless.localnet.server import Localnet

    ports = [port + i if port else 0 for i in range(gateways)]
    try:
        for each in ports:
            check_port("127.0.0.1", each, "the gateway port", "pass --port with free ports")
    except PortUnavailable as exc:
        _cannot_start(exc, 2)
    configure_logging(json_lines=False)

    async def main() -> None:
        net = Localnet(
            data_dir=data_dir / "localnet",
            payment_token=LOCALNET_PAYMENT_TOKEN,
            config=ChainConfig(round_ms=round_ms),
            fresh=fresh,
            settle_heap=True,  # a process of its own: nothing else's objects are frozen with the chain's
        )
        try:
            try:
                urls = await net.start("127.0.0.1", ports)
            except OSError as exc:  # taken since it was checked
                raise PortUnavailable(
                    f"a gateway port cannot be bound ({exc.strerror}): pass --port"
                ) from None
            for url in urls:
                console.print(f"localnet gateway: {url}  (admin: {url}/localnet/info)")
            console.print(f"owner wallet: {net.info['ownerPem']}")
            state = "resumed" if net.resumed else "new"
            console.print(f"chain: {state}, saved in {data_dir / 'localnet' / 'chain'}")
            await asyncio.Event().wait()  # until a signal cancels this
        finally:
            await net.stop()

    try:
        run_service(main)
    except StopRequested as stop:
        _stopped(stop)
        raise
    except (PortUnavailable, SavedChainError) as exc:
        _cannot_start(exc, 2)


class Network(StrEnum):
    """`gasless serve --network`: the settings profile (GASLESS_PROFILE)."""

    mainnet = "mainnet"
    devnet = "devnet"
    localnet = "localnet"


def _missing_settings(profile: str, missing: list[tuple[str, str]]) -> NoReturn:
    """Every setting a mainnet or devnet host lacks (Settings.missing_for_production), in one line; 2."""
    listed = "; ".join(f"{env} ({what})" for env, what in missing)
    fail(
        f"the {profile} profile needs {len(missing)} setting{'s' if len(missing) > 1 else ''} not set or "
        f"not usable: {listed}. Set each in the environment, or in the --config TOML file by its field "
        "name (the variable's name without GASLESS_, in lower case)",
        EXIT_USAGE,
        label="cannot start",
    )


@app.command()
def serve(
    network: Annotated[
        Network | None,
        typer.Option(
            "--network",
            help="The network profile (as GASLESS_PROFILE, which it overrides). Off localnet the host "
            "refuses to start until every setting the network needs is set (docs/deploy.md).",
        ),
    ] = None,
    host_id: Annotated[str | None, typer.Option("--host-id", help="a or b.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="API port.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML settings file.")] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="API worker processes behind the one API port (more than 1 needs PostgreSQL and Redis; "
            "worker k serves metrics on the metrics port + k).",
        ),
    ] = 1,
    # Set by the parent of `--workers N` on each worker (gasless.cli.api_workers); not for people.
    worker: Annotated[int | None, typer.Option("--worker", hidden=True)] = None,
    reuse_port: Annotated[bool, typer.Option("--reuse-port", hidden=True)] = False,
    metrics_fd: Annotated[int | None, typer.Option("--metrics-fd", hidden=True)] = None,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", hidden=True)] = None,
    parent_fd: Annotated[int | None, typer.Option("--parent-fd", hidden=True)] = None,
    ready_wait_s: Annotated[float, typer.Option("--ready-wait-s", hidden=True)] = 0.0,
) -> None:
    """Run the API alone against the configured gateways and database (GASLESS_* settings)."""
    from gasless.cli.api_workers import adopt_socket, watch_parent, worker_socket
    from gasless.core.settings import MAX_WORKERS, Settings
    from gasless.hosting.embedded import (
        Listeners,
        PortUnavailable,
        ServerFailed,
        ServiceRefused,
        host_listeners,
        local_master_secret,
        serve_api,
    )

    overrides: dict[str, object] = {}
    if network is not None:
        overrides["profile"] = network.value
    if host_id is not None:
        overrides["host_id"] = host_id
    if port is not None:
        overrides["api_port"] = port
    if worker is not None:
        overrides["worker"] = worker
    if metrics_port is not None:
        overrides["metrics_port"] = metrics_port
    try:
        # Off localnet, a missing master secret is listed with everything else missing (below).
        settings = Settings.load(config_file=config, defer_production_check=True, **overrides)
        missing = settings.missing_for_production()
        if missing:
            _missing_settings(settings.profile, missing)
        if settings.master_secret is None:
            if not settings.effective_database_url.startswith("sqlite"):
                raise ValueError(
                    "hosts sharing a database must share one master secret (a lease minted on one host is "
                    "verified on the other): set GASLESS_MASTER_SECRET (>= 32 characters) on every host"
                )
            # localnet on SQLite: one secret per data directory, so leases survive a restart.
            overrides["master_secret"] = local_master_secret(settings.data_dir)
            settings = Settings.load(config_file=config, **overrides)
        if workers > 1:
            if workers > MAX_WORKERS:
                raise ValueError(f"--workers is at most {MAX_WORKERS}")
            if settings.effective_database_url.startswith("sqlite") or not settings.redis_url:
                raise ValueError(
                    "--workers above 1 needs PostgreSQL (GASLESS_DATABASE_URL) and Redis (GASLESS_REDIS_URL): "
                    "the workers share them as two hosts do; SQLite has one writer"
                )
    except ValueError as exc:
        invalid_settings(exc)
    assert settings.master_secret is not None
    configure_logging(
        json_lines=True, level=settings.log_level, secrets=[settings.master_secret.get_secret_value()]
    )
    if workers > 1:
        _serve_workers(settings, workers, host_id, config, network)
        return
    if reuse_port:  # a worker of `--workers N`: its own socket on the port; the parent bound metrics
        metrics = adopt_socket(metrics_fd) if metrics_fd is not None else None
        try:
            api = worker_socket(settings.api_host, settings.api_port)
        except OSError as exc:
            _cannot_start(f"the API port {settings.api_host}:{settings.api_port}: {exc}", 1)
        listeners = Listeners(api, metrics)
    else:
        try:
            listeners = host_listeners(settings)
        except PortUnavailable as exc:
            _cannot_start(exc, 2)

    async def main() -> None:
        if parent_fd is not None:
            watch_parent(parent_fd)
        await serve_api(
            settings,
            listeners,
            log_level=settings.log_level.lower(),
            ready_wait_s=ready_wait_s,
            dedicated_process=True,  # this process only serves
        )

    try:
        run_service(main)
    except ServiceRefused as exc:
        _refused(exc.reason, exc.database_url, embedded=False)
    except ServerFailed as exc:
        _cannot_start(exc, 1)


def _serve_workers(
    settings: Any, workers: int, host_id: str | None, config: Path | None, network: Network | None = None
) -> None:
    """`gasless serve --workers N`: bind the ports, then run and supervise the workers (gasless.cli.api_workers)."""
    from gasless.cli.api_workers import WorkerSupervisor, reserve_port, worker_command
    from gasless.hosting.embedded import PortUnavailable, listen

    try:
        api = reserve_port(settings.api_host, settings.api_port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        _cannot_start(
            f"the API port {settings.api_host}:{settings.api_port} is in use ({reason}): pass --port (or "
            "GASLESS_API_PORT) with a free port",
            2,
        )
    metrics: list[Any] = []
    for index in range(workers):
        sock = None
        if settings.metrics_port:
            try:
                sock = listen(
                    settings.metrics_host,
                    settings.metrics_port + index,
                    f"the metrics port of worker {index}",
                    "serving that worker without metrics",
                )
            except PortUnavailable as exc:  # as for one process: metrics never refuse traffic
                console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}")
        metrics.append(sock)
    port = api.getsockname()[1]
    command = worker_command(host_id, port, None if config is None else str(config))
    if network is not None:  # each worker loads the same profile
        command += ["--network", network.value]
    supervisor = WorkerSupervisor(command, metrics)
    status = 0

    async def main() -> None:
        nonlocal status
        status = await supervisor.run()

    try:
        # The parent runs no server: the standard loop (its child watcher) is all it needs.
        run_until_stopped(main, asyncio.run)
    finally:
        api.close()
        for sock in metrics:
            if sock is not None:
                sock.close()
    if status:
        _cannot_start("an API worker refused to start (its log says why)", status)


@app.command()
def errors(
    docs_url: Annotated[str, typer.Option("--docs-url", help="Base of the error reference pages.")] = (
        "https://docs.gasless.example"
    ),
) -> None:
    """Print the error catalogue as JSON (published as docs/errors.json)."""
    import json

    from gasless.core.errors import catalogue_document

    typer.echo(json.dumps(catalogue_document(docs_url), indent=2))


def _place_in_panels() -> None:
    """Put every command and command group in its panel of `gasless --help` (PANELS)."""
    panel_of = {name: panel for panel, names in PANELS.items() for name in names}
    for info in [*app.registered_commands, *app.registered_groups]:
        callback = getattr(info, "callback", None)
        name = info.name or (callback.__name__.replace("_", "-") if callback is not None else None)
        if name in panel_of:
            info.rich_help_panel = panel_of[name]


_place_in_panels()


def main() -> None:
    try:
        app()
    except SystemExit:
        # Typer turns an interrupt into 130; the status says which signal stopped the command.
        code = stop_exit_code()
        if code is not None:
            raise SystemExit(code) from None
        raise
    except StopRequested as stop:  # outside typer's reach (its own start-up)
        raise SystemExit(stop.exit_code) from None
    except Exception as exc:
        code = stop_exit_code()
        if code is not None:  # a signal that surfaced as another exception (gasless.cli.main's import)
            raise SystemExit(code) from None
        # Anything a command did not expect is still one line; GASLESS_DEBUG=1 keeps the traceback.
        if os.environ.get("GASLESS_DEBUG"):
            raise
        console.print(
            f"[red]error:[/red] {escape(type(exc).__name__)}: {escape(one_line(str(exc)))} "
            "(GASLESS_DEBUG=1 shows the traceback)"
        )
        raise SystemExit(EXIT_FAILED) from None
