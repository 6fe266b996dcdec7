"""`gasless x402 topup|purchase` end to end: a subprocess paying an API served by uvicorn (the request
limits of docs/api-conventions.md: the CLI paces itself by Retry-After), then the account shows the credits
and the plan."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from purchase_kit import fund  # type: ignore[import-not-found]
from test_cli_relay import gasless, write_pem  # type: ignore[import-not-found]
from test_client_flow import Served, start_served  # type: ignore[import-not-found]


@pytest.fixture
def served(make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any) -> Iterator[Served]:
    running = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    yield running
    running.server.stop()


async def test_topup_then_purchase_from_the_command_line(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1, plan=False)
    fund(served, key.address, usdc_micro=40_000_000)
    pem = write_pem(key, tmp_path / "payer.pem")

    topup = gasless("x402", "topup", "--pem", str(pem), "--amount", "5", "--api", served.url)
    output = topup.stdout + topup.stderr
    assert topup.returncode == 0, output
    assert "x402 challenge" in output and "x402 payment settled" in output and key.address in output
    assert "5000000" in output
    # Credits alone do not relay: the top-up says which command moves them into the escrow.
    assert f"gasless flags --pem {pem} --payg --payg-budget 5" in topup.stdout, topup.stdout

    bought = gasless(
        "x402", "purchase", "--pem", str(pem), "--tier", "starter", "--api", served.url, "--json"
    )
    assert bought.returncode == 0, bought.stdout + bought.stderr
    answer = json.loads(bought.stdout)
    assert answer["result"]["status"] == "success" and answer["settlement"]["success"] is True
    assert answer["settlement"]["transaction"] == answer["result"]["txHash"]
    account = requests.get(f"{served.url}/v1/account/{key.address}", timeout=10).json()
    assert account["runningPlan"]["ref"] == answer["result"]["quoteId"]


async def test_refusals_exit_2_and_name_the_code(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1, plan=False)  # holds no USDC
    pem = write_pem(key, tmp_path / "payer.pem")
    broke = gasless("x402", "topup", "--pem", str(pem), "--amount", "5", "--api", served.url)
    assert broke.returncode == 2 and "INSUFFICIENT_SENDER_BALANCE" in broke.stderr, broke.stderr
    # The one form of a refusal, on stderr, as every command prints it.
    assert broke.stderr.startswith("refused: INSUFFICIENT_SENDER_BALANCE (422): "), broke.stderr
    assert "request id: req_" in broke.stderr and "refused" not in broke.stdout, broke.stdout
    unknown = gasless("x402", "purchase", "--pem", str(pem), "--tier", "platinum", "--api", served.url)
    assert unknown.returncode == 2 and "no tier 'platinum'" in unknown.stderr, unknown.stderr
    assert unknown.stderr.startswith("refused: NOT_FOUND (404): "), unknown.stderr
