"""The compat facade through a client written to the starter kit's behaviour (kit_client.py): relayer
address cached forever, transfers and contract calls to finality, draining and retired relayers, every
status of compat rule 4 with its `error` string and problem `code`, the billing shared with the native
path (usage row with the compat route), and the rendezvous property."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit_client import KitClient, NeedsRegistration, RelayFailed  # type: ignore[import-not-found]
from relay_kit import key_in_shard  # type: ignore[import-not-found]

from gasless.client.native_auth import make_native_auth_token
from gasless.compat.service import rendezvous
from gasless.limits.buckets import Rate, RouteLimitTable
from gasless.relay.relayers import RelayerInfo

ALICE = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"


def kit(env: Any, tmp_path: Path) -> KitClient:
    return KitClient("", tmp_path, client=env.client)


def check_error(answer: Any, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    body = answer.json()
    assert body["code"] == code and body["status"] == status and isinstance(body["error"], str), body
    assert {"type", "title", "detail", "instance"} <= set(body)
    return body  # type: ignore[no-any-return]


def wait_final(env: Any, tx_hash: str) -> dict[str, Any]:
    return env.wait_state(tx_hash, ("FINALIZED",))  # type: ignore[no-any-return]


def test_health_and_a_stable_relayer_address(env: Any, tmp_path: Path) -> None:
    assert env.client.get("/health").json() == {"status": "ok"}
    sender = env.new_sender(1)
    first = env.client.get(f"/relayer/address/{sender.address}")
    assert first.status_code == 200 and set(first.json()) == {"relayerAddress"}
    relayer = first.json()["relayerAddress"]
    assert relayer in {w.address.to_bech32() for w in env.localnet.net.genesis.relayers if w.shard == 1}
    assert all(
        env.client.get(f"/relayer/address/{sender.address}").json()["relayerAddress"] == relayer
        for _ in range(3)
    )
    body = check_error(env.client.get("/relayer/address/not-an-address"), 404, "NOT_FOUND")
    assert "invalid address" in body["error"]


def test_the_kit_relays_a_transfer_and_a_contract_call_to_finality(env: Any, tmp_path: Path) -> None:
    sender = env.new_sender(1)  # a granted plan: the account pays
    client = kit(env, tmp_path)
    transfer = client.build(sender.key, nonce=0, receiver=ALICE)
    assert "options" not in transfer and "data" not in transfer and isinstance(transfer["nonce"], int)
    tx_hash = client.relay(transfer, challengeNonce="12345", somethingElse=True)
    assert len(tx_hash) == 64
    assert wait_final(env, tx_hash)["outcome"] == "success"
    cache = json.loads((tmp_path / ".relayer_cache.json").read_text())
    assert cache[""][sender.address] == transfer["relayer"]

    call = client.build(
        sender.key, nonce=1, receiver=env.contract, data=b"setAutoRenew@01", gas_limit=3_000_000
    )
    assert "data" in call
    call_hash = client.relay(call)
    assert wait_final(env, call_hash)["outcome"] == "success"

    # The same billing as the native path; the usage row names the compat route.
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(
        sender.key, origin=env.settings.network.app_origin, block_hash=block, ttl_seconds=600
    )
    deadline = time.monotonic() + 15
    while True:
        row = env.client.get(f"/v1/usage/{tx_hash}", headers={"Authorization": f"Bearer {token}"})
        if row.status_code == 200:
            break
        assert time.monotonic() < deadline, row.text
        time.sleep(0.05)
    row = row.json()["row"]
    assert row["route"] == "compat" and row["billed"] and row["billingClass"] == "plan" and row["ru"] == 1
    # An identical resubmission answers the same hash (the kit retries with the same bytes).
    assert client.relay(transfer) == tx_hash


def test_draining_keeps_serving_cached_users_and_retired_says_clear_the_cache(
    env: Any, tmp_path: Path, operator: Any
) -> None:
    sender = env.new_sender(1)
    client = kit(env, tmp_path)
    cached = client.relayer_address(sender.address)
    operator.set_relayer_state(env, "draining", cached)
    fresh = env.client.get(f"/relayer/address/{sender.address}").json()["relayerAddress"]
    assert fresh != cached  # new users get an active relayer
    tx_hash = client.relay(client.build(sender.key, nonce=0, receiver=ALICE))  # the cached one still serves
    assert wait_final(env, tx_hash)["relayer"] == cached

    operator.set_relayer_state(env, "retired", cached)
    with pytest.raises(RelayFailed) as failed:
        client.relay(client.build(sender.key, nonce=1, receiver=ALICE))
    assert failed.value.status == 400 and failed.value.body["code"] == "RELAYER_RETIRED"
    assert ".relayer_cache.json" in failed.value.body["error"]
    (tmp_path / ".relayer_cache.json").unlink()  # what the error says to do
    tx_hash = client.relay(client.build(sender.key, nonce=1, receiver=ALICE))
    assert wait_final(env, tx_hash)["relayer"] == fresh


def test_every_status_of_compat_rule_4(make_env: Any, tmp_path: Path, operator: Any) -> None:
    # The spec's compat limit is 1 RU/s with a burst of 5; here the burst is the spec's and nothing refills
    # during the test (a slow machine must not let a sixth relay through).
    assert RouteLimitTable().compat_sender == Rate(1, 5)
    table = RouteLimitTable(public_read_ip=Rate(1_000, 1_000), compat_sender=Rate(0.001, 5))
    env = make_env(app_kwargs={"route_limits": table})
    client = kit(env, tmp_path)
    sender = env.new_sender(1)

    # 400: unsigned (the kit's registration flow posts one), gas price, gas limit, bad JSON, no transaction.
    unsigned = client.build(sender.key, nonce=0, receiver=ALICE, sign=False)
    body = check_error(env.client.post("/relay", json={"transaction": unsigned}), 400, "MALFORMED_REQUEST")
    assert "not signed" in body["error"]
    pricey = client.build(sender.key, nonce=0, receiver=ALICE, gas_price=2_000_000_000)
    check_error(env.client.post("/relay", json={"transaction": pricey}), 400, "GAS_PRICE_OUT_OF_RANGE")
    huge = client.build(sender.key, nonce=0, receiver=ALICE, gas_limit=60_000_001)
    check_error(env.client.post("/relay", json={"transaction": huge}), 400, "GAS_LIMIT_TOO_HIGH")
    garbled = env.client.post("/relay", content=b"{not json", headers={"Content-Type": "application/json"})
    check_error(garbled, 400, "MALFORMED_REQUEST")
    check_error(env.client.post("/relay", json={"tx": {}}), 400, "MALFORMED_REQUEST")
    too_big = env.client.post(
        "/relay", content=b"{" + b" " * 200_000 + b"}", headers={"Content-Type": "application/json"}
    )
    check_error(too_big, 400, "PAYLOAD_TOO_LARGE")

    # 403: no entitlement; the error mentions registration (the kit's cue).
    stranger = env.new_sender(1, plan=False)
    with pytest.raises(NeedsRegistration) as registration:
        client.relay(client.build(stranger.key, nonce=0, receiver=ALICE))
    assert "register" in str(registration.value)
    check_error(
        env.client.post("/relay", json={"transaction": client.build(stranger.key, nonce=0, receiver=ALICE)}),
        403,
        "NO_ENTITLEMENT",
    )

    # 404: an unknown path or method on the facade.
    check_error(env.client.get("/relay"), 404, "NOT_FOUND")

    # 429: 1 RU/s per sender with a burst of 5; the error starts with "Quota exceeded".
    answers = [
        env.client.post("/relay", json={"transaction": client.build(sender.key, nonce=n, receiver=ALICE)})
        for n in range(6)
    ]
    assert [a.status_code for a in answers[:5]] == [200] * 5, answers[4].text
    body = check_error(answers[5], 429, "RATE_LIMITED")
    assert body["error"].startswith("Quota exceeded") and int(answers[5].headers["Retry-After"]) >= 1

    # 500: a 503-class condition of the native path (no active relayer left in the shard).
    shard1 = operator.relayers_in(env, 1)
    operator.set_relayer_state(env, "retired", *shard1)
    other = key_in_shard(1)
    from gasless.chain.addresses import address_of

    body = check_error(
        env.client.get(f"/relayer/address/{address_of(other.generate_public_key().buffer).to_bech32()}"),
        500,
        "NO_RELAYER_AVAILABLE",
    )
    assert body["error"]


def _relayers(n: int) -> list[RelayerInfo]:
    from gasless.chain.addresses import address_of

    return [
        RelayerInfo(address_of(hashlib.sha256(bytes([i])).digest()).to_bech32(), 1, "active", True, 0)
        for i in range(n)
    ]


@settings(max_examples=40, deadline=None)
@given(
    users=st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=40, unique=True),
    count=st.integers(min_value=2, max_value=8),
    removed=st.integers(min_value=0, max_value=7),
)
def test_rendezvous_moves_only_the_users_of_a_removed_relayer(
    users: list[bytes], count: int, removed: int
) -> None:
    pool = _relayers(count)
    gone = pool[removed % count]
    rest = [r for r in pool if r != gone]
    for user in users:
        before = rendezvous(user, pool)
        after = rendezvous(user, rest)
        assert before in pool and after in rest  # always one of the shard's relayers
        if before != gone:
            assert after == before  # nobody else moves
        assert after != gone
