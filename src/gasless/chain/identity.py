"""The chain a service database belongs to, and the guard that refuses to serve it against another.

A database holds facts about one chain: intents with their transaction hashes and blocks, the contract
mirror's cursor, settlement batches. On a chain that was reset (a devnet is, from time to time) or that went
backwards (localnet restored from an older snapshot), those facts are false: serving them would answer for
transactions the chain does not know. So the first start against a database records the chain in
`chain_identity`: its chain id and genesis time (`erd_chain_id` and `erd_start_time` of
`GET /network/config`, which every gateway serves) and the highest final hyperblock seen with its hash, which
every host advances while it runs (every RECORD_EVERY_MS, and at stop). Every later start compares:

- another chain id or genesis time: another chain;
- the recorded hyperblock with another hash, or not reached within CATCH_UP_ROUNDS rounds (a gateway's
  observer may lag a little behind the one that answered before): the chain went backwards or was replaced.

On a mismatch the host refuses to start (`gasless.hosting.app`): readiness stays 503 with the reason, the relay
routes answer 503, and no worker that acts on the database's state runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.addresses import METACHAIN
from gasless.chain.gateway import GatewayClient
from gasless.chain.network import NetworkView
from gasless.db import begin_write, chain_identity, dialect_insert

CATCH_UP_ROUNDS = 20
RECORD_EVERY_MS = 5_000

log = structlog.get_logger("gasless.chain")


@dataclass(frozen=True)
class ChainIdentity:
    chain_id: str
    start_time_ms: int
    final_nonce: int  # highest final hyperblock seen
    final_hash: str


class ChainMismatch(Exception):
    """The gateways serve another chain than the one the database was written against."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _moment(ms: int) -> str:
    when = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{when} (erd_start_time {ms // 1000})"


class ChainIdentityRepository:
    """The `chain_identity` row."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def load(self) -> ChainIdentity | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(chain_identity).where(chain_identity.c.id == 1))).first()
        if row is None:
            return None
        return ChainIdentity(row.chain_id, row.start_time_ms, row.final_nonce, row.final_hash)

    async def create(self, identity: ChainIdentity, now_ms: int) -> ChainIdentity:
        """Record `identity` unless a row exists (another host was first); returns the stored row."""
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)(chain_identity).values(
                id=1,
                chain_id=identity.chain_id,
                start_time_ms=identity.start_time_ms,
                final_nonce=identity.final_nonce,
                final_hash=identity.final_hash,
                recorded_at_ms=now_ms,
                updated_at_ms=now_ms,
            )
            await conn.execute(insert.on_conflict_do_nothing(index_elements=[chain_identity.c.id]))
        stored = await self.load()
        assert stored is not None
        return stored

    async def advance(self, nonce: int, block_hash: str, now_ms: int) -> None:
        """Move the highest final hyperblock seen forward (never back: hosts advance it concurrently)."""
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(chain_identity)
                .where(chain_identity.c.id == 1, chain_identity.c.final_nonce < nonce)
                .values(final_nonce=nonce, final_hash=block_hash, updated_at_ms=now_ms)
            )


class ChainGuard:
    """Verifies the chain against the database at start, then records its progress while the host runs."""

    def __init__(
        self,
        repo: ChainIdentityRepository,
        gateway: GatewayClient,
        network: NetworkView,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.repo = repo
        self.gateway = gateway
        self.network = network
        self._clock = clock
        self._recorded = -1
        self._recorded_at_ms = 0

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _final_nonce(self) -> int:
        nonce = self.network.meta_highest_final_nonce
        return nonce if nonce is not None else 0

    async def _hash(self, nonce: int) -> str:
        block = await self.gateway.block_by_nonce(METACHAIN, nonce)
        return str(block["hash"]).lower()

    async def verify(self, waiting: Callable[[str], None] = lambda _: None) -> ChainIdentity:
        """The database's chain identity, recorded now on a first start; ChainMismatch when the gateways
        serve another chain. `waiting` hears why it waits (a lagging gateway)."""
        params = self.network.params
        stored = await self.repo.load()
        if stored is None:
            nonce = self._final_nonce()
            seen = ChainIdentity(params.chain_id, params.start_time_ms, nonce, await self._hash(nonce))
            stored = await self.repo.create(seen, self._now_ms())
            log.info("chain identity recorded", chain_id=stored.chain_id, start_time_ms=stored.start_time_ms)
        if (stored.chain_id, stored.start_time_ms) != (params.chain_id, params.start_time_ms):
            raise ChainMismatch(
                f"the database was written against chain {stored.chain_id!r} started {_moment(stored.start_time_ms)}, "
                f"and the gateways serve chain {params.chain_id!r} started {_moment(params.start_time_ms)}"
            )
        await self._reach(stored.final_nonce, params.round_duration_ms, waiting)
        found = await self._hash(stored.final_nonce)
        if found != stored.final_hash:
            raise ChainMismatch(
                f"the chain was replaced or restored from an older state: the database saw final hyperblock "
                f"{stored.final_nonce} with hash {stored.final_hash}, and the gateways' chain has hash {found} there"
            )
        self._recorded = stored.final_nonce
        return stored

    async def _reach(self, nonce: int, round_ms: int, waiting: Callable[[str], None]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_ROUNDS * round_ms / 1000
        while (current := self._final_nonce()) < nonce:
            if loop.time() >= deadline:
                raise ChainMismatch(
                    f"the chain went backwards: the database saw final hyperblock {nonce}, and the gateways' "
                    f"chain is at {current} (not reached within {CATCH_UP_ROUNDS} rounds)"
                )
            waiting(
                f"chain: waiting for final hyperblock {nonce} seen before (the gateways are at {current})"
            )
            await asyncio.sleep(max(0.05, round_ms / 2000))

    async def record(self) -> None:
        """Advance the recorded final hyperblock to the newest one the network view knows."""
        nonce = self._final_nonce()
        if nonce <= self._recorded:
            return
        await self.repo.advance(nonce, await self._hash(nonce), self._now_ms())
        self._recorded = nonce
        self._recorded_at_ms = self._now_ms()

    async def on_poll(self) -> None:
        """A network poll callback: records at most every RECORD_EVERY_MS."""
        if self._now_ms() - self._recorded_at_ms >= RECORD_EVERY_MS:
            await self.record()
