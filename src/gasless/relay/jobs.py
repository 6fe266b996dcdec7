"""After the commit point: broadcasting, tracking to execution and finality, recovery, retention.

Nothing here can turn an accepted relay into an error. The broadcaster sends to every gateway; the
tracker re-broadcasts until the chain settles the intent one way or the other: executed (then finalized)
or dead (its nonce was taken by a replacement or by another transaction of the sender).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from gasless.chain.gateway import Broadcast, GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.db import intents
from gasless.relay.events import IntentBus
from gasless.relay.repository import IN_FLIGHT, IntentRepository, Rec

log = structlog.get_logger("gasless.relay.jobs")

REBROADCAST_MS = 3_000  # an acknowledged intent not yet seen on chain is re-sent this often
GIVE_UP_MS = 900_000  # an intent the chain never saw is declared dead after this long
RESYNC_MS = 2_000  # adopt intents committed by other hosts (and drop those they settled)
REJECTION_RETENTION_MS = 30 * 86_400_000


def now_ms() -> int:
    return int(time.time() * 1000)


class SentIntent:
    """One send of an intent: resolves with the first acknowledgement's time (ms), or None if none came."""

    def __init__(self, broadcast: Broadcast) -> None:
        self.broadcast = broadcast
        self.ack_ms: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()


