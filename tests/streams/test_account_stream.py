"""`GET /v1/stream` on a real server: intent events of real relays, resume and reset, keep-alive,
coalescing, tickets used once."""

from __future__ import annotations

import time
from typing import Any

KEEPALIVE = {"stream_keepalive_ms": 200}


def _relay(env: Any, sender: Any) -> str:
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    sender.nonce += 1
    return answer.json()["id"]  # type: ignore[no-any-return]


def _intents_until_final(stream: Any, ident: str) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while True:
        frame = stream.frame()
        frames.append(frame)
        if (
            frame.get("event") == "intents"
            and frame["data"]["key"] == ident
            and frame["data"]["data"]["final"]
        ):
            return frames


def _seq(frame: dict[str, Any]) -> int:
    return int(frame["id"].rsplit(".", 1)[1])


def test_intent_events_in_order_then_resume_and_reset(served: Any, sse: Any) -> None:
    server, env, auth = served(**KEEPALIVE)
    host = server.host
    account = auth.account()
    prefix = f"a.{host.boot_epoch_ms}."
    # Intents only: settlements also send `quota` events, which share the account's numbering.
    only_intents = {"account": account.address, "topics": "intents"}
    stream = sse(server.client, only_intents, auth.bearer(account))
    try:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        # A fresh stream opens with an id-only frame: the client has a resumable id before any event.
        assert stream.frame() == {"id": f"{prefix}0"}
        ident = _relay(env, account)
        frames = _intents_until_final(stream, ident)
    finally:
        stream.close()
    assert all(f["event"] == "intents" and f["id"].startswith(prefix) for f in frames)
    seqs = [_seq(f) for f in frames]
    assert seqs[0] >= 1 and seqs == sorted(
        set(seqs)
    )  # in order; other topics' events (quota) fill gaps, first too
    states = [f["data"]["data"]["state"] for f in frames]
    order = ["COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED"]
    assert [order.index(s) for s in states] == sorted(order.index(s) for s in states) and states[
        -1
    ] == "FINALIZED"
    for frame in frames:
        doc = frame["data"]
        assert doc["topic"] == "intents" and doc["account"] == account.address and doc["key"] == ident
        assert doc["data"]["id"] == ident and isinstance(doc["atMs"], int)

    # Resume after the first event: the rest is replayed, nothing twice, then live events follow.
    resumed = sse(server.client, only_intents, {**auth.bearer(account), "Last-Event-ID": frames[0]["id"]})
    try:
        replayed = [resumed.frame() for _ in frames[1:]]
        assert [f["id"] for f in replayed] == [f["id"] for f in frames[1:]]
        assert [f["data"] for f in replayed] == [f["data"] for f in frames[1:]]
        second = _relay(env, account)
        live = _intents_until_final(resumed, second)
        assert _seq(live[0]) > seqs[-1]
    finally:
        resumed.close()
    head = host.streams.hub.head(account.address)

    # Ids of another host, of an earlier boot, or unreadable: `reset` first, carrying this host's head id.
    for foreign in (f"b.{host.boot_epoch_ms}.1", f"a.{host.boot_epoch_ms - 1}.1", "garbage"):
        reset = sse(
            server.client, {"account": account.address}, {**auth.bearer(account), "Last-Event-ID": foreign}
        )
        try:
            frame = reset.frame()
        finally:
            reset.close()
        # The head id at the time the stream opened (no later event of the account is expected by now).
        assert frame["event"] == "reset" and frame["id"].startswith(prefix), frame
        assert head <= _seq(frame) <= host.streams.hub.head(account.address), frame
        assert frame["data"]["topic"] == "reset" and frame["data"]["reason"] == "unknown_id"
        assert frame["data"]["account"] == account.address and frame["data"]["data"] is None
    # An id of this process that left the replay window (1 000 events / 300 000 ms): reset, reason window.
    host.streams.hub.replay_events = 2
    try:
        server.on_loop(lambda: host.streams.hub.publish(account.address, "quota", "q", {"n": 1}))
        head = host.streams.hub.head(account.address) - 1
        old = sse(
            server.client,
            {"account": account.address},
            {**auth.bearer(account), "Last-Event-ID": f"{prefix}1"},
        )
        try:
            frame = old.frame()
        finally:
            old.close()
        # The head id when the stream opened: a later event of the account (a quota or notice event the
        # background workers publish) may have moved the head past the one published here.
        assert frame["event"] == "reset" and frame["data"]["reason"] == "window", frame
        assert frame["id"].startswith(prefix), frame
        assert head + 1 <= _seq(frame) <= host.streams.hub.head(account.address), frame
    finally:
        host.streams.hub.replay_events = 1_000


