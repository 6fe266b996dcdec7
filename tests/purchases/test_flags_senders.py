"""The flags and senders builders through HTTP on localnet, signed once and relayed: free flag calls (10 per
24 h, counting flag calls only), the 11th billed with `free: false`; several changes in one request; the
refusals (NO_ENTITLEMENT/NO_ACCOUNT, RENEW_NOT_APPLICABLE, CONTRACT_PAUSED); addSenders billed with its fee
ceiling, then the added sender relays on the account; a fee raised above the ceiling before execution is
reported as PRICE_ABOVE_MAX on the intent and its usage row; removeSenders free."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from purchase_kit import fund, relay_prepared  # type: ignore[import-not-found]
from test_prepare_refusals import eventually, pause  # type: ignore[import-not-found]

from gasless.billing.schedule import ru_for_gas_limit
from gasless.client.native_auth import make_native_auth_token

SENDER_FEE_NOTICE_MS = 172_800_000


def flags(env: Any, address: str, **changes: Any) -> Any:
    return env.client.post("/v1/flags/prepare", json={"address": address, **changes})


def senders(env: Any, account: str, **change: Any) -> Any:
    return env.client.post("/v1/senders/prepare", json={"account": account, **change})


def relayed_one(env: Any, sender: Any, prepared: dict[str, Any], lease: str | None = None) -> dict[str, Any]:
    answer = relay_prepared(env, sender, prepared, lease)
    assert answer.status_code in (200, 202), answer.text
    final = env.wait_state(answer.json()["txHash"], ("FINALIZED",))
    return {"relay": answer.json(), "final": final}


def usage_row(env: Any, owner: Any, tx_hash: str) -> dict[str, Any]:
    """`GET /v1/usage/{txHash}` as the account's owner (native-auth) sees it, once the row exists. A token
    is made on the newest block each time: after a test moved the chain's clock and back, the service's
    record of recent blocks can refuse a block for a moment (401 TOKEN_INVALID), until newer blocks come."""
    deadline = time.monotonic() + 15
    while True:
        block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
        token = make_native_auth_token(
            owner.key, origin=env.settings.network.app_origin, block_hash=block, ttl_seconds=600
        )
        answer = env.client.get(f"/v1/usage/{tx_hash}", headers={"Authorization": f"Bearer {token}"})
        if answer.status_code == 200:
            return answer.json()  # type: ignore[no-any-return]
        waiting = answer.status_code == 404 or answer.json().get("code") in ("TOKEN_INVALID", "TOKEN_EXPIRED")
        assert waiting and time.monotonic() < deadline, answer.text
        time.sleep(0.05)


def deposit_credits(env: Any, sender: Any, amount: int) -> None:
    fund(env, sender.address, usdc_micro=amount)
    prepared = env.client.post(
        "/v1/deposit/prepare", json={"payer": sender.address, "amountMicroUsdc": amount}
    )
    assert prepared.status_code == 200, prepared.text
    done = relayed_one(env, sender, prepared.json())
    assert done["final"]["outcome"] == "success"
    sender.nonce += 1


def test_ten_free_flag_calls_then_the_eleventh_is_billed(env: Any) -> None:
    account = env.new_sender()  # a granted plan: the account can be billed
    deposit_credits(env, account, 5_000_000)  # a free deposit: not a flag call, not counted
    for index in range(10):
        answer = flags(env, account.address, autoRenew=index % 2 == 0)
        assert answer.status_code == 200, answer.text
        one = answer.json()["transactions"][0]
        assert one["free"] is True and one["ru"] is None and one["contractCall"]["function"] == "setAutoRenew"
        assert one["transaction"]["nonce"] == account.nonce
        done = relayed_one(env, account, one)
        assert done["relay"]["billing"]["free"] is True and done["final"]["outcome"] == "success"
        account.nonce += 1
    eleventh = flags(env, account.address, autoRenew=True)
    assert eleventh.status_code == 200, eleventh.text
    one = eleventh.json()["transactions"][0]
    assert one["free"] is False and one["ru"] == ru_for_gas_limit(one["transaction"]["gasLimit"])
    assert eleventh.json()["assignment"]["kind"] == "std"
    done = relayed_one(env, account, one)
    billing = done["relay"]["billing"]
    assert billing["free"] is False and billing["billingClass"] == "plan" and billing["ru"] == one["ru"]
    row = usage_row(env, account, done["relay"]["txHash"])
    assert row["billed"] and row["function"] == "setAutoRenew" and row["ru"] == one["ru"]


def test_past_the_free_flag_calls_an_account_that_cannot_be_billed_is_rate_limited(
    env: Any, problem: Any
) -> None:
    """Purchase builders, flags rule: an address that cannot be billed gets 429 RATE_LIMITED with
    `scope: free_flow` from the builder (retryable: the same request passes once its oldest free call leaves
    the 24 h window), instead of a `free: false` transaction the relay would then bar."""
    account = env.new_sender(plan=False)
    deposit_credits(env, account, 5_000_000)  # an account with credits, no plan, no pay-as-you-go
    for index in range(10):
        one = flags(env, account.address, autoRenew=index % 2 == 0).json()["transactions"][0]
        assert one["free"] is True
        relayed_one(env, account, one)
        account.nonce += 1
    refused = problem(flags(env, account.address, autoRenew=True), "RATE_LIMITED")
    assert refused["details"]["scope"] == "free_flow", refused
    # The oldest of the ten leaves its 24 h window then: within a day, and not before the next minutes.
    assert 23 * 3_600_000 < refused["details"]["retryAfterMs"] <= 24 * 3_600_000, refused


def test_several_changes_in_order_at_consecutive_nonces(env: Any) -> None:
    account = env.new_sender()
    deposit_credits(env, account, 5_000_000)
    answer = flags(
        env,
        account.address,
        autoRenew=True,
        payg={
            "enabled": True,
            "budgetMicroUsdc": 2_000_000,
            "autoTopup": False,
            "maxPaygPriceMicroUsdc": 300,
        },
        releaseEscrow=True,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    calls = [t["contractCall"] for t in body["transactions"]]
    assert [c["function"] for c in calls] == ["setAutoRenew", "setPayg", "releaseEscrow"]
    assert calls[1]["args"] == [True, "2000000", False, "300"]  # enabled, budget, auto_topup, max_payg_price
    assert [t["transaction"]["nonce"] for t in body["transactions"]] == [account.nonce + i for i in range(3)]
    assert all(t["assignment"] == body["assignment"] for t in body["transactions"])
    assert body["assignment"]["pinNonce"] is None and body["assignment"]["kind"] == "free"
    for one in body["transactions"]:  # one free transaction in flight per sender: in turn
        done = relayed_one(env, account, one, body["assignment"]["lease"])
        assert done["final"]["outcome"] == "success" and done["relay"]["billing"]["free"] is True
    view = env.client.get(f"/v1/account/{account.address}").json()
    assert view["autoRenew"] is True and view["payg"]["enabled"] is True


def test_flag_refusals(env: Any, problem: Any) -> None:
    stranger = env.new_sender(plan=False)
    body = problem(flags(env, stranger.address, autoRenew=True), "NO_ENTITLEMENT")
    assert body["details"]["reason"] == "NO_ACCOUNT"
    no_account = flags(env, stranger.address, autoRenew=True)
    required = json.loads(base64.b64decode(no_account.headers["PAYMENT-REQUIRED"]))
    assert required["accepts"][0]["extra"]["payer"] == stranger.address
    assert required["resource"]["url"].endswith("/v1/x402/topup")
    problem(flags(env, stranger.address), "MALFORMED_REQUEST")

    account = env.new_sender()  # a month of plan left, auto-renew off: renewing now does nothing
    body = problem(flags(env, account.address, renew=True), "RENEW_NOT_APPLICABLE")
    assert body["details"]["predictedOutcome"] in ("auto_renew_off", "not_due")
    other = env.new_sender()
    body = problem(flags(env, account.address, renewFor=other.address), "RENEW_NOT_APPLICABLE")
    assert body["details"]["account"] == other.address

    try:
        pause(env, contract={"paused": True})
        body = problem(
            eventually(lambda: flags(env, account.address, autoRenew=True), 503), "CONTRACT_PAUSED"
        )
        assert body["details"]["scope"] == "global"
        problem(senders(env, account.address, add=[other.address]), "CONTRACT_PAUSED")
    finally:
        pause(env, contract={"paused": False})


def test_add_senders_billed_with_the_fee_ceiling_then_the_sender_relays_on_the_account(env: Any) -> None:
    account = env.new_sender()
    deposit_credits(env, account, 20_000_000)
    helper = env.new_sender(plan=False)
    pricing = env.client.get("/v1/pricing").json()
    answer = senders(env, account.address, add=[helper.address])
    assert answer.status_code == 200, answer.text
    one = answer.json()
    call = one["contractCall"]
    assert call["function"] == "addSenders" and call["args"][1:] == [helper.address]
    assert one["free"] is False and one["ru"] == ru_for_gas_limit(one["transaction"]["gasLimit"])
    assert one["feeMicroUsdc"] == int(call["args"][0]) > 0
    assert one["feeMicroUsdc"] == int(pricing["senderFee"]["microUsdc"])
    done = relayed_one(env, account, one)
    assert done["final"]["outcome"] == "success"
    assert done["relay"]["billing"]["free"] is False and done["relay"]["billing"]["billingClass"] == "plan"
    account.nonce += 1

    # The added sender relays a transfer, billed on the account.
    def listed() -> bool:
        page = env.client.get(f"/v1/account/{account.address}/senders")
        return page.status_code == 200 and helper.address in json.dumps(page.json())

    deadline = time.monotonic() + 15
    while not listed():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assignment = env.assign(helper)
    transfer = env.relay(env.build(helper, assignment), assignment["lease"])
    assert transfer.status_code in (200, 202), transfer.text
    assert transfer.json()["billing"]["account"] == account.address

    # removeSenders is free.
    removal = senders(env, account.address, remove=[helper.address])
    assert removal.status_code == 200, removal.text
    assert removal.json()["free"] is True and removal.json()["feeMicroUsdc"] == 0
    assert removal.json()["contractCall"]["function"] == "removeSenders"
    done = relayed_one(env, account, removal.json())
    assert done["final"]["outcome"] == "success" and done["relay"]["billing"]["free"] is True


def test_a_fee_raised_above_the_ceiling_before_execution_is_price_above_max(env: Any, problem: Any) -> None:
    account = env.new_sender()
    deposit_credits(env, account, 50_000_000)
    helper = env.new_sender(plan=False)
    prepared = senders(env, account.address, add=[helper.address]).json()
    ceiling = prepared["feeMicroUsdc"]
    fee_before = env.client.get("/v1/pricing").json()["senderFee"]
    assert ceiling == int(fee_before["microUsdc"])  # one new sender at the fee in force
    # The owner raises the per-sender fee: it takes effect after the notice, and is not shown before.
    env.owner("setSenderFeeRu", [int(fee_before["ru"]) * 10])
    assert senders(env, account.address, add=[helper.address]).json()["feeMicroUsdc"] == ceiling
    env.faults(chain={"stalledShards": [account.shard]})
    try:
        answer = relay_prepared(env, account, prepared)
        assert answer.status_code in (200, 202), answer.text
        env.faults(chain={"clockOffsetMs": SENDER_FEE_NOTICE_MS + 60_000})
    finally:
        env.faults(chain={"stalledShards": []})
    try:
        final = env.wait_state(answer.json()["txHash"], ("EXECUTED", "FINALIZED"), timeout=30)
    finally:
        env.faults(chain={"clockOffsetMs": 0})
    assert final["outcome"] == "fail", final
    assert final["failure"] == {"code": "PRICE_ABOVE_MAX", "message": "ERR_PRICE_ABOVE_MAX"}
    row = usage_row(env, account, answer.json()["txHash"])
    assert row["status"] == "failed" and row["failureCode"] == "PRICE_ABOVE_MAX" and row["billed"] is True
