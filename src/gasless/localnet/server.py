"""Run localnet: one simulated network served by one or more gateways (each with its own faults).

The chain is saved under `<data_dir>/chain/` (`gasless.localnet.persist`): at start, every
`snapshot_interval_s` right after a round, and at stop; a new `Localnet` on the same directory resumes it
(`fresh=True` starts a new chain instead).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from gasless.core.workers import cancel_and_wait, wait_event
from gasless.localnet.admin import (
    FAULTS_KEY,
    INFO_KEY,
    REQUESTS_KEY,
    RNG_KEY,
    GatewayFaults,
    add_admin_routes,
    fault_middleware,
)
from gasless.localnet.chain import ChainConfig, LocalChain
from gasless.localnet.envelope import CHAIN_KEY
from gasless.localnet.gateway import add_routes
from gasless.localnet.genesis import Genesis, apply_genesis, genesis_facts, resume_genesis
from gasless.localnet.persist import ChainStore, SavedChainError, config_difference

MAX_BODY_BYTES = 64 * 1024 * 1024  # send-multiple batches can be large
SNAPSHOT_INTERVAL_S = 5.0

log = structlog.get_logger("gasless.localnet")


def build_gateway_app(chain: LocalChain, info: dict[str, Any]) -> web.Application:
    app = web.Application(middlewares=[fault_middleware], client_max_size=MAX_BODY_BYTES)
    app[CHAIN_KEY] = chain
    app[FAULTS_KEY] = GatewayFaults()
    app[RNG_KEY] = random.Random(0)
    app[INFO_KEY] = info
    app[REQUESTS_KEY] = Counter()
    add_routes(app)
    add_admin_routes(app)
    return app


@dataclass(frozen=True)
class SnapshotTiming:
    """The last snapshot: time on the event loop (the head), time in the writer thread (the new history, and
    writing), bytes written."""

    take_ms: float
    write_ms: float
    bytes: int


class Localnet:
    """A running local network: the chain, its genesis, its round clock, its gateways and its saved copy.

    With `persist` (the default) the chain of `data_dir` is resumed when one was saved (SavedChainError when it
    cannot be: another process runs it, another format, another configuration or other wallets), else a new
    one starts from genesis; `fresh` forgets the saved chain first. `stop()` saves it and releases it.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        payment_token: str,
        config: ChainConfig | None = None,
        auto_rounds: bool = True,
        persist: bool = True,
        fresh: bool = False,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
        settle_heap: bool = False,
    ) -> None:
        config = config or ChainConfig()
        wallets = data_dir / "wallets"
        self.store = ChainStore(data_dir / "chain") if persist else None
        self.resumed = False
        if self.store is None:
            self.chain = LocalChain(config)
            self.genesis: Genesis = apply_genesis(self.chain, wallets, payment_token)
        else:
            self.store.lock()
            try:
                if fresh:
                    self.store.clear()
                saved = self.store.load()
                if saved is None:
                    self.chain = LocalChain(config)
                    self.genesis = apply_genesis(self.chain, wallets, payment_token)
                else:
                    self.chain = saved.chain
                    self.genesis = self._resume(saved.chain, saved.genesis, config, payment_token)
                    self.resumed = True
            except BaseException:
                self.store.unlock()
                raise
        self.info = self.genesis.info(self.chain)
        self.info["resumed"] = self.resumed
        self.auto_rounds = auto_rounds
        self.snapshot_interval_s = snapshot_interval_s
        self.settle_heap = settle_heap
        self.last_snapshot: SnapshotTiming | None = None
        self.apps: list[web.Application] = []
        self._runners: list[web.AppRunner] = []
        self._round_task: asyncio.Task[None] | None = None
        self._persist_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._save_lock = asyncio.Lock()
        self.urls: list[str] = []

    def _resume(
        self, chain: LocalChain, facts: dict[str, Any], config: ChainConfig, payment_token: str
    ) -> Genesis:
        assert self.store is not None
        where = self.store.directory
        if facts["paymentToken"] != payment_token:
            raise SavedChainError(
                f"the chain saved in {where} pays in {facts['paymentToken']}, not {payment_token}: start a new "
                "chain with --fresh"
            )
        difference = config_difference(chain.config, config)
        if difference is not None:
            hint = (
                f" (--round-ms {chain.config.round_ms})" if chain.config.round_ms != config.round_ms else ""
            )
            raise SavedChainError(
                f"the chain saved in {where} was created with another configuration: {difference}; resume it "
                f"with the same settings{hint}, or start a new chain with --fresh"
            )
        genesis = resume_genesis(chain, where.parent / "wallets", payment_token, facts["wegldToken"])
        if genesis_facts(genesis) != facts:
            raise SavedChainError(
                f"the wallets in {where.parent / 'wallets'} are not the ones the chain saved in {where} was "
                "created with: put them back, or start a new chain with --fresh"
            )
        chain.resume_clock()
        return genesis

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
        if self.store is not None:
            await self.save()  # the chain exists on disk from the start: a crash resumes this very chain
            self._persist_task = asyncio.create_task(self._persist(), name="localnet-snapshots")
        if self.auto_rounds:
            self._round_task = asyncio.create_task(self.chain.run(), name="localnet-rounds")
        return self.urls

    async def stop(self) -> None:
        """Stop producing and serving, then save the chain and release it."""
        self._stopping.set()
        for task in (self._persist_task, self._round_task):
            if task is not None and not task.done():
                if task is self._round_task:
                    await cancel_and_wait(task)
                else:
                    await task  # the snapshot task ends by itself: never cut a write short
        self._persist_task = self._round_task = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self.store is not None:
            try:
                await self.save()
            finally:
                self.store.unlock()

    async def save(self) -> SnapshotTiming:
        """Snapshot the chain now: the head serialized on the loop (consistent), the rest in a thread."""
        assert self.store is not None
        async with self._save_lock:
            started = time.perf_counter()
            snapshot = self.store.take(self.chain, genesis_facts(self.genesis))
            taken = time.perf_counter()
            written = await asyncio.to_thread(self.store.write, snapshot)
            timing = SnapshotTiming(
                take_ms=(taken - started) * 1000,
                write_ms=(time.perf_counter() - taken) * 1000,
                bytes=written,
            )
        self.last_snapshot = timing
        return timing

    async def _persist(self) -> None:
        """Every `snapshot_interval_s`, right after a round (the round clock keeps its pace), until stop."""
        while not self._stopping.is_set():
            if await wait_event(self._stopping, self.snapshot_interval_s):
                return
            round_done = asyncio.ensure_future(self.chain.next_round())
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait(
                {round_done, stopping}, timeout=self.snapshot_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
            round_done.cancel()
            stopping.cancel()
            if self._stopping.is_set():
                return
            try:
                await self.save()
            except Exception as exc:  # noqa: BLE001 - a failed write is retried at the next snapshot
                assert self.store is not None
                log.error("localnet snapshot failed", directory=str(self.store.directory), error=repr(exc))
                continue
            if self.settle_heap:
                # The chain is kept whole in memory and its history never changes: frozen out of the cyclic
                # collector's reach, a full collection walks what came since the last snapshot instead of
                # the whole chain. Unfrozen, an hour at 100 tx/s made full collections that stalled every
                # gateway answer for hundreds of ms, longer as the chain grew (docs/localnet.md).
                gc.collect()  # what is garbage already goes now, not frozen for good
                gc.freeze()

    async def __aenter__(self) -> Localnet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
