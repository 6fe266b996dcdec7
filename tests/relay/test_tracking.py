"""The tracker reads executions from the hyperblocks: one read a block for every intent, not one look an intent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from gasless.db import intents, reservations, usage_ledger
from gasless.relay import jobs

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


def test_a_round_is_written_in_bounded_transactions_each_with_its_billing(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One intent a transaction (the bound at its smallest): every execution and finality is still stored,
    each with its reservation settled and its ledger row, and no transaction moved more than one."""
    monkeypatch.setattr(jobs, "ROUND_WRITE_INTENTS", 1)
    repo = env.client.app.state.host.tracker.repo
    moved: list[int] = []
    real = repo.transition_many

    async def counted(changes: Any, now_ms: int) -> Any:
        rows = await real(changes, now_ms)
        moved.append(len(rows))
        return rows

    monkeypatch.setattr(repo, "transition_many", counted)
    senders = [env.new_sender(shard) for shard in (0, 1, 2, 1)]
    hashes = []
    for sender in senders:
        assignment = env.assign(sender)
        answer = env.relay(env.build(sender, assignment), assignment["lease"])
        assert answer.status_code in (200, 202), answer.text
        hashes.append(answer.json()["txHash"])
    for tx_hash in hashes:
        assert env.wait_state(tx_hash, ("FINALIZED",), timeout=30)["outcome"] == "success"
    assert moved and max(moved) == 1 and sum(moved) == 2 * len(hashes)  # executed, then finalized
    url = env.settings.effective_database_url.replace("+aiosqlite", "")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ledger = conn.execute(select(usage_ledger).where(usage_ledger.c.tx_hash.in_(hashes))).all()
            held = conn.execute(
                select(reservations.c.state)
                .join(intents, intents.c.pk == reservations.c.intent_pk)
                .where(intents.c.tx_hash.in_(hashes))
            ).all()
    finally:
        engine.dispose()
    assert sorted(row.tx_hash for row in ledger) == sorted(hashes)
    assert all(row.status == "success" and row.finalized_at_ms is not None for row in ledger)
    assert [row.state for row in held] == ["settled"] * len(held)


def test_a_round_packs_its_changes_in_order_into_transactions_of_at_most_the_bound() -> None:
    batch = jobs._Batch()
    rows = [SimpleNamespace(pk=pk, sender=f"s{pk}", nonce=pk, tx_hash=f"h{pk}") for pk in range(1, 8)]
    for row in rows[:5]:
        batch.executed(row, 1_000, "success")  # one group of five pks: split by the bound
    batch.replaced(rows[0], 2_000)  # weighs one
    batch.finalize([6, 7], 2_000)
    batch.dead(rows[6], "gone", 2_000)
    packed = batch.transactions(3)
    weights = [[_weight(where) for where, _ in changes] for changes in packed]
    assert weights == [[3], [2, 1], [2, 1]]
    states = [values["state"] for changes in packed for _, values in changes]
    assert states == ["EXECUTED", "EXECUTED", "DEAD", "FINALIZED", "DEAD"]
    assert jobs._Batch().transactions(3) == []


def _weight(where: Any) -> int:
    """How many pks a change's `pk IN (...)` names (one for the other guards)."""
    compiled = where.compile(compile_kwargs={"literal_binds": True})
    text = str(compiled)
    return text.split(" IN (", 1)[1].split(")")[0].count(",") + 1 if "pk IN (" in text else 1
