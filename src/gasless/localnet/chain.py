"""The simulated network: mempool, rounds, shard blocks, hyperblocks, cross-shard execution and finality.

Round r starts at `genesis_ms + r * round_ms`. In each round every shard that is not stalled produces one
block: first the destination half of cross-shard transactions whose source block the metachain has
notarized, then the pool's executable transactions (account nonce first, the highest gas price winning a
nonce). The metachain's hyperblock of round r notarizes the shard blocks of the rounds before it (as on the
real network, a shard block is notarized at least one round after it is proposed; a cross-shard transaction
is notarized at its destination at least three rounds after its source block). A block is final once the
next block of its chain exists (single-block finality, as after Andromeda): a transaction is final when the
hyperblock that notarized it at its destination is at or below `erd_highest_final_nonce` of the metachain.

Statuses follow the node (mx-chain-go `process/txstatus`): `pending` until executed, `success` once executed
(a reverted contract call included: its failure is in the logs, and `/transaction/{h}/process-status` says
`fail`), `invalid` for a transaction in an invalid miniblock (fee charged, nonce used), `fail` only for a
failed cross-shard token transfer. A "not executable" transaction (the fee payer cannot pay, a guarded
relayer, a guardian mismatch) leaves the pool without a block: the node no longer knows it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from multiversx_sdk import Transaction

from gasless.chain.addresses import METACHAIN, shard_of_pubkey
from gasless.chain.codec import tx_hash as compute_tx_hash
from gasless.chain.gas import GasRules, is_relayed_v3
from gasless.localnet.processing import (
    Executor,
    NodeError,
    Outcome,
    check_signatures,
    check_state,
    check_static,
    fee_payer,
    initially_paid_fee,
)
from gasless.localnet.state import WorldState


@dataclass(frozen=True)
class ChainConfig:
    chain_id: str = "localnet"
    round_ms: int = 600
    num_shards: int = 3
    rounds_per_epoch: int = 2_000
    max_txs_per_block: int = 20_000
    rules: GasRules = field(default_factory=GasRules)
    min_tx_version: int = 1


@dataclass
class BlockRef:
    shard: int
    nonce: int
    hash: str
    round: int
    epoch: int
    timestamp_ms: int
    miniblock_hash: str


@dataclass
class Block:
    shard: int
    nonce: int
    round: int
    epoch: int
    hash: str
    prev_hash: str
    timestamp_ms: int
    tx_hashes: list[str] = field(default_factory=list)

    def ref(self, miniblock: str) -> BlockRef:
        return BlockRef(
            self.shard, self.nonce, self.hash, self.round, self.epoch, self.timestamp_ms, miniblock
        )


@dataclass
class HyperBlock:
    nonce: int
    round: int
    epoch: int
    hash: str
    prev_hash: str
    timestamp_ms: int
    shard_blocks: list[Block]
    tx_hashes: list[str] = field(default_factory=list)


@dataclass
class TxRecord:
    hash: str
    tx: Transaction
    sender_shard: int
    receiver_shard: int
    received_ms: int
    status: str = "pending"  # pending | success | fail | invalid | dropped (our own states, see `reported`)
    reason: str = ""
    source: BlockRef | None = None
    destination: BlockRef | None = None
    source_hyper: HyperBlock | None = None
    destination_hyper: HyperBlock | None = None
    outcome: Outcome | None = None
    initially_paid_fee: int = 0

    @property
    def completed(self) -> bool:
        return self.status in ("success", "fail", "invalid") and self.destination_hyper is not None

    @property
    def in_pool(self) -> bool:
        return self.source is None and self.status == "pending"

    @property
    def dropped(self) -> bool:
        """Left the pool without a block (not executable, or displaced): the node does not know it."""
        return self.status == "dropped"

    @property
    def settled(self) -> bool:
        """Nothing changes the record any more: notarized at destination. (A dropped transaction may be sent
        again, so it stays unsettled.)"""
        return self.destination_hyper is not None

    @property
    def failed_at_source(self) -> bool:
        return (
            self.status == "fail"
            and self.destination is not None
            and self.destination.shard == self.sender_shard
        )

    def reported(self) -> str:
        """The status the node reports: a failure at the destination (a reverted call) reads `success`;
        `fail` only for a cross-shard transfer that failed at its source."""
        if self.status == "fail":
            cross = self.receiver_shard != self.sender_shard
            return "fail" if cross and self.failed_at_source else "success"
        return self.status


class Faults:
    """Chain-wide faults; per-gateway faults (latency, 5xx, dropped acks) live on each gateway."""

    def __init__(self) -> None:
        self.stalled_shards: set[int] = set()
        self.clock_offset_ms: int = 0


class LocalChain:
    """One simulated network: the state, the pool, the blocks and the records of every transaction."""

    def __init__(self, config: ChainConfig | None = None, *, genesis_ms: int | None = None) -> None:
        self.config = config or ChainConfig()
        self.world = WorldState()
        self.executor = Executor(self.world, self.config.rules)
        self.faults = Faults()
        self.genesis_ms = genesis_ms if genesis_ms is not None else int(time.time() * 1000)
        self.round = 0
        self.records: dict[str, TxRecord] = {}
        self.submissions: Counter[str] = Counter()
        # Hashes whose count changed since the saved chain last took them: a snapshot writes only these.
        self.submissions_changed: set[str] = set()
        # sender pubkey -> nonce -> candidates (replacements at the same nonce compete on gas price)
        self.pool: dict[bytes, dict[int, list[TxRecord]]] = defaultdict(dict)
        self.pool_senders: dict[int, dict[bytes, None]] = {s: {} for s in range(self.config.num_shards)}
        self.incoming: dict[int, list[TxRecord]] = {s: [] for s in range(self.config.num_shards)}
        self.blocks: dict[int, list[Block]] = {s: [] for s in range(self.config.num_shards)}
        self.hyperblocks: list[HyperBlock] = []
        self.block_index: dict[str, Block | HyperBlock] = {}
        # Shard blocks produced, not notarized yet: the next hyperblock notarizes them (with what each block
        # completed at its destination and sent out of its shard).
        self.unnotarized: list[tuple[Block, list[TxRecord], list[TxRecord]]] = []
        self.round_waiters: list[asyncio.Future[int]] = []
        self._genesis_blocks()

    # Clock ------------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(time.time() * 1000) + self.faults.clock_offset_ms

    @property
    def epoch(self) -> int:
        return self.round // self.config.rounds_per_epoch

    def round_start_ms(self, round_: int) -> int:
        return self.genesis_ms + round_ * self.config.round_ms + self.faults.clock_offset_ms

    # Submission -------------------------------------------------------------------------------------
    def validate(self, tx: Transaction, *, check_signature: bool = True) -> None:
        cfg = self.config
        check_static(tx, chain_id=cfg.chain_id, rules=cfg.rules, min_version=cfg.min_tx_version)
        if check_signature:
            check_signatures(tx)
        check_state(tx, self.world, cfg.rules, epoch=self.epoch)

    def submit(self, tx: Transaction) -> str:
        """Validate and add to the pool; the hash, or NodeError with the node's message."""
        h = compute_tx_hash(tx)
        self.count_submission(h)
        known = self.records.get(h)
        if known is not None and not known.dropped:
            if known.in_pool:
                return h  # the same transaction again while it waits: the pool keeps one copy
            # Executed (or executing): its nonce is used, so the node refuses it as any lower nonce.
            self.validate(tx)
            return h
        self.validate(tx)
        sender_pk = tx.sender.get_public_key()
        if known is not None:  # dropped before, executable now: back into the pool
            known.status, known.reason, known.outcome = "pending", "", None
            known.received_ms = self.now_ms()
            self.pool[sender_pk].setdefault(tx.nonce, []).append(known)
            self.pool_senders[known.sender_shard][sender_pk] = None
            return h
        record = TxRecord(
            hash=h,
            tx=tx,
            sender_shard=shard_of_pubkey(sender_pk, self.config.num_shards),
            receiver_shard=self.shard_for(tx.receiver.get_public_key(), sender_pk),
            received_ms=self.now_ms(),
            initially_paid_fee=initially_paid_fee(tx, self.config.rules),
        )
        self.records[h] = record
        self.pool[sender_pk].setdefault(tx.nonce, []).append(record)
        self.pool_senders[record.sender_shard][sender_pk] = None
        return h

    def count_submission(self, tx_hash: str) -> None:
        """Every send, accepted or not (tests count broadcasts with it), and which counts a snapshot writes."""
        self.submissions[tx_hash] += 1
        self.submissions_changed.add(tx_hash)

    def shard_for(self, pubkey: bytes, sender_pk: bytes) -> int:
        shard = shard_of_pubkey(pubkey, self.config.num_shards)
        # System addresses (metachain) are served in the sender's shard here.
        return shard_of_pubkey(sender_pk, self.config.num_shards) if shard == METACHAIN else shard

    def simulate(self, tx: Transaction, *, check_signature: bool) -> dict[str, Any]:
        """Run the transaction against a journaled state and undo it: the gateway's simulate, in its shapes.

        Each shard answers the node's `SimulationResults` as the proxy passes it on (`status`, `failReason`,
        `scResults`, `receipts`, `hash`: no gas used, no logs); a failure's `failReason` is the VM's return
        code text and the contract's message is in an SCR's `returnMessage`. A cross-shard transaction is
        answered `{"senderShard": ..., "receiverShard": ...}` (the proxy simulates it on both shards)."""
        h = compute_tx_hash(tx)
        sender_pk = tx.sender.get_public_key()
        cross = self.shard_for(tx.receiver.get_public_key(), sender_pk) != shard_of_pubkey(
            sender_pk, self.config.num_shards
        )

        def result(status: str, reason: str = "", message: str = "") -> dict[str, Any]:
            answer: dict[str, Any] = {"status": status, "hash": h}
            if reason:
                answer["failReason"] = reason
            if message:
                scr = hashlib.blake2b(f"{h}:simulated".encode(), digest_size=32).hexdigest()
                answer["scResults"] = {
                    scr: {"hash": scr, "returnMessage": message, "originalTxHash": h, "value": 0}
                }
            return answer

        with self.world.journaled():
            try:
                self.validate(tx, check_signature=check_signature)
            except NodeError as exc:
                source = result("fail", exc.message)
                return {"senderShard": source, "receiverShard": result("success")} if cross else source
            status, reason = self.executor.execute_source(tx, epoch=self.epoch)
            if status != "success":
                source = result("fail", reason)
                return {"senderShard": source, "receiverShard": result("success")} if cross else source
            outcome = self.executor.execute_destination(
                tx, bytes.fromhex(h), now_ms=self.now_ms(), round_=self.round, epoch=self.epoch
            )
        destination = (
            result("success")
            if outcome.status == "success"
            else result("fail", "user error", outcome.fail_reason)
        )
        return {"senderShard": result("success"), "receiverShard": destination} if cross else destination

    def estimate(self, tx: Transaction) -> tuple[int, str, Outcome | None]:
        """Gas units a transaction needs (the gateway's cost route), with the failure message if any."""
        rules = self.config.rules
        movement = rules.movement_gas_of(tx)
        probe = Transaction.new_from_dictionary(tx.to_dictionary())
        probe.gas_price, probe.version, probe.options, probe.nonce = (
            tx.gas_price,
            tx.version,
            tx.options,
            tx.nonce,
        )
        probe.gas_limit = rules.max_gas_per_tx
        sender = self.world.peek(tx.sender.get_public_key())
        if sender is not None and probe.nonce < sender.nonce:
            probe.nonce = sender.nonce
        with self.world.journaled():
            payer = self.world.get(fee_payer(probe))
            payer.balance += initially_paid_fee(probe, rules)  # the estimate ignores who can pay
            status, reason = self.executor.execute_source(probe, epoch=self.epoch)
            if status != "success":
                return 0, reason, None
            outcome = self.executor.execute_destination(
                probe, b"\x00" * 32, now_ms=self.now_ms(), round_=self.round, epoch=self.epoch
            )
        if outcome.status != "success":
            return 0, outcome.fail_reason, outcome
        if outcome.gas_used == probe.gas_limit:  # plain move balance consumed "all": it needs only movement
            return movement, "", outcome
        return outcome.gas_used, "", outcome

    # Rounds -----------------------------------------------------------------------------------------
    def _genesis_blocks(self) -> None:
        ts = self.round_start_ms(0)
        # The chain's identity (chain id, genesis time) seeds every hash: two chains never share a block.
        identity = f"{self.config.chain_id}@{self.genesis_ms}"
        shard_blocks = []
        for shard in range(self.config.num_shards):
            block = Block(shard, 0, 0, 0, _hash("block", shard, 0, identity), "", ts)
            self.blocks[shard].append(block)
            self.block_index[block.hash] = block
            shard_blocks.append(block)
        hyper = HyperBlock(0, 0, 0, _hash("hyper", 0, identity), "", ts, shard_blocks)
        self.hyperblocks.append(hyper)
        self.block_index[hyper.hash] = hyper

    def load_history(self, hyperblocks: list[HyperBlock]) -> None:
        """Take a saved chain's blocks: the shard chains and the hash index follow from the hyperblocks
        (every shard block is notarized by exactly one)."""
        self.hyperblocks = hyperblocks
        self.blocks = {s: [] for s in range(self.config.num_shards)}
        self.block_index = {}
        for hyper in hyperblocks:
            for block in hyper.shard_blocks:
                self.blocks[block.shard].append(block)
                self.block_index[block.hash] = block
            self.block_index[hyper.hash] = hyper

    def resume_clock(self) -> None:
        """After a stop, rounds continue on the wall clock: the rounds that passed meanwhile produced no
        block (as on a real network), the next block comes at once, and no timestamp goes backwards."""
        round_ms = self.config.round_ms
        wall_round = (int(time.time() * 1000) - self.genesis_ms) // round_ms
        last_ts = self.hyperblocks[-1].timestamp_ms
        # The smallest round r with round_start_ms(r + 1) > last_ts (a chain ahead of the wall clock, e.g.
        # after manual rounds, waits for it, as `run` does).
        after_last = (last_ts - self.faults.clock_offset_ms - self.genesis_ms) // round_ms
        self.round = max(self.round, wall_round - 1, after_last)

    def produce_round(self) -> HyperBlock:
        """Produce the next round's shard blocks, and the hyperblock that notarizes the earlier rounds' ones."""
        self.round += 1
        r, epoch = self.round, self.epoch
        ts = self.round_start_ms(r)
        produced: list[tuple[Block, list[TxRecord], list[TxRecord]]] = []
        for shard in range(self.config.num_shards):
            if shard in self.faults.stalled_shards:
                continue
            prev = self.blocks[shard][-1]
            block = Block(shard, prev.nonce + 1, r, epoch, _hash("block", shard, r, prev.hash), prev.hash, ts)
            miniblock = _hash("miniblock", shard, r, block.hash)
            ref = block.ref(miniblock)
            completed: list[TxRecord] = []
            sourced: list[TxRecord] = []
            # Destination halves first: their source blocks were notarized in an earlier round.
            arrivals, self.incoming[shard] = self.incoming[shard], []
            for record in arrivals:
                self._finish(record, ref, ts, r, epoch)
                block.tx_hashes.append(record.hash)
                completed.append(record)
            held: set[bytes] = set()  # senders whose transaction was dropped: their later nonces wait
            for record in self._select(shard):
                sender_pk = record.tx.sender.get_public_key()
                if sender_pk in held:
                    self.pool[sender_pk].setdefault(record.tx.nonce, []).append(record)
                    self.pool_senders[shard][sender_pk] = None
                    continue
                status, reason = self.executor.execute_source(record.tx, epoch=epoch)
                if status == "dropped":
                    self._drop(record, reason)
                    held.add(sender_pk)
                    continue
                block.tx_hashes.append(record.hash)
                record.source = ref
                if status != "success":
                    record.status, record.reason = status, reason
                    record.destination = ref
                    record.outcome = Outcome(
                        status,
                        gas_used=record.tx.gas_limit,
                        fee=record.initially_paid_fee,
                        fail_reason=reason,
                    )
                    completed.append(record)
                elif record.receiver_shard == shard:
                    self._finish(record, ref, ts, r, epoch)
                    completed.append(record)
                else:
                    sourced.append(record)
            self.blocks[shard].append(block)
            self.block_index[block.hash] = block
            produced.append((block, completed, sourced))
        # The metachain notarizes what the shards proposed before this round; this round's blocks wait.
        notarized, self.unnotarized = self.unnotarized, produced
        prev_hyper = self.hyperblocks[-1]
        hyper = HyperBlock(
            prev_hyper.nonce + 1,
            r,
            epoch,
            _hash("hyper", r, prev_hyper.hash),
            prev_hyper.hash,
            ts,
            [block for block, _, _ in notarized],
        )
        for _, completed, sourced in notarized:
            for record in sourced:
                # Not listed here: a hyperblock lists only what executed at its destination
                # (mx-chain-proxy-go process/hyperblockBuilder.go collectFinalizedTxs).
                record.source_hyper = hyper
                # Its destination shard takes it once the source block is notarized.
                self.incoming[record.receiver_shard].append(record)
            for record in completed:
                if record.source_hyper is None:
                    record.source_hyper = hyper
                record.destination_hyper = hyper
                hyper.tx_hashes.append(record.hash)
        self.hyperblocks.append(hyper)
        self.block_index[hyper.hash] = hyper
        for waiter in self.round_waiters:
            if not waiter.done():
                waiter.set_result(r)
        self.round_waiters.clear()
        return hyper

    def _finish(self, record: TxRecord, ref: BlockRef, ts: int, r: int, epoch: int) -> None:
        outcome = self.executor.execute_destination(
            record.tx, bytes.fromhex(record.hash), now_ms=ts, round_=r, epoch=epoch
        )
        record.outcome = outcome
        record.status = outcome.status
        record.reason = outcome.fail_reason
        record.destination = ref

    def _select(self, shard: int) -> list[TxRecord]:
        """Executable pool transactions of a shard, in nonce order per sender; losers of a nonce drop out."""
        chosen: list[TxRecord] = []
        senders = self.pool_senders[shard]
        budget = self.config.max_txs_per_block
        for sender_pk in list(senders):
            by_nonce = self.pool[sender_pk]
            account = self.world.peek(sender_pk)
            nonce = account.nonce if account else 0
            for stale in [n for n in by_nonce if n < nonce]:
                for loser in by_nonce.pop(stale):
                    self._drop(loser, "lower nonce in transaction")
            while nonce in by_nonce and budget > 0:
                candidates = by_nonce.pop(nonce)
                # The best gas price wins the nonce; on a tie, the first seen.
                best = max(candidates, key=lambda c: (c.tx.gas_price, -c.received_ms))
                for loser in candidates:
                    if loser is not best:
                        self._drop(loser, "lower nonce in transaction")
                chosen.append(best)
                nonce += 1
                budget -= 1
            if not by_nonce:
                del senders[sender_pk]
                del self.pool[sender_pk]
            if budget <= 0:
                break
        return chosen

    def _drop(self, record: TxRecord, reason: str) -> None:
        # Out of the pool without a block (not executable, or displaced by another transaction of its nonce):
        # the node forgets it, and a lookup answers "transaction not found".
        record.status, record.reason = "dropped", reason
        record.outcome = None

    async def next_round(self) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.round_waiters.append(fut)
        return await fut

    async def run(self) -> None:
        """Produce rounds on the wall clock until cancelled."""
        while True:
            due = self.genesis_ms + (self.round + 1) * self.config.round_ms
            delay = (due - time.time() * 1000) / 1000
            if delay > 0:
                await asyncio.sleep(delay)
            self.produce_round()

    # Reads ------------------------------------------------------------------------------------------
    def shard_status(self, shard: int) -> dict[str, Any]:
        if shard == METACHAIN:
            chain: list[Any] = self.hyperblocks
        else:
            chain = self.blocks[shard]
        last = chain[-1]
        final = chain[-2] if len(chain) > 1 else chain[-1]
        epoch_start_round = self.epoch * self.config.rounds_per_epoch
        return {
            "erd_nonce": last.nonce,
            "erd_highest_final_nonce": final.nonce,
            "erd_current_round": self.round,
            "erd_epoch_number": self.epoch,
            "erd_block_timestamp": last.timestamp_ms // 1000,
            "erd_block_timestamp_ms": last.timestamp_ms,
            "erd_round_at_epoch_start": epoch_start_round,
            "erd_nonce_at_epoch_start": 0,
            "erd_rounds_per_epoch": self.config.rounds_per_epoch,
            "erd_rounds_passed_in_current_epoch": self.round - epoch_start_round,
            "erd_cross_check_block_height": "",
            "erd_last_executed_nonce": last.nonce,
        }

    def highest_final_hyper(self) -> int:
        return self.hyperblocks[-2].nonce if len(self.hyperblocks) > 1 else 0

    def is_final(self, record: TxRecord) -> bool:
        return (
            record.destination_hyper is not None
            and record.destination_hyper.nonce <= self.highest_final_hyper()
        )

    def pool_of(self, sender_pk: bytes) -> list[TxRecord]:
        return sorted(
            (r for candidates in self.pool.get(sender_pk, {}).values() for r in candidates),
            key=lambda r: (r.tx.nonce, -r.tx.gas_price),
        )

    def is_relayed(self, record: TxRecord) -> bool:
        return is_relayed_v3(record.tx)


def _hash(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=32).hexdigest()
