"""The README's test command: run the whole suite, with the server-backed suites when their servers answer.

PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) are probed first. A suite whose server does not
answer is skipped, and this script says so loudly at the start and at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

POSTGRES_URL = os.environ.get(
    "GASLESS_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GASLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.5):
            return True
    except OSError:
        return False


def banner(lines: list[str]) -> str:
    width = max(len(line) for line in lines) + 4
    bar = "!" * width
    return "\n".join([bar, *(f"! {line.ljust(width - 4)} !" for line in lines), bar])


def main() -> int:
    env = dict(os.environ)
    skipped: list[str] = []
    if answers("127.0.0.1", 5432):
        env["GASLESS_TEST_POSTGRES_URL"] = POSTGRES_URL
    else:
        env.pop("GASLESS_TEST_POSTGRES_URL", None)
        skipped.append("PostgreSQL suite SKIPPED: nothing answers on 127.0.0.1:5432")
    if answers("127.0.0.1", 6379):
        env["GASLESS_TEST_REDIS_URL"] = REDIS_URL
    else:
        env.pop("GASLESS_TEST_REDIS_URL", None)
        skipped.append("Redis suite SKIPPED: nothing answers on 127.0.0.1:6379")

    if not shutil.which("chromium"):
        skipped.append("Browser test SKIPPED: no chromium (apt install chromium) for the status site page")
    lint = subprocess.call(
        [sys.executable, "-m", "ruff", "check", "--quiet", "src", "tests", "bench", "tools"], cwd=ROOT
    )
    if lint != 0:
        print("ruff check failed: fix the findings above (or run `.venv/bin/ruff check --fix`).", flush=True)
        return lint
    notice = banner(skipped) if skipped else "PostgreSQL and Redis suites: enabled (servers answered)."
    print(notice, flush=True)
    args = [sys.executable, "-m", "pytest", *sys.argv[1:]]
    code = subprocess.call(args, cwd=ROOT, env=env)
    if skipped:
        print(notice, flush=True)
    # pytest exits 5 when it collected nothing: that is a failure for us, never a silent pass.
    return 1 if code == 5 else code


if __name__ == "__main__":
    sys.exit(main())
