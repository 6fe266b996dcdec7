"""The registry read model: states from the database rows the relayer pool keeps in step with the contract
(the authority), assignability from the pool, statistics from this service's intents. No balance ever."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gasless.core.errors import ApiError
from gasless.registry.repository import RegistryRepository
from gasless.registry.schemas import (
    RelayerPublic,
    RelayerPublicDetail,
    RelayerRegistry,
    RelayerStateChange,
    RelayerStatistics,
)
from gasless.relay.relayers import RelayerPool

STATS_WINDOW_MS = 86_400_000


class RegistryService:
    def __init__(
        self, repo: RegistryRepository, pool: RelayerPool, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.repo = repo
        self.pool = pool
        self.clock = clock
        self.excluded_senders: tuple[str, ...] = ()  # the synthetic probe's accounts (never counted)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _entries(self) -> tuple[list[RelayerPublic], dict[str, list[Any]]]:
        now = self.now_ms()
        rows, history, stats = (
            await self.repo.rows(),
            await self.repo.history(),
            await self.repo.statistics(now - STATS_WINDOW_MS, self.excluded_senders),
        )
        by_relayer: dict[str, list[Any]] = {}
        for change in history:
            by_relayer.setdefault(change.relayer_address, []).append(change)
        entries = []
        for row in rows:
            info = self.pool.get(row.address)
            counts = stats.get(row.address)
            changes = by_relayer.get(row.address, [])
            entries.append(
                RelayerPublic(
                    address=row.address,
                    shard=int(row.shard),
                    state=row.state,
                    assignable=bool(info is not None and info.assignable),
                    stateSinceMs=int(changes[-1].at_ms) if changes else None,
                    statistics=RelayerStatistics(
                        windowMs=STATS_WINDOW_MS,
                        relays=int(counts[1]) if counts else 0,
                        executed=int(counts[2] or 0) if counts else 0,
                        failed=int(counts[3] or 0) if counts else 0,
                        dead=int(counts[4] or 0) if counts else 0,
                        lastRelayAtMs=int(counts[5]) if counts and counts[5] is not None else None,
                    ),
                )
            )
        return entries, by_relayer

    async def registry(self, shard: int | None, state: str | None) -> RelayerRegistry:
        entries, _ = await self._entries()
        items = [
            e for e in entries if (shard is None or e.shard == shard) and (state is None or e.state == state)
        ]
        return RelayerRegistry(items=items)

    async def detail(self, address: str) -> RelayerPublicDetail:
        entries, history = await self._entries()
        entry = next((e for e in entries if e.address == address), None)
        if entry is None:
            raise ApiError("NOT_FOUND", detail=f"{address} is not a relayer of this service")
        return RelayerPublicDetail(
            **entry.model_dump(),
            stateHistory=[
                RelayerStateChange(
                    fromState=c.from_state, toState=c.to_state, atMs=int(c.at_ms), reason=c.reason
                )
                for c in history.get(address, [])
            ],
        )
