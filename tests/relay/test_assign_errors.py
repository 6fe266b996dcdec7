"""Every error of `POST /v1/relay/assign`, through HTTP with real signatures on localnet.

Presence proofs (missing, stale, wrong key, wallet-prefixed, ...), the per-IP and per-sender rate limits,
relayer availability, cancel and renew leases, the signer's state and the host clock; each answer is the
catalogue's problem document (checked with the `problem` fixture).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from multiversx_sdk import Address, Message, MessageComputer, UserSecretKey

from gasless.chain.addresses import address_of, parse_address, shard_of_pubkey
from gasless.relay.checks import presence_message
from gasless.signer import Signer, SignerUnavailable

ASSIGN = "/v1/relay/assign"
PACE_S = 0.12  # keeps a test's own assigns under the 10/s per-IP limit where that limit is not the subject


# Helpers ----------------------------------------------------------------------------------------------
def sender_in(shard: int = 1) -> Any:
    while True:
        key = UserSecretKey.generate()
        if shard_of_pubkey(key.generate_public_key().buffer) == shard:
            return SimpleNamespace(key=key, address=address_of(key.generate_public_key().buffer).to_bech32())


def now_ms() -> int:
    return int(time.time() * 1000)


def proof(
    env: Any, sender: Any, *, at_ms: int | None = None, key: UserSecretKey | None = None, **kw: Any
) -> dict:
    at = now_ms() if at_ms is None else at_ms
    chain_id = kw.get("chain_id", env.settings.network.chain_id)
    message = presence_message(chain_id, kw.get("address", sender.address), at)
    return {"kind": "key", "serverTimeMs": at, "signature": (key or sender.key).sign(message).hex()}


def assign(env: Any, body: dict[str, Any], *, pace: bool = True, **kwargs: Any) -> Any:
    if pace:
        time.sleep(PACE_S)
    return env.client.post(ASSIGN, json=body, **kwargs)


def assert_server_time(body: dict[str, Any], before: int) -> None:
    assert before - 5 <= body["details"]["serverTimeMs"] <= now_ms() + 5, body


def other_hrp(address: str) -> str:
    return Address(parse_address(address).get_public_key(), "drt").to_bech32()


def unknown_relayer_tx(env: Any, sender: Any) -> Any:
    return env.build(sender, {"relayer": sender_in(1).address})


def relay_accepted(env: Any, tx: Any, lease: str) -> dict[str, Any]:
    """Relay and expect 200/202; a SIGNER_TIMEOUT on a loaded machine is retried with the same bytes."""
    for _ in range(10):
        response = env.relay(tx, lease)
        if response.status_code != 503 or response.json()["code"] != "SIGNER_TIMEOUT":
            break
        time.sleep(0.1)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


class UnavailableSigner:
    """A `Signer` that cannot sign now: `check` raises, as a remote signer that is down would."""

    def __init__(self, inner: Signer) -> None:
        self.inner = inner

    def relayers(self) -> list[Any]:
        return self.inner.relayers()

    def check(self) -> None:
        raise SignerUnavailable("remote signer unreachable")

    async def sign(self, relayer: str, message: bytes) -> bytes:
        raise SignerUnavailable("remote signer unreachable")


# Presence proof --------------------------------------------------------------------------------------
def test_assign_proof_required(env: Any, problem: Any, subtests: Any) -> None:
    sender = sender_in(1)
    for body in (
        {"sender": sender.address},
        {"sender": sender.address, "proof": None},
        {"sender": sender.address, "proof": {"kind": "key"}},
    ):
        with subtests.test(body=body):
            before = now_ms()
            assert_server_time(problem(assign(env, body), "ASSIGN_PROOF_REQUIRED"), before)


def test_assign_proof_invalid(env: Any, problem: Any, subtests: Any) -> None:
    sender, stranger = sender_in(1), sender_in(1)
    message = presence_message(env.settings.network.chain_id, sender.address, now_ms())
    wallet_signed = sender.key.sign(MessageComputer().compute_bytes_for_signing(Message(data=message)))
    cases: dict[str, dict[str, Any]] = {
        "stale by 31 s": proof(env, sender, at_ms=now_ms() - 31_000),
        "ahead by 31 s": proof(env, sender, at_ms=now_ms() + 31_000),
        "wrong key": proof(env, sender, key=stranger.key),
        "wallet-prefixed": {
            "kind": "key",
            "serverTimeMs": int(message.decode().rsplit("|", 1)[1]),
            "signature": wallet_signed.hex(),
        },
        "another chain": proof(env, sender, chain_id="D"),
        "another sender's message": proof(env, sender, address=stranger.address),
        "not hex": {"kind": "key", "serverTimeMs": now_ms(), "signature": "zz" * 64},
        "truncated": {**proof(env, sender), "signature": proof(env, sender)["signature"][:-2]},
        "no signature": {"kind": "key", "serverTimeMs": now_ms()},
        "no serverTimeMs": {"kind": "key", "signature": proof(env, sender)["signature"]},
    }
    for name, bad in cases.items():
        with subtests.test(case=name):
            before = now_ms()
            body = problem(assign(env, {"sender": sender.address, "proof": bad}), "ASSIGN_PROOF_INVALID")
            assert_server_time(body, before)
    # The answer's server time lets a client with a skewed clock retry at once.
    skewed = problem(
        assign(env, {"sender": sender.address, "proof": proof(env, sender, at_ms=now_ms() - 120_000)}),
        "ASSIGN_PROOF_INVALID",
    )
    retry = proof(env, sender, at_ms=skewed["details"]["serverTimeMs"])
    assert assign(env, {"sender": sender.address, "proof": retry}).status_code == 200
    # Inside the +/- 30 000 ms tolerance the proof is good.
    for offset in (-29_000, 29_000):
        with subtests.test(offset=offset):
            good = proof(env, sender, at_ms=now_ms() + offset)
            assert assign(env, {"sender": sender.address, "proof": good}).status_code == 200


# Rate limits ----------------------------------------------------------------------------------------------
def _first_refusal(env: Any, bodies: Any, pause_s: float = 0.0, limit: int = 200) -> tuple[int, Any]:
    for count, body in enumerate(bodies, start=1):
        time.sleep(pause_s)
        response = assign(env, body, pace=False)
        if response.status_code != 200:
            return count, response
        assert count < limit, "never rate limited"
    raise AssertionError("ran out of requests")


def _assert_rate_headers(response: Any, limit: int) -> None:
    assert response.headers["RateLimit-Limit"] == str(limit)
    assert response.headers["RateLimit-Remaining"] == "0"
    assert int(response.headers["RateLimit-Reset"]) >= 1


def test_rate_limited_per_ip(env: Any, problem: Any) -> None:
    def bodies() -> Any:
        while True:  # a new sender every time: only the IP is shared
            sender = sender_in(1)
            yield {"sender": sender.address, "proof": proof(env, sender)}

    count, response = _first_refusal(env, bodies())
    assert count >= 11, "the burst is 10 assignments"
    body = problem(response, "RATE_LIMITED")
    assert body["details"]["scope"] == "ip"
    _assert_rate_headers(response, 10)


def test_rate_limited_per_sender(env: Any, problem: Any) -> None:
    sender = sender_in(1)

    def bodies() -> Any:
        while True:
            yield {"sender": sender.address, "proof": proof(env, sender)}

    # Ten at once take the burst of both buckets; then one every 150 ms refills the IP bucket (10/s) faster
    # than it is used and the sender's (2/s) slower: the first refusal is the sender's.
    for _ in range(10):
        assert assign(env, next(bodies()), pace=False).status_code == 200
    count, response = _first_refusal(env, bodies(), pause_s=0.15, limit=30)
    body = problem(response, "RATE_LIMITED")
    assert body["details"]["scope"] == "sender"
    _assert_rate_headers(response, 10)
    # Another sender from the same IP is still served.
    other = sender_in(1)
    time.sleep(0.2)
    assert assign(env, {"sender": other.address, "proof": proof(env, other)}).status_code == 200


# Relayers ----------------------------------------------------------------------------------------------
def test_no_relayer_available(env: Any, problem: Any, operator: Any) -> None:
    operator.set_relayer_state(env, "retired", *operator.relayers_in(env, 1))
    sender = sender_in(1)
    response = assign(env, {"sender": sender.address, "proof": proof(env, sender)})
    problem(response, "NO_RELAYER_AVAILABLE")
    assert int(response.headers["Retry-After"]) >= 1
    # Other shards are unaffected.
    elsewhere = sender_in(0)
    answer = assign(env, {"sender": elsewhere.address, "proof": proof(env, elsewhere)})
    assert answer.status_code == 200 and answer.json()["shard"] == 0


def test_nothing_to_cancel(env: Any, problem: Any) -> None:
    sender = env.new_sender(1)
    for nonce in (0, 5):
        body = {"sender": sender.address, "proof": proof(env, sender), "cancel": nonce}
        problem(assign(env, body), "NOTHING_TO_CANCEL")
    assignment = env.assign(sender)
    relayed = relay_accepted(env, env.build(sender, assignment), assignment["lease"])
    env.wait_state(relayed["txHash"], ("FINALIZED",))
    body = {"sender": sender.address, "proof": proof(env, sender), "cancel": 0}
    problem(assign(env, body), "NOTHING_TO_CANCEL")  # executed: nothing in flight any more


def test_cancel_lease_for_an_in_flight_intent(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    env.faults(chain={"stalledShards": [1]})
    relayed = relay_accepted(env, env.build(sender, assignment), assignment["lease"])
    cancel = env.assign(sender, cancel=0)
    assert cancel["kind"] == "cancel" and cancel["pinNonce"] == 0
    assert cancel["relayer"] == relayed["relayer"]


def test_renew_for_a_signed_tx(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=0)
    renewed = env.assign(sender, renewFor=tx.to_dictionary())
    assert renewed["relayer"] == assignment["relayer"] and renewed["pinNonce"] == 0
    assert renewed["kind"] == "std" and renewed["renewable"] is True


@pytest.mark.parametrize("retire", ["one", "all"])
def test_renew_when_the_relayer_is_retired(env: Any, problem: Any, operator: Any, retire: str) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=0)
    gone = [assignment["relayer"]] if retire == "one" else operator.relayers_in(env, 1)
    operator.set_relayer_state(env, "retired", *gone)
    body = {"sender": sender.address, "proof": proof(env, sender), "renewFor": tx.to_dictionary()}
    if retire == "one":
        new = problem(assign(env, body), "RESIGN_REQUIRED")["details"]["assignment"]
        assert new["relayer"] in operator.relayers_in(env, 1) and new["relayer"] != assignment["relayer"]
        assert new["pinNonce"] == 0 and new["lease"]
    else:
        problem(assign(env, body), "RELAYER_RETIRED")


def test_renew_naming_an_unknown_relayer(env: Any, problem: Any) -> None:
    sender = env.new_sender(1)
    tx = unknown_relayer_tx(env, sender)
    body = {"sender": sender.address, "proof": proof(env, sender), "renewFor": tx.to_dictionary()}
    problem(assign(env, body), "RELAYER_UNKNOWN")


# Malformed requests ------------------------------------------------------------------------------------
def test_assign_malformed(env: Any, problem: Any, subtests: Any) -> None:
    sender = env.new_sender(1)
    good = sender.address
    foreign = env.build(env.new_sender(1, plan=False), env.assign(sender)).to_dictionary()
    bad_nonce = {**env.build(sender, env.assign(sender)).to_dictionary(), "nonce": -1}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sender": good[:-1] + ("q" if good[-1] != "q" else "p")}, "sender"),
        ({"sender": good[:12] + good[12:30].upper() + good[30:]}, "sender"),
        ({"sender": other_hrp(good)}, "sender"),
        ({"sender": 5}, "sender"),
        ({}, "sender"),
        ({"sender": good, "extra": 1}, "extra"),
        ({"sender": good, "proof": {"kind": "key", "sig": "00"}}, "proof.sig"),
        ({"sender": good, "proof": {"kind": "other"}}, "proof.kind"),
        ({"sender": good, "cancel": -1}, "cancel"),
        ({"sender": good, "cancel": "x"}, "cancel"),
        ({"sender": good, "renewFor": "abc"}, "renewFor"),
        ({"sender": good, "renewFor": foreign}, "renewFor.sender"),
        ({"sender": good, "renewFor": bad_nonce}, "renewFor.nonce"),
    ]
    for body, field in cases:
        with subtests.test(field=field, body=body):
            if "sender" in body and body["sender"] == good and "proof" not in body:
                body = {**body, "proof": proof(env, sender)}
            result = problem(assign(env, body), "MALFORMED_REQUEST")
            assert result["details"]["field"] == field, result
    with subtests.test(body="not json"):
        response = env.client.post(ASSIGN, content=b"{", headers={"Content-Type": "application/json"})
        problem(response, "MALFORMED_REQUEST")


# Signer and clock ------------------------------------------------------------------------------------------
def test_signer_unavailable_on_assign(make_env: Any, problem: Any) -> None:
    env = make_env(app_kwargs={"signer_wrapper": UnavailableSigner})
    sender = sender_in(1)
    response = assign(env, {"sender": sender.address, "proof": proof(env, sender)})
    problem(response, "SIGNER_UNAVAILABLE")
    assert int(response.headers["Retry-After"]) >= 1


def test_signer_fenced_on_assign(make_env: Any, problem: Any, operator: Any) -> None:
    env = make_env()
    far = now_ms() + 3_600_000
    operator.db_execute(env, "UPDATE signer_fences SET holder = 'intruder', expires_at_ms = :far", far=far)
    deadline = time.monotonic() + 20  # the claim is renewed every third of its 15 s TTL
    while env.client.get("/readyz").json()["checks"].get("signer") != "fenced":
        assert time.monotonic() < deadline, "the signer did not fence itself"
        time.sleep(0.05)
    sender = sender_in(1)
    response = assign(env, {"sender": sender.address, "proof": proof(env, sender)})
    problem(response, "SIGNER_FENCED")
    assert int(response.headers["Retry-After"]) >= 1


def test_no_leases_on_an_unsynchronised_clock(env: Any, problem: Any) -> None:
    env.faults(chain={"clockOffsetMs": 10_000})
    deadline = time.monotonic() + 10
    while env.client.get("/readyz").json()["checks"].get("clock") == "ok":
        assert time.monotonic() < deadline, "the host did not notice the clock offset"
        time.sleep(0.05)
    sender = sender_in(1)
    problem(assign(env, {"sender": sender.address, "proof": proof(env, sender)}), "UPSTREAM_UNAVAILABLE")
    env.faults(chain={"clockOffsetMs": 0})
    while env.client.get("/readyz").json()["checks"].get("clock") != "ok":
        assert time.monotonic() < deadline + 10, "the host did not notice the clock is back"
        time.sleep(0.05)
    assert assign(env, {"sender": sender.address, "proof": proof(env, sender)}).status_code == 200
