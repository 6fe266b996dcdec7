"""create_app(settings): the API host. Resources are opened in the lifespan and closed there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import structlog
from fastapi import FastAPI, Response

from gasless import __version__
from gasless.accounts import routes as account_routes
from gasless.auth import routes as auth_routes
from gasless.auth.actions import ActionSignatures
from gasless.auth.origins import OriginMiddleware, OriginPolicy
from gasless.billing.decision import Entitlement
from gasless.chain.gateway import gateway_session
from gasless.compat import routes as compat_routes
from gasless.compat.rendering import CompatErrorMiddleware
from gasless.core.logs import quiet_sdk_loggers
from gasless.core.loop_watch import LoopWatch, settle_heap
from gasless.core.metrics import HostCollector, MetricsMiddleware
from gasless.core.redis_client import connect_redis
from gasless.core.settings import Settings
from gasless.db import create_engine, upgrade
from gasless.hosting.host import (
    Health,
    HostState,
    OpsProbe,
    RelayerFunds,
    boot_epoch_ms,
    purpose_keys,
    readiness,
    relayer_funds,
)
from gasless.hosting.startup import start_relay_core, start_webhooks, stop_relay_core
from gasless.http.body_limit import BodyLimitMiddleware
from gasless.http.direct import DirectRoutes, declared_route
from gasless.http.head import HeadMiddleware
from gasless.http.json_body import JsonBodyRoute
from gasless.http.openapi import install_openapi
from gasless.http.pages import CursorCodec
from gasless.http.problems import RequestIdMiddleware, install_problem_handlers
from gasless.incidents import routes as incident_routes
from gasless.incidents.jobs import build_incidents
from gasless.keys import routes as key_routes
from gasless.keys.repository import ApiKeyRepository
from gasless.keys.service import ApiKeyService
from gasless.limits.buckets import RouteLimiter, RouteLimitTable, local_route_limiter
from gasless.limits.redis_backend import redis_backends, redis_namespace
from gasless.limits.route_classes import RateLimitHeadersMiddleware
from gasless.mcp.mount import mount_mcp
from gasless.mirror.follower import MIRROR_ROLE
from gasless.mirror.views import ContractMirror
from gasless.notices import routes as notice_routes
from gasless.notices.jobs import build_notices
from gasless.notifications import routes as notification_routes
from gasless.pricing import routes as pricing_routes
from gasless.purchases import routes as purchase_routes
from gasless.registry import routes as registry_routes
from gasless.relay import routes as relay_routes
from gasless.relay.repository import IntentRepository
from gasless.relay.schemas import transaction_schemas
from gasless.settlement import routes as settlement_routes
from gasless.signer import Signer
from gasless.status import routes as status_routes
from gasless.streams import routes as stream_routes
from gasless.streams.service import build_stream_service
from gasless.usage import routes as usage_routes
from gasless.webhooks import routes as webhook_routes
from gasless.x402 import routes as x402_routes

log = structlog.get_logger("gasless.hosting.app")


async def _until_ready(state: HostState, startup: asyncio.Task[None], wait_s: float) -> None:
    """Until the relay core is restored and the signer holds its claim, the start-up fails, or `wait_s`
    passes (a worker whose gateways are down still answers /readyz with the reason)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not startup.done():
        await asyncio.wait({startup}, timeout=0.1)
    # A restarted worker's claim: its predecessor's must lapse first (gasless.signer.fence); polled, as
    # the fence renews on its own schedule.
    if startup.done() and (startup.cancelled() or startup.exception() is not None):
        return  # failed: serve, so /readyz tells why
    while time.monotonic() < deadline and state.signer is not None and not state.signer.holds:
        await asyncio.sleep(0.1)


