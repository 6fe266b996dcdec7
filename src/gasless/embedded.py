"""The embedded default: localnet + SQLite + the API host(s), all on loopback, data under one directory."""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gasless.app import create_app
from gasless.localnet.chain import ChainConfig
from gasless.localnet.owner import unpause
from gasless.localnet.server import Localnet
from gasless.settings import LOCALNET_PAYMENT_TOKEN, Settings


@dataclass
class EmbeddedOptions:
    data_dir: Path
    api_port: int = 8080
    localnet_port: int = 7950
    round_ms: int = 600
    host: str = "127.0.0.1"


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


async def start_localnet(options: EmbeddedOptions) -> Localnet:
    localnet = Localnet(
        data_dir=options.data_dir / "localnet",
        payment_token=LOCALNET_PAYMENT_TOKEN,
        config=ChainConfig(round_ms=options.round_ms),
    )
    await localnet.start(options.host, [options.localnet_port])
    # Deployed paused, like the real contract; the owner unpauses it with a real transaction.
    await unpause(localnet.urls[0], localnet.genesis.owner, localnet.info["contract"])
    return localnet


def embedded_settings(options: EmbeddedOptions, localnet: Localnet) -> Settings:
    info = localnet.info
    return Settings(
        profile="localnet",
        host_id="a",
        master_secret=local_master_secret(options.data_dir),
        gateway_urls=localnet.urls,
        data_dir=options.data_dir,
        api_host=options.host,
        api_port=options.api_port,
        contract_address=info.get("contract"),
        pair_address=info.get("pair"),
        wrapper_address=info.get("wrapper"),
        api_base_url=f"http://{options.host}:{options.api_port}",
        app_origin=f"http://{options.host}:{options.api_port}",
        relayer_key_files=[wallet.path for wallet in localnet.genesis.relayers],
    )


async def serve_api(settings: Settings, *, log_level: str = "warning") -> None:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
    )
    await uvicorn.Server(config).serve()


async def run_embedded(options: EmbeddedOptions, on_ready: object = None) -> None:
    """Start localnet, then the API; stop both on Ctrl-C or SIGTERM."""
    localnet = await start_localnet(options)
    try:
        settings = embedded_settings(options, localnet)
        if callable(on_ready):
            on_ready(settings, localnet)
        await serve_api(settings)
    finally:
        with contextlib.suppress(Exception):
            await localnet.stop()
