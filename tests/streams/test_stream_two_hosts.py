"""Two hosts sharing Redis: a ticket is used once across both, and a relay on b reaches a stream on a."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from redis import Redis

pytestmark = pytest.mark.redis


def test_tickets_and_events_cross_hosts(served: Any, sse: Any, redis_url: str, ticket_invalid: Any) -> None:
    prefix = f"t-streams-{uuid.uuid4().hex[:10]}"
    common = {"redis_url": redis_url, "redis_prefix": prefix, "stream_keepalive_ms": 200}
    host_a, _env_a, auth_a = served(name="a", host_id="a", **common)
    host_b, env_b, auth_b = served(name="b", host_id="b", **common)
    try:
        account = auth_a.account()
        ticket = host_b.client.post(
            "/v1/stream/tickets",
            json={"account": account.address, "topics": ["intents"]},
            headers=auth_b.bearer(account),
        ).json()["ticket"]
        for host in (host_a, host_b):  # each host listens on the channel before the test relies on it
            fanout = host.host.streams.fanout
            assert fanout is not None
            deadline = time.monotonic() + 10
            while not fanout.subscribed.is_set() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert fanout.subscribed.is_set()
        stream = sse(host_a.client, {"ticket": ticket})  # issued by b, used on a
        try:
            assert stream.response.status_code == 200
            assert stream.frame()["id"] == f"a.{host_a.host.boot_epoch_ms}.0"
            ticket_invalid(host_b.client.get("/v1/stream", params={"ticket": ticket}), "used")
            # Relayed through b: b tracks it and publishes; a's stream numbers the events in a's sequence.
            assignment = env_b.assign(account)
            answer = env_b.relay(env_b.build(account, assignment), assignment["lease"])
            assert answer.status_code in (200, 202), answer.text
            ident = answer.json()["id"]
            frames = []
            while not frames or not frames[-1]["data"]["data"]["final"]:
                frames.append(stream.frame())
        finally:
            stream.close()
        assert all(f["event"] == "intents" and f["data"]["key"] == ident for f in frames)
        # In a's own numbering, in order (the account's `quota` events, not selected here, fill gaps).
        seqs = [int(f["id"].rsplit(".", 1)[1]) for f in frames]
        assert all(f["id"].startswith(f"a.{host_a.host.boot_epoch_ms}.") for f in frames)
        assert seqs[0] >= 1 and seqs == sorted(set(seqs))  # a quota event may come first (seen in CI)
        assert frames[-1]["data"]["data"]["state"] == "FINALIZED"
        # b's own id for the account is not resumable on a.
        reset = sse(
            host_a.client,
            {"account": account.address},
            {**auth_a.bearer(account), "Last-Event-ID": f"b.{host_b.host.boot_epoch_ms}.1"},
        )
        try:
            assert reset.frame()["event"] == "reset"
        finally:
            reset.close()
    finally:
        client = Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)


def _wait(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what}: not reached")


def test_only_streamed_accounts_cross_hosts(served: Any, sse: Any, redis_url: str) -> None:
    """A change of an account no host streams is not built or sent on the channel; once a stream for it
    opens on one host, the other host's changes for it reach that stream at once."""
    prefix = f"t-streams-{uuid.uuid4().hex[:10]}"
    common = {"redis_url": redis_url, "redis_prefix": prefix, "stream_keepalive_ms": 200}
    host_a, _env_a, auth_a = served(name="a", host_id="a", **common)
    host_b, env_b, _auth_b = served(name="b", host_id="b", **common)
    client = Redis.from_url(redis_url)
    listener = client.pubsub()
    try:
        fanouts = [host.host.streams.fanout for host in (host_a, host_b)]
        for fanout in fanouts:  # listening, and the registry read: from then on only streamed accounts go out
            _wait(lambda f=fanout: f.subscribed.is_set() and f._streamed_read_at is not None, "the fan-out")
        listener.subscribe(fanouts[0].channel)
        _wait(lambda: listener.get_message(timeout=0.1), "the test's own subscription")

        def on_channel() -> list[dict[str, Any]]:
            out = []
            while message := listener.get_message(timeout=0.1):
                if message["type"] == "message":
                    out.append(json.loads(message["data"]))
            return out

        def relay_on_b(account: Any) -> str:
            assignment = env_b.assign(account)
            answer = env_b.relay(env_b.build(account, assignment), assignment["lease"])
            assert answer.status_code in (200, 202), answer.text
            account.nonce += 1
            ident = str(answer.json()["id"])
            _wait(lambda: env_b.client.get(f"/v1/relay/{ident}").json()["state"] == "FINALIZED", "finality")
            return ident

        # No stream for the account anywhere: its intent's changes stay on b.
        account = auth_a.account()
        relay_on_b(account)
        assert [m for m in on_channel() if m.get("a") == account.address] == []

        # A stream opens on a: b hears of it, and b's next relay for the account reaches the stream.
        stream = sse(host_a.client, {"account": account.address}, auth_a.bearer(account))
        try:
            assert stream.frame()["id"] == f"a.{host_a.host.boot_epoch_ms}.0"
            ident = relay_on_b(account)
            frames = [stream.frame()]
            while not (frames[-1]["event"] == "intents" and frames[-1]["data"]["data"]["final"]):
                frames.append(stream.frame())
        finally:
            stream.close()
        states = [f["data"]["data"]["state"] for f in frames if f["event"] == "intents"]
        assert states[-1] == "FINALIZED" and all(
            f["data"]["key"] == ident for f in frames if f["event"] == "intents"
        )
        sent = on_channel()
        assert [m["w"] for m in sent if "w" in m] == [account.address]  # a's announcement
        assert {m["t"] for m in sent if m.get("a") == account.address} >= {"intents"}
        # The registry holds it too (an announcement missed on the channel is found there), and both hosts
        # know it; an account nobody streams stays unknown.
        lapses_at = client.zscore(fanouts[0].interest_key, account.address)
        assert lapses_at is not None and lapses_at > time.time() * 1000
        for fanout in fanouts:
            assert fanout.interested(account.address)
            assert not fanout.interested("erd1-streamed-by-nobody")
    finally:
        listener.close()
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
