"""One rule for every front: a refusal marked `retryable: true` (a 429 or 503 with `Retry-After`) is one the
same request, sent again unchanged, can pass later.

- The catalogue: every retryable code names what lets the same request pass, and only retryable 429/503
  carry `Retry-After`.
- The buckets: for every token bucket of `/v1/*` and of the compat facade (the route-class table, the rate
  classes, sponsor-key limits, the platform budget, free flow) the largest single request, refused, passes
  after the waits its refusals state (`gasless.limits.worst_case.unpassable`), on both backends; and the
  check does find the compat relay above the burst under a rule that admits only what a bucket holds.
- Live, over HTTP on localnet: a `/v1/relay` paid by a sponsor key whose hourly limit is below the relay's
  RU passes on a full bucket (it was refused for ever), and the compat relays are in tests/compat.
- The MCP event streams (`GET /mcp`, at most 20 per IP: a slot, not a bucket), live on a served host with
  each backend: the stream refused at 21 (429 `RATE_LIMITED`, `Retry-After: 1`) passes, sent again
  unchanged, as soon as one of the 20 ends, whether its client leaves or its lifetime ends (nobody leaving:
  at the latest at the lifetime); on Redis, the slots of a host that died lapse before a lifetime would.
  Every wait is for a condition (the streams' end, the slots the host holds), none for a fixed time.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import requests
from redis.asyncio import Redis
from relay_kit import (  # type: ignore[import-not-found]
    ServedApi,
    load_conftest,
    relay_settings,
    unthrottled_limits,
)

from gasless.billing.gate import FreeFlowLimits
from gasless.billing.schedule import RU_SCHEDULE_V1, ru_for_gas_limit
from gasless.compat.service import COMPAT_MAX_GAS_LIMIT
from gasless.core.errors import CATALOGUE, ApiError
from gasless.hosting.app import create_app
from gasless.limits.accounts import AccountLimiter, PlatformBudget
from gasless.limits.buckets import (
    STREAM_RETRY_MS,
    Decision,
    LocalConcurrencyLimiter,
    LocalRateLimiter,
    MultiDecision,
    Rate,
    RouteLimitTable,
    Take,
)
from gasless.limits.redis_backend import RedisConcurrencyLimiter, RedisRateLimiter
from gasless.limits.worst_case import WorstCase, route_table_cases, unpassable
from gasless.localnet.contracts.seed import SEED_RATE_CLASSES
from gasless.mcp import mount

# What lets the same request pass later, for every code a client may retry unchanged.
BUCKET = "a token bucket refills; every bucket and its largest request are played below"
CAN_PASS_LATER = {
    "RATE_LIMITED": f"{BUCKET}; a stream slot frees when a stream ends (GET /mcp's are played below)",
    "GAS_BUDGET_EXCEEDED": BUCKET,
    "HOURLY_BURN_EXCEEDED": BUCKET,
    "TOO_MANY_IN_FLIGHT": "the sender's unsettled intents settle",
    "NONCE_IN_FLIGHT": "the intent holding the nonce ends without executing",
    "FREE_FLOW_BUSY": "the sender's free transaction in flight ends",
    "FREE_FLOW_UNAVAILABLE": "the platform's free budget of the last 24 h frees up",
    "SWAP_BUDGET_EXHAUSTED": "the rolling swap budget refills",
    "IDEMPOTENCY_IN_PROGRESS": "the first request with the key finishes; the same one then gets its answer",
    "CONTRACT_PAUSED": "the operator unpauses the contract",
    "SWAP_VENUE_PAUSED": "the exchange venue is unpaused",
    "NO_RELAYER_AVAILABLE": "a relayer of the shard is funded or active again",
    "UPSTREAM_UNAVAILABLE": "the gateway, node or database answers again (or the host finishes starting)",
    "SIGNER_TIMEOUT": "the signer commits within its deadline again",
    "SIGNER_UNAVAILABLE": "the signer is reachable again",
    "SIGNER_FENCED": "the signer's fence is held again",
    "INTERNAL": "a failure before the commit point; nothing was sent",
}
# Retryable in the interface contract's table although the request must change: the client renews the lease and resends
# the same signed bytes with the new lease. Listed so that no other code joins it unnoticed.
RETRYABLE_AFTER_A_CHANGE = {"LEASE_EXPIRED": "renew the lease (POST /v1/relay/assign renewFor)"}


def test_every_retryable_refusal_says_what_lets_the_same_request_pass() -> None:
    retryable = {code for code, spec in CATALOGUE.items() if spec.retryable}
    assert retryable == set(CAN_PASS_LATER) | set(RETRYABLE_AFTER_A_CHANGE)
    for code, spec in CATALOGUE.items():
        details = {"retryAfterMs": 1_000} if spec.retryable else {}
        error = ApiError(code, details=dict(details))
        if spec.status in (429, 503):
            # Only a refusal that can pass later says when to come back.
            assert ("Retry-After" in error.headers) is spec.retryable, code


def worst_relays() -> list[WorstCase]:
    """The largest relay of every rate class (seeded, and the loosest the contract accepts), paid by a
    sponsor key with the tightest limits a key may have, under the smallest platform budget the settings
    allow; free flow; the compat relay and every other route class."""
    compat_ru = ru_for_gas_limit(COMPAT_MAX_GAS_LIMIT)
    cases = route_table_cases(RouteLimitTable(), {"compat_sender": compat_ru})
    limiter = AccountLimiter(LocalRateLimiter(), platform=PlatformBudget(ru_per_second=0.5, burst=25))
    biggest = RU_SCHEDULE_V1[-1][0]
    # The contract only asks ru_burst >= ru_per_sec and a gas burst holding the largest transaction.
    loosest = SimpleNamespace(
        id=9,
        ru_per_sec=1,
        ru_burst=1,
        gas_per_sec_per_shard=1,
        gas_burst_per_shard=biggest,
        max_gas_limit=biggest,
        ru_per_hour=1,
    )
    tight_key = SimpleNamespace(
        key_id="key", policy=SimpleNamespace(limits=SimpleNamespace(ruPerSecond=1, ruPerHour=1))
    )
    for rate_class in (*SEED_RATE_CLASSES, loosest):
        takes = limiter.takes(
            account="acct",
            rate_class=rate_class,
            ru=ru_for_gas_limit(rate_class.max_gas_limit),
            gas_limit=rate_class.max_gas_limit,
            shard=1,
            key=tight_key,
        )
        cases.append(WorstCase(f"relay of class {rate_class.id}", tuple(take for take, _ in takes)))
    cases.append(WorstCase("free flow", (Take("free_flow", "all", FreeFlowLimits().platform_rate, 1),)))
    return cases


async def test_no_bucket_refuses_the_largest_request_for_ever_in_process() -> None:
    cases = worst_relays()
    assert any(t.cost > t.rate.burst for case in cases for t in case.takes)  # the cases that matter
    assert await unpassable(cases, lambda clock: LocalRateLimiter(clock=clock)) == []


@pytest.mark.redis
async def test_no_bucket_refuses_the_largest_request_for_ever_on_redis(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    space = f"test-worst-{uuid.uuid4().hex}"
    try:
        found = await unpassable(worst_relays(), lambda clock: RedisRateLimiter(client, space, clock=clock))
        assert found == []
    finally:
        async for key in client.scan_iter(match=f"{space}:*"):
            await client.delete(key)
        await client.aclose()


class OnlyWhatItHolds:
    """The rule before issue 37: a bucket admits a request only when it holds the request's whole cost, and
    a refusal says to wait until it does (which never comes when the cost is above the burst)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.held: dict[tuple[str, str], tuple[float, float]] = {}

    async def take_all(self, takes: list[Take]) -> MultiDecision:
        now = self.clock()
        tokens = []
        for take in takes:
            held, stamp = self.held.get((take.bucket, take.key), (float(take.rate.burst), now))
            tokens.append(min(float(take.rate.burst), held + (now - stamp) * take.rate.per_second))
        refused = next((i for i, t in enumerate(takes) if tokens[i] < t.cost), None)
        decisions = []
        for take, held in zip(takes, tokens, strict=True):
            held -= take.cost if refused is None else 0.0
            self.held[(take.bucket, take.key)] = (held, now)
            wait = 0 if refused is None else math.ceil((take.cost - held) / take.rate.per_second * 1000)
            decisions.append(Decision(refused is None, take.rate.burst, max(0, int(held)), wait, 0))
        return MultiDecision(refused, tuple(decisions))

    async def close(self) -> None:
        return None


