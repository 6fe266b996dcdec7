"""The payment record is written before anything is co-signed: with the database unreachable between the
challenge and the payment, the paid retry is 503 UPSTREAM_UNAVAILABLE and nothing reaches the chain; once
the database is back, the same payment (same id) goes through once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from purchase_kit import fund  # type: ignore[import-not-found]
from relay_kit import load_conftest  # type: ignore[import-not-found]
from tcp_proxy import TcpProxy  # type: ignore[import-not-found]

from gasless.chain.codec import tx_from_wire
from gasless.client.keys import UserKey
from gasless.client.x402 import pay_header, read_challenge, signed_payment

relay_env = load_conftest("relay")
pytestmark = pytest.mark.postgres


@pytest.fixture
def proxied_postgres(postgres_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """The test's own database behind a proxy the test can cut (torn down after the app using it)."""
    parts = urlsplit(postgres_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy.start()
    try:
        yield postgres_url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}", 1), proxy
    finally:
        proxy.close()


def test_database_down_between_challenge_and_payment(
    proxied_postgres: tuple[str, TcpProxy], make_env: Any
) -> None:
    url, proxy = proxied_postgres
    env = make_env(database_url=url)
    payer = env.new_sender(plan=False)
    fund(env, payer.address, usdc_micro=30_000_000)
    body = {"payer": payer.address, "amountMicroUsdc": 10_000_000}
    challenge = env.client.post("/v1/x402/topup", json=body)
    assert challenge.status_code == 402, challenge.text
    required = read_challenge(challenge.headers)
    payment = signed_payment(required, UserKey(payer.key))
    header, payment_id = pay_header(required, UserKey(payer.key), transaction=payment)

    proxy.stop()
    down = env.client.post("/v1/x402/topup", json=body, headers={"PAYMENT-SIGNATURE": header})
    problem = relay_env.check_problem(down, "UPSTREAM_UNAVAILABLE")
    assert problem["details"]["retryAfterMs"] >= 1 and int(down.headers["Retry-After"]) >= 1
    # Nothing reached the chain: no nonce used, nothing pooled, the co-signed form unknown to the gateway.
    assert relay_env.chain_nonce(env, payer.address) == 0
    assert relay_env.pool_hashes(env, payer.address) == set()
    would_be = relay_env.cosigned_hash(env, tx_from_wire(payment))
    assert would_be is not None and not relay_env.gateway_knows(env, would_be)

    proxy.start()
    deadline = time.monotonic() + 30
    while True:  # the pool reconnects on its next checkout; until then the answer stays 503
        paid = env.client.post("/v1/x402/topup", json=body, headers={"PAYMENT-SIGNATURE": header})
        if paid.status_code != 503:
            break
        assert time.monotonic() < deadline, paid.text
        time.sleep(0.1)
    assert paid.status_code == 200, paid.text
    assert paid.json()["paymentId"] == payment_id and paid.json()["txHash"] == would_be
    assert relay_env.chain_nonce(env, payer.address) == 1
