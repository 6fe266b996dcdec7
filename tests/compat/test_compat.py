"""The compat facade through a client written to the starter kit's behaviour (kit_client.py): relayer
address cached forever, the kit's main path (10 050 000 gas) and contract calls to finality, draining and
retired relayers, every status of docs/compat.md ("Statuses and error bodies") with its `error` string and
problem `code`, the kit's string checks ("register", "Quota exceeded") and registration calls, trailing
slashes, `/health` following readiness, the billing shared with the native path (usage row with the compat
route), relays above the burst, and the rendezvous answers (a property, and literal answers pinned for fixed
relayer sets)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from kit_client import (  # type: ignore[import-not-found]
    KIT_GAS_LIMIT,
    AutoRegistrationFailed,
    KitClient,
    RelayFailed,
)
from multiversx_sdk import UserSecretKey
from relay_kit import key_in_shard, start_env, unthrottled_limits  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of
from gasless.client.native_auth import make_native_auth_token
from gasless.compat.rendering import KIT_COMMAND_WORDS
from gasless.compat.service import COMPAT_MAX_GAS_LIMIT, rendezvous
from gasless.core.errors import CATALOGUE
from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.limits.buckets import LocalRateLimiter, Rate, RouteLimiter, RouteLimitTable
from gasless.localnet.owner import unpause
from gasless.relay.relayers import RelayerInfo

ALICE = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"


def kit(env: Any, tmp_path: Path) -> KitClient:
    # The kit waits 1 s, then 2 s, between attempts; here they are only recorded (`waits`), not slept.
    return KitClient("", tmp_path, client=env.client, backoff=lambda seconds: None)


def no_kit_command(text: str) -> bool:
    return not any(word in text.lower() for word in KIT_COMMAND_WORDS)


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
    transfer = client.build(sender.key, nonce=0, receiver=ALICE)  # the kit's main path: 10 050 000 gas
    assert transfer["gasLimit"] == KIT_GAS_LIMIT == 10_050_000
    assert "options" not in transfer and "data" not in transfer and isinstance(transfer["nonce"], int)
    tx_hash = client.relay(transfer, challengeNonce="12345", somethingElse=True)
    assert len(tx_hash) == 64 and client.attempts == 1
    assert wait_final(env, tx_hash)["outcome"] == "success"
    cache = json.loads((tmp_path / ".relayer_cache.json").read_text())
    assert cache[""][sender.address]["relayerAddress"] == transfer["relayer"]

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
    row = row.json()  # the usage row, members at the top level
    assert row["route"] == "compat" and row["billed"] and row["billingClass"] == "plan" and row["ru"] == 6
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
    # The interface contract's compat limit is 1 RU/s with a burst of 5; here the burst is the interface contract's and nothing refills
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
    body = check_error(env.client.post("/relay", json={"transaction": pricey}), 400, "GAS_PRICE_OUT_OF_RANGE")
    # The catalogue's member names, as on /v1 (only the status is the kit's).
    assert body["details"] == {"limit": 1_000_000_000, "actual": 2_000_000_000, "bound": "max"}, body
    huge = client.build(sender.key, nonce=0, receiver=ALICE, gas_limit=60_000_001)
    body = check_error(env.client.post("/relay", json={"transaction": huge}), 400, "GAS_LIMIT_TOO_HIGH")
    assert body["details"] == {"limit": 60_000_000, "actual": 60_000_001}, body
    garbled = env.client.post("/relay", content=b"{not json", headers={"Content-Type": "application/json"})
    check_error(garbled, 400, "MALFORMED_REQUEST")
    check_error(env.client.post("/relay", json={"tx": {}}), 400, "MALFORMED_REQUEST")
    too_big = env.client.post(
        "/relay", content=b"{" + b" " * 200_000 + b"}", headers={"Content-Type": "application/json"}
    )
    check_error(too_big, 400, "PAYLOAD_TOO_LARGE")

    # 403: no entitlement. The `error` says how to pay, in words the kit does not act on: the kit retries
    # its 3 attempts and reports the text, and never starts its own registration.
    stranger = env.new_sender(1, plan=False)
    with pytest.raises(RelayFailed) as unpaid:
        client.relay(client.build(stranger.key, nonce=0, receiver=ALICE))
    assert not isinstance(unpaid.value, AutoRegistrationFailed), client.log
    body = unpaid.value.body
    assert unpaid.value.status == 403 and body["code"] == "NO_ENTITLEMENT", body
    assert body["error"].startswith("Payment needed") and "GET /v1/pricing" in body["error"], body
    assert no_kit_command(body["error"]), body
    assert [line.split(":")[0] for line in client.log[-3:]] == [
        f"Tx Broadcast Attempt {n} failed" for n in (1, 2, 3)
    ]
    assert client.waits[-2:] == [1.0, 2.0]
    check_error(
        env.client.post("/relay", json={"transaction": client.build(stranger.key, nonce=0, receiver=ALICE)}),
        403,
        "NO_ENTITLEMENT",
    )

    # 404: an unknown path or method on the facade (and under it), each with the kit's `error`.
    for method, path in (
        ("GET", "/relay"),
        ("DELETE", "/relay"),
        ("POST", "/relay/extra"),
        ("GET", "/relayer"),
        ("GET", "/relayer/address"),
        ("GET", "/relayer/address/"),
        ("PUT", "/health"),
    ):
        body = check_error(env.client.request(method, path), 404, "NOT_FOUND")
        assert "POST /relay" in body["error"], body

    # 429: 1 RU/s per sender with a burst of 5 (plain transfers of 100 000 gas: 1 RU each); the error
    # starts with "Quota exceeded" and says when the same transaction passes.
    answers = [
        env.client.post(
            "/relay",
            json={"transaction": client.build(sender.key, nonce=n, receiver=ALICE, gas_limit=100_000)},
        )
        for n in range(6)
    ]
    assert [a.status_code for a in answers[:5]] == [200] * 5, answers[4].text
    body = check_error(answers[5], 429, "RATE_LIMITED")
    assert body["error"].startswith("Quota exceeded") and int(answers[5].headers["Retry-After"]) >= 1
    assert body["retryable"] is True and "send the same transaction again after" in body["error"], body

    # 500: a 503-class condition of the native path (no active relayer left in the shard).
    shard1 = operator.relayers_in(env, 1)
    operator.set_relayer_state(env, "retired", *shard1)
    other = key_in_shard(1)
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


# Rendezvous answers pinned: the kit keeps an answer for ever, so a change of the choice (its hash, its
# input order, the set it chooses from) would send fresh installs elsewhere. Literal values, computed once.
PINNED_RELAYERS = [
    "erd1kn775xksyeuz8ygqqvyyv4lpk7j6v42fk70j34dq8xv6u88ka8esce8g9m",
    "erd1qrexd6kqw9pyy52cc2qqzd40ra73rjnxyss4h55svu76v8dxlm5qxleadj",
    "erd1uxtprrzyfl8jp0lrpjhjx6hc0a9h0sd2d9qnly756rj4sd5zhzzsuhyp6v",
    "erd1ss2xdpvgj0jfanrpeycc7z7zkg6avkflf6uj8mmeh4daj0f0lk0qsxz2yp",
    "erd1666gs8hn2cwhja8tx40v4jfpsu8m7p29eegpp432ts6xyfvreats93wfkn",
]
PINNED_USERS = [
    "erd107kk5ngqgx5nwh3w7er26pd6u8n87gz8jtujre4l88caud53j2ksjah8c3",
    "erd1cmpgney7nszmy9zcvqu8kuaukxxlg0asng0y5j5hz0rkez9m2sds7u0ngr",
    "erd1my4knnac9nk2k3w8206kqq4jcrndq8cn9l3e7ty83pvde9fguy9s5054ed",
    "erd1jgcr4gyysdhp3cclcvt9uscp4cfgv8499pj9e2vpywag9r3pjhksad2jww",
    "erd1h6epszgajk7peaf236l9c6fp3uh3vs70wzvnkacd4wz796pww44qt6m6ng",
    "erd1t4jjex98j8h3p2g48dx6dls60q9cyujq6rhs3shgc3qhxtgs5flsmjywnx",
    "erd1wfx2uvqvc3nyv2x2zj72a854akm2skhudrmf8z4x5lzqpd79hueqktc0n8",
    "erd1pysgz9qtvaa5tklfswe0p49wqfvl7229h75zlxt06lmv4353dp3qqn0sgn",
]
R0, R1, R2, R3, R4 = PINNED_RELAYERS


@pytest.mark.parametrize(
    ("relayers", "expected"),
    [
        # Four relayers.
        ([R0, R1, R2, R3], [R3, R2, R1, R2, R1, R1, R1, R3]),
        # R1 retired (or draining): only its users (3rd, 5th, 6th, 7th) move; the others keep theirs.
        ([R0, R2, R3], [R3, R2, R2, R2, R3, R2, R2, R3]),
        # R4 joins: it takes only the users it outscores (6th, 7th); nobody else moves.
        ([R0, R1, R2, R3, R4], [R3, R2, R1, R2, R1, R4, R4, R3]),
        # The order the relayers are listed in changes nothing.
        ([R3, R2, R1, R0], [R3, R2, R1, R2, R1, R1, R1, R3]),
    ],
)
def test_rendezvous_answers_are_pinned(relayers: list[str], expected: list[str]) -> None:
    from gasless.chain.addresses import parse_address

    pool = [RelayerInfo(address, 1, "active", True, 0) for address in relayers]
    answers = [rendezvous(parse_address(user).get_public_key(), pool) for user in PINNED_USERS]
    assert [info.address for info in answers if info is not None] == expected


# Shard 1 of a localnet whose relayer wallets are fixed test keys, and users of shard 1 (addresses only).
PINNED_KEYS = {
    "relayer-s1-0": "e1c63c0a97ca6c9248187e034f7abcc4b15dc66d1e4cc5d914ac4749be1b3093",
    "relayer-s1-1": "49412cd4ee7e41f0bfe07136697bc7235a22a2035709a20048742e0afb825b8d",
}
S1_R0 = "erd133tayjde6xxv52us3nk9z3fzjgn6strutnggfs38chun6w5gtelssugqh9"
S1_R1 = "erd1xfkka70ddmyk2mr4lafacqs26jul6jlarl6eh2zfgsecdfe7krnss2ssz0"
S1_USERS = [
    "erd1t6qj2eqwww78lf2mt5yr3aft8qhzfvra38pugz2vmll4hpa9dwsse6nvwn",
    "erd1z5m80ypzyrny0qvahzyny4wcdske92g0tgqmwzj5v9gwtme87zgs0qmndm",
    "erd1r76hs7gqykzv3zd06wvjh45eu98ppqdmdudn8y53759pghyl3vns0ehem9",
    "erd1wgegcf2q942cxvtjz5p8t7wgtxyyc6vdcuz72h8y3g8aev4weezsh8dh4x",
    "erd1vc4rmeev784w9l3ugsydgrjzv863uzmt4n303emld4e66lmta4uswd740v",
    "erd1ksaykcfanjjmsmjsx4f72g6r4cz8pges2jgp9m952cdclyq9704sjp3etm",
]


@contextlib.contextmanager
def host_on(directory: Path, localnet: Any, **overrides: Any) -> Iterator[Any]:
    started = start_env(directory, localnet, **overrides)
    try:
        yield next(started)
    finally:
        with contextlib.suppress(StopIteration):
            next(started)


def test_the_relayer_answers_are_pinned_across_restarts_hosts_and_a_draining_relayer(
    tmp_path: Path, run_localnet: Any, operator: Any
) -> None:
    from multiversx_sdk import UserPEM

    wallets = tmp_path / "localnet" / "wallets"
    wallets.mkdir(parents=True)
    for name, secret in PINNED_KEYS.items():
        key = UserSecretKey(bytes.fromhex(secret))
        UserPEM(label=address_of(key.generate_public_key().buffer).to_bech32(), secret_key=key).save(
            wallets / f"{name}.pem"
        )
    localnet = run_localnet(tmp_path / "localnet")
    asyncio.run(unpause(localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"]))
    assert sorted(w.address.to_bech32() for w in localnet.net.genesis.relayers if w.shard == 1) == sorted(
        [S1_R0, S1_R1]
    )

    def answers(env: Any) -> list[str]:
        return [env.client.get(f"/relayer/address/{user}").json()["relayerAddress"] for user in S1_USERS]

    pinned = [S1_R0, S1_R1, S1_R1, S1_R1, S1_R0, S1_R1]
    with host_on(tmp_path / "a", localnet) as env:
        assert answers(env) == pinned
    with host_on(tmp_path / "a", localnet) as env:  # restarted: same database, new process state
        assert answers(env) == pinned
    with host_on(tmp_path / "b", localnet, host_id="b") as env:  # another host, its own database
        assert answers(env) == pinned
        operator.set_relayer_state(env, "draining", S1_R0)
        # Only the users of the draining relayer move; their cached answer is still accepted (docs/compat.md).
        assert answers(env) == [S1_R1] * len(S1_USERS)
    with host_on(tmp_path / "a", localnet) as env:  # the contract is the authority for every host
        assert answers(env) == [S1_R1] * len(S1_USERS)


# The kit's registration calls, trailing slashes, readiness ---------------------------------------------
def test_the_kits_registration_calls_say_none_is_needed_and_how_to_get_a_plan(
    env: Any, tmp_path: Path
) -> None:
    client = kit(env, tmp_path)
    sender = env.new_sender(1, plan=False)
    # scripts/register.ts and validator.ts post {"address"} to /challenge; nothing of the kind exists here.
    for method, path, body in (
        ("POST", "/challenge", {"address": sender.address}),
        ("POST", "/register", {"address": sender.address}),
        ("GET", "/challenge", None),
        ("POST", "/challenge/", {"address": sender.address}),
    ):
        answer = env.client.request(method, path, json=body)
        problem = check_error(answer, 404, "NOT_FOUND")
        assert "needs no registration" in problem["error"] and "GET /v1/pricing" in problem["error"], problem
        assert problem["error"] == problem["detail"] and problem["retryable"] is False
    with pytest.raises(AutoRegistrationFailed) as failed:
        client.register_with_relayer(sender.address)
    assert client.log[-1].startswith("Relaying failed: This relayer needs no registration")
    assert failed.value.status == 404


def test_no_refusal_text_of_the_facade_is_one_the_kit_acts_on() -> None:
    from gasless.compat.rendering import NO_SIGN_UP, compat_error, compat_status

    texts = [NO_SIGN_UP, compat_error("NOT_FOUND", "no such resource")]
    for code, spec in CATALOGUE.items():
        if compat_status(code, spec.status) == 403:  # the status on which the kit reads "register"
            texts.append(compat_error(code, spec.condition, {}))
    texts += [
        compat_error("NO_ENTITLEMENT", "the sender has no plan and is not an authorised sender; top up"),
        compat_error("SENDER_NOT_AUTHORIZED", "erd1a is not erd1b nor one of its authorised senders"),
    ]
    assert all(no_kit_command(text) for text in texts), texts


def test_trailing_slashes_are_served_as_without_never_redirected(env: Any, tmp_path: Path) -> None:
    client = kit(env, tmp_path)
    sender = env.new_sender(1)
    for path in ("/health/", "/health//"):
        answer = env.client.get(path, follow_redirects=False)
        assert answer.status_code == 200 and answer.json() == {"status": "ok"}, answer.text
    relayer = env.client.get(f"/relayer/address/{sender.address}", follow_redirects=False).json()
    slashed = env.client.get(f"/relayer/address/{sender.address}/", follow_redirects=False)
    assert slashed.status_code == 200 and slashed.json() == relayer
    transfer = client.build(sender.key, nonce=0, receiver=ALICE)
    relayed = env.client.post("/relay/", json={"transaction": transfer}, follow_redirects=False)
    assert relayed.status_code == 200 and set(relayed.json()) == {"txHash"}, relayed.text
    assert wait_final(env, relayed.json()["txHash"])["outcome"] == "success"
    # The versioned API keeps its own 404s: problem documents without the kit's `error`.
    native = env.client.get("/v1/no-such-route", follow_redirects=False)
    assert native.status_code == 404 and native.json()["code"] == "NOT_FOUND" and "error" not in native.json()


def test_health_says_ok_only_when_the_host_is_ready(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        silent = f"http://127.0.0.1:{s.getsockname()[1]}"  # no gateway answers: the host never gets ready
    settings = Settings(data_dir=tmp_path, gateway_urls=[silent])
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 503
        health = check_error(client.get("/health"), 500, "UPSTREAM_UNAVAILABLE")
        assert health["error"].startswith("not ready to relay") and "gateway: unreachable" in health["error"]
        assert health["retryable"] is True and int(client.get("/health").headers["Retry-After"]) == 1
        user = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
        check_error(client.get(f"/relayer/address/{user}"), 500, "UPSTREAM_UNAVAILABLE")


# Relays above the burst (issue 37) -------------------------------------------------------------------------
def test_a_relay_above_the_burst_passes_on_a_full_bucket_and_after_the_wait_it_states(
    make_env: Any, tmp_path: Path
) -> None:
    spec = RouteLimitTable().compat_sender
    assert spec == Rate(1, 5)
    env = make_env(app_kwargs={"route_limits": replace(unthrottled_limits(), compat_sender=spec)})
    client = kit(env, tmp_path)
    # The kit's main path: 10 050 000 gas is 6 RU against a burst of 5; it passes at its first attempt.
    proof_sender = env.new_sender(1)
    tx_hash = client.relay(client.build(proof_sender.key, nonce=0, receiver=ALICE))
    assert client.attempts == 1 and wait_final(env, tx_hash)["outcome"] == "success"

    # The largest compat relay (60 000 000 gas: 15 RU), on a clock the test moves.
    compat = env.client.app.state.host.compat
    now = [1_000.0]
    compat.limits = RouteLimiter(
        compat.limits.table, LocalRateLimiter(clock=lambda: now[0]), compat.limits.streams
    )
    sender = env.new_sender(1)

    def post(nonce: int) -> Any:
        tx = client.build(sender.key, nonce=nonce, receiver=ALICE, gas_limit=COMPAT_MAX_GAS_LIMIT)
        return env.client.post("/relay", json={"transaction": tx})

    assert post(0).status_code == 200  # a full bucket pays 15 RU and is 10 in debt
    refused = post(1)
    body = check_error(refused, 429, "RATE_LIMITED")
    assert body["retryable"] is True and body["details"]["retryAfterMs"] == 15_000  # until full again
    assert refused.headers["Retry-After"] == "15"
    assert (
        body["error"]
        == "Quota exceeded: too many requests per sender; send the same transaction again after 15 s"
    )
    now[0] += 14.999
    check_error(post(1), 429, "RATE_LIMITED")
    now[0] += 0.001
    passed = post(1)
    assert passed.status_code == 200, passed.text
    assert wait_final(env, passed.json()["txHash"])["outcome"] == "success"


def test_a_relay_refused_for_good_takes_nothing_from_the_senders_limit(make_env: Any, tmp_path: Path) -> None:
    """A sender with no plan sees the same 403 at each of the kit's 3 attempts, never a 429 that no wait
    would turn into a pass (its RU are taken only with the billing admission)."""
    table = replace(unthrottled_limits(), compat_sender=Rate(0.001, 5))
    env = make_env(app_kwargs={"route_limits": table})
    client = kit(env, tmp_path)
    stranger = env.new_sender(1, plan=False)
    transfer = client.build(stranger.key, nonce=0, receiver=ALICE)  # 6 RU: more than the burst
    with pytest.raises(RelayFailed) as unpaid:
        client.relay(transfer)
    assert unpaid.value.status == 403 and client.attempts == 3
    assert all("Payment needed" in line for line in client.log), client.log
