"""Every refusal of the subscribe and deposit builders through HTTP, with exact status, details and headers;
nothing is built then. And the credits path: deposit, then subscribe from credits."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from typing import Any

from purchase_kit import fund, relay_prepared  # type: ignore[import-not-found]

STARTER, GROWTH, ENTERPRISE, AGENT_METERED = 1, 3, 5, 8


def subscribe(env: Any, payer: str, tier: int, **extra: Any) -> Any:
    return env.client.post("/v1/subscribe/prepare", json={"payer": payer, "tierId": tier, **extra})


def deposit(env: Any, payer: str, amount: int, **extra: Any) -> Any:
    return env.client.post("/v1/deposit/prepare", json={"payer": payer, "amountMicroUsdc": amount, **extra})


def pause(env: Any, **flags: Any) -> None:
    body = json.dumps(flags).encode()
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/pause", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200


def eventually(request: Any, status: int, timeout: float = 10.0) -> Any:
    """The answer once it has `status` (the contract's pause views are cached for a second)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = request()
        if answer.status_code == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def relayed(env: Any, sender: Any, prepared: dict[str, Any]) -> dict[str, Any]:
    answer = relay_prepared(env, sender, prepared)
    assert answer.status_code in (200, 202), answer.text
    final = env.wait_state(answer.json()["txHash"], ("FINALIZED",))
    assert final["outcome"] == "success", final
    sender.nonce += 1
    return final


def test_deposit_then_subscribe_from_credits(env: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=20_000_000)
    prepared = deposit(env, buyer.address, 12_000_000)
    assert prepared.status_code == 200, prepared.text
    body = prepared.json()
    assert body["contractCall"]["function"] == "deposit" and body["contractCall"]["args"] == []
    assert body["contractCall"]["paymentAmount"] == "12000000" and body["free"] is True
    assert body["feeMicroUsdc"] == 0 and body["ru"] is None
    relayed(env, buyer, body)

    answer = subscribe(env, buyer.address, STARTER)
    assert answer.status_code == 200, answer.text
    purchase = answer.json()
    assert purchase["payWith"] == "credits" and purchase["contractCall"]["function"] == "subscribe"
    assert purchase["contractCall"]["paymentAmount"] is None and purchase["transaction"]["nonce"] == 1
    relayed(env, buyer, purchase)

    # Someone else's account: depositFor names the beneficiary.
    friend = env.new_sender(plan=False)
    gift = deposit(env, buyer.address, 2_000_000, beneficiary=friend.address).json()
    assert gift["contractCall"]["function"] == "depositFor"
    assert gift["contractCall"]["args"] == [friend.address]


def test_a_quote_lives_at_most_120_000_ms_from_its_issue(env: Any) -> None:
    """The interface contract's purchase quote validity is 120 000 ms: `expiresAtMs` is never further than that from the
    moment the quote was given, and a client keeps more than 110 000 ms of it."""
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=20_000_000)
    for _ in range(3):
        before = int(time.time() * 1000)
        quote = subscribe(env, buyer.address, STARTER).json()["quote"]
        after = int(time.time() * 1000)
        assert quote["expiresAtMs"] <= before + 120_000 + (after - before), quote
        assert quote["expiresAtMs"] - after > 110_000 - (after - before), quote


def test_same_inputs_in_one_bucket_give_the_same_quote(env: Any, problem: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=20_000_000)
    first, second = (subscribe(env, buyer.address, STARTER, months=2).json()["quote"] for _ in range(2))
    if first["bucket"] == second["bucket"]:  # a bucket turned over between them otherwise
        assert first == second
    other = subscribe(env, buyer.address, STARTER, months=2, payWith="usdc").json()
    assert other["quote"]["quoteId"] == first["quoteId"] or other["quote"]["bucket"] != first["bucket"]
    third = subscribe(env, buyer.address, STARTER, months=1).json()["quote"]
    assert third["quoteId"] != first["quoteId"] and third["priceMicroUsdc"] == "9000000"
    # What the wallet cannot pay is refused before anything is built.
    body = problem(subscribe(env, buyer.address, STARTER, months=3), "INSUFFICIENT_SENDER_BALANCE")
    assert body["details"] == {
        "token": env.settings.network.payment_token,
        "requiredMicroUsdc": 27_000_000,
        "heldMicroUsdc": 20_000_000,
    }


