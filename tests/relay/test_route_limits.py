"""Route-class limits through HTTP: headers on success and on 429 for every wired class, shared buckets.

Tight tables refill one token per 1 000 s, so which request is refused never depends on timing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from fastapi.testclient import TestClient
from redis import Redis
from relay_kit import ServedApi

from gasless.client.native_auth import make_native_auth_token
from gasless.hosting.app import create_app
from gasless.limits.buckets import LocalRateLimiter, Rate, RouteLimiter, RouteLimitTable

SLOW = 0.001  # tokens per second: nothing refills during a test

TIGHT = RouteLimitTable(
    public_read_ip=Rate(SLOW, 3),
    quote_ip=Rate(SLOW, 2),
    quote_account=Rate(SLOW, 3),
    assign_ip=Rate(SLOW, 5),
    assign_sender=Rate(SLOW, 2),
    relay_events_ip=2,
)


def headers_of(response: Any) -> tuple[str, str, int]:
    h = response.headers
    return h["RateLimit-Limit"], h["RateLimit-Remaining"], int(h["RateLimit-Reset"])


def refused(response: Any, problem: Any, scope: str, limit: int) -> None:
    body = problem(response, "RATE_LIMITED")
    assert body["details"]["scope"] == scope
    assert response.headers["RateLimit-Limit"] == str(limit)
    assert response.headers["RateLimit-Remaining"] == "0"
    assert int(response.headers["RateLimit-Reset"]) >= 1


# Public cached reads ------------------------------------------------------------------------------------
def test_public_reads_share_one_bucket_per_ip(make_env: Any, problem: Any) -> None:
    env = make_env(app_kwargs={"route_limits": TIGHT})
    sender = env.new_sender(1, plan=False)
    unknown = "ab" * 32
    answers = [
        env.client.get("/v1/network"),
        env.client.get(f"/v1/relay/{unknown}"),
        env.client.get(f"/v1/intents/{sender.address}/0"),
    ]
    assert [a.status_code for a in answers] == [200, 404, 404]
    # Reset: the seconds until the bucket is full again (1 000 s per token here).
    assert [headers_of(a) for a in answers] == [("3", "2", 1000), ("3", "1", 2000), ("3", "0", 3000)]
    refused(env.client.get(f"/v1/tx/{unknown}"), problem, "ip", 3)
    refused(env.client.get("/v1/network"), problem, "ip", 3)
    # Another address has its own bucket (the network view lives in memory: any event loop may read it).
    elsewhere = TestClient(env.client.app, client=("198.51.100.7", 40000))
    answer = elsewhere.get("/v1/network")
    assert answer.status_code == 200 and headers_of(answer)[:2] == ("3", "2")


def test_default_table_is_what_the_routes_apply(make_env: Any) -> None:
    env = make_env(app_kwargs={"route_limits": RouteLimitTable()})
    # Buckets on a clock that stands still: the counts below are exact however slowly the requests run
    # (on the real clock a 60/min bucket refills one token a second between two requests).
    host = env.client.app.state.host
    stopped = time.monotonic()
    host.limits = RouteLimiter(
        host.limits.table, LocalRateLimiter(clock=lambda: stopped), host.limits.streams
    )
    assert headers_of(env.client.get("/v1/network"))[:2] == ("60", "59")
    assert headers_of(env.client.get("/v1/tx/" + "cd" * 32))[:2] == ("60", "58")
    validate = env.client.post("/v1/validate", json={"tx": {}})  # ValidateRequest: an object `tx`
    assert validate.status_code == 200 and validate.json()["ok"] is False
    assert headers_of(validate)[:2] == ("2", "1")
    quote = env.client.post("/v1/quote", json={})
    assert quote.status_code == 400 and headers_of(quote)[:2] == ("2", "0")  # on errors too
    sender = env.new_sender(1, plan=False)
    assigned = env.client.post(
        "/v1/relay/assign", json={"sender": sender.address, "proof": env.proof(sender)}
    )
    assert assigned.status_code == 200 and headers_of(assigned)[:2] == ("10", "9")


# Purchase builders -----------------------------------------------------------------------------------------
def test_prepare_routes_share_one_bucket_per_ip(make_env: Any, problem: Any) -> None:
    """ "prepare routes: IP, 2 req/s, burst 10" (here a burst of 2 that never refills)."""
    env = make_env(app_kwargs={"route_limits": RouteLimitTable(prepare_ip=Rate(SLOW, 2))})
    payer = env.new_sender(1, plan=False)
    first = env.client.post(
        "/v1/deposit/prepare", json={"payer": payer.address, "amountMicroUsdc": 5_000_000}
    )
    second = env.client.post("/v1/subscribe/prepare", json={"payer": payer.address, "tierId": 1})
    # The payer holds no USDC: both are refused (422), and refusals count against the bucket too.
    assert [first.status_code, second.status_code] == [422, 422], second.text
    assert [headers_of(a)[:2] for a in (first, second)] == [("2", "1"), ("2", "0")]
    refused(
        env.client.post("/v1/deposit/prepare", json={"payer": payer.address, "amountMicroUsdc": 5}),
        problem,
        "ip",
        2,
    )
    assert headers_of(env.client.get("/v1/pricing"))[:2] != ("2", "0")  # public reads have their own bucket


# Quote and validate ---------------------------------------------------------------------------------------
def test_quote_and_validate_per_ip_or_per_authenticated_account(make_env: Any, problem: Any) -> None:
    env = make_env(app_kwargs={"route_limits": TIGHT})
    sender = env.new_sender(1)  # has an account on the contract (a granted plan)
    assignment = env.assign(sender)
    wire = {"tx": env.build(sender, assignment).to_dictionary()}
    first = env.client.post("/v1/validate", json=wire)
    assert first.status_code == 200 and headers_of(first)[:2] == ("2", "1")
    second = env.client.post("/v1/quote", json=wire)
    assert second.status_code == 200 and headers_of(second)[:2] == ("2", "0")
    refused(env.client.post("/v1/validate", json=wire), problem, "ip", 2)
    refused(env.client.post("/v1/quote", json=wire), problem, "ip", 2)

    native = env.client.get("/v1/network").json()["nativeAuth"]

    def bearer(key: Any) -> dict[str, str]:
        token = make_native_auth_token(
            key, origin=native["origins"][0], block_hash=native["blockHash"], ttl_seconds=600
        )
        return {"Authorization": f"Bearer {token}"}

    # A verified token of an account: the account's own allowance, whatever the IP has left.
    account = bearer(sender.key)
    answers = [
        env.client.post(path, json=wire, headers=account) for path in ("/v1/quote", "/v1/validate") * 2
    ]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    assert [headers_of(a)[:2] for a in answers[:3]] == [("3", "2"), ("3", "1"), ("3", "0")]
    refused(answers[3], problem, "account", 3)
    # A token of a key without an account, or one that does not verify, counts as the IP (not a 401).
    stranger = env.new_sender(1, plan=False)
    refused(env.client.post("/v1/quote", json=wire, headers=bearer(stranger.key)), problem, "ip", 2)
    refused(
        env.client.post("/v1/quote", json=wire, headers={"Authorization": "Bearer x.y.z"}), problem, "ip", 2
    )


# Private reads -------------------------------------------------------------------------------------------
def test_every_private_read_is_limited_per_account_by_its_rate_class(make_env: Any, problem: Any) -> None:
    """ "Private reads: account, by class 1 to 6": one bucket per account, the size its class gives (class 3
    here, the granted Growth tier), on every private read route."""
    by_class = {c: Rate(SLOW, 2) for c in range(1, 7)} | {3: Rate(SLOW, 9)}
    env = make_env(app_kwargs={"route_limits": RouteLimitTable(private_read_class=by_class)})
    sender = env.new_sender(1)  # its own account, class 3
    assignment = env.assign(sender)
    relayed = env.relay(env.build(sender, assignment), assignment["lease"])
    tx_hash = relayed.json()["txHash"]
    env.wait_state(tx_hash, ("FINALIZED",))
    native = env.client.get("/v1/network").json()["nativeAuth"]
    token = make_native_auth_token(
        sender.key, origin=native["origins"][0], block_hash=native["blockHash"], ttl_seconds=600
    )
    auth = {"Authorization": f"Bearer {token}"}
    account = sender.address
    reads = [
        "/v1/me",
        f"/v1/account/{account}/keys",
        f"/v1/account/{account}/webhooks",
        f"/v1/account/{account}/webhooks/wh_unknown",
        f"/v1/account/{account}/webhooks/wh_unknown/deliveries",
        f"/v1/usage?account={account}",
        f"/v1/usage/summary?account={account}",
        f"/v1/usage/{tx_hash}",
        f"/v1/usage/{tx_hash}/proof",
    ]
    answers = [env.client.get(path, headers=auth) for path in reads]
    assert [a.status_code for a in answers] == [200, 200, 200, 404, 404, 200, 200, 200, 409], [
        a.text for a in answers
    ]
    assert [headers_of(a)[:2] for a in answers] == [("9", str(8 - i)) for i in range(9)]
    for path in reads:
        refused(env.client.get(path, headers=auth), problem, "account", 9)


# Assignments ----------------------------------------------------------------------------------------------
def test_assign_reports_the_closer_of_its_ip_and_sender_limits(make_env: Any, problem: Any) -> None:
    env = make_env(app_kwargs={"route_limits": TIGHT})

    def assign(sender: Any) -> Any:
        body = {"sender": sender.address, "proof": env.proof(sender)}
        return env.client.post("/v1/relay/assign", json=body)

    alice = env.new_sender(1, plan=False)
    # IP bucket 5, sender bucket 2: the sender's is closer to refusing, so it is the one reported.
    answers = [assign(alice), assign(alice)]
    assert [headers_of(a)[:2] for a in answers] == [("2", "1"), ("2", "0")]
    refused(assign(alice), problem, "sender", 2)
    bob, carol = env.new_sender(1, plan=False), env.new_sender(1, plan=False)
    # IP: 1 left (full again in 4 000 s), Bob: 1 left (1 000 s): a tie goes to the slower to recover.
    assert headers_of(assign(bob)) == ("5", "1", 4000)
    assert headers_of(assign(carol))[:2] == ("5", "0")  # IP: 0 left, Carol: 1 left
    refused(assign(env.new_sender(1, plan=False)), problem, "ip", 5)


# Shared through Redis -------------------------------------------------------------------------------------
@pytest.mark.redis
def test_two_hosts_on_one_redis_share_one_bucket(
    make_env: Any, redis_url: str, tmp_path: Path, problem: Any
) -> None:
    prefix = f"test-route-limits-{uuid.uuid4().hex}"
    shared = {"redis_url": redis_url, "redis_prefix": prefix, "app_kwargs": {"route_limits": TIGHT}}
    try:
        host_a = make_env(**shared)
        host_b = make_env(host_id="b", database_url=f"sqlite+aiosqlite:///{tmp_path / 'b.db'}", **shared)
        answers = [
            host_a.client.get("/v1/network"),
            host_b.client.get("/v1/network"),
            host_a.client.get("/v1/network"),
        ]
        assert [headers_of(a)[:2] for a in answers] == [("3", "2"), ("3", "1"), ("3", "0")]
        refused(host_b.client.get("/v1/network"), problem, "ip", 3)
        keys = {key.decode() for key in Redis.from_url(redis_url).scan_iter(match=f"{prefix}:*")}
        assert keys == {f"{prefix}:test:localnet:rate:public_read_ip:testclient"}
    finally:
        client = Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)


# The per-intent stream's concurrency (a real server: streams must stay open side by side) ----------------
@pytest.fixture
def served(make_env: Any, unpaused_localnet: Any, tmp_path: Path) -> Iterator[tuple[ServedApi, Any]]:
    # tests/relay/conftest.py's namespace, reached through one of its fixtures (several modules are named
    # `conftest`, so importing it by name is not reliable).
    relay_conftest = make_env.__globals__
    settings = relay_conftest["relay_settings"](tmp_path, unpaused_localnet)
    contract = unpaused_localnet.net.info["contract"]
    with ServedApi(create_app(settings, route_limits=TIGHT)) as server:
        # RelayEnv's chain helpers (owner calls, signing) need no client; HTTP goes to the real server.
        yield server, relay_conftest["RelayEnv"](None, unpaused_localnet, settings, contract)


def test_relay_events_streams_are_limited_per_ip(served: tuple[ServedApi, Any], problem: Any) -> None:
    server, env = served
    sender = env.new_sender(1)
    env.faults(chain={"stalledShards": [1]})  # the intent stays in flight, so its stream stays open
    body = {"sender": sender.address, "proof": env.proof(sender)}
    assignment = requests.post(f"{server.url}/v1/relay/assign", json=body, timeout=10).json()
    tx = env.build(sender, assignment)
    relayed = requests.post(
        f"{server.url}/v1/relay", json={"tx": tx.to_dictionary(), "lease": assignment["lease"]}, timeout=10
    )
    assert relayed.status_code in (200, 202), relayed.text
    url = f"{server.url}/v1/relay/{sender.address}:0/events"
    streams = [requests.get(url, stream=True, timeout=10) for _ in range(2)]
    try:
        assert [s.status_code for s in streams] == [200, 200]
        assert [headers_of(s)[:2] for s in streams] == [("2", "1"), ("2", "0")]
        third = requests.get(url, stream=True, timeout=10)
        refused(third, problem, "ip", 2)
        assert third.headers["Retry-After"] == "1"
        # Closing a stream gives its slot back (when the server sees the disconnect).
        streams.pop().close()
        deadline = time.monotonic() + 10
        while True:
            again = requests.get(url, stream=True, timeout=10)
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            again.close()
            time.sleep(0.05)
        streams.append(again)
        assert again.status_code == 200 and headers_of(again)[:2] == ("2", "0")
    finally:
        for stream in streams:
            stream.close()
        env.faults(chain={"stalledShards": []})


# The client SDK under these limits -------------------------------------------------------------------------
async def test_client_follows_by_polling_when_streams_and_polls_are_limited() -> None:
    from aiohttp import web

    from gasless.client.api import RelayClient

    def limited(retry_ms: int) -> web.Response:
        body = {"code": "RATE_LIMITED", "status": 429, "details": {"retryAfterMs": retry_ms, "scope": "ip"}}
        return web.json_response(body, status=429, headers={"Retry-After": "1"})

    polls: list[str] = []

    async def events(request: web.Request) -> web.Response:
        return limited(1_000)

    async def status(request: web.Request) -> web.Response:
        polls.append("poll")
        if len(polls) == 2:
            return limited(50)
        state = "FINALIZED" if len(polls) >= 3 else "BROADCAST"
        return web.json_response({"id": "erd1x:0", "state": state, "final": state == "FINALIZED"})

    app = web.Application()
    app.router.add_get("/v1/relay/{id}/events", events)
    app.router.add_get("/v1/relay/{id}", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with RelayClient(url) as client:
            states = [i["state"] async for i in client.follow("erd1x:0", poll_interval_s=0.01, timeout_s=10)]
        assert states == ["BROADCAST", "FINALIZED"]
        assert len(polls) == 3  # the refused poll was read again
    finally:
        await runner.cleanup()


# x402 ----------------------------------------------------------------------------------------------------
def test_x402_paid_routes_per_ip_and_paid_retries_per_payer(make_env: Any, problem: Any) -> None:
    """ "x402 purchase routes: 1 req/s per IP; 6 per minute per payer" (here 3 and 1 that never refill)."""
    from purchase_kit import fund  # type: ignore[import-not-found]

    from gasless.client.keys import UserKey
    from gasless.client.x402 import pay_header, read_challenge

    table = RouteLimitTable(x402_ip=Rate(SLOW, 3), x402_payer=Rate(SLOW, 1))
    env = make_env(app_kwargs={"route_limits": table})
    payer = env.new_sender(1, plan=False)
    fund(env, payer.address, usdc_micro=30_000_000)
    body = {"payer": payer.address, "amountMicroUsdc": 10_000_000}
    challenge = env.client.post("/v1/x402/topup", json=body)
    assert challenge.status_code == 402 and headers_of(challenge)[:2] == ("3", "2")
    header, _ = pay_header(read_challenge(challenge.headers), UserKey(payer.key))
    paid = env.client.post("/v1/x402/topup", json=body, headers={"PAYMENT-SIGNATURE": header})
    assert paid.status_code == 200, paid.text
    assert headers_of(paid)[:2] == ("1", "0")  # the payer's bucket is the closest to refusing
    refused(
        env.client.post("/v1/x402/topup", json=body, headers={"PAYMENT-SIGNATURE": header}),
        problem,
        "payer",
        1,
    )
    refused(
        env.client.post("/v1/x402/purchase", json={"payer": payer.address, "tierId": 1}), problem, "ip", 3
    )
    assert env.client.get("/v1/x402/supported").status_code == 200  # public reads have their own bucket
