"""`gasless relay send` / `gasless relay status` end to end: a subprocess against the API served by uvicorn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_client_flow import Served, key_in_shard, start_served

from gasless.client import UserKey


@pytest.fixture
def served(make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any) -> Iterator[Served]:
    # make_env's namespace is tests/relay/conftest.py (relay_settings with its MASTER_SECRET).
    running = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    yield running
    running.server.stop()


def gasless(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    # Piped output, no width hint: what a script or a CI log gets (values must not be cut to 80 columns).
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gasless.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def write_pem(key: UserKey, path: Path) -> Path:
    path.write_text(key.to_pem_text())
    return path


async def test_relay_send_follows_to_finalized(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1)
    pem = write_pem(key, tmp_path / "sender.pem")
    receiver = key_in_shard(1).address
    common = ["--api", served.url, "--gateway", served.gateway, "--pem", str(pem), "--to", receiver]

    run = gasless("relay", "send", *common, "--data", "cli hello", "--value", "0")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert key.address in output and "assignment" in output
    assert "relay answer: 200" in output or "relay answer: 202" in output
    assert "FINALIZED" in output and "outcome=success" in output
    tx_hash = output.split("txHash=", 1)[1].split()[0]
    assert len(tx_hash) == 64

    status = gasless("relay", "status", f"{key.address}:0", "--api", served.url, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert '"FINALIZED"' in status.stdout and tx_hash in status.stdout

    # The table, piped: every address and hash whole, on the line of its key.
    table = gasless("relay", "status", tx_hash, "--api", served.url)
    assert table.returncode == 0, table.stdout + table.stderr
    intent = json.loads(status.stdout)
    lines = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│")}
    assert tx_hash in lines["txHash"] and intent["relayer"] in lines["relayer"], table.stdout
    assert receiver in lines["receiver"] and f"intent {key.address}:0" in table.stdout, table.stdout

    # The account nonce moved on: the next send reads nonce 1 from the gateway, here without following.
    second = gasless("relay", "send", *common, "--no-follow")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nonce 1" in second.stdout and "FINALIZED" not in second.stdout


async def test_relay_send_refused_exits_non_zero(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1)
    pem = write_pem(key, tmp_path / "sender.pem")
    run = gasless(
        "relay",
        "send",
        "--api",
        served.url,
        "--pem",
        str(pem),
        "--to",
        key_in_shard(1).address,
        "--nonce",
        "9",
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "NONCE_GAP" in run.stdout

    missing = gasless("relay", "status", f"{key.address}:0", "--api", served.url)
    assert missing.returncode == 2 and "NOT_FOUND" in missing.stdout
