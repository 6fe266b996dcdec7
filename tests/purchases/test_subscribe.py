"""From a wallet holding only USDC to a relayed transaction with no operator: pricing, subscribe/prepare, sign
once, relay (free), the plan mirrored, a transfer billed on it, the quota showing it."""

from __future__ import annotations

import time
from typing import Any

from purchase_kit import fund, relay_prepared, usdc_balance  # type: ignore[import-not-found]

STARTER_PRICE = 9_000_000


def wait_for(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)


def test_a_wallet_with_only_usdc_buys_a_plan_then_relays_on_it(env: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=50_000_000)
    pricing = env.client.get("/v1/pricing").json()
    starter = next(t for t in pricing["tiers"] if t["name"] == "Starter")

    answer = env.client.post(
        "/v1/subscribe/prepare", json={"payer": buyer.address, "tierId": starter["id"], "months": 1}
    )
    assert answer.status_code == 200, answer.text
    prepared = answer.json()
    quote = prepared["quote"]
    assert quote["priceMicroUsdc"] == quote["maxPrice"] == starter["priceMicroUsdc"]
    assert quote["payer"] == buyer.address and quote["expiresAtMs"] - int(time.time() * 1000) >= 110_000
    call = prepared["contractCall"]
    assert call["function"] == "depositAndSubscribe" and prepared["payWith"] == "usdc"
    assert call["args"] == [starter["id"], 1, starter["priceMicroUsdc"], quote["quoteId"]]
    assert call["paymentAmount"] == starter["priceMicroUsdc"] and prepared["free"] is True
    assert prepared["assignment"]["kind"] == "free" and prepared["assignment"]["pinNonce"] == 0
    tx = prepared["transaction"]
    assert tx["sender"] == buyer.address and tx["receiver"] == env.contract and tx["nonce"] == 0

    relayed = relay_prepared(env, buyer, prepared)
    assert relayed.status_code in (200, 202), relayed.text
    assert relayed.json()["billing"]["free"] is True
    final = env.wait_state(relayed.json()["txHash"], ("FINALIZED",))
    assert final["outcome"] == "success", final
    assert usdc_balance(env, buyer.address) == 50_000_000 - STARTER_PRICE

    # The plan is mirrored: the account view shows the running block with the quote as its ref.
    def subscribed() -> Any:
        view = env.client.get(f"/v1/account/{buyer.address}")
        return view.json() if view.status_code == 200 and view.json().get("runningPlan") else None

    account = wait_for(subscribed, "the subscription mirrored")
    assert account["runningPlan"]["tierId"] == starter["id"]
    assert account["runningPlan"]["ref"] == quote["quoteId"]  # the quote id is the contract ref

    # A transfer now relays billed on the new plan, and the quota shows it.
    buyer.nonce = 1
    assignment = env.assign(buyer)
    transfer = env.relay(env.build(buyer, assignment), assignment["lease"])
    assert transfer.status_code in (200, 202), transfer.text
    billing = transfer.json()["billing"]
    assert billing["billingClass"] == "plan" and billing["account"] == buyer.address and billing["ru"] == 1
    env.wait_state(transfer.json()["txHash"], ("FINALIZED",))
    quota = wait_for(
        lambda: (q := env.client.get(f"/v1/account/{buyer.address}/quota").json()).get("usedRu") and q,
        "the quota counting the relay",
    )
    assert quota["usedRu"] == 1, quota
