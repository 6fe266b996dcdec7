"""A tracker round's write (`IntentRepository.transition_many`): executions, deaths and their billing in
one transaction: reservations settled or released, one ledger row per intent, built in SQL from the
intent and its held reservation, and every moved row returned as stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from relay_kit import commit_point_values
from sqlalchemy import and_, select

from gasless.db import intents, reservations, usage_ledger
from gasless.db.engine import create_engine
from gasless.db.migrate import upgrade
from gasless.relay.repository import IntentRepository

NOW = 1_700_000_000_000
BLOCK_TS = NOW + 600


def _executed(pks: list[int], outcome: str = "success", failure: str | None = None) -> list[Any]:
    values: dict[str, Any] = {"state": "EXECUTED", "executed_block_ts_ms": BLOCK_TS, "outcome": outcome}
    if failure is not None:
        values["failure"] = failure
    return [(and_(intents.c.pk.in_(pks), intents.c.state.in_(("COSIGNED", "BROADCAST"))), values)]


def _dead(pk: int) -> list[Any]:
    where = and_(intents.c.pk == pk, intents.c.state.in_(("COSIGNED", "BROADCAST", "EXECUTED")))
    return [(where, {"state": "DEAD", "dead_reason": "not included", "replaced_by": None})]


async def _round(url: str) -> list[Any]:
    """42 plan-billed intents: 38 execute, 2 execute and fail with a contract error, 2 die; the ledger rows
    the round wrote, in intent order (without the intent's pk)."""
    await upgrade(url)
    engine = create_engine(url)
    repo = IntentRepository(engine)
    account = f"erd1acct{secrets.token_hex(8)}"
    try:
        pks = [
            await repo.commit(
                commit_point_values(
                    f"erd1sender{secrets.token_hex(6)}",
                    account,
                    cosigned_at_ms=NOW + i,
                    includedRu=1_000,
                    function="flag" if i == 0 else None,
                    apiKeyId="key0001" if i == 1 else None,
                    route="compat" if i == 2 else None,
                ),
                None,
                86_400_000,
            )
            for i in range(42)
        ]
        changes = [
            *_executed(pks[0:38]),
            *_executed(pks[38:40], "fail", "ERR_PAUSED"),
            *_dead(pks[40]),
            *_dead(pks[41]),
        ]
        # The tracker holds half of the rows (as they were before the round); the others are new to it.
        held = {int(row.pk): row for row in await repo.by_pks(pks[::2])}
        # Acknowledged since: the held rows are stale, as a tracker's may be.
        await repo.record_acks({pk: NOW + 300 for pk in pks[:30]}, {pk: "http://gw" for pk in pks[:30]})
        changed = await repo.transition_many(changes, NOW + 700, held)
        assert sorted(int(row.pk) for row in changed) == sorted(pks)
        # Every row comes back as stored after the round, whether completed from the held row or read whole.
        stored = {int(row.pk): row for row in await repo.by_pks(pks)}
        for row in changed:
            assert _without_tx(row) == _without_tx(stored[int(row.pk)])
        # Written once per intent: the same moves again change nothing and write no second row.
        assert await repo.transition_many(changes, NOW + 800) == []
        async with engine.connect() as conn:
            ledger = (
                await conn.execute(
                    select(
                        usage_ledger.c.intent_pk,
                        usage_ledger.c.account,
                        usage_ledger.c.function,
                        usage_ledger.c.api_key_id,
                        usage_ledger.c.route,
                        usage_ledger.c.status,
                        usage_ledger.c.billed,
                        usage_ledger.c.billing_class,
                        usage_ledger.c.ru,
                        usage_ledger.c.payg_micro,
                        usage_ledger.c.period_id,
                        usage_ledger.c.failure_code,
                        usage_ledger.c.dead_reason,
                        usage_ledger.c.terminal_at_ms,
                        usage_ledger.c.created_at_ms,
                    )
                    .where(usage_ledger.c.intent_pk.in_(pks))
                    .order_by(usage_ledger.c.intent_pk)
                )
            ).all()
            held = dict(
                (
                    await conn.execute(
                        select(reservations.c.intent_pk, reservations.c.state).where(
                            reservations.c.intent_pk.in_(pks)
                        )
                    )
                ).all()
            )
        assert [held[pk] for pk in pks] == ["settled"] * 40 + ["released"] * 2
        assert [row.intent_pk for row in ledger] == pks
        return [tuple(row[1:]) for row in ledger]
    finally:
        await engine.dispose()


def _without_tx(row: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(row).items() if name != "tx"}


def _expected(account: str) -> list[tuple[Any, ...]]:
    billed = ("plan", 1, 0, 1_700_000_000_000)
    rows = []
    for i in range(42):
        member = (
            account,
            "flag" if i == 0 else None,
            "key0001" if i == 1 else None,
            "compat" if i == 2 else None,
        )
        if i < 38:
            rows.append((*member, "success", True, *billed, None, None, BLOCK_TS, NOW + 700))
        elif i < 40:
            rows.append((*member, "failed", True, *billed, "CONTRACT_PAUSED", None, BLOCK_TS, NOW + 700))
        else:
            rows.append(
                (*member, "dead", False, None, None, None, None, None, "not included", NOW + 700, NOW + 700)
            )
    return rows


def test_a_round_settles_and_writes_the_ledger_rows_sqlite(tmp_path: Path) -> None:
    ledger = asyncio.run(_round(f"sqlite+aiosqlite:///{(tmp_path / 'round.db').as_posix()}"))
    assert ledger == _expected(ledger[0][0])


def test_a_round_settles_and_writes_the_ledger_rows_postgres(postgres_url: str) -> None:
    ledger = asyncio.run(_round(postgres_url))
    assert ledger == _expected(ledger[0][0])
