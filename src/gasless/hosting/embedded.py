"""Serving API hosts, and the embedded default: localnet + the API host(s) on loopback, data in one directory.

One host runs on SQLite (the default). Two hosts (`gasless up --hosts 2`) need PostgreSQL: two processes
cannot share SQLite's single writer, and the hosts must share the database that holds intents, idempotency
keys and the singleton locks.

A second start on the same data directory resumes: localnet's chain is saved there, and the database knows
which chain it belongs to (a host refuses another one: `ServiceRefused`). `fresh` starts over: a new chain,
and a new SQLite database; a PostgreSQL database is never dropped (see `reset_database`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from sqlalchemy.engine import make_url

from gasless.core.metrics import admin_app
from gasless.core.settings import LOCALNET_PAYMENT_TOKEN, HostId, Settings
from gasless.db import create_engine, current_revision
from gasless.hosting.app import create_app
from gasless.hosting.host import HostState
from gasless.http.server import api_server_config
from gasless.localnet.chain import ChainConfig
from gasless.localnet.owner import unpause
from gasless.localnet.server import Localnet
from gasless.notifications.mail import CaughtMail, MailCatcher

log = structlog.get_logger("gasless.serve")

HOST_IDS: tuple[HostId, ...] = ("a", "b")


class EmbeddedConfigError(ValueError):
    """The embedded set-up cannot run as asked (the message says why and what to do)."""


class ServiceRefused(RuntimeError):
    """A host refused to start: its database belongs to another chain than the gateways serve."""

    def __init__(self, reason: str, database_url: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.database_url = database_url


@dataclass
class EmbeddedOptions:
    data_dir: Path
    api_port: int = 8080
    localnet_port: int = 7950
    round_ms: int = 600
    host: str = "127.0.0.1"
    hosts: int = 1
    database_url: str | None = None  # else GASLESS_DATABASE_URL, else SQLite under data_dir
    redis_url: str | None = None  # else GASLESS_REDIS_URL
    metrics_port: int = 9108  # host i serves its metrics on metrics_port + i; 0 turns them off
    metrics_host: str = "127.0.0.1"
    fresh: bool = False  # a new chain and a new SQLite database (see reset_database)
    status_port: int = 8090  # the status site (its own process, reading the feed files); 0: not started
    mail_port: int = 1025  # the local mail catcher (SMTP, mails kept under data_dir/mail); 0: not started
    dedicated_process: bool = False  # the process only serves these hosts (create_app): the CLI's

    @property
    def status_url(self) -> str | None:
        return f"http://{self.host}:{self.status_port}" if self.status_port else None

    @property
    def effective_database_url(self) -> str:
        explicit = self.database_url or os.environ.get("GASLESS_DATABASE_URL")
        return explicit or f"sqlite+aiosqlite:///{(self.data_dir / 'gasless.db').as_posix()}"


def local_master_secret(data_dir: Path) -> str:
    """The localnet environment's master secret, generated once per data directory (never logged)."""
    path = data_dir / "master-secret"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(48)
    # Whole or absent, never half-written (a signal may stop the start-up here), and 0600 from the start.
    partial = path.with_name(path.name + ".partial")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(value + "\n")
    os.replace(partial, path)
    return value


def check_embedded(options: EmbeddedOptions) -> None:
    """Refuse a set-up that cannot work, before anything starts."""
    if options.hosts not in (1, 2):
        raise EmbeddedConfigError("--hosts is 1 or 2 (hosts a and b)")
    if options.hosts > 1 and not options.effective_database_url.startswith("postgresql"):
        raise EmbeddedConfigError(
            "two hosts need PostgreSQL: SQLite has one writer and cannot be shared by two processes. "
            "Pass --database-url postgresql+asyncpg://user@host:5432/db (or set GASLESS_DATABASE_URL), "
            "and preferably --redis-url redis://host:6379/0."
        )


class PortUnavailable(ValueError):
    """A port the command was asked to listen on cannot be used (the message names it and the option)."""


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "is in use"
    if exc.errno == errno.EACCES:
        return "needs privileges"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "is not an address of this machine"
    return f"cannot be bound ({exc.strerror or exc})"


def listen(host: str, port: int, what: str, hint: str) -> socket.socket:
    """A listening socket on host:port, or PortUnavailable: `<what> <host>:<port> is in use: <hint>`."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise PortUnavailable(f"{what} {host}:{port} {_why(exc)}: {hint}") from None
    sock.setblocking(False)
    return sock


def check_port(host: str, port: int, what: str, hint: str) -> None:
    """PortUnavailable when another program listens on host:port (the server binds it itself later)."""
    if port:
        listen(host, port, what, hint).close()


@dataclass
class Listeners:
    """One host's sockets, bound before anything starts so a port in use is refused at once."""

    api: socket.socket
    metrics: socket.socket | None  # None: metrics off (or, for `serve`, not bound: logged)

    def close(self) -> None:
        for sock in (self.api, self.metrics):
            if sock is not None:
                sock.close()


