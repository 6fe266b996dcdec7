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
import os
import secrets
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import uvicorn
from sqlalchemy.engine import make_url

from gasless.app import create_app
from gasless.db import create_engine, current_revision
from gasless.host import HostState
from gasless.localnet.chain import ChainConfig
from gasless.localnet.owner import unpause
from gasless.localnet.server import Localnet
from gasless.metrics import admin_app
from gasless.settings import LOCALNET_PAYMENT_TOKEN, HostId, Settings

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
    fresh: bool = False  # a new chain and a new SQLite database (see reset_database)

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
    path.write_text(value + "\n")
    path.chmod(0o600)
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
    await localnet.start(options.host, [options.localnet_port])
    if not localnet.resumed:
        # Deployed paused, like the real contract; the owner unpauses it with a real transaction. A resumed
        # chain keeps the pause flags it had.
        await unpause(localnet.urls[0], localnet.genesis.owner, localnet.info["contract"])
    return localnet


def embedded_settings(options: EmbeddedOptions, localnet: Localnet, index: int = 0) -> Settings:
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
        "contract_address": info.get("contract"),
        "pair_address": info.get("pair"),
        "wrapper_address": info.get("wrapper"),
        "api_base_url": f"http://{options.host}:{port}",
        # One app origin for the deployment: a native-auth token made for it works on either host.
        "app_origin": first,
        "relayer_key_files": [wallet.path for wallet in localnet.genesis.relayers],
        "owner_key_file": localnet.genesis.owner.path,  # settles usage batches on localnet
    }
    if options.database_url:
        values["database_url"] = options.database_url
    if options.redis_url:
        values["redis_url"] = options.redis_url
    return Settings(**values)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `serve_hosts` stops every server on one signal."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


def _bind(host: str, port: int) -> socket.socket | None:
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
        return sock
    except OSError as exc:
        # Metrics are not worth refusing traffic for; the scraper reports the target down.
        log.error("metrics listener not started", address=f"{host}:{port}", error=str(exc))
        return None


def _servers(
    settings: Settings, log_level: str
) -> tuple[HostState, list[tuple[uvicorn.Server, list[socket.socket] | None]]]:
    app = create_app(settings)
    api = _Server(
        uvicorn.Config(
            app,
            host=settings.api_host,
            port=settings.api_port,
            log_level=log_level,
            log_config=None,  # uvicorn's records go through our logging pipeline (JSON, redacted)
            access_log=False,  # the metrics middleware writes the access log
            lifespan="on",
        )
    )
    servers: list[tuple[uvicorn.Server, list[socket.socket] | None]] = [(api, None)]
    if settings.metrics_port:
        sock = _bind(settings.metrics_host, settings.metrics_port)
        if sock is not None:
            registry = app.state.host.metrics.registry
            admin = _Server(
                uvicorn.Config(
                    admin_app(registry),
                    log_level=log_level,
                    log_config=None,
                    access_log=False,
                    lifespan="off",
                )
            )
            servers.append((admin, [sock]))
            log.info(
                "metrics listener",
                host_id=settings.host_id,
                url=f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
            )
    return app.state.host, servers


async def serve_hosts(hosts: Sequence[Settings], *, log_level: str = "warning") -> None:
    """Serve each host's API and admin port until SIGINT/SIGTERM (a second signal forces the exit).

    A host that refuses its chain (gasless.chain.identity) stops every server: ServiceRefused."""
    built = [_servers(settings, log_level) for settings in hosts]
    states = [state for state, _ in built]
    servers = [server for _, host_servers in built for server in host_servers]

    def stop_all() -> None:
        for server, _ in servers:
            if server.should_exit:
                server.force_exit = True
            server.should_exit = True

    loop = asyncio.get_running_loop()
    installed: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop_all)
            installed.append(sig)
    tasks = [asyncio.create_task(server.serve(sockets)) for server, sockets in servers]
    refusals = [asyncio.create_task(state.refused.wait()) for state in states]
    try:
        # One server ending (a signal, a failed start) or one host refusing ends them all.
        await asyncio.wait([*tasks, *refusals], return_when=asyncio.FIRST_COMPLETED)
        stop_all()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for waiter in refusals:
            waiter.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
    refused = next((state for state in states if state.refusal is not None), None)
    if refused is not None:
        assert refused.refusal is not None
        raise ServiceRefused(refused.refusal, refused.settings.effective_database_url)


async def serve_api(settings: Settings, *, log_level: str = "warning") -> None:
    await serve_hosts([settings], log_level=log_level)


async def run_embedded(
    options: EmbeddedOptions, on_ready: Callable[[list[Settings], Localnet], None] | None = None
) -> None:
    """Start localnet, then the API host(s); stop everything on Ctrl-C or SIGTERM."""
    check_embedded(options)
    await check_fresh(options)
    localnet = await start_localnet(options)  # holds the data directory's chain from here
    try:
        if options.fresh:
            reset_database(options.effective_database_url)
        hosts = [embedded_settings(options, localnet, index) for index in range(options.hosts)]
        if on_ready is not None:
            on_ready(hosts, localnet)
        await serve_hosts(hosts)
    finally:
        with contextlib.suppress(Exception):
            await localnet.stop()
