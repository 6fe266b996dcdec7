"""A long-running command freezes its start-up heap (`gasless.cli.main.settle_heap`): a full collection
then walks only what the service allocates later, not the imported modules' objects (docs/performance.md:
200 ms pauses of every thread, a few times a minute under load, before)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import gc
from gasless.cli.main import run_service

async def main():
    print(gc.get_freeze_count(), len(gc.get_objects()), flush=True)

run_service(main)
"""


def test_a_service_process_freezes_what_it_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=True
    )
    frozen, tracked = done.stdout.split()
    # The CLI's imports alone are far more than 50 000 objects; what the collector still walks is less.
    assert int(frozen) > 50_000, done.stdout
    assert int(tracked) < int(frozen) / 2, done.stdout


def test_a_client_command_starts_without_the_server_stack() -> None:
    """`gasless relay send` and the other client commands check a transaction as the relay does
    (`gasless.relay.checks`) without importing the web framework or the database toolkit: each of those
    cost a command a quarter of a second of start-up before it did anything."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gasless.cli", "relay", "send", "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "gasless.relay.checks" in imported and "multiversx_sdk" in imported, sorted(imported)
    server_stack = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "aiosqlite", "asyncpg"}
    assert sorted(imported & server_stack) == []
