"""Alembic environment: runs on a connection handed over by gasless.db.migrate (or from a URL for tooling)."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import Connection

from gasless.db.engine import create_engine, transactional
from gasless.db.tables import metadata

config = context.config


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        render_as_batch=True,  # SQLite can only ALTER by rebuilding tables
        compare_type=True,
        user_module_prefix="gtypes.",  # script.py.mako imports gasless.db.types as gtypes
        **kwargs,
    )


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("GASLESS_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url on the Config or GASLESS_DATABASE_URL")
    return url


async def _run_from_url(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            conn = await transactional(conn)
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    _configure(url=_database_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    _run(connection)
else:
    asyncio.run(_run_from_url(_database_url()))
