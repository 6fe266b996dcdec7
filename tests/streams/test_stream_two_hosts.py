"""Two hosts sharing Redis: a ticket is used once across both, and a relay on b reaches a stream on a."""

from __future__ import annotations

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