LOCALNET_HINT = "pass --localnet-port with a free port"


def embedded_listeners(options: EmbeddedOptions) -> list[Listeners]:
    """Every host's API and metrics sockets (and a check of the localnet port): nothing has started yet."""
    bound: list[Listeners] = []
    try:
        for index in range(options.hosts):
            name = f"(host {HOST_IDS[index]})"
            api = listen(
                options.host, options.api_port + index, f"the API port {name}", "pass --port with a free port"
            )
            bound.append(Listeners(api, None))
            if options.metrics_port:
                bound[-1].metrics = listen(
                    options.metrics_host,
                    options.metrics_port + index,
                    f"the metrics port {name}",
                    "pass --metrics-port (or GASLESS_METRICS_PORT) with a free port, or 0 to turn metrics off",
                )
        check_port(options.host, options.localnet_port, "the localnet gateway port", LOCALNET_HINT)
        if options.status_port:
            check_port(
                options.host,
                options.status_port,
                "the status site port",
                "pass --status-port with a free port, or 0",
            )
        if options.mail_port:
            check_port(
                options.host,
                options.mail_port,
                "the mail catcher port",
                "pass --mail-port with a free port, or 0",
            )
    except PortUnavailable:
        for listeners in bound:
            listeners.close()
        raise
    return bound


def host_listeners(settings: Settings) -> Listeners:
    """`gasless serve`: the API port must be free; metrics are not worth refusing traffic for (logged)."""
    api = listen(
        settings.api_host,
        settings.api_port,
        "the API port",
        "pass --port (or GASLESS_API_PORT) with a free port",
    )
    metrics = None
    if settings.metrics_port:
        try:
            metrics = listen(
                settings.metrics_host, settings.metrics_port, "the metrics port", "serving without metrics"
            )
        except PortUnavailable as exc:
            # The scraper reports the target down; the API keeps serving.
            log.error("metrics listener not started", error=str(exc))
    return Listeners(api, metrics)


