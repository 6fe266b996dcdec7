"""Limiter semantics: token buckets (in process and on Redis), stream slots, the route-class table."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manual_clock import ManualClock
from redis.asyncio import Redis
from starlette.requests import Request

from gasless.core.errors import ApiError
from gasless.limits.buckets import (
    STREAM_RETRY_MS,
    LocalConcurrencyLimiter,
    LocalRateLimiter,
    Rate,
    RouteLimiter,
    RouteLimitTable,
    TokenBuckets,
)
from gasless.limits.redis_backend import RedisConcurrencyLimiter, RedisRateLimiter
from gasless.limits.route_classes import client_key


# Token buckets ------------------------------------------------------------------------------------------
def test_bucket_spends_its_burst_then_refuses_with_the_wait_for_one_token() -> None:
    clock = ManualClock()
    buckets = TokenBuckets(2, 10, clock=clock)
    decisions = [buckets.take("k") for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [d.remaining for d in decisions[:10]] == list(range(9, -1, -1))
    refused = decisions[-1]
    assert (refused.limit, refused.remaining, refused.retry_after_ms, refused.reset_ms) == (10, 0, 500, 5_000)
    clock.now += 0.499
    assert not buckets.take("k").allowed
    clock.now += 0.001
    allowed = buckets.take("k")
    assert allowed.allowed and allowed.remaining == 0
    # Another key has its own bucket.
    assert buckets.take("other").remaining == 9


def test_bucket_refills_to_burst_and_no_further() -> None:
    clock = ManualClock()
    buckets = TokenBuckets(5, 3, clock=clock)
    for _ in range(3):
        buckets.take("k")
    clock.now += 3600
    assert [buckets.take("k").allowed for _ in range(4)] == [True, True, True, False]


def test_a_clock_stepping_back_mints_no_tokens() -> None:
    clock = ManualClock()
    buckets = TokenBuckets(1, 1, clock=clock)
    assert buckets.take("k").allowed
    clock.now -= 100
    assert not buckets.take("k").allowed
    clock.now += 100.5  # half a token since the last real refill
    assert not buckets.take("k").allowed
    clock.now += 0.5
    assert buckets.take("k").allowed


COSTS = [1.0, 1.0, 2.0, 0.5, 7.0]  # 7: above many bursts below
events = st.lists(
    st.tuples(st.floats(min_value=0, max_value=2, allow_nan=False), st.sampled_from(COSTS)),
    min_size=1,
    max_size=80,
)


def _assert_never_above_burst_plus_rate(
    rate: float, burst: int, times: list[float], granted: list[float]
) -> None:
    """Over any window: at most the burst, the refill, and the one overshoot of a request that cost more
    than the burst (admitted on a full bucket, it leaves the bucket in debt)."""
    overshoot = max(0.0, max(COSTS) - burst)
    for i in range(len(times)):
        total = 0.0
        for j in range(i, len(times)):
            total += granted[j]
            assert total <= burst + rate * (times[j] - times[i]) + overshoot + 1e-6, (i, j, total)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.05, max_value=100, allow_nan=False),
    burst=st.integers(min_value=1, max_value=100),
    steps=events,
)
def test_property_a_bucket_never_allows_more_than_burst_plus_rate_times_t(
    rate: float, burst: int, steps: list[tuple[float, float]]
) -> None:
    clock = ManualClock()
    buckets = TokenBuckets(rate, burst, clock=clock)
    times: list[float] = []
    granted: list[float] = []
    for gap, cost in steps:
        clock.now += gap
        decision = buckets.take("k", cost)
        assert 0 <= decision.remaining <= burst
        times.append(clock.now)
        granted.append(cost if decision.allowed else 0.0)
    _assert_never_above_burst_plus_rate(rate, burst, times, granted)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.05, max_value=100, allow_nan=False),
    burst=st.integers(1, 20),
    cost=st.sampled_from([0.5, 1.0, 3.0, 15.0, 25.0]),
    steps=events,
)
def test_property_a_refused_request_passes_after_the_wait_it_is_told(
    rate: float, burst: int, cost: float, steps: list[tuple[float, float]]
) -> None:
    """Whatever the traffic before, a refused request of any cost (above the burst included) passes once
    its stated wait has passed with no other traffic: retryable means it can pass."""
    clock = ManualClock()
    buckets = TokenBuckets(rate, burst, clock=clock)
    for gap, other in steps:
        clock.now += gap
        buckets.take("k", other)
    decision = buckets.take("k", cost)
    if not decision.allowed:
        assert decision.retry_after_ms >= 1
        clock.now += decision.retry_after_ms / 1000
        assert buckets.take("k", cost).allowed, decision


def test_a_request_above_the_burst_passes_only_on_a_full_bucket_and_leaves_it_in_debt() -> None:
    clock = ManualClock()
    buckets = TokenBuckets(1, 5, clock=clock)
    assert buckets.take("k", 4).allowed  # 1 left
    refused = buckets.take("k", 15)
    assert not refused.allowed and refused.retry_after_ms == 4_000  # until the bucket is full
    clock.now += 4
    admitted = buckets.take("k", 15)
    assert admitted.allowed and admitted.remaining == 0 and admitted.reset_ms == 15_000  # 10 in debt
    assert buckets.take("k", 1).retry_after_ms == 11_000  # one token needs 11 s from -10
    clock.now += 11
    assert buckets.take("k", 1).allowed


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.05, max_value=100, allow_nan=False),
    burst=st.integers(1, 100),
    n=st.integers(1, 300),
)
def test_property_a_full_bucket_allows_exactly_its_burst_at_one_instant(
    rate: float, burst: int, n: int
) -> None:
    buckets = TokenBuckets(rate, burst, clock=ManualClock())
    assert sum(buckets.take("k").allowed for _ in range(n)) == min(n, burst)


async def test_local_limiter_keeps_buckets_apart_by_name_rate_and_key() -> None:
    clock = ManualClock()
    limiter = LocalRateLimiter(clock=clock)
    one = Rate(1, 1)
    assert (await limiter.take("a", "k", one)).allowed
    assert not (await limiter.take("a", "k", one)).allowed
    assert (await limiter.take("a", "other", one)).allowed
    assert (await limiter.take("b", "k", one)).allowed


async def test_route_limiter_refusal_is_rate_limited_with_scope_and_headers() -> None:
    table = RouteLimitTable(public_read_ip=Rate(0.5, 2))
    limits = RouteLimiter(table, LocalRateLimiter(clock=ManualClock()), LocalConcurrencyLimiter())
    first = await limits.check("public_read_ip", "1.2.3.4", "ip")
    assert first.headers() == {"RateLimit-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": "2"}
    await limits.check("public_read_ip", "1.2.3.4", "ip")
    with pytest.raises(ApiError) as refused:
        await limits.check("public_read_ip", "1.2.3.4", "ip")
    error = refused.value
    assert error.code == "RATE_LIMITED" and error.status == 429
    assert error.details == {"retryAfterMs": 2_000, "scope": "ip"}
    assert error.headers == {
        "RateLimit-Limit": "2",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "4",
        "Retry-After": "2",
    }


async def test_per_class_rules_use_the_callers_class_and_others_ignore_it() -> None:
    limits = RouteLimiter(RouteLimitTable(), LocalRateLimiter(clock=ManualClock()), LocalConcurrencyLimiter())
    assert (await limits.check("private_read_class", "acct", "account", rate_class=1)).limit == 20
    assert (await limits.check("private_read_class", "acct", "account", rate_class=5)).limit == 320
    assert (await limits.check("account_write", "acct", "account", rate_class=3)).limit == 5
    with pytest.raises(ValueError):
        await limits.check("private_read_class", "acct", "account")


# The table ------------------------------------------------------------------------------------------------
def test_default_table_is_the_spec_table() -> None:
    table = RouteLimitTable()
    assert table.public_read_ip == Rate(20, 60)
    assert table.relay_events_ip == 20
    assert (table.quote_ip.per_second, table.quote_account.per_second) == (2, 5)
    assert table.prepare_ip == Rate(2, 10)
    assert table.x402_ip.per_second == 1 and table.x402_payer.per_second * 60 == pytest.approx(6)
    assert {c: (r.per_second, r.burst) for c, r in table.private_read_class.items()} == {
        1: (5, 20),
        2: (10, 40),
        3: (20, 80),
        4: (40, 160),
        5: (80, 320),
        6: (10, 40),
    }
    assert dict(table.stream_class) == {1: 2, 2: 3, 3: 5, 4: 10, 5: 20, 6: 2}
    assert table.stream_ip == 5
    assert table.account_write == Rate(1, 5)
    assert (table.assign_ip, table.assign_sender) == (Rate(10, 10), Rate(2, 10))


# Stream slots ---------------------------------------------------------------------------------------------
async def test_local_slots_count_up_to_the_limit_and_free_on_release() -> None:
    limiter = LocalConcurrencyLimiter()
    held = []
    for expected_remaining in (2, 1, 0):
        decision, slot = await limiter.acquire("s", "ip", 3)
        assert decision.allowed and decision.remaining == expected_remaining and slot is not None
        held.append(slot)
    refused, none = await limiter.acquire("s", "ip", 3)
    assert none is None and not refused.allowed and refused.retry_after_ms == STREAM_RETRY_MS
    assert (await limiter.acquire("s", "other-ip", 3))[1] is not None
    await held[0].release()
    await held[0].release()  # a second release gives nothing back twice
    assert (await limiter.acquire("s", "ip", 3))[1] is not None
    assert (await limiter.acquire("s", "ip", 3))[1] is None


# Client IP keys -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.9", "203.0.113.9"),
        ("testclient", "testclient"),
    ],
)
def test_client_key_groups_an_ipv6_slash_64(host: str, key: str) -> None:
    request = Request({"type": "http", "client": (host, 1234), "headers": []})
    assert client_key(request) == key


# Redis backends -------------------------------------------------------------------------------------------
@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def namespace() -> str:
    return f"test-limits-{uuid.uuid4().hex}:test:localnet"


async def _drop(redis: Redis, prefix: str) -> None:
    async for key in redis.scan_iter(match=f"{prefix}:*"):
        await redis.delete(key)


@pytest.mark.redis
async def test_redis_bucket_is_shared_by_two_limiters_and_keys_are_namespaced(redis: Redis) -> None:
    space = namespace()
    clock = ManualClock()
    host_a, host_b = RedisRateLimiter(redis, space, clock=clock), RedisRateLimiter(redis, space, clock=clock)
    rate = Rate(2, 3)
    try:
        answers = [
            await (host_a if i % 2 else host_b).take("public_read_ip", "1.2.3.4", rate) for i in range(4)
        ]
        assert [a.allowed for a in answers] == [True, True, True, False]
        assert [a.remaining for a in answers] == [2, 1, 0, 0]
        assert answers[-1].retry_after_ms == 500
        keys = [k.decode() async for k in redis.scan_iter(match=f"{space}:*")]
        assert keys == [f"{space}:rate:public_read_ip:1.2.3.4"]
        # The key lives only until the bucket would be full again (+1 s).
        assert 0 < await redis.pttl(keys[0]) <= 2_500
        clock.now += 0.5
        assert (await host_b.take("public_read_ip", "1.2.3.4", rate)).allowed
        other_space = RedisRateLimiter(redis, namespace(), clock=clock)
        assert (await other_space.take("public_read_ip", "1.2.3.4", rate)).remaining == 2
    finally:
        await _drop(redis, space.split(":")[0])


@pytest.mark.redis
async def test_redis_bucket_admits_above_its_burst_when_full_as_in_process(redis: Redis) -> None:
    space = namespace()
    clock = ManualClock()
    shared, local = RedisRateLimiter(redis, space, clock=clock), LocalRateLimiter(clock=clock)
    rate = Rate(1, 5)
    try:
        for cost, wait in ((4, 0.0), (15, 0.0), (15, 4.0), (1, 0.0), (1, 11.0)):
            clock.now += wait
            on_redis = await shared.take("compat_sender", "s", rate, cost)
            in_process = await local.take("compat_sender", "s", rate, cost)
            assert on_redis == in_process, (cost, wait, on_redis, in_process)
        assert on_redis.allowed
        # A bucket in debt expires only once it would be full again.
        [key] = [k.decode() async for k in redis.scan_iter(match=f"{space}:*")]
        assert 5_000 < await redis.pttl(key) <= 6_000
    finally:
        await _drop(redis, space.split(":")[0])


@pytest.mark.redis
async def test_redis_bucket_on_the_servers_clock(redis: Redis) -> None:
    space = namespace()
    limiter = RedisRateLimiter(redis, space)  # no clock: Redis TIME
    try:
        rate = Rate(0.001, 2)  # no refill within the test
        assert [(await limiter.take("b", "k", rate)).allowed for _ in range(3)] == [True, True, False]
    finally:
        await _drop(redis, space.split(":")[0])


@pytest.mark.redis
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=st.floats(min_value=0.1, max_value=50, allow_nan=False), burst=st.integers(1, 20), steps=events)
def test_property_redis_bucket_never_allows_more_than_burst_plus_rate_times_t(
    redis_url: str, rate: float, burst: int, steps: list[tuple[float, float]]
) -> None:
    async def run() -> None:
        client = Redis.from_url(redis_url)
        space = namespace()
        clock = ManualClock()
        limiter = RedisRateLimiter(client, space, clock=clock)
        times: list[float] = []
        granted: list[float] = []
        try:
            for gap, cost in steps:
                clock.now += gap
                decision = await limiter.take("b", "k", Rate(rate, burst), cost)
                times.append(clock.now)
                granted.append(cost if decision.allowed else 0.0)
        finally:
            await _drop(client, space.split(":")[0])
            await client.aclose()
        _assert_never_above_burst_plus_rate(rate, burst, times, granted)

    asyncio.run(run())


@pytest.mark.redis
async def test_redis_slots_are_shared_and_lapse_when_their_host_dies(redis: Redis) -> None:
    space = namespace()
    clock = ManualClock()
    host_a = RedisConcurrencyLimiter(redis, space, lease_ms=30_000, clock=clock)
    host_b = RedisConcurrencyLimiter(redis, space, lease_ms=30_000, clock=clock)
    try:
        first = await host_a.acquire("events", "ip", 2)
        second = await host_b.acquire("events", "ip", 2)
        assert [d.remaining for d, _ in (first, second)] == [1, 0]
        refused, none = await host_a.acquire("events", "ip", 2)
        assert none is None and not refused.allowed
        # Host b releases: a slot is free on either host.
        assert second[1] is not None
        await second[1].release()
        third = await host_a.acquire("events", "ip", 2)
        assert third[1] is not None
        # Host a "dies" holding two slots (no release, no renewal): they lapse after the lease.
        host_a.held.clear()
        clock.now += 29.999
        assert (await host_b.acquire("events", "ip", 2))[1] is None
        clock.now += 0.002
        decision, slot = await host_b.acquire("events", "ip", 2)
        assert slot is not None and decision.remaining == 1
        # A live host renews what it holds: its lease outlives the original expiry.
        clock.now += 20
        await host_b.renew()
        clock.now += 20  # 40 s after it was taken: without the renewal it would have lapsed
        assert (await host_b.acquire("events", "ip", 2))[1] is not None
        assert (await host_b.acquire("events", "ip", 2))[1] is None
    finally:
        await host_a.close()
        await host_b.close()
        await _drop(redis, space.split(":")[0])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_redis_falls_back_to_limits_of_this_host() -> None:
    client = Redis.from_url(f"redis://127.0.0.1:{_closed_port()}/0", socket_connect_timeout=1)
    try:
        rates = RedisRateLimiter(client, namespace())
        rate = Rate(0.001, 2)
        assert [(await rates.take("b", "k", rate)).allowed for _ in range(3)] == [True, True, False]
        streams = RedisConcurrencyLimiter(client, namespace())
        decision, slot = await streams.acquire("s", "k", 1)
        assert decision.allowed and slot is not None
        assert (await streams.acquire("s", "k", 1))[1] is None
        await slot.release()
        assert (await streams.acquire("s", "k", 1))[1] is not None
    finally:
        await client.aclose()
