"""Paying with credits, through HTTP on a real localnet: credits pay for relays only through the
pay-as-you-go escrow (or, with auto top-up, as the escrow's refill). Each refusal on this path says what the
account holds (plan, credits, escrow) and the one command that lets it relay, in `detail` and in `details`
(`reason` as the catalogue requires); none uses a word a starter-kit client reads as a command."""

from __future__ import annotations

import time
from typing import Any

from billing_paths_kit import (
    USDC,
    contract_data,
    faucet,
    relay_contract_call,
    relay_data,
    relay_transfer,
    wait_final,
)

from gasless.localnet.contracts.seed import SEED_RU_PRICE_MICRO


def _transfer_until(env: Any, sender: Any, done: Any, timeout: float = 10.0) -> Any:
    """Relay a transfer until `done(response)`: the contract mirror's account view lags a final event by up
    to its ~1 s cache, and a sender is assigned about once a second."""
    deadline = time.monotonic() + timeout
    while True:
        answer = relay_transfer(env, sender)
        if done(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(1.1)


def _reason(answer: Any) -> str | None:
    return answer.json().get("details", {}).get("reason") if answer.status_code >= 400 else None


def _no_command_words(detail: str) -> None:
    assert "regist" not in detail.lower(), detail


def test_credits_relay_only_through_the_escrow_and_every_refusal_says_how(env: Any, problem: Any) -> None:
    account = env.new_sender(plan=False)
    faucet(env, account.address, usdc_micro=20 * USDC)
    token = env.localnet.net.info["paymentToken"].encode()
    wait_final(env, relay_data(env, account, contract_data("ESDTTransfer", token, 10 * USDC, b"deposit")))

    # Credits and nothing else: 402 NO_ENTITLEMENT (NO_PLAN), with the holdings and the command.
    refused = _transfer_until(env, account, lambda a: _reason(a) == "NO_PLAN")
    body = problem(refused, "NO_ENTITLEMENT")
    command = "gasless flags --pem <wallet.pem> --payg --payg-budget 10"
    assert body["details"] == {
        "reason": "NO_PLAN",
        "account": account.address,
        "runningPlan": None,
        "creditsMicro": 10 * USDC,
        "escrowMicro": 0,
        "nextCommand": command,
    }, body
    holds = (
        f"{account.address} has no running plan, 10 USDC of credits and 0 USDC in the pay-as-you-go escrow "
        "(pay-as-you-go off)"
    )
    assert body["detail"].startswith(holds) and f"run `{command}`" in body["detail"], body["detail"]
    assert "PAYMENT-REQUIRED" in refused.headers
    _no_command_words(body["detail"])

    # Auto top-up: pay-as-you-go draws on the credits, nothing moved to escrow first.
    wait_final(env, relay_contract_call(env, account, "setPayg", 1, 0, 1, 0))
    paid = _transfer_until(env, account, lambda a: a.status_code in (200, 202))
    assert paid.status_code in (200, 202), paid.text
    assert paid.json()["billing"]["billingClass"] == "payg", paid.text
    wait_final(env, paid)

    # A budget below the price (1 micro-USDC moved to escrow, no auto top-up): refused at the commit
    # point, with what is left to spend, the holdings, and the command that moves the credits.
    wait_final(env, relay_contract_call(env, account, "setPayg", 1, 1, 0, 0))
    short = _transfer_until(env, account, lambda a: _reason(a) == "PAYG_ESCROW")
    body = problem(short, "QUOTA_EXHAUSTED")
    details = body["details"]
    assert details["reason"] == "PAYG_ESCROW" and details["account"] == account.address, body
    assert details["escrowMicro"] == 1 and details["runningPlan"] is None, body
    credits = details["creditsMicro"]
    assert 0 < credits < 10 * USDC, body
    assert details["nextCommand"].startswith("gasless flags --pem <wallet.pem> --payg --payg-budget "), body
    assert body["detail"].startswith("pay-as-you-go cannot pay for this relay: it has 0 USDC left"), body
    assert f"the relay costs {SEED_RU_PRICE_MICRO / USDC:g} USDC" in body["detail"], body["detail"]
    assert (
        "the plan is spent" not in body["detail"] and "(pay-as-you-go on, auto top-up off)" in body["detail"]
    )
    _no_command_words(body["detail"])


def test_an_address_with_nothing_is_told_the_one_command(env: Any, problem: Any) -> None:
    nobody = env.new_sender(plan=False)
    refused = relay_transfer(env, nobody)
    body = problem(refused, "NO_ENTITLEMENT")
    command = "gasless x402 topup --pem <wallet.pem> --amount 1 --to-escrow"
    assert body["details"] == {
        "reason": "NO_ACCOUNT",
        "account": nobody.address,
        "runningPlan": None,
        "creditsMicro": 0,
        "escrowMicro": 0,
        "nextCommand": command,
    }, body
    assert body["detail"].startswith(f"{nobody.address} has no account in the contract"), body["detail"]
    assert f"run `{command}`" in body["detail"], body["detail"]
    _no_command_words(body["detail"])
