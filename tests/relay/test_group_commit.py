"""Group commit of the commit point: commit points that arrive together are written in one transaction, and
each one's outcome (its pk, CommitConflict, QUOTA_EXHAUSTED, a pay-as-you-go fallback) is exactly what it
would have been written alone, in arrival order (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from relay_kit import commit_point_values
from sqlalchemy import func, select

from gasless.core.errors import ApiError
from gasless.db import account_period_usage, intents, reservations
from gasless.db.engine import create_engine
from gasless.db.migrate import upgrade
from gasless.relay.repository import CommitConflict, IntentRepository

NOW = 1_700_000_000_000
PERIOD = 1_700_000_000_000


def _values(account: str, index: int, *, tx_hash: str | None = None, **billing: Any) -> dict[str, Any]:
    return commit_point_values(
        f"erd1sender{secrets.token_hex(4)}{index:04d}",
        account,
        tx_hash=tx_hash,
        cosigned_at_ms=NOW + index,
        **{"periodId": PERIOD, "includedRu": 2, "paygPriceMicro": 10, "paygCapMicro": 30, **billing},
    )


async def _outcome(repo: IntentRepository, values: dict[str, Any]) -> str:
    try:
        await repo.commit(values, None, 86_400_000)
    except CommitConflict:
        return "conflict"
    except ApiError as error:
        return f"{error.code}:{error.details.get('reason')}"
    return str(values["billing"]["billingClass"])


async def _scenario(url: str, *, together: bool) -> None:
    await upgrade(url)
    engine = create_engine(url)
    repo = IntentRepository(engine)
    account = f"erd1acct{secrets.token_hex(8)}"
    taken = secrets.token_hex(32)
    try:
        assert await _outcome(repo, _values(account, 0, tx_hash=taken, ru=0)) == "plan"
        twice = secrets.token_hex(32)
        batch = [
            _values(account, 1),  # plan: 1 of 2 RU
            _values(account, 2, tx_hash=twice),  # plan: 2 of 2 RU
            _values(account, 3, tx_hash=twice),  # the same bytes again: one insert, then a conflict
            _values(account, 4, tx_hash=taken),  # meets a stored row: a conflict
            _values(account, 5),  # the plan is spent: pay-as-you-go, 10 of 30
            _values(account, 6, paygPriceMicro=None),  # spent, and no pay-as-you-go: refused
            _values(account, 7),  # pay-as-you-go, 20 of 30
            _values(account, 8, ru=2),  # 40 > 30: the escrow cannot cover it
            _values(account, 9),  # pay-as-you-go, 30 of 30
            _values(account, 10),  # the escrow is spent
        ]
        if together:
            outcomes = await asyncio.gather(*(_outcome(repo, values) for values in batch))
        else:
            outcomes = [await _outcome(repo, values) for values in batch]
        assert outcomes == [
            "plan",
            "plan",
            "conflict",
            "conflict",
            "payg",
            "QUOTA_EXHAUSTED:PLAN_CAP",
            "payg",
            "QUOTA_EXHAUSTED:PAYG_ESCROW",
            "payg",
            "QUOTA_EXHAUSTED:PAYG_ESCROW",
        ]
        async with engine.connect() as conn:
            used = (
                await conn.execute(
                    select(account_period_usage.c.ru_used).where(account_period_usage.c.account == account)
                )
            ).scalar_one()
            held = (
                await conn.execute(
                    select(reservations.c.billing_class, func.count())
                    .where(reservations.c.account == account)
                    .group_by(reservations.c.billing_class)
                )
            ).all()
            stored = (
                await conn.execute(
                    select(intents.c.billing).where(intents.c.billing["account"].as_string() == account)
                )
            ).all()
        assert used == 2
        assert dict(held) == {"plan": 3, "payg": 3}
        # Refused intents left nothing behind; a fallback's stored billing says pay-as-you-go.
        assert sorted(row.billing["billingClass"] for row in stored) == ["payg"] * 3 + ["plan"] * 3
    finally:
        await engine.dispose()


def test_group_commit_matches_one_by_one_sqlite(tmp_path: Path) -> None:
    asyncio.run(_scenario(f"sqlite+aiosqlite:///{(tmp_path / 'one.db').as_posix()}", together=False))
    asyncio.run(_scenario(f"sqlite+aiosqlite:///{(tmp_path / 'group.db').as_posix()}", together=True))


def test_group_commit_matches_one_by_one_postgres(postgres_url: str) -> None:
    asyncio.run(_scenario(postgres_url, together=False))
    asyncio.run(_scenario(postgres_url, together=True))
