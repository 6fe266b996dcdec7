"""`GET /v1/usage/latency`: an account's latency by shard, relayer, sender or first-acknowledging gateway,
from the rollups (never from raw rows); samples (at most 48 per group, with their hashes) are the raw rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import false, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db.tables import usage_ledger
from gasless.usage.rollups import (
    ACCOUNT_DIMENSIONS,
    DAY_MS,
    HOUR_MS,
    RELATIVE_ERROR,
    UNKNOWN_GATEWAY,
    RollupRepository,
    bins,
    figures,
    merged,
    percentile,
)
from gasless.usage.schemas import (
    LatencyBin,
    LatencyGroup,
    LatencyPercentiles,
    LatencySample,
    UsageLatency,
)

WINDOWS: dict[str, tuple[int, str]] = {
    "1h": (HOUR_MS, "m"),
    "24h": (DAY_MS, "m"),
    "7d": (7 * DAY_MS, "h"),
    "30d": (30 * DAY_MS, "h"),
}
ROLLUP_MS = {"m": 60_000, "h": HOUR_MS}
INCLUSION_EDGES = (250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000)
MAX_SAMPLES = 48


def _percentiles(histogram: Any) -> LatencyPercentiles:
    return LatencyPercentiles(
        p50Ms=percentile(histogram, 50), p95Ms=percentile(histogram, 95), p99Ms=percentile(histogram, 99)
    )


class LatencyService:
    def __init__(
        self,
        engine: AsyncEngine,
        rollups: RollupRepository,
        round_ms: Callable[[], int],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.rollups = rollups
        self.round_ms = round_ms
        self.clock = clock

    async def latency(self, account: str, window: str, group_by: str) -> UsageLatency:
        window_ms, granularity = WINDOWS[window]
        now = int(self.clock() * 1000)
        from_ms = now - window_ms
        prefix = f"{account}|"
        rows = await self.rollups.read(
            ACCOUNT_DIMENSIONS[group_by],
            granularity=granularity,
            from_ms=from_ms,
            to_ms=now + 1,
            key_prefix=prefix,
            metrics=("added", "inclusion"),
        )
        by_group: dict[str, dict[str, list[str]]] = {}
        for row in rows:
            by_group.setdefault(row.key[len(prefix) :], {}).setdefault(row.metric, []).append(row.histogram)
        samples = await self._samples(account, group_by, from_ms)
        groups = []
        for key in sorted(by_group):
            added = merged(by_group[key].get("added", []))
            inclusion = merged(by_group[key].get("inclusion", []))
            groups.append(
                LatencyGroup(
                    key=key,
                    count=int(max(added.get_total_count(), inclusion.get_total_count())),
                    added=_percentiles(added),
                    inclusion=_percentiles(inclusion),
                    bins=[LatencyBin(leMs=le, count=count) for le, count in bins(inclusion, INCLUSION_EDGES)],
                    samples=samples.get(key, []),
                )
            )
        return UsageLatency(
            account=account,
            window=window,  # type: ignore[arg-type]
            windowMs=window_ms,
            groupBy=group_by,  # type: ignore[arg-type]
            rollupMs=ROLLUP_MS[granularity],
            fromMs=from_ms,
            toMs=now,
            relativeError=RELATIVE_ERROR,
            groups=groups,
        )

    async def _samples(self, account: str, group_by: str, from_ms: int) -> dict[str, list[LatencySample]]:
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(usage_ledger)
                    .where(
                        usage_ledger.c.account == account,
                        usage_ledger.c.terminal_at_ms >= from_ms,
                        # An expression, so no index on `rolled_up` can serve it: on a migrated SQLite
                        # database the planner otherwise walked every rolled-up row of the window, all
                        # accounts', by `(rolled_up, terminal_at_ms)` (17x the CPU at 10 M rows) instead of
                        # the account's newest rows by `(account, terminal_at_ms)`.
                        func.coalesce(usage_ledger.c.rolled_up, false()).is_(True),
                    )
                    .order_by(usage_ledger.c.terminal_at_ms.desc())
                    .limit(MAX_SAMPLES * 16)
                )
            ).all()
        round_ms = int(self.round_ms())
        samples: dict[str, list[LatencySample]] = {}
        for row in rows:
            key = {
                "shard": str(int(row.sender_shard)),
                "relayer": row.relayer,
                "sender": row.sender,
                "gateway": row.first_ack_gateway or UNKNOWN_GATEWAY,
            }[group_by]
            bucket = samples.setdefault(key, [])
            if len(bucket) < MAX_SAMPLES:
                values = figures(row, round_ms)
                bucket.append(
                    LatencySample(
                        txHash=row.tx_hash,
                        addedMs=values.get("added"),
                        inclusionMs=values.get("inclusion"),
                        terminalAtMs=int(row.terminal_at_ms),
                    )
                )
        return samples


SHARD_WINDOW_MS = HOUR_MS  # the network view's latency window (1-minute rollups of the last hour)


async def shard_figures(rollups: RollupRepository, now_ms: int) -> dict[str, dict[str, Any]]:
    """Per shard: added and inclusion percentiles over the last hour and the relays of the last 24 h, from
    the public `shard` rollups (synthetic probe traffic never reaches them)."""
    rows = await rollups.read(
        "shard", granularity="m", from_ms=now_ms - DAY_MS, to_ms=now_ms + 1, metrics=("added", "inclusion")
    )
    recent: dict[str, dict[str, list[str]]] = {}
    day_counts: dict[str, int] = {}
    for row in rows:
        if row.metric == "added":
            day_counts[row.key] = day_counts.get(row.key, 0) + row.count
        if row.bucket_ms >= now_ms - SHARD_WINDOW_MS:
            recent.setdefault(row.key, {}).setdefault(row.metric, []).append(row.histogram)
    figures_: dict[str, dict[str, Any]] = {}
    for shard in set(recent) | set(day_counts):
        added = merged(recent.get(shard, {}).get("added", []))
        inclusion = merged(recent.get(shard, {}).get("inclusion", []))
        figures_[shard] = {
            "addedP50Ms": percentile(added, 50),
            "addedP99Ms": percentile(added, 99),
            "inclusionP50Ms": percentile(inclusion, 50),
            "inclusionP95Ms": percentile(inclusion, 95),
            "inclusionP99Ms": percentile(inclusion, 99),
            "samples": int(max(added.get_total_count(), inclusion.get_total_count())),
            "relays24h": day_counts.get(shard, 0),
        }
    return figures_