async def test_the_check_finds_the_compat_relay_above_the_burst_under_the_old_rule() -> None:
    found = await unpassable(worst_relays(), lambda clock: OnlyWhatItHolds(clock))  # type: ignore[arg-type,return-value]
    assert "compat_sender (full)" in found
    assert {name.split(" (")[0] for name in found} == {
        "compat_sender",  # a relay of 6 to 15 RU against a burst of 5: point 1 of issue 37
        "relay of class 9",  # RU, RU per hour and key limits below the largest relay
        "relay of class 1",  # a sponsor key's RU per hour (1) below the class's largest relay
        "relay of class 2",
        "relay of class 3",
        "relay of class 4",
        "relay of class 5",
        "relay of class 6",
    }, found


def test_a_refused_request_above_the_burst_waits_for_a_full_bucket() -> None:
    limiter = LocalRateLimiter(clock=lambda: 0.0)
    compat = RouteLimitTable().compat_sender
    first = limiter.take_now("compat_sender", "s", compat, 6)  # the kit's 10 050 000 gas: 6 RU
    assert first.allowed and first.remaining == 0 and first.reset_ms == 6_000  # 1 RU in debt
    again = limiter.take_now("compat_sender", "s", compat, 6)
    assert not again.allowed and again.retry_after_ms == 6_000  # until the bucket is full again


