"""After the commit point: broadcasting, tracking to execution and finality, recovery, retention.

Nothing here can turn an accepted relay into an error. The broadcaster sends to every gateway; the
tracker re-broadcasts until the chain settles the intent one way or the other: executed (then finalized)
or dead (its nonce was taken by a replacement or by another transaction of the sender, or the network
dropped it as not executable).

What the chain says (read in `relay/chain_reads`) is read as the real network says it (docs/chain.md): the
node's `success` is not an outcome for a contract call (process-status decides it), `invalid` is an
execution that cost the relayer a fee, finality comes from the hyperblock that notarized the transaction at
its destination, and a transaction the sender-shard lookup cannot find is confirmed missing by a second
source before it is dead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import structlog
from sqlalchemy import ColumnElement, and_

from gasless.chain.addresses import METACHAIN
from gasless.chain.gateway import Broadcast, GatewayClient
from gasless.chain.network import NetworkView
from gasless.chain.outcomes import contract_failure, is_move_balance
from gasless.core.workers import cancel_and_wait, wait_event
from gasless.db import intents
from gasless.relay.chain_reads import UNREACHABLE, ChainReads
from gasless.relay.events import IntentBus
from gasless.relay.repository import IN_FLIGHT, IntentRepository, Rec

log = structlog.get_logger("gasless.relay.jobs")

REBROADCAST_MS = 3_000  # an acknowledged intent not yet seen on chain is re-sent this often
GIVE_UP_MS = 900_000  # an intent the chain never saw is declared dead after this long
RESYNC_MS = 2_000  # adopt intents committed by other hosts (and drop those they settled)
# While the hyperblocks are followed, an intent is first looked at on its own this many rounds after it was
# co-signed: by then a transaction the chain executed has shown in a hyperblock, so a look is only needed
# for the ones that did not (still in the pool, rejected, replaced, or a hyperblock that was not read). A
# hyperblock lists a transaction once it is notarized at its destination: one round after its block for a
# same-shard one, three for a cross-shard one (included the round after its co-signature: four).
LOOK_AFTER_ROUNDS = 5
REJECTION_RETENTION_MS = 30 * 86_400_000
# A round's moves are written in transactions of at most this many intents. SQLite has one writer: every
# commit point that arrives while a round's transaction runs waits for its end, and a round at half the
# maximum load (hundreds of executions and finalizations) held it long enough to be the relays' p99. A
# part's time grows with the tables: each usage row and settled reservation lands on index leaves at
# random keys, which on 10 M rows are seldom cached (a part of 64 took 26 ms on average there, 5 on an
# empty database; docs/performance.md, "Cost as the data grows"), so parts are kept small.
ROUND_PART_INTENTS = 16


def now_ms() -> int:
    return int(time.time() * 1000)


class SentIntent:
    """One send of an intent: resolves with the first acknowledgement's time (ms), or None if none came."""

    def __init__(self, broadcast: Broadcast) -> None:
        self.broadcast = broadcast
        self.ack_ms: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()


def gateway_name(url: str) -> str:
    """A gateway as recorded and published: scheme, host and port, never credentials or a path."""
    parts = urlsplit(url)
    host = parts.hostname or url
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") if parts.scheme else url


