"""x402 end to end on localnet, driven by a payer built on the `x402` package's models and codecs
(gasless.client.x402): challenge -> sign the payment transaction once -> paid retry -> 200 with
PAYMENT-RESPONSE once the contract's event is mirrored; replays by payment id; polling."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from purchase_kit import fund, usdc_balance  # type: ignore[import-not-found]
from relay_kit import load_conftest  # type: ignore[import-not-found]
from x402.schemas import PaymentRequired

from gasless.client.keys import UserKey
from gasless.client.x402 import pay_header, read_challenge, read_settlement

relay_env = load_conftest("relay")
STARTER_PRICE = 9_000_000


def payer_of(sender: Any) -> UserKey:
    return UserKey(sender.key)


def challenge(env: Any, path: str, body: dict[str, Any]) -> tuple[PaymentRequired, Any]:
    answer = env.client.post(path, json=body)
    assert answer.status_code == 402, answer.text
    problem = answer.json()
    assert problem["code"] == "PAYMENT_REQUIRED" and answer.headers["content-type"].startswith(
        "application/problem+json"
    )
    assert answer.headers["Cache-Control"] == "no-store"
    return read_challenge(answer.headers), answer


def pay(env: Any, path: str, body: dict[str, Any], header: str, **headers: str) -> Any:
    return env.client.post(path, json=body, headers={"PAYMENT-SIGNATURE": header, **headers})


def credits_of(env: Any, address: str) -> int:
    view = env.client.get(f"/v1/account/{address}")
    return int(view.json()["creditsMicro"]) if view.status_code == 200 else 0


def test_discovery_and_supported_name_the_network_and_signers(env: Any) -> None:
    chain = env.settings.network.chain_id
    known = env.client.get("/.well-known/x402")
    assert known.status_code == 200, known.text
    doc = known.json()
    assert doc["x402Version"] == 2 and isinstance(doc["x402Version"], int)
    assert doc["networks"] == [f"mvx:{chain}"] and doc["assets"] == [env.settings.network.payment_token]
    assert {r["url"].rsplit("/", 1)[-1] for r in doc["resources"]} == {"topup", "purchase"}
    supported = env.client.get("/v1/x402/supported").json()
    assert supported["kinds"] == [{"x402Version": 2, "scheme": "exact", "network": f"mvx:{chain}"}]
    assert supported["extensions"] == ["payment-identifier"]
    relayers = {w.address.to_bech32() for w in env.localnet.net.genesis.relayers}
    assert supported["signers"]["mvx:*"] and set(supported["signers"]["mvx:*"]) <= relayers


def test_topup_end_to_end_then_replays_return_the_stored_result(env: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=50_000_000)
    body = {"payer": buyer.address, "amountMicroUsdc": 20_000_000}
    required, first = challenge(env, "/v1/x402/topup", body)
    assert required.x402_version == 2
    entry = required.accepts[0]
    chain = env.settings.network.chain_id
    assert entry.network == f"mvx:{chain}" and entry.asset == env.settings.network.payment_token
    assert entry.pay_to == env.contract and entry.amount == "20000000" and entry.max_timeout_seconds >= 110
    assert entry.extra["quoteMac"] and entry.extra["transaction"]["sender"] == buyer.address
    assert required.resource is not None and required.resource.url.endswith("/v1/x402/topup")
    assert required.extensions["payment-identifier"]["info"]["required"] is True
    assert first.json()["details"]["accepts"][0]["extra"]["quoteMac"] == entry.extra["quoteMac"]

    header, payment_id = pay_header(required, payer_of(buyer))
    paid = pay(env, "/v1/x402/topup", body, header)
    assert paid.status_code == 200, paid.text
    result = paid.json()
    assert result["status"] == "success" and result["paymentId"] == payment_id
    assert result["kind"] == "topup" and result["beneficiary"] == buyer.address
    assert result["amountMicroUsdc"] == "20000000" and result["quoteId"] == entry.extra["quoteId"]
    settlement = read_settlement(paid.headers)
    assert settlement.success is True and settlement.transaction == result["txHash"]
    assert settlement.payer == buyer.address and settlement.network == f"mvx:{chain}"
    assert usdc_balance(env, buyer.address) == 30_000_000
    intent = env.client.get(f"/v1/relay/{result['txHash']}").json()
    assert intent["outcome"] == "success" and intent["state"] in ("EXECUTED", "FINALIZED")
    assert credits_of(env, buyer.address) > 0

    # The same id and payload: the stored answer, nothing sent again.
    again = pay(env, "/v1/x402/topup", body, header)
    assert again.status_code == 200 and again.json() == result
    assert read_settlement(again.headers).transaction == result["txHash"]
    polled = env.client.get(f"/v1/x402/payments/{payment_id}")
    assert polled.status_code == 200 and polled.json() == result
    assert read_settlement(polled.headers).success is True
    assert usdc_balance(env, buyer.address) == 30_000_000

    # The same id with another payload (another challenge): PAYMENT_INVALID.
    required2, _ = challenge(env, "/v1/x402/topup", {**body, "amountMicroUsdc": 11_000_000})
    other, _ = pay_header(required2, payer_of(buyer), payment_id=payment_id)
    refused = pay(env, "/v1/x402/topup", {**body, "amountMicroUsdc": 11_000_000}, other)
    assert refused.status_code == 402 and refused.json()["code"] == "PAYMENT_INVALID"
    assert refused.json()["details"]["reason"] == "payment_id_reused"
    assert env.client.get("/v1/x402/payments/pay_unknown_0123456789").status_code == 404


def test_topup_for_a_beneficiary_executes_deposit_for(env: Any) -> None:
    buyer = env.new_sender(plan=False)
    friend = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=30_000_000)
    body = {"payer": buyer.address, "amountMicroUsdc": 10_000_000, "beneficiary": friend.address}
    required, _ = challenge(env, "/v1/x402/topup", body)
    assert required.accepts[0].extra["function"] == "depositFor"
    header, _ = pay_header(required, payer_of(buyer))
    paid = pay(env, "/v1/x402/topup", body, header)
    assert paid.status_code == 200, paid.text
    assert paid.json()["beneficiary"] == friend.address
    assert credits_of(env, friend.address) > 0


def test_purchase_end_to_end_then_a_transfer_is_billed_on_the_plan(env: Any) -> None:
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=50_000_000)
    starter = next(t for t in env.client.get("/v1/pricing").json()["tiers"] if t["name"] == "Starter")
    body = {"payer": buyer.address, "tierId": starter["id"], "months": 1}
    required, _ = challenge(env, "/v1/x402/purchase", body)
    entry = required.accepts[0]
    assert entry.amount == str(STARTER_PRICE) and entry.extra["function"] == "depositAndSubscribe"
    header, payment_id = pay_header(required, payer_of(buyer))
    paid = pay(env, "/v1/x402/purchase", body, header)
    assert paid.status_code == 200, paid.text
    result = paid.json()
    assert result["kind"] == "purchase" and result["tierId"] == starter["id"] and result["months"] == 1
    assert result["priceMicroUsdc"] == str(STARTER_PRICE)
    account = env.client.get(f"/v1/account/{buyer.address}").json()
    assert account["runningPlan"]["tierId"] == starter["id"]
    assert account["runningPlan"]["ref"] == entry.extra["quoteId"] == result["quoteId"]
    assert read_settlement(paid.headers).amount == str(STARTER_PRICE)

    buyer.nonce = 1
    assignment = env.assign(buyer)
    transfer = env.relay(env.build(buyer, assignment), assignment["lease"])
    assert transfer.status_code in (200, 202), transfer.text
    assert transfer.json()["billing"]["billingClass"] == "plan"


def test_past_the_budget_the_answer_is_202_then_200_by_polling(make_env: Any) -> None:
    env = make_env()
    env.client.app.state.host.x402.budget_ms = 0  # every completion is past the budget
    buyer = env.new_sender(plan=False)
    fund(env, buyer.address, usdc_micro=30_000_000)
    body = {"payer": buyer.address, "amountMicroUsdc": 10_000_000}
    required, _ = challenge(env, "/v1/x402/topup", body)
    header, payment_id = pay_header(required, payer_of(buyer))
    pending = pay(env, "/v1/x402/topup", body, header)
    assert pending.status_code == 202, pending.text
    assert pending.json()["status"] == "pending" and pending.json()["paymentId"] == payment_id
    assert pending.headers["Location"] == f"/v1/x402/payments/{payment_id}"
    assert "PAYMENT-RESPONSE" not in pending.headers
    deadline = time.monotonic() + 20
    while True:
        polled = env.client.get(f"/v1/x402/payments/{payment_id}")
        if polled.status_code == 200:
            break
        assert polled.status_code == 202 and polled.json()["status"] == "pending", polled.text
        assert time.monotonic() < deadline, "the payment never became final"
        time.sleep(0.1)
    assert polled.json()["status"] == "success"
    assert read_settlement(polled.headers).success is True


def test_no_entitlement_carries_a_complete_topup_challenge_for_the_sender(env: Any) -> None:
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code == 402 and answer.json()["code"] == "NO_ENTITLEMENT"
    required = read_challenge(answer.headers)
    entry = required.accepts[0]
    assert required.resource is not None and required.resource.url.endswith("/v1/x402/topup")
    assert entry.pay_to == env.contract and entry.max_timeout_seconds >= 110
    assert entry.extra["quoteMac"] and entry.extra["payer"] == sender.address
    assert entry.extra["beneficiary"] == sender.address and entry.network.startswith("mvx:")
    # The challenge verifies as this service's own quote: paid over the topup route, it is accepted.
    raw = json.loads(base64.b64decode(answer.headers["PAYMENT-REQUIRED"]))
    assert raw["accepts"][0]["payTo"] == env.contract


@pytest.mark.parametrize("kind", ["topup", "purchase"])
def test_an_unknown_payment_id_is_404_and_a_bad_one_400(env: Any, kind: str) -> None:
    assert env.client.get("/v1/x402/payments/pay_0000000000000000").status_code == 404
    short = env.client.get("/v1/x402/payments/short")
    assert short.status_code == 400 and short.json()["code"] == "MALFORMED_REQUEST"