async def check_fresh(options: EmbeddedOptions) -> None:
    """`--fresh` never drops a PostgreSQL database (it may be shared, or hold more than gasless' tables): it
    refuses one that gasless already wrote to, before anything starts."""
    url = options.effective_database_url
    if not options.fresh or url.startswith("sqlite"):
        return
    engine = create_engine(url)
    try:
        revision = await current_revision(engine)
    except Exception as exc:  # unreachable, refused: --fresh must know what it would start on
        raise EmbeddedConfigError(
            f"--fresh cannot read the database given: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        await engine.dispose()
    if revision is not None:
        raise EmbeddedConfigError(
            "--fresh starts a new chain, and the PostgreSQL database given already holds gasless data, which "
            "gasless never drops: point --database-url at an empty database, or drop and recreate this one "
            "yourself first"
        )


def reset_database(url: str) -> None:
    """Delete the SQLite database file (with its WAL and shared-memory files) for `--fresh`."""
    if not url.startswith("sqlite"):
        return  # check_fresh made sure a PostgreSQL database holds nothing of gasless
    path = make_url(url).database
    if path and path != ":memory:":
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(path + suffix).unlink(missing_ok=True)


async def start_localnet(options: EmbeddedOptions) -> Localnet:
    localnet = Localnet(
        data_dir=options.data_dir / "localnet",
        payment_token=LOCALNET_PAYMENT_TOKEN,
        config=ChainConfig(round_ms=options.round_ms),
        fresh=options.fresh,
    )
    try:
        try:
            await localnet.start(options.host, [options.localnet_port])
        except OSError as exc:  # taken since embedded_listeners checked it
            raise PortUnavailable(
                f"the localnet gateway port {options.host}:{options.localnet_port} {_why(exc)}: {LOCALNET_HINT}"
            ) from None
        if not localnet.resumed:
            # Deployed paused, like the real contract; the owner unpauses it with a real transaction. A
            # resumed chain keeps the pause flags it had.
            await unpause(localnet.urls[0], localnet.genesis.owner, localnet.info["contract"])
    except BaseException:  # cancelled (a signal) or failed: release what started
        with contextlib.suppress(Exception):
            await localnet.stop()
        raise
    return localnet


PROBE_TIER, PROBE_MONTHS = 5, 12  # a large plan: three 1-RU transfers a minute


def probe_wallets(data_dir: Path) -> list[Any]:
    from gasless.localnet.genesis import load_or_create_wallet

    return [load_or_create_wallet(data_dir / "probe", f"probe-s{shard}", shard) for shard in range(3)]


async def grant_probe_plans(options: EmbeddedOptions, localnet: Localnet) -> None:
    """Give each probe account a plan (best effort: an account that has one already keeps it)."""
    from gasless.localnet.owner import owner_call

    contract = localnet.info.get("contract")
    if not contract:
        return
    for wallet in probe_wallets(options.data_dir):
        try:
            await owner_call(
                localnet.urls[0],
                localnet.genesis.owner,
                contract,
                "grant",
                [wallet.address, PROBE_TIER, PROBE_MONTHS],
            )
        except Exception as exc:  # e.g. a plan already runs (a resumed chain): the probe relays on it
            log.info("probe plan not granted", address=wallet.address.to_bech32(), reason=str(exc)[:120])


def embedded_settings(
    options: EmbeddedOptions, localnet: Localnet, index: int = 0, smtp_url: str | None = None
) -> Settings:
    """Settings of host `index` (0: a, 1: b). Both share the master secret, database and Redis."""
    info = localnet.info
    port = options.api_port + index
    first = f"http://{options.host}:{options.api_port}"
    values: dict[str, Any] = {
        "profile": "localnet",
        "host_id": HOST_IDS[index],
        # One secret for every host: a lease minted on a verifies on b.
        "master_secret": os.environ.get("GASLESS_MASTER_SECRET") or local_master_secret(options.data_dir),
        "gateway_urls": localnet.urls,
        "data_dir": options.data_dir,
        "api_host": options.host,
        "api_port": port,
        "metrics_port": options.metrics_port + index if options.metrics_port else 0,
        "metrics_host": options.metrics_host,
        "contract_address": info.get("contract"),
        "pair_address": info.get("pair"),
        "wrapper_address": info.get("wrapper"),
        "api_base_url": f"http://{options.host}:{port}",
        # One app origin for the deployment: a native-auth token made for it works on either host.
        "app_origin": first,
        "relayer_key_files": [wallet.path for wallet in localnet.genesis.relayers],
        "owner_key_file": localnet.genesis.owner.path,  # settles usage batches on localnet
        # The synthetic probe: one account per shard under <data_dir>/probe (granted a plan at start).
        "probe_enabled": True,
        "probe_key_files": [wallet.path for wallet in probe_wallets(options.data_dir)],
    }
    if smtp_url is not None:
        values["smtp_url"] = (
            smtp_url  # the local mail catcher: a newcomer reads the mails under data_dir/mail
        )
    if options.database_url:
        values["database_url"] = options.database_url
    if options.redis_url:
        values["redis_url"] = options.redis_url
    return Settings(**values)


# A stop waits this long for the responses under way (a relay takes well under a second; streams end at
# once), then cancels what is left: no request can hold a stop forever. A relay cancelled after its commit
# point is resumed by the next start, as after kill -9.
GRACEFUL_STOP_S = 10


class ServerFailed(RuntimeError):
    """A server of a host ended on its own (its application did not start)."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (`serve_hosts` stops every server when it is cancelled),
    telling when it listens, and failing with an exception instead of exiting the process."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        except SystemExit:  # uvicorn exits the process when the lifespan start-up fails
            raise ServerFailed("the application did not start (see the log above)") from None
        self.listening.set()


def _servers(
    settings: Settings, listeners: Listeners, log_level: str, ready_wait_s: float, dedicated_process: bool
) -> tuple[HostState, list[tuple[uvicorn.Server, list[socket.socket]]]]:
    app = create_app(settings, ready_wait_s=ready_wait_s, dedicated_process=dedicated_process)
    api = _Server(
        api_server_config(
            app,
            docs_url=settings.docs_url,
            log_level=log_level,
            log_config=None,  # uvicorn's records go through our logging pipeline (JSON, redacted)
            access_log=False,  # the metrics middleware writes the access log
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
        )
    )
    servers: list[tuple[uvicorn.Server, list[socket.socket]]] = [(api, [listeners.api])]
    if listeners.metrics is not None:
        registry = app.state.host.metrics.registry
        admin = _Server(
            uvicorn.Config(
                admin_app(registry),
                log_level=log_level,
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=GRACEFUL_STOP_S,
            )
        )
        servers.append((admin, [listeners.metrics]))
        log.info(
            "metrics listener",
            host_id=settings.instance_id,
            url=f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
        )
    return app.state.host, servers


async def serve_hosts(
    hosts: Sequence[tuple[Settings, Listeners]],
    *,
    log_level: str = "warning",
    on_listening: Callable[[], None] | None = None,
    ready_wait_s: float = 0.0,
    dedicated_process: bool = False,
) -> None:
    """Serve each host's API and admin port on its listeners until cancelled (the CLI cancels on SIGINT or
    SIGTERM) or until one server ends; every server shuts down cleanly either way. `on_listening` runs
    once all serve. A host that refuses its chain (gasless.chain.identity) stops every server:
    ServiceRefused. `ready_wait_s`, `dedicated_process`: see gasless.hosting.app.create_app (the CLI's process only
    serves)."""
    built = [
        _servers(settings, listeners, log_level, ready_wait_s, dedicated_process)
        for settings, listeners in hosts
    ]
    states = [state for state, _ in built]
    servers = [server for _, host_servers in built for server in host_servers]
    tasks = [asyncio.create_task(server.serve(sockets)) for server, sockets in servers]
    refusals = [asyncio.create_task(state.refused.wait()) for state in states]
    listening = asyncio.ensure_future(asyncio.gather(*(server.listening.wait() for server, _ in servers)))
    try:
        await asyncio.wait([listening, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if listening.done() and on_listening is not None:
            on_listening()
        # One server ending (a failed start) or one host refusing its chain ends them all.
        await asyncio.wait([*tasks, *refusals], return_when=asyncio.FIRST_COMPLETED)
    finally:
        listening.cancel()
        for waiter in refusals:
            waiter.cancel()
        for state in states:
            state.begin_stop()  # open streams end: uvicorn's stop waits for every open response
        for server, _ in servers:
            server.should_exit = True
        # Not gather: a cancelled gather would cancel the servers mid-shutdown.
        await asyncio.wait(tasks)
    refused = next((state for state in states if state.refusal is not None), None)
    if refused is not None:
        assert refused.refusal is not None
        raise ServiceRefused(refused.refusal, refused.settings.effective_database_url)
    for task in tasks:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def serve_api(
    settings: Settings,
    listeners: Listeners,
    *,
    log_level: str = "warning",
    ready_wait_s: float = 0.0,
    dedicated_process: bool = False,
) -> None:
    try:
        await serve_hosts(
            [(settings, listeners)],
            log_level=log_level,
            ready_wait_s=ready_wait_s,
            dedicated_process=dedicated_process,
        )
    finally:
        listeners.close()


async def start_status_site(options: EmbeddedOptions, feed_dir: Path) -> asyncio.subprocess.Process | None:
    """The status site as its own process (`gasless status-site`), reading the hosts' feed directory."""
    if not options.status_port:
        return None
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gasless.cli",
        "status-site",
        "--feed-dir",
        str(feed_dir),
        "--port",
        str(options.status_port),
        "--host",
        options.host,
        stdout=asyncio.subprocess.DEVNULL,
    )


