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
    assert deposited.returncode == 0 and "credits 10 USDC" in deposited.stdout, deposited.stdout

    changed = gasless("flags", "--pem", str(pem), "--auto-renew", "--payg", "--payg-budget", "2", *api)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert (
        "setAutoRenew: FINALIZED" in changed.stdout
        and "setPayg(true, 2000000, false, 0): free" in changed.stdout  # JSON's spelling, not Python's
        and "moves 2 USDC of credits into the escrow" in changed.stdout
    ), changed.stdout

    # `flags` changes only what it is given: auto top-up on keeps pay-as-you-go on and auto-renew; a
    # budget later keeps auto top-up on (nothing moves to escrow without --payg-budget).
    topup = gasless("flags", "--pem", str(pem), "--payg-auto-topup", *api)
    assert topup.returncode == 0 and "setPayg(true, 0, true, 0): free" in topup.stdout, topup.stdout
    assert "setAutoRenew" not in topup.stdout and "moves no credits" in topup.stdout, topup.stdout
    budget = gasless("flags", "--pem", str(pem), "--payg", "--payg-budget", "1", *api)
    assert budget.returncode == 0 and "setPayg(true, 1000000, true, 0): free" in budget.stdout, budget.stdout
    account = requests.get(f"{served.url}/v1/account/{key.address}", timeout=10).json()
    assert account["autoRenew"] is True and account["escrowMicro"] == 3_000_000, account
    assert account["payg"] == {
        "enabled": True,
        "budgetMicro": 1_000_000,
        "autoTopup": True,
        "maxPaygPriceMicro": 0,
    }, account

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
    # The one form every command prints a refusal in, on stderr; amounts in USDC as the user typed them.
    assert broke.stderr.startswith("refused: INSUFFICIENT_SENDER_BALANCE (422): "), broke.stderr
    assert "request id: req_" in broke.stderr and broke.stdout == "", broke.stdout
    small = gasless("deposit", "--pem", str(pem), "--amount", "0.5", "--api", served.url)
    assert small.returncode == 2 and small.stderr.startswith("refused: DEPOSIT_BELOW_MIN (422): "), (
        small.stderr
    )
    assert "a deposit is at least 1 USDC" in small.stderr and "this one is 0.5 USDC" in small.stderr
    no_account = gasless("flags", "--pem", str(pem), "--auto-renew", "--api", served.url)
    assert no_account.returncode == 2 and "NO_ENTITLEMENT" in no_account.stderr, no_account.stderr
    unknown = gasless("buy", "--pem", str(pem), "--tier", "Platinum", "--api", served.url)
    assert unknown.returncode == 2 and "no tier 'Platinum'" in unknown.stderr, unknown.stderr


async def test_credits_reach_a_relay_through_the_escrow(served: Served, tmp_path: Path) -> None:
    """Credits alone do not pay for relays: the deposit says so with the command, the refused relay says what
    the account holds and the same command, and `deposit --to-escrow` lets the next relay through."""
    key = await served.new_sender(1, plan=False)
    fund(served, key.address, usdc_micro=20_000_000)
    pem = write_pem(key, tmp_path / "user.pem")
    api = ["--api", served.url]
    send = ["relay", "send", "--pem", str(pem), "--to", key_in_shard(1).address, *api]

    deposited = gasless("deposit", "--pem", str(pem), "--amount", "3", *api)
    assert deposited.returncode == 0, deposited.stdout + deposited.stderr
    command = f"gasless flags --pem {pem} --payg --payg-budget 3"
    assert command in deposited.stdout, deposited.stdout

    refused = gasless(*send)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    first = refused.stderr.splitlines()[0]
    assert first.startswith("refused: NO_ENTITLEMENT (402): "), refused.stderr
    assert f"{key.address} has no running plan, 3 USDC of credits and 0 USDC in the pay-as-you-go" in first
    assert "`gasless flags --pem <wallet.pem> --payg --payg-budget 3`" in first, first
    assert "regist" not in first.lower(), first

    moved = gasless("deposit", "--pem", str(pem), "--amount", "2", "--to-escrow", *api)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "setPayg(true, 2000000, false, 0): free" in moved.stdout, moved.stdout
    account = requests.get(f"{served.url}/v1/account/{key.address}", timeout=10).json()
    assert account["escrowMicro"] == 2_000_000 and account["creditsMicro"] == 3_000_000, account

    sent = gasless(*send)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "billing=payg (1 RU)" in sent.stdout and "FINALIZED outcome=success" in sent.stdout, sent.stdout
