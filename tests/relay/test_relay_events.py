"""The per-intent event stream, and the commit point on PostgreSQL."""

from __future__ import annotations

import json
import threading
from typing import Any


def read_events(env: Any, ident: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with env.client.stream("GET", f"/v1/relay/{ident}/events", headers=headers or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        for line in response.iter_lines():
            if line.startswith("event:"):
                current["event"] = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                current["id"] = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line.split(":", 1)[1])
            elif line == "" and current:
                events.append(current)
                current = {}
    return events


def test_stream_sends_each_state_and_closes_after_final(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    response = env.relay(env.build(sender, assignment), assignment["lease"])
    assert response.status_code in (200, 202)
    tx_hash = response.json()["txHash"]
    events = read_events(env, tx_hash)  # returns only because the server closed the stream
    assert events and all(e["event"] == "intent" for e in events)
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert events[-1]["data"]["state"] == "FINALIZED" and events[-1]["data"]["final"] is True
    assert all(e["data"]["final"] is False for e in events[:-1])
    # Resuming after the last id sends nothing new but the stream still closes on the final state.
    resumed = read_events(env, f"{sender.address}:0", {"Last-Event-ID": events[-1]["id"]})
    assert resumed == []
    # Resuming from an earlier id replays the current state once.
    again = read_events(env, tx_hash, {"Last-Event-ID": "0"})
    assert [e["data"]["state"] for e in again] == ["FINALIZED"]


def test_stream_of_unknown_intent_is_404(env: Any) -> None:
    response = env.client.get("/v1/relay/" + "ab" * 32 + "/events")
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"


def test_rejected_submission_streams_one_final_event(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, gas_price=10)
    assert env.relay(tx, assignment["lease"]).json()["code"] == "GAS_PRICE_OUT_OF_RANGE"
    env.wait_state(f"{sender.address}:0", ("REJECTED",))
    events = read_events(env, f"{sender.address}:0")
    assert [e["data"]["state"] for e in events] == ["REJECTED"] and events[0]["data"]["final"] is True


def test_commit_point_on_postgres_broadcasts_same_bytes_once(make_env: Any, postgres_url: str) -> None:
    env = make_env(database_url=postgres_url)
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    barrier = threading.Barrier(6)
    answers: list[Any] = []

    def post() -> None:
        barrier.wait()
        answers.append(env.relay(tx, assignment["lease"]))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
    assert sum(1 for a in answers if not a.json()["duplicate"]) == 1
    final = env.wait_state(answers[0].json()["txHash"], ("FINALIZED",), timeout=30)
    submissions = env.localnet.call(lambda: env.localnet.net.chain.submissions[final["txHash"]])
    assert submissions == 1


def test_native_auth_token_proves_presence_on_assign(env: Any) -> None:
    from gasless.client.native_auth import make_native_auth_token

    network = env.client.get("/v1/network")
    assert network.status_code == 200 and network.headers["Cache-Control"].startswith("public")
    native = network.json()["nativeAuth"]
    assert network.json()["roundDurationMs"] == 100 and native["blockHash"]
    sender = env.new_sender(1, plan=False)
    token = make_native_auth_token(
        sender.key, origin=native["origins"][0], block_hash=native["blockHash"], ttl_seconds=600
    )
    ok = env.client.post(
        "/v1/relay/assign", json={"sender": sender.address}, headers={"Authorization": f"Bearer {token}"}
    )
    assert ok.status_code == 200, ok.text
    other = env.new_sender(1, plan=False)
    wrong = env.client.post(
        "/v1/relay/assign", json={"sender": other.address}, headers={"Authorization": f"Bearer {token}"}
    )
    assert wrong.status_code == 401 and wrong.json()["code"] == "ASSIGN_PROOF_INVALID"
    bad = env.client.post(
        "/v1/relay/assign", json={"sender": sender.address}, headers={"Authorization": f"Bearer {token}x"}
    )
    assert bad.status_code == 401 and bad.json()["code"] == "TOKEN_INVALID"
