"""The relayer set as the hot path sees it: state and funding per relayer, refreshed in the background.

The database row is the operator's word on a relayer's state (`active`, `draining`, `retired`); funding is
read from the chain. A relayer is assignable when it is active and funded. The hot path only reads the
in-memory copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.gateway import GatewayClient
from gasless.db import begin_write, dialect_insert, relayer_state_history, relayers
from gasless.signer import RelayerKey
from gasless.workers import cancel_and_wait

log = structlog.get_logger("gasless.relayers")


@dataclass(frozen=True)
class RelayerInfo:
    address: str
    shard: int
    state: str
    funded: bool
    balance_atto: int

    @property
    def assignable(self) -> bool:
        return self.state == "active" and self.funded


class RelayerPool:
    def __init__(
        self,
        engine: AsyncEngine,
        gateway: GatewayClient,
        keys: list[RelayerKey],
        *,
        min_balance_atto: int,
        refresh_ms: int = 5_000,
        chain_states: Callable[[Sequence[str]], Awaitable[dict[str, tuple[str, int]]]] | None = None,
    ) -> None:
        self.engine = engine
        self.gateway = gateway
        self.keys = {key.bech32: key for key in keys}
        self.min_balance_atto = min_balance_atto
        self.refresh_ms = refresh_ms
        self.chain_states = chain_states  # the contract's relayer states (the authority), when configured
        self._info: dict[str, RelayerInfo] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._register_keys()
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="relayer-pool")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _register_keys(self) -> None:
        now = int(time.time() * 1000)
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            for key in self.keys.values():
                result = await conn.execute(
                    insert(relayers)
                    .values(
                        address=key.bech32,
                        shard=key.shard,
                        state="active",
                        funded=False,
                        balance_atto=0,
                        created_at_ms=now,
                        updated_at_ms=now,
                    )
                    .on_conflict_do_nothing(index_elements=["address"])
                )
                if result.rowcount:
                    await conn.execute(
                        relayer_state_history.insert().values(
                            relayer_address=key.bech32,
                            from_state=None,
                            to_state="active",
                            reason="key loaded",
                            at_ms=now,
                        )
                    )

    async def refresh(self) -> None:
        """Re-read states (the contract's, written through to the database) and balances from the chain."""
        await self._follow_contract()
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(relayers))).all()
        states = {row.address: row for row in rows if row.address in self.keys}
        balances = await asyncio.gather(
            *(self._balance(address) for address in states), return_exceptions=True
        )
        now = int(time.time() * 1000)
        fresh: dict[str, RelayerInfo] = {}
        changed: list[RelayerInfo] = []
        for (address, row), balance in zip(states.items(), balances, strict=True):
            if isinstance(balance, BaseException):
                # Unknown balance: keep the last funding verdict rather than flapping on a gateway blip.
                funded, amount = bool(row.funded), int(row.balance_atto)
            else:
                funded, amount = balance >= self.min_balance_atto, balance
            info = RelayerInfo(address, int(row.shard), str(row.state), funded, amount)
            fresh[address] = info
            if funded != bool(row.funded) or amount != int(row.balance_atto):
                changed.append(info)
        self._info = fresh
        if changed:
            async with begin_write(self.engine) as conn:
                for info in changed:
                    await conn.execute(
                        update(relayers)
                        .where(relayers.c.address == info.address)
                        .values(
                            funded=info.funded,
                            balance_atto=info.balance_atto,
                            balance_checked_at_ms=now,
                            updated_at_ms=now,
                        )
                    )

    async def _follow_contract(self) -> None:
        """Write the contract's relayer states into the database rows (with a history entry per move), so
        every host and the registry agree with the chain. A contract that cannot be read keeps the rows."""
        if self.chain_states is None:
            return
        try:
            on_chain = await self.chain_states(sorted(self.keys))
        except Exception as exc:  # a gateway blip: the last known states stay in force
            log.warning("relayer states unreadable from the contract", error=type(exc).__name__)
            return
        async with self.engine.connect() as conn:
            rows = {row.address: row for row in (await conn.execute(select(relayers))).all()}
        moves = [
            (address, str(rows[address].state), state, since)
            for address, (state, since) in on_chain.items()
            if address in rows and state in ("active", "draining", "retired") and state != rows[address].state
        ]
        if not moves:
            return
        now = int(time.time() * 1000)
        async with begin_write(self.engine) as conn:
            for address, before, after, since in moves:
                result = await conn.execute(
                    update(relayers)
                    .where(relayers.c.address == address, relayers.c.state == before)
                    .values(state=after, updated_at_ms=now)
                )
                if result.rowcount:  # another host may have written the same move first
                    await conn.execute(
                        relayer_state_history.insert().values(
                            relayer_address=address,
                            from_state=before,
                            to_state=after,
                            reason="contract",
                            at_ms=since or now,
                        )
                    )

    async def _balance(self, address: str) -> int:
        account = await self.gateway.account(address)
        return int(account.get("balance", "0"))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_ms / 1000)
            try:
                await self.refresh()
            except Exception as exc:  # keep the last known set; the next refresh may succeed
                log.warning("relayer refresh failed", error=type(exc).__name__)

    def get(self, address: str) -> RelayerInfo | None:
        return self._info.get(address)

    def assignable(self, shard: int) -> list[RelayerInfo]:
        return sorted(
            (info for info in self._info.values() if info.shard == shard and info.assignable),
            key=lambda info: info.address,
        )

    def choose(self, sender_pubkey: bytes, shard: int) -> RelayerInfo | None:
        """A stable choice per sender, so one sender's intents share a relayer while it stays assignable."""
        candidates = self.assignable(shard)
        if not candidates:
            return None
        index = int.from_bytes(hashlib.sha256(sender_pubkey).digest()[:4], "big") % len(candidates)
        return candidates[index]

    def all(self) -> list[RelayerInfo]:
        return sorted(self._info.values(), key=lambda info: (info.shard, info.address))
