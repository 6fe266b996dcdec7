"""Pay-as-you-go on the relay path through HTTP on a real localnet: the account's max_payg_price refuses a
dearer tariff (PAYG_PRICE_ABOVE_MAX), an empty escrow refuses at the commit point (QUOTA_EXHAUSTED,
PAYG_ESCROW, nothing sent), and a plan whose cap is spent falls back to pay-as-you-go the same way."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

from gasless.chain.addresses import address_of
from gasless.localnet.contracts.seed import SEED_RU_PRICE_MICRO
from gasless.localnet.owner import owner_call

M = 1_000_000
MONTH_MS = 2_592_000_000
PAYG_TIER = 8  # seed: "Agent Metered", a tier without period


def _addr(sender: Any) -> Any:
    return address_of(sender.key.generate_public_key().buffer)


def _user_call(env: Any, who: Any, function: str, args: list[Any]) -> None:
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/faucet",
        data=json.dumps({"address": who.address, "egldAtto": str(10**18)}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).read()
    wallet = SimpleNamespace(address=_addr(who), secret_key=who.key)
    asyncio.run(owner_call(env.localnet.url, wallet, env.contract, function, args))  # type: ignore[arg-type]
    who.nonce += 1  # the call used the account's next nonce


def _relay(env: Any, sender: Any) -> Any:
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    response = env.relay(tx, assignment["lease"])
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def _relay_until(env: Any, sender: Any, code: str, timeout: float = 10.0) -> Any:
    """Relay until the answer is `code` (the contract mirror caches an account's view for ~1 s)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = _relay(env, sender)
        if last.status_code >= 400 and last.json().get("code") == code:
            return last
        time.sleep(1.1)  # the per-sender assignment limit and the ~1 s account cache
    raise AssertionError(f"never {code}: {last.text if last is not None else None}")


def test_payg_price_above_max_then_empty_escrow(env: Any, problem: Any) -> None:
    account = env.new_sender(plan=False)
    env.owner("grant", [_addr(account), PAYG_TIER, 1])
    _user_call(env, account, "setPayg", [True, 0, False, SEED_RU_PRICE_MICRO - 1])
    refused = _relay_until(env, account, "PAYG_PRICE_ABOVE_MAX")
    # Purchase group: 409, not retryable; checked here as the error catalogue (docs/errors.json) states it.
    body = refused.json()
    assert refused.status_code == 409 and body["code"] == "PAYG_PRICE_ABOVE_MAX" and body["status"] == 409
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert body["details"] == {
        "priceMicro": SEED_RU_PRICE_MICRO,
        "maxPaygPriceMicro": SEED_RU_PRICE_MICRO - 1,
    }

    # A max at the tariff admits the price; the escrow (0) cannot cover it: refused at the commit point.
    _user_call(env, account, "setPayg", [True, 0, False, SEED_RU_PRICE_MICRO])
    empty = _relay_until(env, account, "QUOTA_EXHAUSTED")
    body = problem(empty, "QUOTA_EXHAUSTED")
    # What the account holds and the one command that lets it relay (docs/billing.md).
    command = "gasless x402 topup --pem <wallet.pem> --amount 1 --to-escrow"
    assert body["details"] == {
        "reason": "PAYG_ESCROW",
        "account": account.address,
        "runningPlan": "Agent Metered",
        "creditsMicro": 0,
        "escrowMicro": 0,
        "nextCommand": command,
    }
    assert (
        "a running Agent Metered plan, 0 USDC of credits and 0 USDC in the pay-as-you-go escrow"
        in (body["detail"])
        and f"`{command}`" in body["detail"]
    ), body["detail"]
    assert "Retry-After" not in empty.headers


def test_spent_plan_falls_back_to_payg_which_needs_escrow(env: Any, problem: Any) -> None:
    env.owner("setTier", [31, b"T31", "Human", 3, 1 * M, 1, MONTH_MS, True, False])
    account = env.new_sender(plan=False)
    env.owner("grant", [_addr(account), 31, 1])
    first = _relay(env, account)
    assert first.status_code in (200, 202), first.text
    assert first.json()["billing"]["billingClass"] == "plan"
    env.wait_state(first.json()["id"], ("EXECUTED", "FINALIZED"))  # its nonce is spent before ours
    spent = _relay(env, account)
    assert problem(spent, "QUOTA_EXHAUSTED")["details"]["reason"] == "PLAN_CAP"
    # With pay-as-you-go on, the spent plan falls back to it; an empty escrow still refuses.
    _user_call(env, account, "setPayg", [True, 0, False, 0])
    deadline = time.monotonic() + 10
    while True:
        refused = _relay(env, account)
        reason = refused.json().get("details", {}).get("reason")
        if reason == "PAYG_ESCROW" or time.monotonic() > deadline:
            break
        time.sleep(1.1)  # the per-sender assignment limit and the ~1 s account cache
    body = problem(refused, "QUOTA_EXHAUSTED")
    assert body["details"]["reason"] == "PAYG_ESCROW" and body["details"]["account"] == account.address
    assert body["detail"].startswith("the plan's RU for this period are used up and pay-as-you-go"), body
