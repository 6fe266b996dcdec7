"""Free operations and the free-flow limits through HTTP on a real localnet (docs/billing.md "Free flow"):
the contract's free operations relay free; one free relay in flight per sender (FREE_FLOW_BUSY); the
per-account limits (10 / 24 h, 30 / 30 days; injected smaller here) bill an account's next free call as a
normal relay (`free: false`) and bar an address that cannot be billed (FREE_FLOW_BARRED, `untilMs`); the
platform's daily budget (FREE_FLOW_UNAVAILABLE) and rate (RATE_LIMITED, scope `free_flow`)."""

from __future__ import annotations

from typing import Any

import pytest
from billing_paths_kit import (
    DAY_MS,
    MONTH_MS,
    USDC,
    call_gas,
    check_relay_problem,
    contract_data,
    deposit_for_data,
    faucet,
    relay_contract_call,
    relay_data,
    reservation_rows,
    wait_final,
    wait_ledger,
)

from gasless.billing.schedule import ru_for_gas_limit
from gasless.localnet.contracts.seed import SEED_FREE_OPERATIONS


def _free(env: Any, sender: Any) -> Any:
    """A free flag call of an account holder: setAutoRenew(true)."""
    return relay_contract_call(env, sender, "setAutoRenew", 1)


def _free_for_stranger(env: Any, stranger: Any, beneficiary: Any) -> Any:
    """A free call an address without an account can make: depositFor(beneficiary) paying 1 USDC."""
    data = deposit_for_data(env, beneficiary, 1 * USDC)
    return relay_data(env, stranger, data)


def test_free_operation_relays_free_and_one_in_flight_per_sender(env: Any) -> None:
    assert {"setAutoRenew", "depositFor", "setPayg"} <= set(SEED_FREE_OPERATIONS)
    account = env.new_sender()
    env.faults(chain={"stalledShards": [1]})  # the first free relay stays in flight
    try:
        first = _free(env, account)
        assert first.status_code in (200, 202), first.text
        assert first.json()["billing"] == {
            "authMode": "signed_tx",
            "billingClass": "free",
            "account": account.address,
            "ru": 0,
            "free": True,
        }
        busy = _free(env, account)  # the next nonce, while the first is in flight
        body = check_relay_problem(busy, "FREE_FLOW_BUSY", 409, retryable=True, resign="SAME_BYTES")
        assert body["details"]["reason"] == "in_flight"
        assert body["details"]["txHash"] == first.json()["txHash"]
    finally:
        env.faults(chain={"stalledShards": []})
    wait_final(env, first)
    again = _free(env, account)  # no longer busy
    assert again.status_code in (200, 202), again.text
    assert again.json()["billing"]["free"] is True
    wait_final(env, again)
    rows = wait_ledger(env, [first.json()["txHash"], again.json()["txHash"]])
    for row in rows.values():
        assert row.status == "success" and row.function == "setAutoRenew" and row.account == account.address
        assert row.billing_class == "free" and row.ru == 0 and row.payg_micro == 0


@pytest.mark.parametrize(
    ("limits", "window_ms"),
    [
        ({"billing_free_flow_per_day": 2}, DAY_MS),
        ({"billing_free_flow_per_day": 100, "billing_free_flow_per_30_days": 2}, MONTH_MS),
    ],
    ids=["per_day", "per_30_days"],
)
def test_free_flow_limit_bills_an_account_and_bars_a_stranger(
    make_env: Any, limits: dict[str, int], window_ms: int
) -> None:
    env = make_env(**limits)
    account = env.new_sender()
    for _ in range(2):
        response = _free(env, account)
        assert response.status_code in (200, 202), response.text
        assert response.json()["billing"]["free"] is True
        wait_final(env, response)
    billed = _free(env, account)  # past the limit: billed as a normal relay on the account's plan
    assert billed.status_code in (200, 202), billed.text
    assert billed.json()["billing"] == {
        "authMode": "signed_tx",
        "billingClass": "plan",
        "account": account.address,
        "ru": ru_for_gas_limit(call_gas(env, "setAutoRenew", contract_data("setAutoRenew", 1))),
        "free": False,
    }
    wait_final(env, billed)
    row = wait_ledger(env, [billed.json()["txHash"]])[billed.json()["txHash"]]
    assert (
        row.billed
        and row.billing_class == "plan"
        and row.ru == billed.json()["billing"]["ru"]
        and row.function == "setAutoRenew"
    )

    # Only flag calls count: an address without an account pays depositFor for someone else, free, past
    # the limit (a deposit is not a flag call).
    stranger = env.new_sender(plan=False)
    faucet(env, stranger.address, usdc_micro=10 * USDC)
    for _ in range(3):
        response = _free_for_stranger(env, stranger, account)
        assert response.status_code in (200, 202), response.text
        assert response.json()["billing"]["free"] is True
        wait_final(env, response)

    # An account that cannot be billed (credits but no plan, pay-as-you-go off) is barred past its free
    # flag calls until the oldest one leaves the window.
    holder = env.new_sender(plan=False)
    faucet(env, holder.address, usdc_micro=10 * USDC)
    token = env.localnet.net.info["paymentToken"].encode()
    created = relay_data(env, holder, contract_data("ESDTTransfer", token, 2 * USDC, b"deposit"))
    assert created.status_code in (200, 202), created.text
    wait_final(env, created)
    # (no wait for the mirror: a flag call right after the account's creation is recognised)
    for _ in range(2):
        response = _free(env, holder)
        assert response.status_code in (200, 202), response.text
        assert response.json()["billing"]["free"] is True
        wait_final(env, response)
    barred = _free(env, holder)
    oldest = min(
        r.created_at_ms
        for r in reservation_rows(env)
        if r.account == holder.address and r.billing_class == "free" and r.function == "setAutoRenew"
    )
    check_relay_problem(
        barred,
        "FREE_FLOW_BARRED",
        403,
        retryable=False,
        resign="NONE",
        details={"untilMs": oldest + window_ms, "account": holder.address},
    )


def test_platform_free_budget_spent(make_env: Any) -> None:
    env = make_env(billing_free_flow_platform_per_day=1)
    first = _free(env, env.new_sender())
    assert first.status_code in (200, 202), first.text
    refused = _free(env, env.new_sender())  # another account: the platform's budget is spent
    check_relay_problem(
        refused,
        "FREE_FLOW_UNAVAILABLE",
        503,
        retryable=True,
        resign="SAME_BYTES",
        details={"retryAfterMs": 60_000},
    )


def test_platform_free_rate(make_env: Any, problem: Any) -> None:
    env = make_env(billing_free_flow_platform_per_second=0.01, billing_free_flow_platform_burst=1)
    first = _free(env, env.new_sender())
    assert first.status_code in (200, 202), first.text
    refused = _free(env, env.new_sender())
    body = problem(refused, "RATE_LIMITED")
    assert body["details"]["scope"] == "free_flow"
    assert body["details"]["retryAfterMs"] > 90_000  # one token per 100 s
