"""Run localnet: one simulated network served by one or more gateways (each with its own faults)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

from aiohttp import web

from gasless.localnet.admin import (
    FAULTS_KEY,
    INFO_KEY,
    RNG_KEY,
    GatewayFaults,
    add_admin_routes,
    fault_middleware,
)
from gasless.localnet.chain import ChainConfig, LocalChain
from gasless.localnet.gateway import CHAIN_KEY, add_routes
from gasless.localnet.genesis import Genesis, apply_genesis

MAX_BODY_BYTES = 64 * 1024 * 1024  # send-multiple batches can be large


def build_gateway_app(chain: LocalChain, info: dict[str, Any]) -> web.Application:
    app = web.Application(middlewares=[fault_middleware], client_max_size=MAX_BODY_BYTES)
    app[CHAIN_KEY] = chain
    app[FAULTS_KEY] = GatewayFaults()
    app[RNG_KEY] = random.Random(0)
    app[INFO_KEY] = info
    add_routes(app)
    add_admin_routes(app)
    return app


class Localnet:
    """A running local network: the chain, its genesis, its round clock and its gateways."""

    def __init__(
        self,
        *,
        data_dir: Path,
        payment_token: str,
        config: ChainConfig | None = None,
        auto_rounds: bool = True,
    ) -> None:
        self.chain = LocalChain(config)
        self.genesis: Genesis = apply_genesis(self.chain, data_dir / "wallets", payment_token)
        self.info = self.genesis.info(self.chain)
        self.auto_rounds = auto_rounds
        self.apps: list[web.Application] = []
        self._runners: list[web.AppRunner] = []
        self._round_task: asyncio.Task[None] | None = None
        self.urls: list[str] = []

    async def start(self, host: str = "127.0.0.1", ports: list[int] | None = None) -> list[str]:
        """Serve one gateway per port (0 picks a free port); returns their base URLs."""
        for port in ports or [0]:
            app = build_gateway_app(self.chain, self.info)
            # Stop promptly even while a fault holds a request (a held send waits up to minutes).
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
            # Registered before it binds: `stop` releases it even when the start fails or is cancelled.
            self._runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            self.apps.append(app)
            self.urls.append(f"http://{host}:{bound}")
        self.info["gateways"] = list(self.urls)
        if self.auto_rounds:
            self._round_task = asyncio.create_task(self.chain.run(), name="localnet-rounds")
        return self.urls

    async def stop(self) -> None:
        if self._round_task is not None:
            self._round_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._round_task
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def __aenter__(self) -> Localnet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
