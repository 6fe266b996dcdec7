"""Fixtures for the storage tests: an engine on each database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import create_engine


@pytest.fixture
async def db_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a fresh, empty database (SQLite, then PostgreSQL)."""
    engine = create_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()
