"""Prometheus metrics of one API host: one registry per app, served on the admin port only.

- request latency per route template and status class (a pure-ASGI middleware; also the access log);
- relay stage timings, observed when a stage's closing transition is published on the intent bus;
- gateway failures by gateway and kind (the gateway client reports each answer that is not the node's);
- platform admission refusals, and the automatic incidents raised and resolved (gasless.incidents);
- queue depths and singleton leadership, read from the host at scrape time;
- what an on-call person acts on (deploy/prometheus/, docs/operations.md "Alerts and runbooks"): relayer
  funds (balance, spend rate, time to the floor, assignability), intents stuck after their co-signature,
  sends no gateway acknowledged, the mirror's and the tracker's lag, settlement failures, the webhook
  backlog, the dependencies (database, Redis, gateways) as the host's own probe finds them, the signer
  fence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = structlog.get_logger("gasless.http.access")

ASGIApp = Callable[..., Any]

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
UNMATCHED_ROUTE = "<unmatched>"  # never the raw path: arbitrary paths would be unbounded label values
PROBE_ROUTES = frozenset({"/healthz", "/readyz"})


class HostMetrics:
    """The metrics of one host, registered in its own `CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Histogram(
            "gasless_http_request_duration_seconds",
            "API request latency until the response is complete (event streams: until the headers).",
            ("method", "route", "status_class"),
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.stages = Histogram(
            "gasless_relay_stage_seconds",
            "Relay stage durations of the intents this host moved (an Intent's `latency` figures).",
            ("stage",),
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.transitions = Counter(
            "gasless_intent_transitions",
            "Intent state changes this host made, by the state entered.",
            ("state",),
            registry=self.registry,
        )
        self.gateway_errors = Counter(
            "gasless_gateway_errors",
            "Gateway requests without a node's answer, by gateway and kind.",
            ("gateway", "kind"),
            registry=self.registry,
        )
        self.platform_refusals = Counter(
            "gasless_platform_admission_refusals",
            "Relays this host refused because the platform-wide admission budget bound.",
            registry=self.registry,
        )
        self.automatic_incidents = Counter(
            "gasless_automatic_incidents",
            "Automatic incidents this host raised or resolved, by kind and change (raised, resolved).",
            ("kind", "change"),
            registry=self.registry,
        )
        self.unacknowledged_sends = Counter(
            "gasless_broadcast_unacknowledged",
            "Sends of a co-signed transaction (first sends and re-sends) that no gateway acknowledged.",
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "gasless_event_loop_lag_seconds",
            "How late this process's event loop ran its heartbeat: what every callback due meanwhile waited.",
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.gc_pause = Histogram(
            "gasless_gc_pause_seconds",
            "How long each of this process's cyclic garbage collections ran, by the oldest generation it "
            "collected: every thread waits meanwhile (2 is a full collection).",
            ("generation",),
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.settlement_failures = Counter(
            "gasless_settlement_failures",
            "Settlement batch failures on this host, by kind (send, execution, root_conflict, tick).",
            ("kind",),
            registry=self.registry,
        )

    # Relay stages -----------------------------------------------------------------------------------
    def observe_intent(self, row: Any) -> None:
        """Observe the stage figures a published intent change closes (each change is published once)."""
        state = row.state
        self.transitions.labels(state).inc()
        received, cosigned = row.received_at_ms, row.cosigned_at_ms
        broadcast, executed, finalized = row.broadcast_at_ms, row.executed_block_ts_ms, row.finalized_at_ms
        if state == "BROADCAST" or (state == "EXECUTED" and broadcast is None):
            # The first change after the commit: how long the service took before the network had it.
            self._stage("acceptToCosign", received, cosigned)
            self._stage("cosignToBroadcast", cosigned, broadcast)
            self._stage("added", received, broadcast)
        if state == "EXECUTED":
            self._stage("inclusion", received, executed)
        elif state == "FINALIZED":
            self._stage("finality", executed, finalized)
            self._stage("total", received, finalized)

    def _stage(self, stage: str, start_ms: int | None, end_ms: int | None) -> None:
        # A null input gives a null figure (as in the Intent's `latency`), left out.
        if start_ms is None or end_ms is None:
            return
        self.stages.labels(stage).observe(max(0, int(end_ms) - int(start_ms)) / 1000)

    def gc_paused(self, generation: int, seconds: float) -> None:
        self.gc_pause.labels(str(generation)).observe(seconds)

    def gateway_failed(self, url: str, kind: str) -> None:
        """GatewayClient.on_failure: an answer that was not the node speaking (timeout, connection,
        http_5xx, throttled, bad_answer). A node's verdict (`transaction not found`) is not an error."""
        self.gateway_errors.labels(url, kind).inc()


class HostCollector(Collector):
    """Queue depths and leadership, read at scrape time from `read()`: {name: value or {label: value}}."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        yield GaugeMetricFamily(
            "gasless_broadcaster_pending_sends",
            "Sends of this host still waiting for a gateway's first answer.",
            value=values.get("pending_sends", 0),
        )
        yield GaugeMetricFamily(
            "gasless_tracker_in_flight",
            "Intents this host's tracker is following (its own, plus adopted ones while it leads recovery).",
            value=values.get("tracked", 0),
        )
        leader = GaugeMetricFamily(
            "gasless_singleton_leader",
            "1 while this host runs the singleton worker of `role` (holds its advisory lock), else 0.",
            labels=("role",),
        )
        for role, leads in sorted(values.get("leader", {}).items()):
            leader.add_metric((role,), 1.0 if leads else 0.0)
        yield leader
        yield GaugeMetricFamily(
            "gasless_host_ready",
            "1 once the host restored its state (the restore check is ok).",
            value=values.get("ready", 0),
        )
        if values.get("signer_fenced") is not None:
            yield GaugeMetricFamily(
                "gasless_signer_fenced",
                "1 while this host's signer identity is fenced (another process holds it: no co-signing).",
                value=values["signer_fenced"],
            )
        yield from _relayer_families(values.get("relayers", []), values.get("floor_atto"))
        oldest = GaugeMetricFamily(
            "gasless_tracker_oldest_unexecuted_seconds",
            "Age since co-signature of the oldest intent this host follows that is still COSIGNED (no gateway "
            "acknowledged it) or BROADCAST (not executed).",
            labels=("state",),
        )
        for state, age_ms in sorted(values.get("oldest_unexecuted_ms", {}).items()):
            oldest.add_metric((state,), age_ms / 1000)
        yield oldest
        for name, key, text in (
            (
                "gasless_tracker_lag_hyperblocks",
                "tracker_lag",
                "Metachain blocks the network view has shown that this host's tracker has not read yet.",
            ),
            (
                "gasless_mirror_lag_hyperblocks",
                "mirror_lag",
                "Final hyperblocks the contract mirror has not applied yet (on the host leading `mirror`).",
            ),
            (
                "gasless_webhook_backlog",
                "webhook_backlog",
                "Webhook deliveries due and not delivered (the shared database, read by this host's probe).",
            ),
            (
                "gasless_webhook_backlog_oldest_seconds",
                "webhook_oldest_s",
                "How long the oldest due webhook delivery has been waiting (0 when none is due).",
            ),
        ):
            if values.get(key) is not None:
                yield GaugeMetricFamily(name, text, value=values[key])
        up = GaugeMetricFamily(
            "gasless_dependency_up",
            "1 when this host's last probe (every 5 s, as /readyz checks) reached the dependency "
            "(database, redis, gateway: at least one gateway), else 0.",
            labels=("dependency",),
        )
        for dependency, ok in sorted(values.get("dependencies", {}).items()):
            up.add_metric((dependency,), 1.0 if ok else 0.0)
        yield up

    def describe(self) -> Iterator[Metric]:
        return iter(())


ATTO_PER_EGLD = 10**18


def _relayer_families(relayers: list[Any], floor_atto: int | None) -> Iterator[Metric]:
    """The relayer pool's funds: one series per relayer (labels `relayer`, `shard`)."""
    if floor_atto is not None:
        yield GaugeMetricFamily(
            "gasless_relayer_floor_egld",
            "The balance under which a relayer is no longer assigned (GASLESS_RELAYER_MIN_BALANCE_ATTO).",
            value=floor_atto / ATTO_PER_EGLD,
        )
    labels = ("relayer", "shard")
    balance = GaugeMetricFamily(
        "gasless_relayer_balance_egld", "The relayer's balance on chain, as last read.", labels=labels
    )
    in_flight = GaugeMetricFamily(
        "gasless_relayer_in_flight_egld",
        "The most the relayer's co-signed, not yet executed intents can cost (counted against its floor).",
        labels=labels,
    )
    spend = GaugeMetricFamily(
        "gasless_relayer_spend_egld_per_hour",
        "EGLD the relayer paid per hour over the last hour (balance drops read by this host; absent until "
        "two readings).",
        labels=labels,
    )
    time_left = GaugeMetricFamily(
        "gasless_relayer_time_to_floor_seconds",
        "Time until the relayer's balance less its in-flight fees reaches the floor at the spend rate of the "
        "last hour (+Inf when nothing is spent; 0 when it is under the floor).",
        labels=labels,
    )
    assignable = GaugeMetricFamily(
        "gasless_relayer_assignable",
        "1 when the relayer is assigned new senders (state active and funded above its floor), else 0.",
        labels=(*labels, "state"),
    )
    for info in relayers:
        key = (info.address, str(info.shard))
        balance.add_metric(key, info.balance_atto / ATTO_PER_EGLD)
        in_flight.add_metric(key, info.in_flight_atto / ATTO_PER_EGLD)
        if info.spend_atto_per_hour is not None:
            spend.add_metric(key, info.spend_atto_per_hour / ATTO_PER_EGLD)
        if info.seconds_to_floor is not None:
            time_left.add_metric(key, info.seconds_to_floor)  # +Inf: nothing spent
        assignable.add_metric((*key, info.state), 1.0 if info.assignable else 0.0)
    yield from (balance, in_flight, spend, time_left, assignable)


class MetricsMiddleware:
    """Pure ASGI: the request latency histogram and one access-log line per request.

    The route label is the matched route's template (`/v1/relay/{id}`), never the raw path. Event streams
    are timed until their headers: their lifetime is the client's choice, not our latency.
    """

    def __init__(self, app: ASGIApp, metrics: HostMetrics, *, host_id: str, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.host_id = host_id
        self.access_log = access_log

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        structlog.contextvars.bind_contextvars(host_id=self.host_id)
        observed = False

        def finish() -> None:
            nonlocal observed
            if observed:
                return
            observed = True
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or UNMATCHED_ROUTE
            self.metrics.requests.labels(scope["method"], route, f"{status // 100}xx").observe(elapsed)
            if self.access_log:
                # Probes would drown the log: health and readiness answers are logged at debug level.
                emit = log.debug if route in PROBE_ROUTES else log.info
                fields: dict[str, Any] = {
                    "method": scope["method"],
                    "route": route,
                    "path": scope.get("path", ""),  # never the query string: it may carry a ticket
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                }
                if logging.getLogger().isEnabledFor(logging.DEBUG):
                    # For debugging clients; credentials are masked by the log redaction (by name).
                    fields["headers"] = {
                        name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                    }
                emit("request", **fields)

        async def send_timed(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                await send(message)
                headers = dict(message.get("headers") or ())
                if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
                    finish()
                return
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()

        try:
            await self.app(scope, receive, send_timed)
        finally:
            finish()


def admin_app(registry: CollectorRegistry) -> ASGIApp:
    """The admin port's application: `/metrics` (Prometheus text format) and `/healthz`, nothing else."""
    metrics = make_asgi_app(registry)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path == "/metrics":
            await metrics(scope, receive, send)
            return
        status, body = (200, b"ok\n") if path == "/healthz" else (404, b"not found\n")
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app
