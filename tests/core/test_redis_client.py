"""The host's Redis pool: what a burst opened is closed once idle for the timeout; the connection in use
stays; a new burst opens connections again."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gasless.core.redis_client import connect_redis

pytestmark = pytest.mark.redis


async def test_redis_pool_closes_connections_idle_past_the_timeout(redis_url: str) -> None:
    name = f"gasless-test-{uuid.uuid4().hex}"
    key = f"{name}:queue"
    client = connect_redis(redis_url, close_idle_after_s=0.4, client_name=name)
    admin = connect_redis(redis_url)

    async def ours() -> list[dict[str, object]]:
        return [c for c in await admin.client_list() if c.get("name") == name]

    async def burst(size: int) -> None:
        # Each BLPOP holds its connection until the push: `size` connections at once.
        waiting = [asyncio.create_task(client.blpop([key], timeout=30)) for _ in range(size)]
        deadline = time.monotonic() + 30
        while len(await ours()) < size:  # the condition waited for: every BLPOP has its connection
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await admin.rpush(key, *range(size))
        await asyncio.gather(*waiting)

    try:
        await burst(10)
        assert len(await ours()) == 10
        used: set[int] = set()
        deadline = time.monotonic() + 30
        while True:  # the condition waited for: nine connections closed
            used.add(int(await client.client_id()))
            left = len(await ours())
            if left == 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)  # one command at a time, as a quiet host sends them
        assert left == 1
        assert len(used) == 1  # the connection in use was never the one closed
        await burst(10)
        assert len(await ours()) == 10
    finally:
        await client.aclose()
        await admin.delete(key)
        await admin.aclose()
    assert await ours_after_close(redis_url, name) == 0


async def ours_after_close(redis_url: str, name: str) -> int:
    admin = connect_redis(redis_url)
    try:
        deadline = time.monotonic() + 30
        while count := len([c for c in await admin.client_list() if c.get("name") == name]):
            if time.monotonic() > deadline:
                return count
            await asyncio.sleep(0.01)  # the server notices a closed socket at its next read
        return 0
    finally:
        await admin.aclose()
