"""HTTP caching of public reads: Cache-Control per route and state, strong ETags, 304 Not Modified."""

from __future__ import annotations

import hashlib
from typing import Any

from gasless.core.crypto import b64url


def etag_of(body: bytes) -> str:
    return '"' + b64url(hashlib.sha256(body).digest()[:18]) + '"'


def assert_revalidates(env: Any, path: str, cache_control: str) -> str:
    """200 with a strong ETag of the body; 304 for a matching If-None-Match; 200 again for another tag."""
    first = env.client.get(path)
    assert first.status_code == 200, first.text
    etag = first.headers["ETag"]
    assert etag == etag_of(first.content) and not etag.startswith("W/")
    assert first.headers["Cache-Control"] == cache_control
    for validator in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        cached = env.client.get(path, headers={"If-None-Match": validator})
        assert cached.status_code == 304, (validator, cached.text)
        assert cached.content == b""
        assert cached.headers["ETag"] == etag and cached.headers["Cache-Control"] == cache_control
        assert cached.headers["Relay-Request-Id"] and cached.headers["RateLimit-Limit"]
    stale = env.client.get(path, headers={"If-None-Match": '"not-this-one"'})
    assert stale.status_code == 200 and stale.content == first.content and stale.headers["ETag"] == etag
    return etag


def test_finalized_intent_is_cacheable_for_a_day_on_every_read_path(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    response = env.relay(env.build(sender, assignment), assignment["lease"])
    assert response.status_code in (200, 202), response.text
    tx_hash = response.json()["txHash"]
    env.wait_state(tx_hash, ("FINALIZED",))
    immutable = "public, max-age=86400, immutable"
    etags = {
        assert_revalidates(env, path, immutable)
        for path in (
            f"/v1/relay/{tx_hash}",
            f"/v1/relay/{sender.address}:0",
            f"/v1/intents/{sender.address}/0",
            f"/v1/tx/{tx_hash}",
        )
    }
    assert len(etags) == 1  # one document, one representation, whichever path reads it


def test_rejected_and_in_flight_intents_are_revalidated_every_time(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    assert env.relay(env.build(sender, assignment, gas_price=10), assignment["lease"]).status_code == 422
    env.wait_state(f"{sender.address}:0", ("REJECTED",))
    # The same nonce may be relayed again: what the slot answers can still change.
    rejected = assert_revalidates(env, f"/v1/intents/{sender.address}/0", "public, no-cache")
    env.faults(chain={"stalledShards": [1]})
    try:
        response = env.relay(env.build(sender, assignment), assignment["lease"])
        assert response.status_code in (200, 202), response.text
        in_flight = env.client.get(f"/v1/intents/{sender.address}/0")
        assert in_flight.json()["state"] in ("COSIGNED", "BROADCAST")
        assert in_flight.headers["Cache-Control"] == "public, no-cache"
        # The new state is a new representation: the old validator no longer matches.
        assert in_flight.headers["ETag"] != rejected
        again = env.client.get(f"/v1/intents/{sender.address}/0", headers={"If-None-Match": rejected})
        assert again.status_code == 200 and again.json()["state"] in ("COSIGNED", "BROADCAST")
    finally:
        env.faults(chain={"stalledShards": []})


def test_network_document_is_cached_for_a_second(env: Any) -> None:
    # The document names a recent block, so it changes every round: revalidate until a round is caught.
    first = env.client.get("/v1/network")
    assert first.headers["Cache-Control"] == "public, max-age=1"
    etag = first.headers["ETag"]
    for _ in range(50):
        answer = env.client.get("/v1/network", headers={"If-None-Match": etag})
        if answer.status_code == 304:
            assert answer.content == b"" and answer.headers["ETag"] == etag
            assert answer.headers["Cache-Control"] == "public, max-age=1"
            return
        # A new block: a new representation with its own validator.
        assert answer.status_code == 200 and answer.headers["ETag"] == etag_of(answer.content) != etag
        etag = answer.headers["ETag"]
    raise AssertionError("the network document changed on every request")


def test_errors_carry_no_validators(env: Any) -> None:
    missing = env.client.get("/v1/tx/" + "ab" * 32)
    assert missing.status_code == 404
    assert "ETag" not in missing.headers and "Cache-Control" not in missing.headers
