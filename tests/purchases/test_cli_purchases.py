"""`gasless pricing | buy | deposit | flags | senders` end to end: subprocesses against an API served by
uvicorn on localnet (the README quickstart's commands), each transaction signed once and followed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from purchase_kit import fund  # type: ignore[import-not-found]
from test_cli_relay import gasless, write_pem  # type: ignore[import-not-found]
from test_client_flow import Served, key_in_shard, start_served  # type: ignore[import-not-found]


@pytest.fixture
def served(make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any) -> Iterator[Served]:
    running = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    yield running
    running.server.stop()


async def test_quickstart_buy_then_relay_and_the_account_commands(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1, plan=False)
    fund(served, key.address, usdc_micro=60_000_000)
    pem = write_pem(key, tmp_path / "user.pem")
    api = ["--api", served.url]

    prices = gasless("pricing", *api)
    assert prices.returncode == 0 and "Starter" in prices.stdout and "30 days" in prices.stdout, prices.stdout
    document = json.loads(gasless("pricing", "--json", *api).stdout)
    assert document["schemaVersion"] == "pricing-v1"

    bought = gasless("buy", "--pem", str(pem), "--tier", "Starter", *api)
    assert bought.returncode == 0, bought.stdout + bought.stderr
    assert "depositAndSubscribe: FINALIZED outcome=success" in bought.stdout and "Starter" in bought.stdout
    account = requests.get(f"{served.url}/v1/account/{key.address}", timeout=10).json()
    assert account["runningPlan"]["tierName"] == "Starter" and account["runningPlan"]["ref"] in bought.stdout

    receiver = key_in_shard(1).address
    sent = gasless("relay", "send", "--pem", str(pem), "--to", receiver, "--gateway", served.gateway, *api)
    assert sent.returncode == 0 and "FINALIZED outcome=success" in sent.stdout, sent.stdout + sent.stderr

    deposited = gasless("deposit", "--pem", str(pem), "--amount", "10", *api)
    assert deposited.returncode == 0 and "credits 10.000000 USDC" in deposited.stdout, deposited.stdout

    changed = gasless("flags", "--pem", str(pem), "--auto-renew", "--payg", "--payg-budget", "2", *api)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert (
        "setAutoRenew: FINALIZED" in changed.stdout
        and "setPayg(True, 2000000, False, 0): free" in changed.stdout
    )

    helper = key_in_shard(1).address
    added = gasless("senders", "add", "--pem", str(pem), helper, *api)
    assert added.returncode == 0 and "addSenders: FINALIZED" in added.stdout, added.stdout + added.stderr
    assert "fee ceiling" in added.stdout and "RU on plan" in added.stdout
    removed = gasless("senders", "remove", "--pem", str(pem), helper, *api)
    assert removed.returncode == 0 and "removeSenders: relayed (free)" in removed.stdout, removed.stdout


async def test_refusals_exit_2_with_the_code(served: Served, tmp_path: Path) -> None:
    key = await served.new_sender(1, plan=False)  # no USDC, no account
    pem = write_pem(key, tmp_path / "user.pem")
    broke = gasless("buy", "--pem", str(pem), "--tier", "Starter", "--api", served.url)
    assert broke.returncode == 2 and "INSUFFICIENT_SENDER_BALANCE" in broke.stderr, broke.stderr
    no_account = gasless("flags", "--pem", str(pem), "--auto-renew", "--api", served.url)
    assert no_account.returncode == 2 and "NO_ENTITLEMENT" in no_account.stderr, no_account.stderr
    unknown = gasless("buy", "--pem", str(pem), "--tier", "Platinum", "--api", served.url)
    assert unknown.returncode == 2 and "no tier 'Platinum'" in unknown.stderr, unknown.stderr
