"""Shared fixtures: real servers when the test command found them, loud skips when not."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_ENV = "GASLESS_TEST_POSTGRES_URL"
REDIS_ENV = "GASLESS_TEST_REDIS_URL"


def _admin_dsn(url: str) -> str:
    # asyncpg wants a plain postgresql:// DSN.
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _pg_exec(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_admin_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"PostgreSQL suite skipped: {POSTGRES_ENV} not set (no server answered on 127.0.0.1:5432)")
    return url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"gasless_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_pg_exec(postgres_server_url, f'CREATE DATABASE "{name}"'))
    base = postgres_server_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_pg_exec(postgres_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get(REDIS_ENV)
    if not url:
        pytest.skip(f"Redis suite skipped: {REDIS_ENV} not set (no server answered on 127.0.0.1:6379)")
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{(tmp_path / 'gasless.db').as_posix()}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on SQLite and once on PostgreSQL (skipped loudly when the server is absent)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")