class Broadcaster:
    def __init__(self, gateway: GatewayClient, repo: IntentRepository, bus: IntentBus) -> None:
        self.gateway = gateway
        self.repo = repo
        self.bus = bus
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sending: set[int] = set()  # intents with a send still waiting for its first answer
        self.on_update: Callable[[Rec], None] | None = None
        # Called once per send that no gateway acknowledged (metrics: broadcast failures).
        self.on_unacknowledged: Callable[[], None] | None = None
        self._acks: dict[int, int] = {}  # first acknowledgements waiting to be written (pk -> ms)
        self._ack_gateways: dict[int, str] = {}  # ... and the gateway that gave each
        self._ack_writer: asyncio.Task[None] | None = None

    def send(self, pk: int, wire: dict[str, Any], tx_hash: str) -> SentIntent:
        """Send to every gateway now; the first acknowledgement is recorded in the background."""
        sent = SentIntent(self.gateway.broadcast(wire, tx_hash))
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
        if ack_ms is None:
            log.warning("no gateway acknowledged; the tracker re-sends", tx_hash=tx_hash, error=result.error)
            if self.on_unacknowledged is not None:
                self.on_unacknowledged()
            try:
                await self.repo.note_sent(pk, now_ms())
            except Exception as exc:  # the tracker repairs state from the chain
                log.warning("could not record the send", tx_hash=tx_hash, error=type(exc).__name__)
            return
        if result.tx_hash != tx_hash:
            log.error("gateway returned another hash", expected=tx_hash, got=result.tx_hash, url=result.url)
        # Acknowledgements are written in groups (group commit): whatever arrived while the previous
        # write ran goes into the next one, so a burst of relays costs a few writes, not one each.
        self._acks[pk] = ack_ms
        if result.url:
            self._ack_gateways[pk] = gateway_name(result.url)
        if self._ack_writer is None or self._ack_writer.done():
            self._ack_writer = asyncio.create_task(self._write_acks())
            self._tasks.add(self._ack_writer)
            self._ack_writer.add_done_callback(self._tasks.discard)

    async def _write_acks(self) -> None:
        while self._acks:
            acks, self._acks = self._acks, {}
            gateways, self._ack_gateways = self._ack_gateways, {}
            try:
                rows, _ = await self.repo.record_acks(acks, gateways)
            except Exception as exc:  # the tracker repairs state from the chain; never lose the task silently
                log.warning("could not record acknowledgements", count=len(acks), error=type(exc).__name__)
                continue
            for row in rows:
                self.bus.publish(row)
                if self.on_update is not None:
                    self.on_update(row)

    async def drain(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, deadline - time.monotonic()))