async def stop_process(process: asyncio.subprocess.Process | None) -> None:
    """Stop and reap a child: SIGTERM, then SIGKILL after 10 s."""
    if process is None or process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        async with asyncio.timeout(10):  # not wait_for: see gasless.core.workers.wait_event
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def start_mail_catcher(
    options: EmbeddedOptions, on_mail: Callable[[CaughtMail], None] | None
) -> MailCatcher | None:
    """The local mail catcher (a real SMTP server in this process): every mail lands in data_dir/mail."""
    if not options.mail_port:
        return None
    catcher = MailCatcher(host=options.host, port=options.mail_port, maildir=options.data_dir / "mail")
    catcher.on_mail = on_mail
    await catcher.start()
    return catcher


async def run_embedded(
    options: EmbeddedOptions,
    listeners: list[Listeners],
    on_ready: Callable[[list[Settings], Localnet], None] | None = None,
    on_mail: Callable[[CaughtMail], None] | None = None,
) -> None:
    """Start localnet, then the API host(s) on `listeners` (`embedded_listeners`), and serve until
    cancelled; whatever started is stopped on the way out, whenever the cancellation comes. `on_ready`
    runs once every host listens."""
    try:
        check_embedded(options)
        await check_fresh(options)
        localnet = await start_localnet(options)  # holds the data directory's chain from here
        try:
            if options.fresh:
                reset_database(options.effective_database_url)
            await grant_probe_plans(options, localnet)
            catcher = await start_mail_catcher(options, on_mail)
            smtp_url = catcher.url if catcher is not None else None
            hosts = [embedded_settings(options, localnet, index, smtp_url) for index in range(options.hosts)]
            site = await start_status_site(options, hosts[0].effective_status_feed_dir)
            try:
                await serve_hosts(
                    list(zip(hosts, listeners, strict=True)),
                    dedicated_process=options.dedicated_process,
                    on_listening=(lambda: on_ready(hosts, localnet)) if on_ready is not None else None,
                )
            finally:
                await stop_process(site)
                if catcher is not None:
                    await catcher.stop()
        finally:
            with contextlib.suppress(Exception):
                await localnet.stop()
    finally:
        for bound in listeners:
            bound.close()
