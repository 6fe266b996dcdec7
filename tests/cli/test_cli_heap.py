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
