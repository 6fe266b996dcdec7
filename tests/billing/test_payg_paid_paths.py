"""Pay-as-you-go that actually pays, through HTTP on a real localnet: an address deposits USDC (a free
relayed `deposit`), moves a budget to escrow with `setPayg(enabled, budget, auto_topup, max_payg_price)`
(free too), then relays a transfer billed `payg`: the reservation and the ledger row carry the price
(`paygMicro` = RU x the contract's RU price) and GET /v1/usage/{txHash} shows it."""

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
    reservation_rows,
    wait_final,
    wait_ledger,
)

from gasless.localnet.contracts.seed import SEED_RU_PRICE_MICRO


def test_payg_relay_is_billed_from_escrow(env: Any, auth: Any) -> None:
    account = env.new_sender(plan=False)
    faucet(env, account.address, usdc_micro=20 * USDC)
    token = env.localnet.net.info["paymentToken"].encode()
    deposit = relay_data(env, account, contract_data("ESDTTransfer", token, 10 * USDC, b"deposit"))
    assert deposit.json()["billing"]["billingClass"] == "free", deposit.text
    wait_final(env, deposit)
    payg = relay_contract_call(env, account, "setPayg", 1, 5 * USDC, 0, 0)
    assert payg.json()["billing"]["free"] is True, payg.text
    wait_final(env, payg)

    deadline = time.monotonic() + 10
    while True:  # the contract mirror caches the account's view for ~1 s
        paid = relay_transfer(env, account)
        if paid.status_code in (200, 202) or time.monotonic() > deadline:
            break
        assert paid.json()["code"] == "NO_ENTITLEMENT", paid.text
        time.sleep(1.1)
    assert paid.status_code in (200, 202), paid.text
    assert paid.json()["billing"] == {
        "authMode": "signed_tx",
        "billingClass": "payg",
        "account": account.address,
        "ru": 1,
        "free": False,
    }
    tx_hash = paid.json()["txHash"]
    wait_final(env, paid)
    row = wait_ledger(env, [tx_hash])[tx_hash]
    assert row.billed and row.status == "success" and row.billing_class == "payg"
    assert row.ru == 1 and row.payg_micro == SEED_RU_PRICE_MICRO and row.period_id is None
    (reservation,) = [r for r in reservation_rows(env) if r.intent_pk == row.intent_pk]
    assert reservation.state == "settled" and reservation.payg_micro == SEED_RU_PRICE_MICRO

    detail = env.client.get(f"/v1/usage/{tx_hash}", headers=auth.bearer(account))
    assert detail.status_code == 200, detail.text
    usage = detail.json()
    assert usage["billingClass"] == "payg" and usage["paygMicro"] == SEED_RU_PRICE_MICRO
    assert usage["ru"] == 1 and usage["billed"] is True and usage["periodId"] is None