class Worker:
    """A background loop (`_loop`) started and stopped with the host."""

    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=type(self).__name__.lower())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

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
        self.reads = ChainReads(gateway, network)  # hyperblocks, looks, outcomes, absences
        broadcaster.on_update = self._refresh
        self._resynced_ms = 0
        self._meta_nonce: int | None = None  # the newest metachain block the network view has shown
        self._new_block = asyncio.Event()
        network.on_poll(self._on_network_poll)

    def _refresh(self, row: Rec) -> None:
        old = self._tracked.get(int(row.pk))
        if old is not None:
            self._tracked[int(row.pk)] = _updated(old, row)

    def watch(self, row: Rec) -> None:
        self._tracked[int(row.pk)] = row
        round_ms = self.network.params.round_duration_ms
        # Executions are read from the hyperblocks (one read a block for every intent); while that works an
        # intent is looked at on its own only if it has not executed within a few rounds. Otherwise: a fresh
        # intent cannot be in a block before the next round, so look at it then.
        wait_ms = max(1_000, LOOK_AFTER_ROUNDS * round_ms) if self.reads.following else round_ms // 2
        self._next_check[int(row.pk)] = self.clock() + wait_ms

    @property
    def tracked(self) -> int:
        return len(self._tracked)

    def oldest_unexecuted_ms(self, now_ms: int) -> dict[str, int]:
        """Per state (COSIGNED: no gateway acknowledged it yet; BROADCAST: not executed yet), how long ago
        the oldest intent this host follows in that state was co-signed (metrics: stuck intents)."""
        oldest: dict[str, int] = {}
        for row in self._tracked.values():
            if row.state in ("COSIGNED", "BROADCAST") and row.cosigned_at_ms is not None:
                oldest[row.state] = min(oldest.get(row.state, now_ms), int(row.cosigned_at_ms))
        return {state: max(0, now_ms - at) for state, at in oldest.items()}

    def lag_hyperblocks(self) -> int | None:
        """How many metachain blocks the network view has shown that the tracker has not read yet."""
        if self.reads.hyper_cursor is None or self._meta_nonce is None:
            return None
        return max(0, self._meta_nonce - self.reads.hyper_cursor + 1)

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

    def _on_network_poll(self) -> None:
        meta = self.network.status(METACHAIN)
        if meta is not None and meta.nonce != self._meta_nonce:
            self._meta_nonce = meta.nonce
            self._new_block.set()

    async def _loop(self) -> None:
        # A tick as soon as the network view sees a new metachain block (its polls follow the round clock),
        # so executions are read and written at the start of a round; otherwise every half round, for the
        # per-intent looks and re-broadcasts.
        while True:
            interval = max(0.05, self.network.params.round_duration_ms / 2000)
            await wait_event(self._new_block, interval)
            self._new_block.clear()
            try:
                await self.tick()
            except Exception as exc:  # one bad tick must not stop tracking
                log.warning("tracker tick failed", error=type(exc).__name__, message=str(exc)[:200])

    async def tick(self) -> None:
        now = self.clock()
        if now - self._resynced_ms >= RESYNC_MS:
            self._resynced_ms = now
            await self._resync()
        for pk in [pk for pk in self._next_check if pk not in self._tracked]:
            del self._next_check[pk]
        for pk in [pk for pk in self._hyper if pk not in self._tracked]:
            del self._hyper[pk]
        for pk in [pk for pk in self.reads.absent if pk not in self._tracked]:
            del self.reads.absent[pk]
        batch = _Batch()
        # Executed intents whose hyperblock is known become final without asking the gateway again.
        final = self.network.meta_highest_final_nonce
        if final is not None:
            batch.finalize([pk for pk, hyper in self._hyper.items() if hyper <= final], now)
        # Each intent is looked at about once per round: the chain cannot change faster than that.
        next_at = now + max(50, self.network.params.round_duration_ms)
        settled: list[tuple[Rec, dict[str, Any]]] = []
        for pk, chain_tx in (await self.reads.hyperblocks(self._tracked)).items():
            row = self._tracked.get(pk)
            if row is None or pk in self._hyper:
                continue
            if chain_tx.get("status") == "fail":
                self._next_check[pk] = 0  # a full look: the hyperblock does not carry the failure's reason
                continue
            self._next_check[pk] = next_at
            settled.append((row, chain_tx))
        await self.reads.outcomes(settled)
        for row, chain_tx in settled:
            await self._decide(row, chain_tx, batch, now)
        due = [
            row
            for pk, row in list(self._tracked.items())
            if self._next_check.get(pk, 0) <= now and pk not in self._hyper and pk not in batch.expected
        ]
        for row in due:
            self._next_check[int(row.pk)] = next_at
        if due:
            looked = await asyncio.gather(*(self.reads.look(row) for row in due))
            seen = [
                (row, chain_tx)
                for row, chain_tx in zip(due, looked, strict=True)
                if chain_tx is not UNREACHABLE
            ]
            await self.reads.outcomes([(row, tx) for row, tx in seen if tx is not None])  # type: ignore[misc]
            for row, chain_tx in seen:
                await self._decide(row, chain_tx, batch, now)  # type: ignore[arg-type]
        await self._commit(batch, now)
        # Only once the execution is stored: an intent waiting for its hyperblock is never looked at again,
        # so one whose write failed (the database dropped the connection) would wait for ever, unbilled.
        self._hyper.update((pk, hyper) for pk, hyper in batch.hyper.items() if pk in self._tracked)

    async def _resync(self) -> None:
        """Adopt intents committed by other hosts (and drop those settled elsewhere): a light read of
        (pk, state, seq), full rows only for what this host does not know yet or has stale."""
        known = {pk: int(row.seq) for pk, row in self._tracked.items()}
        stamps = await self.repo.in_flight_stamps()
        for pk in [pk for pk in self._tracked if pk not in stamps]:
            self._tracked.pop(pk, None)
        wanted = [pk for pk, seq in stamps.items() if known.get(pk) != seq]
        if wanted:
            for row in await self.repo.by_pks(wanted):
                if row.state in IN_FLIGHT:
                    self._tracked[int(row.pk)] = row

    async def _decide(self, row: Rec, chain_tx: dict[str, Any] | None, batch: _Batch, now: int) -> None:
        """What the chain says about one intent, as changes added to this round's batch."""
        status = chain_tx.get("status") if chain_tx else None
        block_nonce = int(chain_tx.get("blockNonce") or 0) if chain_tx else 0
        if chain_tx is not None and status in ("success", "fail", "invalid") and block_nonce > 0:
            self.reads.absent.pop(int(row.pk), None)
            if status == "invalid":
                # In an invalid miniblock: the nonce is used and the relayer paid the fee, so the relay is
                # billed as a failed execution (docs/billing.md).
                receipt = (chain_tx.get("receipt") or {}).get("data")
                outcome, failure = "fail", f"invalid on chain: {receipt or 'no reason given'}"[:64]
            elif status == "success" and not is_move_balance(chain_tx):
                if chain_tx.get("_outcome") is None:
                    return  # executed, outcome not decided yet (process-status said pending): next round
                outcome, failure = chain_tx["_outcome"], chain_tx.get("_failure")
            else:
                outcome = status
                failure = (contract_failure(chain_tx) or "failed on chain") if status == "fail" else None
            # Finality: the hyperblock that notarized it at its destination. Only the proxy's lookup without
            # `sender` fills `hyperblockNonce`; `notarizedAtDestinationInMetaNonce` is on every path.
            hyper = int(
                chain_tx.get("hyperblockNonce") or chain_tx.get("notarizedAtDestinationInMetaNonce") or 0
            )
            final = self.network.meta_highest_final_nonce
            if row.state in ("COSIGNED", "BROADCAST"):
                executed_ts = int(chain_tx.get("timestampMs") or int(chain_tx.get("timestamp") or 0) * 1000)
                batch.executed(row, executed_ts or None, outcome, failure)
                self._rivals_of(row, batch, now)
            if hyper > 0 and final is not None and hyper <= final:
                batch.finalize([int(row.pk)], now)
            elif hyper > 0:
                batch.hyper[int(row.pk)] = hyper  # final once the metachain's final nonce reaches it
            return
        # Not executed yet: keep it in the network's hands.
        age = now - int(row.cosigned_at_ms)
        last_sent = int(row.last_sent_at_ms or row.cosigned_at_ms)
        if chain_tx is None:
            missing = await self.reads.missing(row, now, self._with_wire)
            if isinstance(missing, dict):  # the second source found it: decide on what it says
                if missing.get("status") in ("success", "fail", "invalid"):
                    await self.reads.outcomes([(row, missing)])
                    await self._decide(row, missing, batch, now)
                    return
            elif missing is not None:
                batch.dead(row, missing, now)
                return
            if age > self.give_up_ms:
                batch.dead(row, f"not included within {self.give_up_ms} ms", now)
                return
        else:
            self.reads.absent.pop(int(row.pk), None)
        # Re-send: quickly while no gateway acknowledged, slowly while the chain does not know the hash;
        # never while a send of this intent is still waiting for its answer.
        due = 1_000 if row.state == "COSIGNED" else self.rebroadcast_ms
        sending = int(row.pk) in self.broadcaster.sending
        if not sending and now - last_sent >= due and (row.state == "COSIGNED" or chain_tx is None):
            row = await self._with_wire(row)
            if row is None:
                return
            self.broadcaster.send(int(row.pk), dict(row.tx), row.tx_hash)
            self._tracked[int(row.pk)] = row._replace(
                last_sent_at_ms=now, send_attempts=row.send_attempts + 1
            )

    async def _with_wire(self, row: Rec) -> Rec | None:
        if getattr(row, "tx", None) is None:  # an update's row without the wire transaction
            fresh = await self.repo.by_pk(int(row.pk))
            if fresh is None:
                return None
            row = row._replace(tx=fresh.tx)
        return row

    def _rivals_of(self, winner: Rec, batch: _Batch, now: int) -> None:
        """The executed intent took the slot: every other in-flight intent of that nonce is dead. Rivals
        this host knows are in memory; a slot that saw replacements (slot_seq > 0) is also swept in the
        database, for rivals another host committed since the last resync."""
        if batch.slots is None:  # built once a tick: a scan of every tracked row per execution was quadratic
            batch.slots = {}
            for row in self._tracked.values():
                batch.slots[(row.sender, int(row.nonce))] = (
                    batch.slots.get((row.sender, int(row.nonce)), 0) + 1
                )
        rivals = batch.slots.get((winner.sender, int(winner.nonce)), 0) > 1
        if rivals or int(winner.slot_seq) > 0:
            batch.replaced(winner, now)

    async def _commit(self, batch: _Batch, now: int) -> None:
        parts = batch.parts(ROUND_PART_INTENTS)
        if not parts:
            return
        seen = set()
        # Each part is a transaction of its own, published as it commits; commit points waiting for the
        # writer go in between two parts.
        for part in parts:
            for row in await self.repo.transition_many(part, now, self._tracked):
                seen.add(int(row.pk))
                if row.state == "DEAD":
                    log.info("intent dead", tx_hash=row.tx_hash, reason=(row.dead_reason or "")[:120])
                self._publish(row)
        # A guarded update that changed nothing: another host moved the row first. Re-read it.
        for pk in batch.expected - seen:
            row = self._tracked.get(pk)
            if row is not None:
                await self._reload(row)

    async def _reload(self, row: Rec) -> None:
        fresh = await self.repo.by_pk(int(row.pk))
        if fresh is None or fresh.state not in IN_FLIGHT:
            self._tracked.pop(int(row.pk), None)
        else:
            self._tracked[int(row.pk)] = fresh
        if fresh is None or fresh.state != "EXECUTED":
            self._hyper.pop(int(row.pk), None)  # not executed as stored: look at the chain again

    def _publish(self, row: Rec) -> None:
        if row.state in IN_FLIGHT:
            old = self._tracked.get(int(row.pk))
            self._tracked[int(row.pk)] = row if old is None else _updated(old, row)
        else:
            self._tracked.pop(int(row.pk), None)
            self._hyper.pop(int(row.pk), None)
        self.bus.publish(row)


