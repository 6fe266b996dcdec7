"""Many concurrent commits racing for the last RU of a plan never overspend it (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from relay_kit import commit_point_values
from sqlalchemy import select

from gasless.core.errors import ApiError
from gasless.db import account_period_usage, reservations
from gasless.db.engine import create_engine
from gasless.db.migrate import upgrade
from gasless.relay.repository import IntentRepository

CAP = 10
RACERS = 40


def _values(account: str, index: int, period_id: int) -> dict[str, Any]:
    return commit_point_values(f"erd1sender{index:04d}", account, periodId=period_id, includedRu=CAP)


async def _race(url: str) -> None:
    await upgrade(url)
    engine = create_engine(url)
    repo = IntentRepository(engine)
    account = f"erd1acct{secrets.token_hex(8)}"
    period_id = 1_700_000_000_000

    async def one(index: int) -> str:
        try:
            await repo.commit(_values(account, index, period_id), None, 86_400_000)
        except ApiError as error:
            return error.code
        return "ok"

    try:
        outcomes = await asyncio.gather(*(one(i) for i in range(RACERS)))
        assert outcomes.count("ok") == CAP, outcomes
        assert set(outcomes) == {"ok", "QUOTA_EXHAUSTED"}
        async with engine.connect() as conn:
            used = (
                await conn.execute(
                    select(account_period_usage.c.ru_used).where(account_period_usage.c.account == account)
                )
            ).scalar_one()
            held = (
                await conn.execute(select(reservations.c.ru).where(reservations.c.account == account))
            ).all()
        assert used == CAP and len(held) == CAP
    finally:
        await engine.dispose()


def test_plan_cap_race_sqlite(tmp_path: Path) -> None:
    asyncio.run(_race(f"sqlite+aiosqlite:///{(tmp_path / 'race.db').as_posix()}"))


def test_plan_cap_race_postgres(postgres_url: str) -> None:
    asyncio.run(_race(postgres_url))
