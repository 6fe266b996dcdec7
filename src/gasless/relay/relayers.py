"""The relayer set as the hot path sees it: state and funding per relayer, refreshed in the background.

The database row is the operator's word on a relayer's state (`active`, `draining`, `retired`); funding is
read from the chain. A relayer is assignable when it is active and funded: its balance, less the fees of
its intents co-signed and not executed yet (on every host), is at least the floor
(`GASLESS_RELAYER_MIN_BALANCE_ATTO`). A co-signature on this host counts at once (`note_cosigned`), so a
burst between two refreshes cannot spend a relayer past its floor unseen. The hot path only reads the
in-memory copy.

The spend rate is measured from balance deltas: every refresh reads each balance, and the drops over the
last hour (a top-up is not spending) divided by the time covered give the EGLD paid per hour, whoever
relayed (every host's relays, after the network's gas refunds). From it, the time left until the balance
reaches the floor (docs/keys.md, "Relayer funds and rotation").
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.gateway import GatewayClient
from gasless.core.workers import cancel_and_wait
from gasless.db import begin_write, dialect_insert, intents, relayer_state_history, relayers
from gasless.signer import RelayerKey

log = structlog.get_logger("gasless.relayers")


SPEND_WINDOW_MS = 3_600_000  # the spend rate is the fees paid over the last hour
IN_FLIGHT_STATES = ("COSIGNED", "BROADCAST")  # co-signed, fee not charged yet


@dataclass(frozen=True)
class RelayerInfo:
    address: str
    shard: int
    state: str
    funded: bool  # balance less in-flight fees is at least the floor
    balance_atto: int
    in_flight_atto: int = 0  # the most its co-signed, not yet executed intents can cost (gas limit x price)
    floor_atto: int = 0
    spend_atto_per_hour: int | None = None  # None until the host read the balance twice
    seconds_to_floor: float | None = None  # at that rate; math.inf when nothing is spent; None: unknown

    @property
    def assignable(self) -> bool:
        return self.state == "active" and self.funded

    @property
    def available_atto(self) -> int:
        return self.balance_atto - self.in_flight_atto


class SpendWindow:
    """One relayer's balance drops over the last `window_ms` (this host's readings): the spend rate."""

    def __init__(self, window_ms: int = SPEND_WINDOW_MS) -> None:
        self.window_ms = window_ms
        self.first_ms: int | None = None
        self.last_balance: int | None = None
        self.drops: deque[tuple[int, int]] = deque()  # (read at ms, atto spent since the previous reading)
        self.spent = 0

    def observe(self, at_ms: int, balance: int) -> None:
        if self.first_ms is None:
            self.first_ms = at_ms
        elif self.last_balance is not None and balance < self.last_balance:
            self.drops.append((at_ms, self.last_balance - balance))
            self.spent += self.last_balance - balance
        self.last_balance = balance
        while self.drops and self.drops[0][0] <= at_ms - self.window_ms:
            self.spent -= self.drops.popleft()[1]

    def per_hour(self, now_ms: int) -> int | None:
        if self.first_ms is None:
            return None
        covered = min(self.window_ms, now_ms - self.first_ms)
        if covered <= 0:
            return None
        return self.spent * 3_600_000 // covered


def seconds_to_floor(available_atto: int, floor_atto: int, per_hour: int | None) -> float | None:
    """How long until `available_atto` reaches the floor at `per_hour`: 0 when it is there already,
    infinity when nothing is being spent, None when the rate is not known yet."""
    if available_atto < floor_atto:
        return 0.0
    if per_hour is None:
        return None
    if per_hour <= 0:
        return math.inf
    return (available_atto - floor_atto) * 3600 / per_hour


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
        self._spend: dict[str, SpendWindow] = {}
        # Fees of intents this host co-signed since the current refresh began reading the intents: the
        # refresh may not have seen them, so they count on top of what it read (at worst twice: safe).
        self._cosigned_since_read: dict[str, int] = {}

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
        """Re-read states (the contract's, written through to the database), the fees in flight and the
        balances from the chain."""
        await self._follow_contract()
        self._cosigned_since_read = {}
        # The intents before the balances: an intent executed in between is counted twice (safe), never
        # not at all.
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(relayers))).all()
            pending = (
                await conn.execute(
                    select(intents.c.relayer, intents.c.gas_limit, intents.c.gas_price).where(
                        intents.c.state.in_(IN_FLIGHT_STATES)
                    )
                )
            ).all()
        in_flight: dict[str, int] = {}
        for relayer, gas_limit, gas_price in pending:
            in_flight[relayer] = in_flight.get(relayer, 0) + int(gas_limit) * int(gas_price)
        states = {row.address: row for row in rows if row.address in self.keys}
        balances = await asyncio.gather(
            *(self._balance(address) for address in states), return_exceptions=True
        )
        now = int(time.time() * 1000)
        fresh: dict[str, RelayerInfo] = {}
        changed: list[RelayerInfo] = []
        for (address, row), balance in zip(states.items(), balances, strict=True):
            window = self._spend.setdefault(address, SpendWindow())
            fees = in_flight.get(address, 0) + self._cosigned_since_read.get(address, 0)
            if isinstance(balance, BaseException):
                # Unknown balance: keep the last funding verdict rather than flapping on a gateway blip.
                funded, amount = bool(row.funded), int(row.balance_atto)
            else:
                window.observe(now, balance)
                funded, amount = balance - fees >= self.min_balance_atto, balance
            info = self._funds(
                RelayerInfo(address, int(row.shard), str(row.state), funded, amount), fees, now
            )
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

    def _funds(self, info: RelayerInfo, in_flight: int, now_ms: int) -> RelayerInfo:
        window = self._spend.get(info.address)
        per_hour = window.per_hour(now_ms) if window is not None else None
        available = info.balance_atto - in_flight
        return replace(
            info,
            in_flight_atto=in_flight,
            floor_atto=self.min_balance_atto,
            spend_atto_per_hour=per_hour,
            seconds_to_floor=seconds_to_floor(available, self.min_balance_atto, per_hour),
        )

    def note_cosigned(self, address: str, fee_atto: int) -> None:
        """A transaction co-signed for `address` on this host (its most: gas limit x gas price): it counts
        against the relayer's balance at once, so the relayer stops being assigned before its balance could
        fail a transaction, not a refresh later."""
        self._cosigned_since_read[address] = self._cosigned_since_read.get(address, 0) + fee_atto
        info = self._info.get(address)
        if info is None:
            return
        in_flight = info.in_flight_atto + fee_atto
        funded = info.funded and info.balance_atto - in_flight >= self.min_balance_atto
        self._info[address] = self._funds(replace(info, funded=funded), in_flight, int(time.time() * 1000))

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
