"""create_app(settings): the API host. Resources are opened in the lifespan and closed there."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import structlog
from fastapi import FastAPI, Response
from pydantic import BaseModel
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless import __version__
from gasless.db import create_engine, ping, upgrade
from gasless.problems import RequestIdMiddleware, install_problem_handlers
from gasless.settings import Settings

log = structlog.get_logger("gasless.app")


class Health(BaseModel):
    """Liveness or readiness of one API host."""

    status: Literal["ok", "starting", "unavailable"]
    hostId: str
    version: str
    network: str
    chainId: str
    bootEpochMs: int
    checks: dict[str, str] = {}


@dataclass
class HostState:
    """What one API host holds while it runs."""

    settings: Settings
    boot_epoch_ms: int
    engine: AsyncEngine | None = None
    http: aiohttp.ClientSession | None = None
    redis: Redis | None = None
    restored: bool = False
    checks: dict[str, str] = field(default_factory=dict)


async def _gateway_answers(state: HostState) -> bool:
    assert state.http is not None
    for url in state.settings.effective_gateway_urls:
        try:
            async with state.http.get(
                f"{url}/network/config", timeout=aiohttp.ClientTimeout(total=1.5)
            ) as resp:
                if resp.status == 200:
                    return True
        except (TimeoutError, aiohttp.ClientError):
            continue
    return False


async def _redis_answers(redis: Redis) -> bool:
    try:
        return bool(await redis.ping())
    except Exception:  # any connection or protocol error means "not ready"
        return False


def create_app(settings: Settings) -> FastAPI:
    state = HostState(settings=settings, boot_epoch_ms=int(time.time() * 1000))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engine = create_engine(settings.effective_database_url)
        state.http = aiohttp.ClientSession()
        if settings.redis_url:
            state.redis = Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=2)
        try:
            await upgrade(state.engine)
            state.restored = True
            log.info("host ready", host_id=settings.host_id, network=settings.profile)
            yield
        finally:
            if state.redis is not None:
                await state.redis.aclose()
            await state.http.close()
            await state.engine.dispose()

    app = FastAPI(
        title="gasless",
        version="1.0.0-draft.1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.host = state
    app.add_middleware(RequestIdMiddleware)
    install_problem_handlers(app, settings.docs_url)

    def health(status: Literal["ok", "starting", "unavailable"], checks: dict[str, str]) -> Health:
        return Health(
            status=status,
            hostId=settings.host_id,
            version=__version__,
            network=settings.profile,
            chainId=settings.network.chain_id,
            bootEpochMs=state.boot_epoch_ms,
            checks=checks,
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
        """Readiness: state restored, database and at least one gateway reachable."""
        checks = {
            "restore": "ok" if state.restored else "running",
            "database": "ok" if state.engine is not None and await ping(state.engine) else "unreachable",
            "gateway": "ok" if state.http is not None and await _gateway_answers(state) else "unreachable",
        }
        if state.redis is not None:
            checks["redis"] = "ok" if await _redis_answers(state.redis) else "unreachable"
        ready = all(v == "ok" for v in checks.values())
        if not ready:
            response.status_code = 503
        return health("ok" if ready else ("starting" if not state.restored else "unavailable"), checks)

    return app
