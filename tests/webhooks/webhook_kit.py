"""Fixtures of the webhook HTTP tests (a helper module, not a conftest: a directory conftest named after
`relay` in collection order would shadow the `conftest` module the relay tests import from): the auth kit (real native-auth tokens on a real localnet app) plus a real local receiver
(an aiohttp server on loopback, reachable because the tests set `webhook_local_receiver_cidrs`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from relay_kit import load_conftest

_auth = load_conftest("auth")
env = _auth.env
make_env = _auth.make_env
unpaused_localnet = _auth.unpaused_localnet
problem = _auth.problem
auth_for = _auth.auth_for
platform_problem = _auth.platform_problem
relay_env = _auth.relay_env

LOCAL_RECEIVERS = {
    "webhook_local_receiver_cidrs": ["127.0.0.0/8"],
    "webhook_retry_backoff_ms": [50, 50, 50],
    "webhook_poll_ms": 50,
}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A webhook endpoint on 127.0.0.1: records every request; answers from `statuses` (then 200)."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    delay_s: float = 0.0

    def wait(self, count: int, timeout: float = 15.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.received) >= count:
                return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"receiver got {len(self.received)} requests, expected {count}")


@contextlib.contextmanager
def serve_receiver() -> Iterator[Receiver]:
    """A webhook endpoint on 127.0.0.1 (an aiohttp server in its own thread), stopped on exit."""
    state = Receiver()
    loop = asyncio.new_event_loop()
    runner_box: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        state.received.append(Received(dict(request.headers), body))
        status = state.statuses.pop(0) if state.statuses else 200
        return web.Response(status=status, text="ok")

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/hook", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state.url = f"http://127.0.0.1:{port}/hook"
        runner_box["runner"] = runner

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner_box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve_receiver() as state:
        yield state


@pytest.fixture
def local_env(make_env: Any) -> Any:
    return make_env(**LOCAL_RECEIVERS)


@pytest.fixture
def auth(local_env: Any) -> Any:
    return _auth.AuthKit(local_env)


@pytest.fixture
def start_local_env(tmp_path: Path, unpaused_localnet: Any) -> Any:
    """`start_local_env()`: a generator yielding an app with local receivers on this test's database;
    the caller stops it (restart tests start a second one on the same database)."""

    def start() -> Iterator[Any]:
        return relay_env.start_env(tmp_path, unpaused_localnet, **LOCAL_RECEIVERS)  # type: ignore[no-any-return]

    return start
