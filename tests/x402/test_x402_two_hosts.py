"""x402 across two real hosts (a and b) on one PostgreSQL and one Redis, with the interface contract's request limits:
a challenge minted on host a is paid on host b; the same payment id replayed to the other host returns the
stored result. The hosts run the interface contract's request limits (1 req/s per IP on the paid routes, one bucket in
Redis for both): the client paces itself by Retry-After."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import test_two_hosts  # type: ignore[import-not-found]
from test_two_hosts import Cluster, new_sender  # type: ignore[import-not-found]

from gasless.client.keys import UserKey
from gasless.client.x402 import pay_header, read_challenge, read_settlement

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
cluster = test_two_hosts.cluster  # the module-scoped fixture: this module gets its own two hosts


def fund(cluster: Cluster, address: str, usdc_micro: int) -> None:
    body = {"address": address, "usdcMicro": str(usdc_micro)}
    requests.post(f"{cluster.gateway}/localnet/faucet", json=body, timeout=5).raise_for_status()


def paced(send: Any, attempts: int = 20) -> requests.Response:
    """Send, honouring 429 + Retry-After (the x402 routes allow 1 request per second per IP)."""
    for _ in range(attempts):
        answer: requests.Response = send()
        if answer.status_code != 429:
            return answer
        assert answer.json()["code"] == "RATE_LIMITED" and answer.json()["details"]["scope"] in (
            "ip",
            "payer",
        )
        time.sleep(int(answer.headers["Retry-After"]))  # the server's own instruction
    raise AssertionError("still limited")


def test_a_challenge_from_a_is_paid_on_b_and_replayed_on_a(cluster: Cluster) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, address = new_sender(cluster, plan=False)
    fund(cluster, address, 30_000_000)
    body = {"payer": address, "amountMicroUsdc": 10_000_000}
    first = paced(lambda: a.post("/v1/x402/topup", body))
    assert first.status_code == 402, first.text
    required = read_challenge(first.headers)
    header, payment_id = pay_header(required, UserKey(key))

    paid = paced(lambda: b.post("/v1/x402/topup", body, headers={"PAYMENT-SIGNATURE": header}))
    assert paid.status_code in (200, 202), paid.text
    if paid.status_code == 202:  # past the 8 s budget on a loaded machine: poll

        def final() -> Any:
            answer = b.get(f"/v1/x402/payments/{payment_id}")
            return answer if answer.status_code == 200 else None

        deadline = time.monotonic() + 30
        while (answer := final()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        paid = answer
    result = paid.json()
    assert result["status"] == "success" and result["quoteId"] == required.accepts[0].extra["quoteId"]
    assert read_settlement(paid.headers).transaction == result["txHash"]

    # The same id and payload on the other host: the stored result, nothing sent twice.
    replay = paced(lambda: a.post("/v1/x402/topup", body, headers={"PAYMENT-SIGNATURE": header}))
    assert replay.status_code == 200 and replay.json() == result
    assert a.get(f"/v1/x402/payments/{payment_id}").json() == result
    submitted = cluster.submissions(result["txHash"])
    assert submitted >= 1
    assert requests.get(f"{cluster.gateway}/address/{address}/nonce", timeout=5).json()["data"]["nonce"] == 1


def test_a_subscribe_quote_is_the_same_on_both_hosts_in_one_bucket(cluster: Cluster) -> None:
    """Quotes are stateless MACs under the shared secret: the same inputs in one TTL bucket give the same
    quote id on a and b (nothing stored), and the quote b minted verifies on a (its x402 twin above)."""
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    _, address = new_sender(cluster, plan=False)
    fund(cluster, address, 30_000_000)
    body = {"payer": address, "tierId": 1, "months": 1}
    for _ in range(3):  # two answers straddle a bucket boundary at most once
        quotes = [paced(lambda h=h: h.post("/v1/subscribe/prepare", body)).json()["quote"] for h in (a, b)]
        if quotes[0]["bucket"] == quotes[1]["bucket"]:
            break
    assert quotes[0]["bucket"] == quotes[1]["bucket"]
    assert quotes[0]["quoteId"] == quotes[1]["quoteId"] and quotes[0]["quoteMac"] == quotes[1]["quoteMac"]
