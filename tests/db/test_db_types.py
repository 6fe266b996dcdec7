"""Column types: exact round trips and refusals, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, Table, select, text
from sqlalchemy.exc import StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import Atto, Hash32, JsonDoc, Micro, UnixMs, create_engine
from gasless.db.types import ATTO_MAX, INT64_MAX, INT64_MIN

UINT256_MAX = 2**256 - 1

scratch = MetaData()
samples = Table(
    "samples",
    scratch,
    Column("id", Integer, primary_key=True),
    Column("atto", Atto),
    Column("micro", Micro),
    Column("ms", UnixMs),
    Column("tx", Hash32),
    Column("doc", JsonDoc),
)


@pytest.fixture
async def engine(db_engine: AsyncEngine) -> AsyncEngine:
    async with db_engine.begin() as conn:
        await conn.run_sync(scratch.create_all)
    return db_engine


async def _store(engine: AsyncEngine, column: str, value: Any) -> Any:
    async with engine.begin() as conn:
        row_id = (await conn.execute(samples.insert().values({column: value}))).inserted_primary_key[0]
    async with engine.connect() as conn:
        return (await conn.execute(select(samples.c[column]).where(samples.c.id == row_id))).scalar_one()


async def _row_count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT count(*) FROM samples"))).scalar_one()


def _refusal(excinfo: pytest.ExceptionInfo[StatementError]) -> BaseException:
    refusal = excinfo.value.orig
    if refusal is None:
        raise AssertionError(f"expected a driver-level refusal, got {excinfo.value!r}")
    return refusal


@pytest.mark.parametrize("amount", [0, 1, 10**18, 10**30, 10**30 + 7, UINT256_MAX, ATTO_MAX])
async def test_atto_round_trips_exactly(engine: AsyncEngine, amount: int) -> None:
    stored = await _store(engine, "atto", amount)
    assert type(stored) is int
    assert stored == amount


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (-1, ValueError),
        (-(10**30), ValueError),
        (ATTO_MAX + 1, ValueError),
        (True, TypeError),
        (1.0, TypeError),
        (Decimal(5), TypeError),
        ("5", TypeError),
    ],
)
async def test_atto_refuses_negative_oversized_and_non_int(
    engine: AsyncEngine, bad: Any, error: type
) -> None:
    with pytest.raises(StatementError) as excinfo:
        await _store(engine, "atto", bad)
    assert isinstance(_refusal(excinfo), error)
    assert await _row_count(engine) == 0


async def test_atto_sql_comparisons_follow_numeric_order(engine: AsyncEngine) -> None:
    amounts = [5, 10**30 + 7, 10, UINT256_MAX, 0, 10**18, 10**30, 9]
    async with engine.begin() as conn:
        await conn.execute(samples.insert(), [{"atto": amount} for amount in amounts])
    async with engine.connect() as conn:
        ordered = (await conn.execute(select(samples.c.atto).order_by(samples.c.atto))).scalars().all()
        above = (await conn.execute(select(samples.c.atto).where(samples.c.atto > 10**18))).scalars().all()
        equal = select(samples.c.atto).where(samples.c.atto == 10**30 + 7)
        exact = (await conn.execute(equal)).scalars().all()
    assert ordered == sorted(amounts)
    assert sorted(above) == [10**30, 10**30 + 7, UINT256_MAX]
    assert exact == [10**30 + 7]


async def test_atto_storage_form_per_database(engine: AsyncEngine) -> None:
    await _store(engine, "atto", 10**30 + 7)
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            raw, kind = (await conn.execute(text("SELECT atto, typeof(atto) FROM samples"))).one()
            assert kind == "text"
            assert raw == str(10**30 + 7).zfill(78)
        else:
            raw = (await conn.execute(text("SELECT atto::text FROM samples"))).scalar_one()
            assert raw == str(10**30 + 7)


def test_atto_round_trip_property(database_url: str) -> None:
    with asyncio.Runner() as runner:
        engine = create_engine(database_url)

        async def setup() -> None:
            async with engine.begin() as conn:
                await conn.run_sync(scratch.create_all)

        runner.run(setup())

        @settings(max_examples=50, deadline=None)
        @given(st.integers(min_value=0, max_value=UINT256_MAX))
        def check(amount: int) -> None:
            stored = runner.run(_store(engine, "atto", amount))
            assert type(stored) is int
            assert stored == amount

        try:
            check()
        finally:
            runner.run(engine.dispose())


@pytest.mark.parametrize("ms", [0, 1, 1_700_000_000_123, 2**53 + 1, INT64_MAX])
async def test_unix_ms_round_trips_as_int(engine: AsyncEngine, ms: int) -> None:
    stored = await _store(engine, "ms", ms)
    assert type(stored) is int
    assert stored == ms


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (dt.datetime(2025, 1, 1, tzinfo=dt.UTC), TypeError),
        (1.5, TypeError),
        (-1, ValueError),
        (2**63, ValueError),
    ],
)
async def test_unix_ms_refuses_datetimes_floats_and_out_of_range(
    engine: AsyncEngine, bad: Any, error: type
) -> None:
    with pytest.raises(StatementError) as excinfo:
        await _store(engine, "ms", bad)
    assert isinstance(_refusal(excinfo), error)


@pytest.mark.parametrize("micro", [0, 1_000_000, -5, INT64_MIN, INT64_MAX])
async def test_micro_round_trips_as_int(engine: AsyncEngine, micro: int) -> None:
    stored = await _store(engine, "micro", micro)
    assert type(stored) is int
    assert stored == micro


async def test_micro_refuses_values_beyond_int64(engine: AsyncEngine) -> None:
    with pytest.raises(StatementError) as excinfo:
        await _store(engine, "micro", INT64_MAX + 1)
    assert isinstance(_refusal(excinfo), ValueError)


async def test_hash32_is_stored_lower_case(engine: AsyncEngine) -> None:
    tx_hash = "AB" * 32
    assert await _store(engine, "tx", tx_hash) == "ab" * 32
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT tx FROM samples"))).scalar_one() == "ab" * 32
        found = (await conn.execute(select(samples.c.id).where(samples.c.tx == tx_hash))).scalars().all()
    assert len(found) == 1


@pytest.mark.parametrize("bad", ["ab" * 31, "ab" * 33, "0x" + "ab" * 31, "zz" * 32, b"\x00" * 32])
async def test_hash32_refuses_malformed_hashes(engine: AsyncEngine, bad: Any) -> None:
    with pytest.raises(StatementError) as excinfo:
        await _store(engine, "tx", bad)
    assert isinstance(_refusal(excinfo), ValueError)


async def test_json_doc_round_trips(engine: AsyncEngine) -> None:
    doc = {
        "genesis": {"chain_id": "localnet", "shards": [0, 1, 2]},
        "big": 2**53 + 1,
        "none": None,
        "ok": True,
    }
    assert await _store(engine, "doc", doc) == doc
