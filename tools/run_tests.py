"""The README's test command: run the whole suite, with the server-backed suites when their servers answer.

PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) are probed first. A suite whose server does not
answer is skipped, and this script says so loudly at the start and at the end of the run.

The MCP tests also drive the server with official TypeScript clients (tests/mcp/js): they are installed
here from their lock file (`npm ci`, again only when the lock file changed since); without Node.js and npm,
or when the registry cannot be reached, those tests are skipped, and this script says so the same way.
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
JS_CLIENTS = ROOT / "tests" / "mcp" / "js"
NPM_TIMEOUT_S = 600
# One worker more than cores: a test waits on rounds, subprocesses and databases a good part of its time, so
# two workers on two cores kept only 1.2 cores busy (a clean-clone run at 7409a83: 17:05 with 2 workers,
# 13:10 with 3; docs/performance.md).
EXTRA_WORKERS = 1


def parallel(extra: list[str]) -> list[str]:
    """pytest-xdist workers, one per core and EXTRA_WORKERS more, unless the caller chose (`-n`,
    `-p no:xdist`) or runs a subset: tests are independent (own databases, keys, ports and localnets)."""
    chosen = any(
        a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in extra
    )
    # A subset named by path (`tests/relay`, `tests/hosting/test_app.py::test_x`): as the caller says. Option values
    # (`-p no:cacheprovider`, `-k expr`) are not paths.
    subset = any(a.startswith("tests") or a.endswith(".py") or "::" in a for a in extra)
    if chosen or subset:
        return []
    # worksteal: a worker that ran out takes queued tests from the other, so a few long tests (a real
    # Prometheus, a previous release's build, the restore runs) do not leave one core idle at the end; the
    # slowest tests are listed after every full run, where the suite's time is watched (docs/performance.md).
    workers = str((os.cpu_count() or 1) + EXTRA_WORKERS)
    return ["-n", workers, "--dist", "worksteal", "--durations", "25"]


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.5):
            return True
    except OSError:
        return False


def install_js_clients() -> str | None:
    """`npm ci` the MCP test clients when their lock file changed since the last install; None when they
    are installed, else the line saying why their tests are skipped."""
    skipped = "MCP TypeScript client tests SKIPPED"
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return f"{skipped}: no {'node' if node is None else 'npm'} (apt-get install nodejs npm)"
    lock = JS_CLIENTS / "package-lock.json"
    installed = JS_CLIENTS / "node_modules" / ".package-lock.json"  # npm writes it at each install
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return None
    command = [npm, "ci", "--prefix", str(JS_CLIENTS), "--ignore-scripts", "--no-audit", "--no-fund"]
    print(f"installing the MCP test clients: npm ci --prefix {JS_CLIENTS.relative_to(ROOT)}", flush=True)
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"{skipped}: npm ci did not finish in {NPM_TIMEOUT_S} s (is the npm registry reachable?)"
    if done.returncode != 0:
        # npm's error code, and its first sentence (not the `syscall`/`errno` lines or the log's path).
        said = [
            line.removeprefix("npm error").strip()
            for line in done.stderr.splitlines()
            if line.startswith("npm error")
        ]
        code = next((line.split()[1] for line in said if line.startswith("code ")), "")
        sentence = next(
            (line for line in said if len(line.split()) >= 4 and not line.startswith("A complete log")), ""
        )
        why = ": ".join(part for part in (code, sentence) if part) or f"exit status {done.returncode}"
        return f"{skipped}: npm ci --prefix tests/mcp/js failed ({why})"
    return None


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
    if not shutil.which("softhsm2-util"):
        skipped.append("PKCS#11 signer tests SKIPPED: no SoftHSM 2 (apt install softhsm2) for the token")
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        skipped.append("Prometheus rule tests SKIPPED: no prometheus/promtool (apt install prometheus)")
    js_skipped = install_js_clients()
    if js_skipped is not None:
        skipped.append(js_skipped)
    lint = subprocess.call(
        [sys.executable, "-m", "ruff", "check", "--quiet", "src", "tests", "bench", "tools"], cwd=ROOT
    )
    if lint != 0:
        print("ruff check failed: fix the findings above (or run `.venv/bin/ruff check --fix`).", flush=True)
        return lint
    notice = (
        banner(skipped)
        if skipped
        else "PostgreSQL and Redis suites, browser and MCP TypeScript client tests: enabled."
    )
    print(notice, flush=True)
    args = [sys.executable, "-m", "pytest", *parallel(sys.argv[1:]), *sys.argv[1:]]
    code = subprocess.call(args, cwd=ROOT, env=env)
    if skipped:
        print(notice, flush=True)
    # pytest exits 5 when it collected nothing: that is a failure for us, never a silent pass.
    return 1 if code == 5 else code


if __name__ == "__main__":
    sys.exit(main())