def test_first_stream_of_an_account_starts_at_its_first_live_event(served: Any, sse: Any) -> None:
    """Relays of an account that has never had a stream on this host are not numbered (no client can hold
    an id to resume them from): its first stream opens at id 0 and numbers the next change 1."""
    server, env, auth = served(**KEEPALIVE)
    host = server.host
    account = auth.account()
    prefix = f"a.{host.boot_epoch_ms}."
    earlier = _relay(env, account)
    deadline = time.monotonic() + 30
    while env.client.get(f"/v1/relay/{earlier}").json()["state"] != "FINALIZED":
        assert time.monotonic() < deadline, "the earlier relay did not finalize"
        time.sleep(0.1)
    # Every topic: the account's other changes (its `account` and `quota` events, which the contract
    # mirror may publish once the stream exists) share the numbering, so the next change, whatever its
    # topic, is 1.
    stream = sse(server.client, {"account": account.address}, auth.bearer(account))
    try:
        assert stream.frame() == {"id": f"{prefix}0"}
        ident = _relay(env, account)
        frames = _intents_until_final(stream, ident)
    finally:
        stream.close()
    assert [_seq(frame) for frame in frames] == list(range(1, len(frames) + 1)), frames
    intents = [frame for frame in frames if frame["event"] == "intents"]
    assert intents and all(frame["data"]["key"] == ident for frame in intents), frames


def test_keep_alive_topics_and_coalescing(served: Any, sse: Any) -> None:
    server, env, auth = served(**KEEPALIVE)
    account = auth.account()
    hub = server.host.streams.hub
    # Topics nothing else publishes to in this test (a grant's mirror event sends `account` and `quota`).
    stream = sse(
        server.client, {"account": account.address, "topics": "notices,pricing"}, auth.bearer(account)
    )
    try:
        assert set(stream.frame()) == {"id"}
        # A change on a topic the stream did not select sends nothing; while nothing else happens, a
        # keep-alive comment comes every 200 ms here (15 000 ms by default).
        server.on_loop(lambda: hub.publish(account.address, "intents", "filtered", {"n": 0}))
        stream.keepalives(3)

        # Ten changes of one key within a window, and one of another key: the first change goes out at
        # once, the other nine fold into one (the latest), the other key is not held back.
        def burst() -> None:
            for n in range(1, 11):
                hub.publish(account.address, "notices", "period", {"n": n})
            hub.publish(account.address, "pricing", "tariff", {"v": 7})

        server.on_loop(burst)
        frames = [stream.frame() for _ in range(3)]
    finally:
        stream.close()
    assert stream.comments >= 3
    got = [(f["event"], f["data"]["key"], f["data"]["data"]) for f in frames]
    assert got == [
        ("notices", "period", {"n": 1}),
        ("pricing", "tariff", {"v": 7}),
        ("notices", "period", {"n": 10}),
    ]
    assert all(f["data"]["key"] != "filtered" for f in frames)


def test_ticket_opens_one_stream_and_forbidden_stranger(served: Any, sse: Any, ticket_invalid: Any) -> None:
    server, env, auth = served(**KEEPALIVE)
    account, stranger = auth.account(), auth.stranger()
    ticket = server.client.post(
        "/v1/stream/tickets",
        json={"account": account.address, "topics": ["intents"]},
        headers=auth.bearer(account),
    ).json()["ticket"]
    stream = sse(server.client, {"ticket": ticket})
    try:
        assert stream.response.status_code == 200
        assert "id" in stream.frame()
        ident = _relay(env, account)
        frames = _intents_until_final(stream, ident)
        assert frames[-1]["data"]["data"]["state"] == "FINALIZED"
        # Used once: refused on a second use, even while the first stream is open.
        ticket_invalid(server.client.get("/v1/stream", params={"ticket": ticket}), "used")
    finally:
        stream.close()
    ticket_invalid(server.client.get("/v1/stream", params={"ticket": ticket}), "used")
    refused = server.client.get(
        "/v1/stream", params={"account": account.address}, headers=auth.bearer(stranger)
    )
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"


def test_concurrent_streams_are_limited_per_account_by_class(served: Any, sse: Any, problem: Any) -> None:
    import dataclasses

    from gasless.limits.buckets import RouteLimitTable

    table = dataclasses.replace(RouteLimitTable(), stream_class={c: 1 for c in range(1, 7)}, stream_ip=5)
    server, _env, auth = served(route_limits=table, **KEEPALIVE)
    account = auth.account()
    first = sse(server.client, {"account": account.address}, auth.bearer(account))
    try:
        assert first.response.status_code == 200 and "id" in first.frame()
        second = server.client.get(
            "/v1/stream", params={"account": account.address}, headers=auth.bearer(account)
        )
        body = problem(second, "RATE_LIMITED")
        assert body["details"]["scope"] == "account"
    finally:
        first.close()