def create_app(
    settings: Settings,
    *,
    signer_wrapper: Callable[[Signer], Signer] | None = None,
    entitlement_factory: Callable[[ContractMirror], Entitlement] | None = None,
    route_limits: RouteLimitTable | None = None,
    ready_wait_s: float = 0.0,
    dedicated_process: bool = False,
) -> FastAPI:
    """The API host. `signer_wrapper` and `entitlement_factory` replace collaborators (fault tests, KMS);
    `route_limits` replaces the request-limit table of docs/api-conventions.md (tests, an operator's tighter
    limits).
    `ready_wait_s`: how long the start-up may hold off serving until the host is ready (a worker process
    restarted on its host's port, gasless.cli.api_workers); 0 serves at once, /readyz answering 503.
    `dedicated_process`: the process serves and does nothing else (`gasless serve`, `gasless up`): once the
    host is ready, what it holds is frozen out of the cyclic collector's reach (gasless.core.loop_watch
    .settle_heap), and the loop's watch times each collection (`gasless_gc_pause_seconds`; why only such a
    process: gasless.core.loop_watch)."""
    keys = purpose_keys(settings)
    state = HostState(
        settings=settings,
        boot_epoch_ms=boot_epoch_ms(settings.worker),
        keys=keys,
        limits=local_route_limiter(route_limits),
        cursors=CursorCodec(keys),
        origin_policy=OriginPolicy.from_settings(settings),
    )
    quiet_sdk_loggers()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Everything started from here (workers included) logs with this host's id.
        structlog.contextvars.bind_contextvars(host_id=settings.instance_id)
        state.engine = create_engine(settings.effective_database_url)
        state.http = gateway_session()
        if settings.redis_url:
            state.redis = connect_redis(settings.redis_url, socket_connect_timeout=2, socket_timeout=2)
            # Shared buckets and stream slots: hosts a and b limit together.
            namespace = redis_namespace(settings.redis_prefix, settings.key_env, settings.network.chain_id)
            state.limits = RouteLimiter(state.limits.table, *redis_backends(state.redis, namespace))
        # Per-action challenges are single use on every host: through Redis when hosts share one.
        state.action_signatures = ActionSignatures(
            state.keys, redis=state.redis, namespace=settings.redis_prefix
        )
        startup: asyncio.Task[None] | None = None
        loop_watch: LoopWatch | None = None
        if settings.loop_stall_ms:
            loop_watch = LoopWatch(
                settings.loop_stall_ms / 1000,
                observe=state.metrics.loop_lag.observe,
                observe_gc=state.metrics.gc_paused if dedicated_process else None,
            )
            loop_watch.start()
        try:
            await upgrade(state.engine)
            # The intents are readable before the relay core starts: a replay of bytes another host
            # co-signed is answered from here while this host is still starting (relay/replay.py).
            state.repo = IntentRepository(state.engine)
            state.api_key_service = ApiKeyService(ApiKeyRepository(state.engine), state.keys)
            state.streams = build_stream_service(settings, state.keys, state.redis, state.boot_epoch_ms)
            await state.streams.start()
            await start_webhooks(state, settings)
            state.incident_service, state.incident_watch = build_incidents(
                state.engine, state.cursors, settings, state.metrics, state.streams
            )
            await state.incident_watch.start()
            state.notice_parts = build_notices(
                state.engine,
                state.keys,
                state.cursors,
                settings,
                state.streams.hub,
                worker_id=f"{settings.instance_id}.{state.boot_epoch_ms}",
                pricing=lambda: state.pricing,
            )
            state.notices = state.notice_parts.notices
            state.notifications = state.notice_parts.notifications
            await state.notice_parts.start()
            state.probe = OpsProbe(state)
            await state.probe.start()
            # Serve at once (/readyz answers 503) while the relay core restores its state.
            startup = asyncio.create_task(
                start_relay_core(state, settings, signer_wrapper, entitlement_factory), name="startup"
            )
            if dedicated_process:
                startup.add_done_callback(
                    lambda task: settle_heap() if not task.cancelled() and state.restored else None
                )
            if ready_wait_s > 0:
                await _until_ready(state, startup, ready_wait_s)
            try:
                yield
            finally:
                assert state.mcp is not None
                await state.mcp.stop()  # /mcp: the MCP server's sessions, when one was asked for
        finally:
            if startup is not None and not startup.done():
                startup.cancel()
                with contextlib.suppress(BaseException):
                    await startup
            await stop_relay_core(state)
            for part in (
                state.probe,
                state.webhook_recorder,
                state.webhook_dispatcher,
                state.incident_watch,
                state.notice_parts,
            ):
                if part is not None:
                    with contextlib.suppress(Exception):
                        await part.stop()
            if state.streams is not None:
                await state.streams.stop()
            await state.limits.close()
            if state.redis is not None:
                await state.redis.aclose()
            await state.http.close()
            await state.engine.dispose()
            if loop_watch is not None:
                loop_watch.stop()

    app = FastAPI(
        title="gasless",
        version="1.0.0-draft.1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by gasless.http.openapi
    )
    app.router.route_class = JsonBodyRoute  # as every router's: JSON bodies parsed by http/json_body
    app.state.host = state
    # Outermost last: request id, metrics, RateLimit-* headers, then origins/CORS (so even a 413 from the
    # body limit is readable by an allowed page, and an origin refusal carries its request id), then the
    # body limit (before any route code), then HEAD answered as GET without a body, then the direct routes
    # (next to the router).
    # Innermost: the relay answered as plain ASGI, past every middleware below but before the router.
    app.add_middleware(
        DirectRoutes,
        routes=[(declared_route(relay_routes.router.routes, "relayTransaction"), relay_routes.relay_direct)],
        docs_url=settings.docs_url,
    )
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, docs_url=settings.docs_url)
    app.add_middleware(
        OriginMiddleware, router=app.router, policy=state.origin_policy, docs_url=settings.docs_url
    )
    app.add_middleware(RateLimitHeadersMiddleware)
    state.metrics.registry.register(HostCollector(lambda: _gauges(state)))
    # Inside the request-id middleware, so the access log line carries the request id.
    app.add_middleware(
        MetricsMiddleware, metrics=state.metrics, host_id=settings.instance_id, access_log=settings.access_log
    )
    app.add_middleware(CompatErrorMiddleware)  # the kit's paths: no trailing slash; its statuses and `error`
    app.add_middleware(RequestIdMiddleware)
    install_problem_handlers(app, settings.docs_url, settings.problem_record_file)
    app.include_router(relay_routes.router)
    app.include_router(account_routes.router)
    app.include_router(auth_routes.router)
    app.include_router(key_routes.router)
    app.include_router(stream_routes.router)
    app.include_router(webhook_routes.router)
    app.include_router(usage_routes.router)
    app.include_router(settlement_routes.router)
    app.include_router(incident_routes.router)
    app.include_router(pricing_routes.router)
    app.include_router(purchase_routes.router)
    app.include_router(x402_routes.router)
    app.include_router(compat_routes.router)
    app.include_router(registry_routes.router)
    app.include_router(status_routes.router)
    app.include_router(notice_routes.router)
    app.include_router(notification_routes.router)
    app.include_router(notification_routes.links_router)
    app.include_router(auth_routes.admin_router)
    install_openapi(
        app,
        (*relay_routes.EXTRA_SCHEMAS, *stream_routes.EXTRA_SCHEMAS, *compat_routes.EXTRA_SCHEMAS),
        transaction_schemas(settings.network.chain_id),
    )

    def health(
        status: Literal["ok", "starting", "unavailable"],
        checks: dict[str, str],
        singletons: dict[str, str] | None = None,
        relayers: list[RelayerFunds] | None = None,
    ) -> Health:
        return Health(
            status=status,
            hostId=settings.host_id,
            version=__version__,
            network=settings.profile,
            chainId=settings.network.chain_id,
            bootEpochMs=state.boot_epoch_ms,
            checks=checks,
            singletons=singletons or {},
            relayers=relayers or [],
        )

    @app.get("/healthz", operation_id="getHealth", response_model=Health, tags=["meta"])
    async def healthz() -> Health:
        """Liveness: the process answers."""
        return health("ok", {})

    @app.get(
        "/readyz",
        operation_id="getReadiness",
        response_model=Health,
        tags=["meta"],
        responses={503: {"model": Health, "description": "not ready (restoring, or a dependency is down)"}},
    )
    async def readyz(response: Response) -> Health:
        """Readiness: state restored, database and at least one gateway reachable. `relayers` details the
        relayer pool's funds (balance, in-flight fees, floor, spend rate, time to the floor): informative,
        never a reason to be unready."""
        checks = await readiness(state)
        ready = all(v == "ok" for v in checks.values())
        if not ready:
            response.status_code = 503
        leadership = state.singletons.leadership() if state.singletons is not None else {}
        return health(
            "ok" if ready else ("starting" if not (state.restored or state.refusal) else "unavailable"),
            checks,
            {role: "leader" if leads else "standby" for role, leads in leadership.items()},
            [relayer_funds(info) for info in state.relayers.all()] if state.relayers is not None else [],
        )

    # Last: `/mcp` after every route; its server (tools whose schemas come from the finished OpenAPI document)
    # is built on the first MCP request.
    recorder = app.state.problem_recorder
    state.mcp = mount_mcp(
        app, docs_url=settings.docs_url, on_problems=recorder.record if recorder is not None else None
    )
    return app


