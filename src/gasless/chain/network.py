"""Network parameters and chain-time facts, kept current by one background poller.

Everything the request path needs about the chain (gas rules, shard heights, finality, recent shard-1 block
hashes for native auth, how far our clock is from the chain's) is read from here, never fetched per request.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import structlog

from gasless.chain.addresses import METACHAIN
from gasless.chain.gas import GasRules
from gasless.chain.gateway import GatewayClient, GatewayUnavailable
from gasless.core.workers import cancel_and_wait

MIN_POLL_MS = 50
# How long after a round starts the aligned poll reads the statuses: the block of that round is proposed at
# its start, and a node serves it a few milliseconds later.
ROUND_POLL_LAG_MS = 25
MAX_BLOCKS_PER_POLL = 64  # catch-up bound: after a long outage, skip to the recent blocks
STALL_ROUNDS = 3  # a shard whose newest block is this many rounds behind the freshest shard is stalled


def _log() -> Any:
    # Looked up per use, not bound at import: logging is configured at start (and captured in tests).
    return structlog.get_logger("gasless.chain")


@dataclass(frozen=True)
class NetworkParams:
    """The `/network/config` values the service uses."""

    chain_id: str
    round_duration_ms: int
    min_gas_price: int
    min_gas_limit: int
    gas_per_data_byte: int
    gas_price_modifier: Decimal
    extra_gas_guarded: int
    extra_gas_relayed: int
    max_gas_per_tx: int
    num_shards: int
    rounds_per_epoch: int
    start_time_ms: int
    min_tx_version: int

    def gas_rules(self) -> GasRules:
        return GasRules(
            min_gas_price=self.min_gas_price,
            min_gas_limit=self.min_gas_limit,
            gas_per_data_byte=self.gas_per_data_byte,
            gas_price_modifier=self.gas_price_modifier,
            extra_gas_guarded=self.extra_gas_guarded,
            extra_gas_relayed=self.extra_gas_relayed,
            max_gas_per_tx=self.max_gas_per_tx,
        )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> NetworkParams:
        """From `data.config`; ValueError when a required member is missing or malformed."""
        try:
            min_gas_limit = int(config["erd_min_gas_limit"])
            return cls(
                chain_id=str(config["erd_chain_id"]),
                round_duration_ms=int(config["erd_round_duration"]),
                min_gas_price=int(config["erd_min_gas_price"]),
                min_gas_limit=min_gas_limit,
                gas_per_data_byte=int(config["erd_gas_per_data_byte"]),
                # A string ("0.01") on the wire: Decimal keeps it exact.
                gas_price_modifier=Decimal(str(config["erd_gas_price_modifier"])),
                # Older proxies omit these; the node's values are MinGasLimit for both extras.
                extra_gas_guarded=int(config.get("erd_extra_gas_limit_guarded_tx", min_gas_limit)),
                extra_gas_relayed=int(config.get("erd_extra_gas_limit_relayed_tx", min_gas_limit)),
                max_gas_per_tx=int(config.get("erd_max_gas_per_transaction", GasRules.max_gas_per_tx)),
                num_shards=int(config["erd_num_shards_without_meta"]),
                rounds_per_epoch=int(config["erd_rounds_per_epoch"]),
                start_time_ms=int(config["erd_start_time"]) * 1000,
                min_tx_version=int(config["erd_min_transaction_version"]),
            )
        except (KeyError, TypeError, ArithmeticError, ValueError) as exc:
            raise ValueError(f"unusable /network/config: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class ShardStatus:
    shard: int
    nonce: int
    highest_final_nonce: int
    round: int
    epoch: int
    block_ts_ms: int  # timestamp of the shard's newest block, on the chain's clock
    observed_at_ms: int  # when we read it, on our clock

    @classmethod
    def from_status(cls, shard: int, status: dict[str, Any], observed_at_ms: int) -> ShardStatus:
        ts_ms = status.get("erd_block_timestamp_ms")
        if not ts_ms:
            ts_ms = int(status.get("erd_block_timestamp", 0)) * 1000
        return cls(
            shard=shard,
            nonce=int(status["erd_nonce"]),
            highest_final_nonce=int(status["erd_highest_final_nonce"]),
            round=int(status["erd_current_round"]),
            epoch=int(status["erd_epoch_number"]),
            block_ts_ms=int(ts_ms),
            observed_at_ms=observed_at_ms,
        )


class BlockRecord:
    """Recent blocks of one shard by hash, so a native-auth token's block hash resolves without a gateway.

    Bounded both by age (relative to the newest recorded block, i.e. on the chain's clock) and by count.
    """

    def __init__(self, max_age_ms: int = 86_400_000, max_blocks: int = 200_000) -> None:
        self.max_age_ms = max_age_ms
        self.max_blocks = max_blocks
        self._by_hash: dict[str, tuple[int, int]] = {}
        self._order: deque[str] = deque()  # insertion order, oldest first (blocks are added in nonce order)
        self._latest: tuple[str, int, int] | None = None

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._by_hash

    def add(self, block_hash: str, nonce: int, timestamp_ms: int) -> None:
        if block_hash in self._by_hash:
            return
        self._by_hash[block_hash] = (nonce, timestamp_ms)
        self._order.append(block_hash)
        if self._latest is None or nonce > self._latest[1]:
            self._latest = (block_hash, nonce, timestamp_ms)
        self._prune()

    def _prune(self) -> None:
        assert self._latest is not None
        horizon = self._latest[2] - self.max_age_ms
        while self._order and (
            len(self._order) > self.max_blocks or self._by_hash[self._order[0]][1] < horizon
        ):
            del self._by_hash[self._order.popleft()]

    def timestamp_ms(self, block_hash: str) -> int | None:
        entry = self._by_hash.get(block_hash)
        return entry[1] if entry else None

    def nonce(self, block_hash: str) -> int | None:
        entry = self._by_hash.get(block_hash)
        return entry[0] if entry else None

    def latest(self) -> tuple[str, int, int] | None:
        """(hash, nonce, timestamp_ms) of the highest recorded block."""
        return self._latest

    def settled(self, behind: int) -> tuple[str, int, int] | None:
        """(hash, nonce, timestamp_ms) of the newest recorded block at least `behind` nonces below the
        highest; the highest itself while fewer blocks are recorded."""
        if self._latest is None:
            return None
        target = self._latest[1] - behind
        for block_hash in reversed(self._order):  # newest first: about `behind` + 1 steps
            nonce, timestamp_ms = self._by_hash[block_hash]
            if nonce <= target:
                return block_hash, nonce, timestamp_ms
        return self._latest

    def latest_timestamp_ms(self) -> int | None:
        return self._latest[2] if self._latest else None


PollCallback = Callable[[], Awaitable[None] | None]


class NetworkView:
    """Network parameters, shard statuses, recent blocks and clock offset, refreshed by a poll loop."""

    def __init__(
        self,
        gateway: GatewayClient,
        *,
        poll_ms: int | None = None,
        clock: Callable[[], float] = time.time,
        record_shard: int = 1,
    ) -> None:
        self.gateway = gateway
        self.poll_ms = poll_ms
        self.record_shard = record_shard
        self.blocks = BlockRecord()
        self._clock = clock
        self._params: NetworkParams | None = None
        self._epoch: int | None = None
        self._statuses: dict[int, ShardStatus] = {}
        self._callbacks: list[PollCallback] = []
        self._task: asyncio.Task[None] | None = None
        self._failing = False  # inside a streak of failed polls (log the start and the end, not each one)
        self.polls = 0

    # Lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the config and every shard's status once (GatewayUnavailable if impossible), then poll."""
        if self._task is not None:
            return
        self._params = NetworkParams.from_config(await self.gateway.network_config())
        statuses = await asyncio.gather(*(self._fetch_status(s) for s in self._shards()))
        for status in statuses:
            self._statuses[status.shard] = status
        self._epoch = self._statuses[METACHAIN].epoch
        try:
            await self._record_blocks()
        except Exception as exc:  # noqa: BLE001 - blocks are best effort here; the poll loop retries them
            _log().warning("network.blocks_failed", shard=self.record_shard, error=str(exc))
        self._task = asyncio.create_task(self._run(), name="network-view-poll")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    @property
    def ready(self) -> bool:
        return self._params is not None and METACHAIN in self._statuses

    def on_poll(self, callback: PollCallback) -> None:
        """Run `callback` after every poll (its failures are logged, never fatal)."""
        self._callbacks.append(callback)

    # Reads ----------------------------------------------------------------------------------------------
    @property
    def params(self) -> NetworkParams:
        if self._params is None:
            raise RuntimeError("NetworkView.start() has not loaded the network config yet")
        return self._params

    @property
    def epoch(self) -> int:
        if self._epoch is None:
            raise RuntimeError("NetworkView.start() has not loaded the metachain status yet")
        return self._epoch

    def status(self, shard: int) -> ShardStatus | None:
        return self._statuses.get(shard)

    @property
    def meta_highest_final_nonce(self) -> int | None:
        meta = self._statuses.get(METACHAIN)
        return meta.highest_final_nonce if meta else None

    async def block_timestamp_ms(self, block_hash: str) -> int | None:
        """A block's timestamp on the chain, by hash: the record first, then the gateway, the recorded shard
        first, then the others; None when no shard has it. GatewayUnavailable when a shard could not tell."""
        known = self.blocks.timestamp_ms(block_hash)
        if known is not None:
            return known
        shards = [self.record_shard, *(s for s in self._shards() if s != self.record_shard)]
        for shard in shards:
            block = await self.gateway.block_by_hash(shard, block_hash)
            if block is not None and str(block.get("hash", "")).lower() == block_hash.lower():
                return int(block.get("timestampMs") or int(block.get("timestamp", 0)) * 1000)
        return None

    def clock_offset_ms(self) -> int | None:
        """Our clock minus the chain's, from the freshest shards (positive: we are ahead of the chain).

        Each shard gives `observed_at - timestamp of its newest block`, which is the skew plus the block's age
        when we read it. A skew moves every shard alike, while a stalled shard only ages: shards whose newest
        block lags the freshest one (chain time against chain time, so the skew cannot hide it) are left out,
        and of the rest the smallest offset in absolute value is the best estimate.
        """
        if not self._statuses:
            return None
        statuses = list(self._statuses.values())
        freshest = max(s.block_ts_ms for s in statuses)
        round_ms = self._params.round_duration_ms if self._params else 0
        live = [s for s in statuses if freshest - s.block_ts_ms <= STALL_ROUNDS * round_ms]
        offsets = [s.observed_at_ms - s.block_ts_ms for s in live or statuses]
        return min(offsets, key=abs)

    # Polling --------------------------------------------------------------------------------------------
    def _shards(self) -> list[int]:
        return [*range(self.params.num_shards), METACHAIN]

    def _interval_s(self) -> float:
        ms = self.poll_ms if self.poll_ms is not None else self.params.round_duration_ms // 2
        return max(MIN_POLL_MS, ms) / 1000

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def _fetch_status(self, shard: int) -> ShardStatus:
        status = await self.gateway.network_status(shard)
        return ShardStatus.from_status(shard, status, self._now_ms())

    def next_poll_delay_ms(self, polled_in_ms: int) -> int:
        """How long to wait before the next poll, the last one having taken `polled_in_ms`.

        Twice a round, in phase with the chain's round clock: just after a round starts (when its block
        appears) and half a round later. A new block is then seen within milliseconds instead of anywhere
        up to half a round, and the tracker's write of what that block settled (it follows this poll) falls
        at the start of a round, not at its end, where it would hold up relays racing for the next block.
        The phase comes from the newest metachain block's timestamp (blocks are stamped with the start of
        their round). Without it, or with a fixed `poll_ms`, a steady cadence."""
        interval_ms = int(self._interval_s() * 1000)
        meta = self._statuses.get(METACHAIN)
        if self.poll_ms is not None or self._params is None or meta is None or meta.block_ts_ms <= 0:
            return max(0, interval_ms - polled_in_ms)
        half_ms = max(MIN_POLL_MS, self._params.round_duration_ms // 2)
        since = self._now_ms() - (meta.block_ts_ms + ROUND_POLL_LAG_MS)
        return half_ms - since % half_ms  # to the next aligned moment, in (0, half a round]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.poll_once()
            await asyncio.sleep(self.next_poll_delay_ms(int(1000 * (loop.time() - started))) / 1000)

    async def poll_once(self) -> None:
        """One poll: statuses, params on a new epoch, new blocks, then the callbacks. Never raises."""
        try:
            await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the poller must outlive any gateway or parsing failure
            if not self._failing:
                _log().warning("network.poll_failed", error=str(exc), error_type=type(exc).__name__)
            else:
                _log().debug("network.poll_failed", error=str(exc), error_type=type(exc).__name__)
            self._failing = True
        else:
            if self._failing:
                _log().info("network.poll_recovered")
            self._failing = False
        self.polls += 1
        for callback in list(self._callbacks):
            try:
                outcome = callback()
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one subscriber must not stop the poller
                _log().exception("network.poll_callback_failed", error=str(exc))

    async def _poll(self) -> None:
        shards = self._shards()
        results = await asyncio.gather(*(self._fetch_status(s) for s in shards), return_exceptions=True)
        errors: list[str] = []
        for shard, result in zip(shards, results, strict=True):
            if isinstance(result, ShardStatus):
                self._statuses[shard] = result
            elif isinstance(result, asyncio.CancelledError):
                raise result
            else:
                errors.append(f"shard {shard}: {result}")
        meta = self._statuses[METACHAIN]
        if meta.epoch != self._epoch:
            # Parameters change only at epoch boundaries (round duration too, e.g. Supernova).
            self._params = NetworkParams.from_config(await self.gateway.network_config())
            _log().info(
                "network.epoch_changed",
                old=self._epoch,
                new=meta.epoch,
                round_ms=self.params.round_duration_ms,
            )
            self._epoch = meta.epoch  # only after the config is read: a failed read is retried next poll
        await self._record_blocks()
        if errors:
            raise GatewayUnavailable("; ".join(errors))

    async def _record_blocks(self) -> None:
        status = self._statuses.get(self.record_shard)
        if status is None:
            return
        latest = self.blocks.latest()
        first = latest[1] + 1 if latest else status.nonce
        first = max(first, status.nonce - MAX_BLOCKS_PER_POLL + 1)  # skip an older gap rather than crawl it
        nonces = list(range(first, status.nonce + 1))
        if not nonces:
            return
        results = await asyncio.gather(
            *(self.gateway.block_by_nonce(self.record_shard, n) for n in nonces), return_exceptions=True
        )
        for nonce, block in zip(nonces, results, strict=True):
            if isinstance(block, asyncio.CancelledError):
                raise block
            if isinstance(block, BaseException):
                # Keep the record gap-free: the rest is fetched again next poll.
                raise block
            ts_ms = block.get("timestampMs") or int(block.get("timestamp", 0)) * 1000
            self.blocks.add(str(block["hash"]), int(block.get("nonce", nonce)), int(ts_ms))
