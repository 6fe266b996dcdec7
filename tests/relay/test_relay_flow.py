"""End to end on localnet: assign, sign once, relay, follow to finality."""

from __future__ import annotations

from typing import Any


def test_assign_sign_relay_finalize(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    assert assignment["shard"] == 1
    tx = env.build(sender, assignment)
    response = env.relay(tx, assignment["lease"])
    assert response.status_code in (200, 202), response.text
    body = response.json()
    assert body["duplicate"] is False
    assert body["id"] == f"{sender.address}:0"
    assert response.headers["Relay-Request-Id"].startswith("req_")
    final = env.wait_state(body["txHash"], ("FINALIZED",))
    for member in ("receivedAtMs", "cosignedAtMs", "broadcastAtMs", "executedBlockTsMs", "finalizedAtMs"):
        assert final[member] is not None, member
    assert final["receivedAtMs"] <= final["cosignedAtMs"] <= final["broadcastAtMs"]
    assert final["executedBlockTsMs"] <= final["finalizedAtMs"]
    assert final["final"] is True and final["outcome"] == "success"
    latency = final["latency"]
    assert latency["acceptToCosignMs"] >= 0 and latency["roundsToInclusion"] >= 1