def _gauges(state: HostState) -> dict[str, Any]:
    leadership = state.singletons.leadership() if state.singletons is not None else {}
    now_ms = int(time.time() * 1000)
    values: dict[str, Any] = {
        "pending_sends": len(state.broadcaster.sending) if state.broadcaster is not None else 0,
        "tracked": state.tracker.tracked if state.tracker is not None else 0,
        "leader": leadership,
        "ready": 1 if state.restored else 0,
    }
    if state.signer is not None:
        values["signer_fenced"] = 0 if state.signer.holds else 1
    if state.relayers is not None:
        values["relayers"] = state.relayers.all()
        values["floor_atto"] = state.relayers.min_balance_atto
    if state.tracker is not None:
        values["oldest_unexecuted_ms"] = state.tracker.oldest_unexecuted_ms(now_ms)
        values["tracker_lag"] = state.tracker.lag_hyperblocks()
    if state.mirror_follower is not None and leadership.get(MIRROR_ROLE):
        values["mirror_lag"] = state.mirror_follower.lag_hyperblocks()
    probe = state.probe
    if probe is not None:
        values["dependencies"] = probe.dependencies
        values["webhook_backlog"] = probe.webhook_backlog
        if probe.webhook_backlog is not None:
            oldest = probe.webhook_oldest_due_ms
            values["webhook_oldest_s"] = max(0, now_ms - oldest) / 1000 if oldest is not None else 0
    return values
