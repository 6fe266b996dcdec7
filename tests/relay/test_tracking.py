"""The tracker reads executions from the hyperblocks: one read a block for every intent, not one look an intent."""

from __future__ import annotations

from typing import Any

# Longest prefix wins (localnet faults): every `GET /transaction/{hash}` hangs far past the gateway client's
# timeout, while sending, the pool, simulation and cost answer at once.
LOOKS_HANG = {
    "/transaction/": 120_000,
    "/transaction/send": 0,
    "/transaction/pool": 0,
    "/transaction/simulate": 0,
    "/transaction/cost": 0,
}


def test_executions_and_finality_come_from_the_hyperblocks_when_no_single_look_answers(env: Any) -> None:
    senders = [env.new_sender(shard) for shard in (0, 1, 2)]
    assignments = [env.assign(sender) for sender in senders]
    env.faults(gateway={"latencyMs": LOOKS_HANG})
    try:
        responses = [
            env.relay(env.build(sender, assignment), assignment["lease"])
            for sender, assignment in zip(senders, assignments, strict=True)
        ]
        for response in responses:
            assert response.status_code in (200, 202), response.text
        for response in responses:
            final = env.wait_state(response.json()["txHash"], ("FINALIZED",), timeout=30)
            assert final["outcome"] == "success"
            assert final["latency"]["roundsToInclusion"] is not None
    finally:
        env.faults(gateway={"latencyMs": {}})
