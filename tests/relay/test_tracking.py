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


def test_a_round_larger_than_a_part_moves_and_bills_every_intent_once(env: Any, monkeypatch: Any) -> None:
    """A round's moves are written in transactions of at most `ROUND_PART_INTENTS` intents (here 4), so a
    commit point never waits behind a whole round: every intent still executes, becomes final and is billed
    exactly once."""
    from relay_kit import Sender  # type: ignore[import-not-found]
    from sqlalchemy import create_engine, select

    from gasless.db import reservations, usage_ledger
    from gasless.relay import jobs

    monkeypatch.setattr(jobs, "ROUND_PART_INTENTS", 4)
    tracker = env.client.app.state.host.tracker
    parts: list[int] = []
    write = tracker.repo.transition_many

    async def counted(changes: Any, now_ms: int, held: Any = None) -> Any:
        changed = await write(changes, now_ms, held)
        parts.append(len({int(row.pk) for row in changed}))
        return changed

    monkeypatch.setattr(tracker.repo, "transition_many", counted)
    senders: list[Sender] = [env.new_sender(shard) for shard in (0, 1, 2)]
    hashes = []
    for sender in senders:
        assignment = env.assign(sender)
        for _ in range(6):
            response = env.relay(env.build(sender, assignment), assignment["lease"])
            assert response.status_code in (200, 202), response.text
            sender.nonce += 1
            hashes.append(response.json()["txHash"])
    for tx_hash in hashes:
        final = env.wait_state(tx_hash, ("FINALIZED",), timeout=30)
        assert final["outcome"] == "success"
    # 18 executions and 18 finalizations, in rounds of more than one part each, no part above the bound.
    assert sum(parts) >= 36 and max(parts) <= 4 and len(parts) >= 9, parts
    engine = create_engine(env.settings.effective_database_url.replace("+aiosqlite", ""))
    try:
        with engine.connect() as conn:
            ledger = conn.execute(select(usage_ledger.c.tx_hash, usage_ledger.c.finalized_at_ms)).all()
            held = conn.execute(select(reservations.c.state)).scalars().all()
    finally:
        engine.dispose()
    assert sorted(row.tx_hash for row in ledger) == sorted(hashes)
    assert all(row.finalized_at_ms is not None for row in ledger)
    assert sorted(held) == ["settled"] * len(hashes)
