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
import requests
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
    # Progress from the first state, each state once, in order; values in JSON's spelling, never Python's.
    steps = [line.split()[0] for line in run.stdout.splitlines() if line.startswith("[")]
    assert steps == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], run.stdout
    assert "pinNonce" in run.stdout and "None" not in run.stdout and "False" not in run.stdout, run.stdout

    status = gasless("relay", "status", f"{key.address}:0", "--api", served.url, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert '"FINALIZED"' in status.stdout and tx_hash in status.stdout

    # The table, piped: every address and hash whole, on the line of its key.
    table = gasless("relay", "status", tx_hash, "--api", served.url)
    assert table.returncode == 0, table.stdout + table.stderr
    intent = json.loads(status.stdout)
    lines = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│")}
    assert tx_hash in lines["txHash"] and intent["relayer"] in lines["relayer"], table.stdout
    assert receiver in lines["receiver"] and f"{key.address}:0" in lines["id"], table.stdout

    # The account nonce moved on: the next send, with neither --gateway nor --nonce, has the API read it
    # (nonce 1), here without following: the progress shows the states the relay answer reached.
    alone = ["--api", served.url, "--pem", str(pem), "--to", receiver, "--no-follow"]
    second = gasless("relay", "send", *alone)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nonce 1" in second.stdout and "FINALIZED" not in second.stdout
    assert "[1/4] COSIGNED" in second.stdout and "billing=plan (1 RU)" in second.stdout, second.stdout


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
    # A refusal is printed in the one form every command uses, on stderr (the code, status, detail, id).
    assert run.stderr.startswith("refused: NONCE_GAP (409): nonce 9 skips ahead"), run.stderr
    assert "request id: req_" in run.stderr and "refused" not in run.stdout, run.stdout

    missing = gasless("relay", "status", f"{key.address}:0", "--api", served.url)
    assert missing.returncode == 2 and missing.stderr.startswith("refused: NOT_FOUND (404):"), missing.stderr
    assert missing.stdout == ""

    # An id of neither form is refused before any request, naming the forms it could have.
    nonsense = gasless("relay", "status", "nonsense", "--api", served.url)
    assert nonsense.returncode == 2 and nonsense.stdout == "", nonsense.stdout
    assert "`<erd1...>:<nonce>`" in nonsense.stderr and "64-hex transaction hash" in nonsense.stderr
    # ... and by the API itself in words, not as a pattern to look up.
    answer = requests.get(f"{served.url}/v1/relay/nonsense", timeout=10)
    assert answer.status_code == 400 and "<erd1...>:<nonce>" in answer.json()["detail"], answer.text
    assert "pattern" not in answer.json()["detail"], answer.text


def env_without(*names: str, **values: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names and k not in ("COLUMNS", "LINES")} | values


def gasless_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gasless.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def one_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, run.stdout + run.stderr
    return lines[0]


async def test_relay_commands_take_the_api_and_gateway_from_the_environment(
    served: Served, tmp_path: Path
) -> None:
    key = await served.new_sender(1)
    pem = write_pem(key, tmp_path / "sender.pem")
    env = env_without(GASLESS_API_URL=served.url, GASLESS_GATEWAY_URL=served.gateway, NO_COLOR="1")
    sent = gasless_env(
        env, "relay", "send", "--pem", str(pem), "--to", key_in_shard(1).address, "--no-follow"
    )
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "nonce 0" in sent.stdout
    status = gasless_env(env, "relay", "status", f"{key.address}:0", "--json")
    assert status.returncode == 0 and key.address in status.stdout, status.stdout + status.stderr


async def test_swapped_api_and_gateway_are_named_in_one_line(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1)
    pem = write_pem(key, tmp_path / "sender.pem")
    env = env_without("GASLESS_API_URL", "GASLESS_GATEWAY_URL", NO_COLOR="1")
    send = ["relay", "send", "--pem", str(pem), "--to", key_in_shard(1).address]

    swapped = gasless_env(env, *send, "--api", served.gateway, "--gateway", served.url)
    assert swapped.returncode == 2, swapped.stdout + swapped.stderr
    line = one_line(swapped)
    assert f"--api {served.gateway} does not answer as a gasless API" in line and "gateway" in line, line

    wrong_gateway = gasless_env(env, *send, "--api", served.url, "--gateway", served.url)
    assert wrong_gateway.returncode == 2, wrong_gateway.stdout + wrong_gateway.stderr
    line = one_line(wrong_gateway)
    assert f"--gateway {served.url} does not answer as a MultiversX gateway" in line and "API" in line, line

    status = gasless_env(env, "relay", "status", f"{key.address}:0", "--api", served.gateway)
    assert status.returncode == 2, status.stdout + status.stderr
    assert f"--api {served.gateway} does not answer as a gasless API" in one_line(status)


async def test_auth_token_is_accepted_by_the_api(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1)  # an account (a granted plan): /v1/usage?account= answers it too
    pem = write_pem(key, tmp_path / "sender.pem")
    made = gasless("auth", "token", "--pem", str(pem), "--api", served.url, "--ttl-seconds", "600")
    assert made.returncode == 0, made.stdout + made.stderr
    token = made.stdout.strip()
    assert token.count(".") == 2 and "\n" not in token, made.stdout  # stdout is the token alone
    bearer = {"Authorization": f"Bearer {token}"}

    me = requests.get(f"{served.url}/v1/me", headers=bearer, timeout=10)
    assert me.status_code == 200, me.text
    assert me.json()["address"] == key.address and me.json()["accounts"][0]["role"] == "owner"
    usage = requests.get(
        f"{served.url}/v1/usage", params={"account": key.address}, headers=bearer, timeout=10
    )
    assert usage.status_code == 200, usage.text

    # The origin is the token's: one the API does not accept makes a token it refuses.
    other = gasless(
        "auth", "token", "--pem", str(pem), "--api", served.url, "--origin", "https://elsewhere.example"
    )
    assert other.returncode == 0, other.stdout + other.stderr
    refused = requests.get(
        f"{served.url}/v1/me", headers={"Authorization": f"Bearer {other.stdout.strip()}"}, timeout=10
    )
    assert refused.status_code == 401 and refused.json()["code"] == "TOKEN_INVALID", refused.text

    too_long = gasless("auth", "token", "--pem", str(pem), "--api", served.url, "--ttl-seconds", "86401")
    assert too_long.returncode == 2 and "--ttl-seconds" in one_line(too_long), (
        too_long.stdout + too_long.stderr
    )