# Live: /v1/relay paid by a sponsor key whose RU per hour is below the relay's RU ---------------------------
def test_a_sponsored_relay_above_the_keys_hourly_limit_passes_on_a_full_bucket(env: Any) -> None:
    kit = auth_kit(env)
    account = kit.account()
    key = kit.create_key(account, policy={"scopes": ["relay"], "limits": {"ruPerHour": 1}})
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, gas_limit=20_000_000)  # 6 RU against a bucket of 1 RU
    first = env.relay(tx, assignment["lease"], headers={"X-Api-Key": key["secret"]})
    assert first.status_code in (200, 202), first.text
    env.wait_state(f"{sender.address}:0", ("FINALIZED",))
    # The bucket is now 5 RU in debt: the next relay is refused, and says the 6 h it takes to refill.
    sender.nonce = 1
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, gas_limit=20_000_000)
    refused = env.relay(tx, assignment["lease"], headers={"X-Api-Key": key["secret"]})
    body = refused.json()
    assert refused.status_code == 429 and body["code"] == "HOURLY_BURN_EXCEEDED", body
    # Until the bucket is full again (6 RU at 1 RU per hour, less what refilled since the first relay).
    assert body["retryable"] is True and 5.9 * 3_600_000 < body["details"]["retryAfterMs"] <= 6 * 3_600_000
    assert int(refused.headers["Retry-After"]) * 1000 >= body["details"]["retryAfterMs"]


def auth_kit(env: Any) -> Any:
    return load_conftest("auth").AuthKit(env)


def test_unpassable_runs_every_start() -> None:
    # A bucket of 2 refilling 1 per second; a request of 3: full, emptied and "just paid" all pass.
    case = WorstCase("small", (Take("small", "k", Rate(1, 2), 3),))
    assert asyncio.run(unpassable([case], lambda clock: LocalRateLimiter(clock=clock))) == []


# GET /mcp: at most 20 event streams per IP --------------------------------------------------------------
LOOPBACK = "127.0.0.1"  # the IP (the slots' key) of every stream below
EVENTS = {"Accept": "text/event-stream"}


@pytest.fixture(params=["local", pytest.param("redis", marks=pytest.mark.redis)])
def mcp_host(request: pytest.FixtureRequest, unpaused_localnet: Any, tmp_path: Path) -> Iterator[Any]:
    """A served host (uvicorn: a stream is a connection of its own), its stream slots in process or in
    Redis (a namespace of its own, removed after)."""
    overrides: dict[str, Any] = {}
    if request.param == "redis":
        overrides = {
            "redis_url": request.getfixturevalue("redis_url"),
            "redis_prefix": f"t{uuid.uuid4().hex}",
        }
    settings = relay_settings(tmp_path, unpaused_localnet, **overrides)
    try:
        with ServedApi(create_app(settings, route_limits=unthrottled_limits())) as served:
            streams = served.app.state.host.limits.streams
            assert isinstance(
                streams, RedisConcurrencyLimiter if settings.redis_url else LocalConcurrencyLimiter
            )
            yield served
    finally:
        if settings.redis_url:
            with redis.Redis.from_url(settings.redis_url) as client:
                for key in client.scan_iter(match=f"{settings.redis_prefix}:*"):
                    client.delete(key)


def open_mcp_stream(served: Any) -> requests.Response:
    """The same request every time: `GET /mcp` for the event stream, its headers read (not its body)."""
    return requests.get(f"{served.url}/mcp", headers=EVENTS, stream=True, timeout=10)


def mcp_slots_held(served: Any) -> int:
    """The `GET /mcp` slots held for 127.0.0.1, as the host's limiter counts them when it admits one."""
    host = served.server.config.app.state.host
    streams = host.limits.streams
    if isinstance(streams, LocalConcurrencyLimiter):
        return streams.held.get((mount.MCP_STREAM_BUCKET, LOOPBACK), 0)
    assert isinstance(streams, RedisConcurrencyLimiter)
    with redis.Redis.from_url(host.settings.redis_url) as client:
        seconds, micros = client.time()
        # The leases not lapsed yet (a lease lapses at its score), as the acquire script counts them.
        return int(
            client.zcount(
                streams.key(mount.MCP_STREAM_BUCKET, LOOPBACK), seconds * 1000 + micros // 1000 + 1, "+inf"
            )
        )


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s} s"
        time.sleep(0.01)


