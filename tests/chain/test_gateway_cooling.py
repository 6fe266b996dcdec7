"""The cool-down of a gateway that failed a read: reads ask it after the others for `COOL_DOWN_MS`, then
in their usual order again. Two small in-process gateways; the client's clock is stepped, never waited for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gasless.chain.gateway import COOL_DOWN_MS, GatewayClient


@dataclass
class Asked:
    """Every request of either gateway, in order: (gateway name, path)."""

    entries: list[tuple[str, str]] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def first_for(self, path: str) -> str:
        """The gateway asked first for `path`, once one was."""
        async with asyncio.timeout(5), self.arrived:
            await self.arrived.wait_for(lambda: any(p == path for _, p in self.entries))
        return next(name for name, p in self.entries if p == path)

    def of(self, name: str) -> list[str]:
        return [p for n, p in self.entries if n == name]


@dataclass
class Gateway:
    name: str
    asked: Asked
    url: str = ""
    down: bool = False  # answers 503 "gateway unavailable": a gateway failing, not a node answering
    held: asyncio.Event | None = None  # answers wait for it: a read under way there stays under way


async def serve(gateway: Gateway) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        async with gateway.asked.arrived:
            gateway.asked.entries.append((gateway.name, request.path))
            gateway.asked.arrived.notify_all()
        if gateway.down:
            return web.json_response(
                {"data": None, "error": "gateway unavailable", "code": "internal_issue"}, status=503
            )
        if gateway.held is not None:
            await gateway.held.wait()
        return web.json_response({"data": {"path": request.path}, "error": "", "code": "successful"})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gateway.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runner


@pytest.fixture
async def gateways() -> AsyncIterator[tuple[Gateway, Gateway]]:
    asked = Asked()
    first, second = Gateway("first", asked), Gateway("second", asked)
    runners = [await serve(first), await serve(second)]
    try:
        yield first, second
    finally:
        for gateway in (first, second):
            if gateway.held is not None:
                gateway.held.set()
        for runner in runners:
            await runner.cleanup()


async def test_a_gateway_that_failed_is_asked_last_until_its_cool_down_ends(gateways) -> None:  # type: ignore[no-untyped-def]
    first, second = gateways
    asked = first.asked
    now = [1_000.0]
    async with aiohttp.ClientSession() as session:
        client = GatewayClient(session, [first.url, second.url], clock=lambda: now[0])
        assert client.preferred_url == first.url
        # The first gateway fails a read; the second holds its answer, so no read completes there and the
        # order is the cool-down's doing alone (an answer would also move the reads' start to it).
        first.down, second.held = True, asyncio.Event()
        reads: list[asyncio.Task[Any]] = [asyncio.create_task(client.get("/a"))]
        assert await asked.first_for("/a") == "first"
        async with asyncio.timeout(5), asked.arrived:
            await asked.arrived.wait_for(lambda: ("second", "/a") in asked.entries)
        assert client.cooling() == (first.url,)
        first.down = False  # back, but still cooling: the next reads ask the second first
        for path, step_s in (("/b", 0.0), ("/c", COOL_DOWN_MS / 1000 - 0.001)):
            now[0] += step_s
            reads.append(asyncio.create_task(client.get(path)))
            assert await asked.first_for(path) == "second", f"{path} went to the cooling gateway first"
        assert asked.of("first") == ["/a"]
        # The cool-down is over: reads start at the first gateway again, which answers.
        now[0] += 0.002
        assert client.cooling() == ()
        assert await client.get("/d") == {"path": "/d"}
        assert asked.of("first") == ["/a", "/d"] and "/d" not in asked.of("second")
        assert client.preferred_url == first.url
        second.held.set()
        assert [await read for read in reads] == [{"path": p} for p in ("/a", "/b", "/c")]