def _updated(old: Rec, fresh: Rec) -> Rec:
    """A tracked row after an update: updates return rows without the wire transaction, which never
    changes, so the tracked row keeps its own."""
    return old._replace(**vars(fresh))


class _Batch:
    """One round's state changes, written in parts of a bounded size (`parts`, each part one
    `IntentRepository.transition_many`), in order: executions first, then the rivals they kill, then
    finalizations, then other deaths."""

    def __init__(self) -> None:
        self._executed: dict[tuple[int | None, str, str | None], list[int]] = {}
        self._replaced: list[tuple[ColumnElement[bool], dict[str, Any]]] = []
        self._final: list[int] = []
        self._dead: list[tuple[ColumnElement[bool], dict[str, Any]]] = []
        self.expected: set[int] = set()  # pks a change targets directly (re-read when it did not apply)
        self.hyper: dict[int, int] = {}  # executed, not final yet: the hyperblock that will finalize each
        self.slots: dict[tuple[str, int], int] | None = None  # tracked intents per (sender, nonce)
        self._final_at = 0

    def executed(self, row: Rec, block_ts_ms: int | None, outcome: str, failure: str | None = None) -> None:
        self._executed.setdefault((block_ts_ms, outcome, failure), []).append(int(row.pk))
        self.expected.add(int(row.pk))

    def replaced(self, winner: Rec, now: int) -> None:
        self._replaced.append(
            (
                and_(
                    intents.c.sender == winner.sender,
                    intents.c.nonce == int(winner.nonce),
                    intents.c.pk != int(winner.pk),
                    intents.c.state.in_(IN_FLIGHT),
                ),
                {
                    "state": "DEAD",
                    "dead_reason": "replaced: another transaction with the same nonce executed",
                    "replaced_by": winner.tx_hash,
                },
            )
        )

    def finalize(self, pks: list[int], now: int) -> None:
        self._final.extend(pks)
        self.expected.update(pks)
        self._final_at = now

    def dead(self, row: Rec, reason: str, now: int) -> None:
        self._dead.append(
            (
                and_(intents.c.pk == int(row.pk), intents.c.state.in_(IN_FLIGHT)),
                {"state": "DEAD", "dead_reason": reason[:500], "replaced_by": None},
            )
        )
        self.expected.add(int(row.pk))

    def parts(self, limit: int) -> list[list[tuple[ColumnElement[bool], dict[str, Any]]]]:
        """This round's changes in order, cut into transactions that each move at most `limit` intents (a
        rival sweep counts as one). The sweeps go with the last executions, so a slot's winner and the
        death of its rivals are written together."""
        parts: list[list[tuple[ColumnElement[bool], dict[str, Any]]]] = [[]]
        size = 0

        def add(change: tuple[ColumnElement[bool], dict[str, Any]], count: int) -> None:
            nonlocal size
            if size and size + count > limit:
                parts.append([])
                size = 0
            parts[-1].append(change)
            size += count

        for (block_ts_ms, outcome, failure), pks in self._executed.items():
            values = {"state": "EXECUTED", "executed_block_ts_ms": block_ts_ms, "outcome": outcome}
            if failure is not None:
                values["failure"] = failure
            for start in range(0, len(pks), limit):
                chunk = pks[start : start + limit]
                where = and_(intents.c.pk.in_(chunk), intents.c.state.in_(("COSIGNED", "BROADCAST")))
                add((where, values), len(chunk))
        for sweep in self._replaced:
            parts[-1].append(sweep)
            size += 1
        final = sorted(set(self._final))
        for start in range(0, len(final), limit):
            chunk = final[start : start + limit]
            where = and_(intents.c.pk.in_(chunk), intents.c.state == "EXECUTED")
            add((where, {"state": "FINALIZED", "finalized_at_ms": self._final_at}), len(chunk))
        for death in self._dead:
            add(death, 1)
        return [part for part in parts if part]


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