def refused_for_now(response: requests.Response) -> None:
    """The 21st stream's refusal: retryable, to be asked again in 1 s (it cannot know when a stream ends)."""
    body = load_conftest("relay").check_problem(response, "RATE_LIMITED")
    assert body["details"] == {"retryAfterMs": STREAM_RETRY_MS, "scope": "ip"}, body
    assert response.headers["Retry-After"] == "1" and body["retryable"] is True
    response.close()


def fill_mcp_slots(served: Any, opened: list[requests.Response]) -> float:
    """Open the 20 streams one IP may hold; the 21st, refused: when it was refused."""
    opened += [open_mcp_stream(served) for _ in range(mount.MCP_STREAMS_PER_IP)]
    assert [response.status_code for response in opened] == [200] * mount.MCP_STREAMS_PER_IP
    refused_for_now(open_mcp_stream(served))
    return time.monotonic()


def test_a_refused_mcp_stream_passes_unchanged_when_a_client_leaves(mcp_host: Any) -> None:
    served = mcp_host
    opened: list[requests.Response] = []
    try:
        fill_mcp_slots(served, opened)
        opened.pop().close()
        # Once the host has seen the client go, the same request passes, and takes the slot back.
        wait_until(lambda: mcp_slots_held(served) < mount.MCP_STREAMS_PER_IP, "a slot freed")
        again = open_mcp_stream(served)
        opened.append(again)
        assert again.status_code == 200, again.text
        refused_for_now(open_mcp_stream(served))
    finally:
        for response in opened:
            response.close()


def test_a_refused_mcp_stream_passes_unchanged_at_the_latest_at_the_stream_lifetime(
    mcp_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody leaves: every stream ends at its lifetime, and the same request passes then."""
    served, lifetime = mcp_host, 2.0  # long enough to open 21 streams on a loaded machine
    monkeypatch.setattr(mount, "STREAM_LIFETIME_S", lifetime)  # read as each stream starts
    opened: list[requests.Response] = []
    try:
        refused = fill_mcp_slots(served, opened)
        for response in opened:
            body = b"".join(response.iter_content(chunk_size=None))  # returns when the host ends the stream
            assert body.startswith(b": open")
        assert time.monotonic() - refused < lifetime + 2.0, "a stream outlived its lifetime"
        wait_until(lambda: mcp_slots_held(served) < mount.MCP_STREAMS_PER_IP, "a slot freed at the lifetime")
        again = open_mcp_stream(served)
        opened.append(again)
        assert again.status_code == 200, again.text
    finally:
        for response in opened:
            response.close()


@pytest.mark.redis
async def test_the_mcp_stream_slots_of_a_host_that_died_lapse_before_a_lifetime(redis_url: str) -> None:
    """A host that dies holding streams neither releases nor renews their slots; on Redis they lapse after
    the lease (30 s), shorter than a stream's lifetime (120 s), and the refused request passes on another host."""
    client = Redis.from_url(redis_url)
    space = f"test-mcp-slots-{uuid.uuid4().hex}"
    start = 1_000_000.0
    now = [start]
    died, other = (RedisConcurrencyLimiter(client, space, clock=lambda: now[0]) for _ in range(2))
    limit = mount.MCP_STREAMS_PER_IP
    try:
        assert died.lease_ms <= mount.STREAM_LIFETIME_S * 1000
        for _ in range(limit):
            assert (await died.acquire(mount.MCP_STREAM_BUCKET, LOOPBACK, limit))[1] is not None
        died.held.clear()  # it died: nothing renews or releases its slots
        decision, slot = await other.acquire(mount.MCP_STREAM_BUCKET, LOOPBACK, limit)
        assert slot is None and decision.retry_after_ms == STREAM_RETRY_MS
        now[0] = start + (died.lease_ms - 1) / 1000
        assert (await other.acquire(mount.MCP_STREAM_BUCKET, LOOPBACK, limit))[1] is None  # not yet
        now[0] = start + died.lease_ms / 1000
        decision, slot = await other.acquire(mount.MCP_STREAM_BUCKET, LOOPBACK, limit)
        assert slot is not None and decision.allowed
    finally:
        await died.close()
        await other.close()
        async for key in client.scan_iter(match=f"{space}:*"):
            await client.delete(key)
        await client.aclose()
