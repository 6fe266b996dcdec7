"""The Status document: measured values only (docs/status.md has every formula).

- components: the API (this host ready), relaying per shard (an assignable relayer, a moving shard, no open
  incident on it), the gateways (the network view's polls), the contract (its pause state) and the exchange
  venue (its state);
- latency per shard: the last hour of 1-minute rollups; latency30d: 30 days of 1-hour rollups;
- floatPerShard: `critical` when no active relayer of the shard is funded, `low` when one of them holds less
  than `LOW_FLOAT_FACTOR` times the funding minimum, else `ok` (never a balance);
- availability: per UTC day, the share of valid relay requests answered BROADCAST or a correct 4xx;
  `availability30d` stays null until 30 days of data exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gasless.incidents.repository import IncidentRepository
from gasless.incidents.service import to_incident
from gasless.status.probe import load_results
from gasless.status.repository import AVAILABILITY_DAYS, DAY_MS, StatusRepository, availability_start
from gasless.status.schemas import AvailabilityDay, Component, ProbeResult, ShardLatency, Status, Telemetry
from gasless.usage.latency import SHARD_WINDOW_MS
from gasless.usage.rollups import RollupRepository, merged, percentile

LOW_FLOAT_FACTOR = 5
PROBE_FRESH_MS = 60_000  # a failed probe older than three periods no longer degrades the shard
STALLED_ROUNDS = 10
ORDER = {"operational": 0, "degraded": 1, "outage": 2}


def _latency(shard: int, histograms: dict[str, list[str]], window_ms: int, first: int | None) -> ShardLatency:
    added, inclusion = merged(histograms.get("added", [])), merged(histograms.get("inclusion", []))
    return ShardLatency(
        shard=shard,
        addedP50Ms=percentile(added, 50),
        addedP99Ms=percentile(added, 99),
        inclusionP50Ms=percentile(inclusion, 50),
        inclusionP95Ms=percentile(inclusion, 95),
        inclusionP99Ms=percentile(inclusion, 99),
        samples=int(max(added.get_total_count(), inclusion.get_total_count())),
        windowMs=window_ms,
        measuredFromMs=first,
    )


class StatusService:
    def __init__(
        self,
        repo: StatusRepository,
        rollups: RollupRepository,
        incidents: IncidentRepository,
        *,
        host: Any,  # HostState: readiness, the relayer pool, the network view, the contract mirror
        min_balance_atto: int,
        excluded_senders: Callable[[], tuple[str, ...]] = tuple,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.repo = repo
        self.rollups = rollups
        self.incidents = incidents
        self.host = host
        self.min_balance_atto = min_balance_atto
        self.excluded_senders = excluded_senders  # the synthetic probe's accounts
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _shard_latency(
        self, granularity: str, window_ms: int, now: int, shards: int
    ) -> list[ShardLatency]:
        rows = await self.rollups.read(
            "shard",
            granularity=granularity,
            from_ms=now - window_ms,
            to_ms=now + 1,
            metrics=("added", "inclusion"),
        )
        by_shard: dict[str, dict[str, list[str]]] = {}
        first: dict[str, int] = {}
        for row in rows:
            by_shard.setdefault(row.key, {}).setdefault(row.metric, []).append(row.histogram)
            first[row.key] = min(first.get(row.key, row.bucket_ms), row.bucket_ms)
        return [_latency(s, by_shard.get(str(s), {}), window_ms, first.get(str(s))) for s in range(shards)]

    def _floats(self, shards: int) -> dict[str, str]:
        pool = self.host.relayers
        labels: dict[str, str] = {}
        for shard in range(shards):
            active = [r for r in (pool.all() if pool else []) if r.shard == shard and r.state == "active"]
            funded = [r for r in active if r.funded]
            if not funded:
                labels[str(shard)] = "critical"
            elif any(r.balance_atto < LOW_FLOAT_FACTOR * self.min_balance_atto for r in active):
                labels[str(shard)] = "low"
            else:
                labels[str(shard)] = "ok"
        return labels

    async def _components(self, shards: int, floats: dict[str, str], open_: list[Any]) -> list[Component]:
        host = self.host
        view = host.network
        components = [
            Component(
                id="api",
                name="API",
                status="operational" if host.restored else "outage",
                reason=None if host.restored else "the host is starting",
            )
        ]
        now = self.now_ms()
        chain_now = now + ((view.clock_offset_ms() or 0) if view is not None else 0)
        probes = await load_results(self.repo.engine)
        for shard in range(shards):
            status = view.status(shard) if view is not None else None
            round_ms = view.params.round_duration_ms if view is not None and view.ready else 600
            reason, state = None, "operational"
            if status is None or chain_now - status.block_ts_ms > STALLED_ROUNDS * round_ms:
                state, reason = "outage", "no new block for more than 10 rounds"
            elif floats.get(str(shard)) == "critical":
                state, reason = "outage", "no funded active relayer"
            elif (
                (probe := probes.get(shard)) is not None
                and probe["outcome"] not in ("success",)
                and (now - int(probe["atMs"]) < 3 * PROBE_FRESH_MS)
            ):
                state, reason = "degraded", f"the synthetic probe's last transfer: {probe['outcome']}"
            elif any(i.shard == shard for i in open_):
                state, reason = "degraded", "an open incident"
            elif floats.get(str(shard)) == "low":
                state, reason = "degraded", "relayer float low"
            last = probes.get(shard)
            components.append(
                Component(
                    id=f"relaying-shard-{shard}",
                    name=f"Relaying, shard {shard}",
                    shard=shard,
                    status=state,  # type: ignore[arg-type]
                    reason=reason,
                    probe=None
                    if last is None
                    else ProbeResult(**{k: last.get(k) for k in ("atMs", "outcome", "inclusionMs", "code")}),
                )
            )
        failing = view is None or not view.ready or bool(getattr(view, "_failing", False))
        components.append(
            Component(
                id="gateways",
                name="Gateways",
                status="outage" if failing else "operational",
                reason="the gateways do not answer" if failing else None,
            )
        )
        mirror = host.mirror
        contract_state, contract_reason, venue_state, venue_reason = "operational", None, "operational", None
        if mirror is not None and mirror.contract is not None:
            try:
                pause = (await mirror.pause_state())[0]
                if pause.paused:
                    contract_state, contract_reason = "degraded", "paused: purchases and contract calls wait"
                elif pause.deposits_paused:
                    contract_state, contract_reason = "degraded", "deposits paused"
                if mirror.pair is not None and not await mirror.venue_open():
                    venue_state, venue_reason = "degraded", "paused: deposits and purchases wait"
            except Exception:  # the gateways do not answer: the gateways component says so
                contract_state, contract_reason = "degraded", "its state could not be read"
        components.append(
            Component(id="contract", name="Billing contract", status=contract_state, reason=contract_reason)
        )  # type: ignore[arg-type]
        components.append(
            Component(id="exchange-venue", name="Exchange venue", status=venue_state, reason=venue_reason)
        )  # type: ignore[arg-type]
        return components

    async def availability(self, now: int) -> tuple[list[AvailabilityDay], float | None]:
        today = now // DAY_MS * DAY_MS
        start = availability_start(now)
        outcomes = await self.repo.outcomes_by_day(start, self.excluded_senders(), now_ms=now)
        touching = await self.repo.incidents_between(start, today + DAY_MS)
        days = []
        for index in range(AVAILABILITY_DAYS):
            day = start + index * DAY_MS
            good, bad = outcomes.get(day, (0, 0))
            pct = round(100.0 * good / (good + bad), 3) if good + bad else None
            count = sum(
                1
                for incident in touching
                if incident.created_at_ms < day + DAY_MS
                and (incident.resolved_at_ms is None or incident.resolved_at_ms >= day)
            )
            days.append(AvailabilityDay(dayStartMs=day, availabilityPct=pct, incidents=count))
        first = await self.repo.first_activity_ms()
        overall: float | None = None
        if first is not None and now - first >= 30 * DAY_MS:
            window = [outcomes.get(today - i * DAY_MS, (0, 0)) for i in range(30)]
            good, total = sum(g for g, _ in window), sum(g + b for g, b in window)
            overall = round(100.0 * good / total, 3) if total else None
        return days, overall

    async def status(self) -> Status:
        now = self.now_ms()
        view = self.host.network
        shards = view.params.num_shards if view is not None and view.ready else 3
        rows = await self.incidents.page(
            shard=None, status=None, from_ms=now, to_ms=now, now_ms=now, after=None, limit=100
        )
        open_ = [row for row in rows if row.resolved_at_ms is None]
        floats = self._floats(shards)
        latency = await self._shard_latency("m", SHARD_WINDOW_MS, now, shards)
        latency30 = await self._shard_latency("h", 30 * DAY_MS, now, shards)
        days, overall = await self.availability(now)
        components = await self._components(shards, floats, open_)
        day_rows = await self.rollups.read(
            "shard", granularity="m", from_ms=now - DAY_MS, to_ms=now + 1, metrics=("added",)
        )
        return Status(
            overall=max((c.status for c in components), key=lambda s: ORDER[s]),  # type: ignore[arg-type]
            components=components,
            latency=latency,
            floatPerShard=floats,  # type: ignore[arg-type]
            openIncidents=[to_incident(row) for row in open_],
            latency30d=latency30,
            availabilityDaily90=days,
            availability30d=overall,
            relays24h=sum(row.count for row in day_rows),
            generatedAtMs=now,
        )

    @staticmethod
    def telemetry(status: Status) -> Telemetry:
        return Telemetry(
            latency30d=status.latency30d,
            availabilityDaily90=status.availabilityDaily90,
            generatedAtMs=status.generatedAtMs,
        )