class Broadcaster:
    def __init__(self, gateway: GatewayClient, repo: IntentRepository, bus: IntentBus) -> None:
        self.gateway = gateway
        self.repo = repo
        self.bus = bus
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sending: set[int] = set()  # intents with a send still waiting for its first answer
        self.on_update: Callable[[Rec], None] | None = None

    def send(self, pk: int, wire: dict[str, Any], tx_hash: str) -> SentIntent:
        """Send to every gateway now; the first acknowledgement is recorded in the background."""
        sent = SentIntent(self.gateway.broadcast(wire))
        self.sending.add(pk)
        task = asyncio.create_task(self._record(pk, tx_hash, sent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return sent

    async def _record(self, pk: int, tx_hash: str, sent: SentIntent) -> None:
        try:
            result = await sent.broadcast.first_ack
        finally:
            self.sending.discard(pk)
        ack_ms = now_ms() if result.tx_hash is not None else None
        sent.ack_ms.set_result(ack_ms)
        try:
            row = None
            if ack_ms is not None:
                if result.tx_hash != tx_hash:
                    log.error(
                        "gateway returned another hash", expected=tx_hash, got=result.tx_hash, url=result.url
                    )
                # One write in the common case: the first acknowledgement and the send bookkeeping together.
                row = await self.repo.transition(
                    pk,
                    ("COSIGNED",),
                    {
                        "state": "BROADCAST",
                        "broadcast_at_ms": ack_ms,
                        "last_sent_at_ms": ack_ms,
                        "send_attempts": intents.c.send_attempts + 1,
                    },
                    ack_ms,
                )
                if row is not None:
                    self.bus.publish(row)
                    if self.on_update is not None:
                        self.on_update(row)
            else:
                log.warning(
                    "no gateway acknowledged; the tracker re-sends", tx_hash=tx_hash, error=result.error
                )
            if row is None:
                await self.repo.note_sent(pk, now_ms())
        except Exception as exc:  # the tracker repairs state from the chain; never lose the task silently
            log.warning("could not record the broadcast", tx_hash=tx_hash, error=type(exc).__name__)

    async def drain(self, timeout_s: float = 5.0) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


class Worker:
    """A background loop (`_loop`) started and stopped with the host."""

    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=type(self).__name__.lower())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        raise NotImplementedError


class Tracker(Worker):
    """Drives in-flight intents to EXECUTED, FINALIZED or DEAD from what the gateways report."""

    def __init__(
        self,
        gateway: GatewayClient,
        network: NetworkView,
        repo: IntentRepository,
        bus: IntentBus,
        broadcaster: Broadcaster,
        *,
        rebroadcast_ms: int = REBROADCAST_MS,
        give_up_ms: int = GIVE_UP_MS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.gateway = gateway
        self.network = network
        self.repo = repo
        self.bus = bus
        self.broadcaster = broadcaster
        self.rebroadcast_ms = rebroadcast_ms
        self.give_up_ms = give_up_ms
        self.clock = clock
        self._tracked: dict[int, Rec] = {}
        self._next_check: dict[int, int] = {}
        self._hyper: dict[int, int] = {}  # executed intents whose notarizing hyperblock is known
        broadcaster.on_update = self._refresh
        self._resynced_ms = 0
        self._limit = asyncio.Semaphore(32)

    def _refresh(self, row: Rec) -> None:
        if int(row.pk) in self._tracked:
            self._tracked[int(row.pk)] = row

    def watch(self, row: Rec) -> None:
        self._tracked[int(row.pk)] = row
        # A fresh intent cannot be in a block before the next round: look at it then.
        self._next_check[int(row.pk)] = self.clock() + self.network.params.round_duration_ms // 2

    @property
    def tracked(self) -> int:
        return len(self._tracked)

    async def recover(self) -> int:
        """Orphan recovery at start-up: re-broadcast every co-signed row no gateway acknowledged."""
        rows = await self.repo.unbroadcast()
        for row in rows:
            self.broadcaster.send(int(row.pk), dict(row.tx), row.tx_hash)
            self.watch(row)
        for row in await self.repo.in_flight():
            self.watch(row)
        self._resynced_ms = self.clock()
        if rows:
            log.info("orphan recovery re-broadcast co-signed intents", count=len(rows))
        return len(rows)

    async def _loop(self) -> None:
        while True:
            interval = max(0.05, self.network.params.round_duration_ms / 2000)
            await asyncio.sleep(interval)
            try:
                await self.tick()
            except Exception as exc:  # one bad tick must not stop tracking
                log.warning("tracker tick failed", error=type(exc).__name__, message=str(exc)[:200])

    async def tick(self) -> None:
        now = self.clock()
        if now - self._resynced_ms >= RESYNC_MS:
            self._resynced_ms = now
            fresh = {int(row.pk): row for row in await self.repo.in_flight()}
            for pk in list(self._tracked):
                if pk not in fresh:
                    self._tracked.pop(pk, None)
            for pk, row in fresh.items():
                self._tracked.setdefault(pk, row)
        for pk in [pk for pk in self._next_check if pk not in self._tracked]:
            del self._next_check[pk]
        for pk in [pk for pk in self._hyper if pk not in self._tracked]:
            del self._hyper[pk]
        # Executed intents whose hyperblock is known become final without asking the gateway again.
        final = self.network.meta_highest_final_nonce
        if final is not None:
            ready = [pk for pk, hyper in self._hyper.items() if hyper <= final]
            await asyncio.gather(*(self._finalize(self._tracked[pk]) for pk in ready if pk in self._tracked))
        due = [
            row
            for pk, row in list(self._tracked.items())
            if self._next_check.get(pk, 0) <= now and pk not in self._hyper
        ]
        # Each intent is looked at about once per round: the chain cannot change faster than that.
        next_at = now + max(50, self.network.params.round_duration_ms)
        for row in due:
            self._next_check[int(row.pk)] = next_at
        if due:
            await asyncio.gather(*(self._check(row) for row in due))

    async def _finalize(self, row: Rec) -> None:
        now = self.clock()
        self._hyper.pop(int(row.pk), None)
        updated = await self.repo.transition(
            row.pk, ("EXECUTED",), {"state": "FINALIZED", "finalized_at_ms": now}, now
        )
        if updated is not None:
            self._publish(updated)
            self._tracked.pop(int(row.pk), None)
        else:
            await self._reload(row)

    async def _check(self, row: Rec) -> None:
        async with self._limit:
            try:
                chain_tx = await self.gateway.transaction(row.tx_hash, sender=row.sender)
            except (GatewayUnavailable, GatewayRejected):
                return
            await self._apply(row, chain_tx)

    async def _apply(self, row: Rec, chain_tx: dict[str, Any] | None) -> None:
        now = self.clock()
        status = chain_tx.get("status") if chain_tx else None
        block_nonce = int(chain_tx.get("blockNonce") or 0) if chain_tx else 0
        if status == "invalid":
            await self._dead(
                row, reason=(chain_tx or {}).get("receipt", {}).get("data") or "invalid on chain"
            )
            return
        if status in ("success", "fail") and block_nonce > 0:
            assert chain_tx is not None
            if row.state in ("COSIGNED", "BROADCAST"):
                executed_ts = int(chain_tx.get("timestampMs") or int(chain_tx.get("timestamp") or 0) * 1000)
                updated = await self.repo.transition(
                    row.pk,
                    ("COSIGNED", "BROADCAST"),
                    {"state": "EXECUTED", "executed_block_ts_ms": executed_ts or None, "outcome": status},
                    now,
                )
                if updated is None:
                    await self._reload(row)
                    return
                row = updated
                self._publish(row)
                await self._settle_rivals(row)
            hyper = int(chain_tx.get("hyperblockNonce") or 0)
            final = self.network.meta_highest_final_nonce
            if row.state == "EXECUTED" and hyper > 0 and (final is None or hyper > final):
                self._hyper[int(row.pk)] = hyper  # final once the metachain's final nonce reaches it
                return
            if row.state == "EXECUTED" and hyper > 0 and final is not None and hyper <= final:
                updated = await self.repo.transition(
                    row.pk, ("EXECUTED",), {"state": "FINALIZED", "finalized_at_ms": now}, now
                )
                if updated is not None:
                    self._publish(updated)
                    self._tracked.pop(int(row.pk), None)
                else:
                    await self._reload(row)
            return
        # Not executed yet: keep it in the network's hands.
        age = now - int(row.cosigned_at_ms)
        last_sent = int(row.last_sent_at_ms or row.cosigned_at_ms)
        if chain_tx is None:
            if await self._nonce_taken(row):
                await self._dead(row, reason="nonce used by another transaction of the sender")
                return
            if age > self.give_up_ms:
                await self._dead(row, reason=f"not included within {self.give_up_ms} ms")
                return
        # Re-send: quickly while no gateway acknowledged, slowly while the chain does not know the hash;
        # never while a send of this intent is still waiting for its answer.
        due = 1_000 if row.state == "COSIGNED" else self.rebroadcast_ms
        sending = int(row.pk) in self.broadcaster.sending
        if not sending and now - last_sent >= due and (row.state == "COSIGNED" or chain_tx is None):
            self.broadcaster.send(int(row.pk), dict(row.tx), row.tx_hash)
            self._tracked[int(row.pk)] = row._replace(
                last_sent_at_ms=now, send_attempts=row.send_attempts + 1
            )

    async def _nonce_taken(self, row: Rec) -> bool:
        try:
            account = await self.gateway.account(row.sender)
        except (GatewayUnavailable, GatewayRejected):
            return False
        if int(account.get("nonce", 0)) <= int(row.nonce):
            return False
        # The nonce moved past ours; make sure our transaction is not simply being executed right now.
        try:
            again = await self.gateway.transaction(row.tx_hash, sender=row.sender)
        except (GatewayUnavailable, GatewayRejected):
            return False
        return again is None

    async def _settle_rivals(self, winner: Rec) -> None:
        """The executed intent took the slot: every other in-flight intent of that nonce is dead."""
        for rival in await self.repo.slot_rivals(winner.sender, int(winner.nonce), int(winner.pk)):
            await self._dead(
                rival,
                reason="replaced: another transaction with the same nonce executed",
                replaced_by=winner.tx_hash,
            )

    async def _dead(self, row: Rec, *, reason: str, replaced_by: str | None = None) -> None:
        now = self.clock()
        updated = await self.repo.transition(
            row.pk, IN_FLIGHT, {"state": "DEAD", "dead_reason": reason[:500], "replaced_by": replaced_by}, now
        )
        self._tracked.pop(int(row.pk), None)
        if updated is not None:
            log.info("intent dead", tx_hash=row.tx_hash, reason=reason[:120])
            self._publish(updated)

    async def _reload(self, row: Rec) -> None:
        fresh = await self.repo.by_pk(int(row.pk))
        if fresh is None or fresh.state not in IN_FLIGHT:
            self._tracked.pop(int(row.pk), None)
        else:
            self._tracked[int(row.pk)] = fresh

    def _publish(self, row: Rec) -> None:
        if row.state in IN_FLIGHT:
            self._tracked[int(row.pk)] = row
        self.bus.publish(row)


class Retention(Worker):
    """Drops REJECTED rows after 30 days and expired idempotency keys."""

    def __init__(self, repo: IntentRepository, *, every_ms: int = 600_000) -> None:
        self.repo = repo
        self.every_ms = every_ms

    async def _loop(self) -> None:
        while True:
            try:
                await self.repo.purge(now_ms(), REJECTION_RETENTION_MS)
            except Exception as exc:
                log.warning("retention run failed", error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)