def test_plan_refusals(env: Any, problem: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=400_000_000)
    body = problem(subscribe(env, buyer.address, ENTERPRISE), "TIER_NOT_PURCHASABLE")
    assert body["details"] == {"tierId": ENTERPRISE}
    problem(subscribe(env, buyer.address, 999), "TIER_NOT_PURCHASABLE")
    body = problem(subscribe(env, buyer.address, STARTER, maxPriceMicroUsdc=8_999_999), "PRICE_ABOVE_MAX")
    assert body["details"] == {"priceMicroUsdc": 9_000_000, "maxPriceMicroUsdc": 8_999_999}

    # Credits only, with none: 402 with the x402 challenge of the same plan, for the payer.
    short = subscribe(env, buyer.address, STARTER, payWith="credits")
    body = problem(short, "INSUFFICIENT_CREDITS")
    assert body["details"] == {"creditsMicroUsdc": 0, "priceMicroUsdc": 9_000_000}
    required = json.loads(base64.b64decode(short.headers["PAYMENT-REQUIRED"]))
    assert required["x402Version"] == 2 and required["resource"]["url"].endswith("/v1/x402/purchase")
    entry = required["accepts"][0]
    assert entry["extra"]["payer"] == buyer.address and entry["extra"]["tierId"] == STARTER
    assert entry["amount"] == "9000000" and entry["payTo"] == env.contract and entry["extra"]["quoteMac"]

    # A Growth plan runs: a period-less tier cannot start now, a cheaper one queues once.
    env.owner("grant", [env_address(buyer), GROWTH, 1])
    body = problem(subscribe(env, buyer.address, AGENT_METERED), "DOWNGRADE_NOT_IMMEDIATE")
    assert body["details"]["runningTierId"] == GROWTH
    queued = subscribe(env, buyer.address, STARTER)
    assert queued.status_code == 200, queued.text
    relayed(env, buyer, queued.json())
    body = problem(subscribe(env, buyer.address, STARTER), "QUEUED_BLOCK_EXISTS")
    assert body["details"]["queuedTierId"] == STARTER
    # A more expensive tier is an upgrade: it starts now and credits the queued block back.
    upgrade = subscribe(env, buyer.address, 4)
    assert upgrade.status_code == 200, upgrade.text
    relayed(env, buyer, upgrade.json())
    env.wait_mirror()
    view = env.client.get(f"/v1/account/{buyer.address}").json()
    assert view["runningPlan"]["tierId"] == 4 and view["queuedPlan"] is None


def test_deposit_refusals(env: Any, problem: Any) -> None:
    payer = env.new_sender(plan=False)
    fund(env, payer.address, usdc_micro=20_000_000)
    body = problem(deposit(env, payer.address, 999_999), "DEPOSIT_BELOW_MIN")
    assert body["details"] == {"minMicroUsdc": 1_000_000, "amountMicroUsdc": 999_999}
    body = problem(deposit(env, payer.address, 10_000_000_001), "DEPOSIT_ABOVE_MAX")
    assert body["details"] == {"maxMicroUsdc": 10_000_000_000, "amountMicroUsdc": 10_000_000_001}
    problem(deposit(env, payer.address, 0), "MALFORMED_REQUEST")
    problem(deposit(env, "erd1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq", 5), "MALFORMED_REQUEST")
    # The rolling swap budget: 10 % of each deposit is swapped for gas; a budget below that share binds.
    env.owner("setSwapConfig", [1_000, 50_000])
    body = problem(deposit(env, payer.address, 1_000_000), "SWAP_BUDGET_EXHAUSTED")
    assert 0 < body["details"]["retryAfterMs"] <= 86_400_000
    assert int(deposit(env, payer.address, 1_000_000).headers["Retry-After"]) >= 1
    env.owner("setSwapConfig", [1_000, 0])  # 0: unlimited
    assert deposit(env, payer.address, 1_000_000).status_code == 200


def test_pauses_are_answered_before_anything_is_built_or_signed(env: Any, problem: Any) -> None:
    payer = env.new_sender(plan=False)
    fund(env, payer.address, usdc_micro=20_000_000)
    try:
        pause(env, venue=True)
        venue = eventually(lambda: deposit(env, payer.address, 2_000_000), 503)
        problem(venue, "SWAP_VENUE_PAUSED")
        problem(subscribe(env, payer.address, STARTER), "SWAP_VENUE_PAUSED")
        # A deposit prepared before the pause and relayed during it: refused before any co-signature.
        pause(env, venue=False)
        ready = eventually(lambda: deposit(env, payer.address, 2_000_000), 200).json()
        pause(env, venue=True)
        refused = eventually(lambda: relay_prepared(env, payer, ready), 503)
        problem(refused, "SWAP_VENUE_PAUSED")
        pause(env, venue=False)
        pause(env, contract={"depositsPaused": True})
        body = problem(eventually(lambda: deposit(env, payer.address, 2_000_000), 503), "CONTRACT_PAUSED")
        assert body["details"]["scope"] == "deposits"
        pause(env, contract={"depositsPaused": False, "paused": True})
        body = problem(eventually(lambda: subscribe(env, payer.address, STARTER), 503), "CONTRACT_PAUSED")
        assert body["details"]["scope"] == "global"
    finally:
        pause(env, venue=False, contract={"paused": False, "depositsPaused": False})
    env.wait_state(f"{payer.address}:0", ("REJECTED",))  # recorded after the answer, off its path
    nothing = env.client.get(f"/v1/intents/{payer.address}/0").json()
    assert nothing["state"] == "REJECTED"  # the refused relay was recorded, never sent


def env_address(sender: Any) -> Any:
    from gasless.chain.addresses import address_of

    return address_of(sender.key.generate_public_key().buffer)
