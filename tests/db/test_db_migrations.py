"""Migrations: empty to head, idempotent, matching tables.py, reversible, safe under concurrency."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import begin_write, create_engine, relayer_state_history, relayers
from gasless.db.migrate import (
    MIGRATION_LOCK_KEY,
    current_revision,
    downgrade,
    head_revision,
    is_up_to_date,
    upgrade,
)
from gasless.db.tables import metadata

TABLES = {
    "relayers",
    "relayer_state_history",
    "service_meta",
    "intents",
    "intent_keys",
    "rejections",
    "signer_fences",
    "api_keys",
    "webhooks",
    "webhook_deliveries",
    "idempotency_keys",
    "reservations",
    "mirror_accounts",
    "mirror_senders",
    "mirror_purchases",
    "mirror_views",
    "mirror_settlements",
    "account_period_usage",
    "settlement_batches",
    "usage_ledger",
    "incidents",
    "incident_updates",
    "chain_identity",
    "x402_payments",
    "latency_rollups",
    "notices",
    "notice_acks",
    "notification_prefs",
    "mail_outbox",
}
ADDRESS = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"


async def _schema_diff(engine: AsyncEngine) -> list[Any]:
    def diff(sync: Connection) -> list[Any]:
        return compare_metadata(MigrationContext.configure(sync, opts={"compare_type": True}), metadata)

    async with engine.connect() as conn:
        return await conn.run_sync(diff)


async def _table_names(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))


def _relayer(**overrides: Any) -> dict[str, Any]:
    row = {"address": ADDRESS, "shard": 1, "state": "active", "created_at_ms": 1_000, "updated_at_ms": 1_000}
    return {**row, **overrides}


async def test_upgrade_from_empty_reaches_head(db_engine: AsyncEngine, database_url: str) -> None:
    assert head_revision() == "0017"
    assert await current_revision(db_engine) is None
    assert await is_up_to_date(db_engine) is False

    await upgrade(database_url)

    assert await current_revision(db_engine) == head_revision()
    assert await is_up_to_date(db_engine) is True
    assert await _table_names(db_engine) == TABLES | {"alembic_version"}


async def test_migrated_schema_matches_tables_module(db_engine: AsyncEngine) -> None:
    before = await _schema_diff(db_engine)
    assert {op[1].name for op in before if op[0] == "add_table"} == TABLES

    await upgrade(db_engine)

    assert await _schema_diff(db_engine) == []


async def test_upgrade_twice_keeps_schema_and_data(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)
    async with db_engine.begin() as conn:
        await conn.execute(relayers.insert().values(_relayer()))

    await upgrade(db_engine)

    assert await current_revision(db_engine) == head_revision()
    async with db_engine.connect() as conn:
        assert (await conn.execute(select(relayers.c.address))).scalars().all() == [ADDRESS]
    assert await _schema_diff(db_engine) == []


async def test_downgrade_to_base_then_upgrade_again(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)
    await downgrade(db_engine, "base")

    assert await current_revision(db_engine) is None
    assert await _table_names(db_engine) == {"alembic_version"}

    await upgrade(db_engine)

    assert await current_revision(db_engine) == head_revision()
    assert await _schema_diff(db_engine) == []


async def test_migrated_schema_defaults_and_constraints(db_engine: AsyncEngine) -> None:
    await upgrade(db_engine)
    async with db_engine.begin() as conn:
        await conn.execute(relayers.insert().values(_relayer()))
        await conn.execute(relayers.insert().values(_relayer(address="erd1rich", balance_atto=2**256 - 1)))
        for at_ms, (old, new) in enumerate([(None, "active"), ("active", "draining")], start=5):
            await conn.execute(
                relayer_state_history.insert().values(
                    relayer_address=ADDRESS, from_state=old, to_state=new, at_ms=at_ms
                )
            )
    async with db_engine.connect() as conn:
        rows = (await conn.execute(select(relayers).order_by(relayers.c.address))).mappings().all()
        by_time = select(relayer_state_history.c.id).order_by(relayer_state_history.c.at_ms)
        history_ids = (await conn.execute(by_time)).scalars().all()
    assert [(row["address"], row["funded"], row["balance_atto"]) for row in rows] == [
        (ADDRESS, False, 0),
        ("erd1rich", False, 2**256 - 1),
    ]
    assert len(history_ids) == 2
    assert history_ids[0] < history_ids[1]

    bad_rows = [
        (relayer_state_history, {"relayer_address": "erd1unknown", "to_state": "active", "at_ms": 1}),
        (relayers, _relayer(address="erd1bad", state="paused")),
        (relayers, _relayer(address=ADDRESS)),
    ]
    for table, values in bad_rows:
        with pytest.raises(IntegrityError):
            async with db_engine.begin() as conn:
                await conn.execute(table.insert().values(values))


async def test_concurrent_upgrades_from_two_tasks(db_engine: AsyncEngine, database_url: str) -> None:
    await asyncio.gather(upgrade(database_url), upgrade(database_url), upgrade(db_engine))

    assert await current_revision(db_engine) == head_revision()
    assert await _schema_diff(db_engine) == []


async def test_concurrent_upgrades_from_two_processes(db_engine: AsyncEngine, database_url: str) -> None:
    script = "import asyncio, sys; from gasless.db.migrate import upgrade; asyncio.run(upgrade(sys.argv[1]))"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            database_url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = await asyncio.wait_for(asyncio.gather(*(proc.communicate() for proc in procs)), timeout=120)

    for proc, (_, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr.decode()
    assert await current_revision(db_engine) == head_revision()
    assert await _schema_diff(db_engine) == []


@pytest.mark.postgres
async def test_postgres_upgrade_waits_for_the_advisory_lock(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    try:
        async with engine.connect() as holder:
            await holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            task = asyncio.create_task(upgrade(postgres_url))
            await asyncio.sleep(1.0)
            assert not task.done()
            assert await current_revision(engine) is None
            await holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            await holder.commit()
            await asyncio.wait_for(task, timeout=60)
        assert await current_revision(engine) == head_revision()
    finally:
        await engine.dispose()


async def test_sqlite_upgrade_waits_for_the_writer(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        async with begin_write(engine) as holder:
            await holder.execute(text("CREATE TABLE unrelated (x INTEGER)"))
            task = asyncio.create_task(upgrade(sqlite_url))
            await asyncio.sleep(1.0)
            assert not task.done()
        await asyncio.wait_for(task, timeout=60)
        assert await current_revision(engine) == head_revision()
        assert await _table_names(engine) == TABLES | {"alembic_version", "unrelated"}
    finally:
        await engine.dispose()


async def test_sqlite_foreign_keys_are_checked_after_a_migration_and_not_on_an_up_to_date_start(
    sqlite_url: str,
) -> None:
    """The check reads every row of every table with a foreign key (1.5 s at 1 M intents, most of a
    start-up at 10 M): it follows a migration that ran, and a start on an up-to-date database skips it."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        await upgrade(sqlite_url, "0016")
        checks_after_migrating = statements.count("PRAGMA foreign_key_check")
        statements.clear()
        await upgrade(sqlite_url)  # 0017 applied
        checks_after_the_last = statements.count("PRAGMA foreign_key_check")
        statements.clear()
        await upgrade(sqlite_url)  # nothing to do
        checks_when_up_to_date = statements.count("PRAGMA foreign_key_check")
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    assert (checks_after_migrating, checks_after_the_last, checks_when_up_to_date) == (1, 1, 0)
