"""The contract-view cache behind entitlement: single-flight loads, and stale-while-revalidate for the
values that may be refreshed ahead (a found paying account), never for the others ("no account")."""

from __future__ import annotations

import asyncio
from typing import Any

from manual_clock import ManualClock

from gasless.mirror.views import _Cached


async def settled(cache: _Cached) -> None:
    """Until the background loads the cache started are over."""
    while cache._refreshing:
        await asyncio.sleep(0)


class Loader:
    def __init__(self) -> None:
        self.calls = 0
        self.value: Any = "v1"
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> Any:
        self.calls += 1
        await self.gate.wait()
        return self.value


def test_found_value_is_served_stale_while_one_background_load_replaces_it() -> None:
    async def run() -> None:
        clock = ManualClock()
        cache, load = _Cached(ttl_ms=50, clock=clock), Loader()
        ahead = lambda value: value is not None  # noqa: E731
        assert await cache.get("k", load, refresh_ahead=ahead) == "v1"
        clock.advance(70)  # expired, inside the grace
        load.value, load.gate = "v2", asyncio.Event()
        # Answered at once with the stale value, however many callers: one background load.
        results = await asyncio.wait_for(
            asyncio.gather(*(cache.get("k", load, refresh_ahead=ahead) for _ in range(5))), 0.5
        )
        assert results == ["v1"] * 5 and load.calls == 2
        load.gate.set()
        await settled(cache)
        assert await cache.get("k", load, refresh_ahead=ahead) == "v2" and load.calls == 2

    asyncio.run(run())


def test_forgotten_or_unrefreshable_values_load_in_line() -> None:
    async def run() -> None:
        clock = ManualClock()
        cache, load = _Cached(ttl_ms=50, clock=clock), Loader()
        ahead = lambda value: value is not None  # noqa: E731
        assert await cache.get(("account", "erd1a"), load, refresh_ahead=ahead) == "v1"
        cache.forget("erd1a")  # a final event named it: the next read waits for the fresh view
        load.value = "v2"
        assert await cache.get(("account", "erd1a"), load, refresh_ahead=ahead) == "v2"
        load.value = None  # "no account" is never served stale
        cache.forget(None)
        assert await cache.get("n", load, refresh_ahead=ahead) is None
        clock.advance(70)
        load.value = "bought"
        assert await cache.get("n", load, refresh_ahead=ahead) == "bought"
        # Past the grace (two more TTLs), a found value is loaded in line too.
        clock.advance(200)
        load.value = "later"
        assert await cache.get("n", load, refresh_ahead=ahead) == "later"

    asyncio.run(run())
