"""Settlement of a dead intent through HTTP on a real localnet: a cancel replacement at the same nonce (a
cancel assignment, a higher gas price) executes; the replaced intent ends DEAD with an unbilled `dead`
ledger row, its reservation `released` and its RU given back to `account_period_usage`; only the executed
replacement is billed."""

from __future__ import annotations

from typing import Any

from billing_paths_kit import ledger, period_usage, reservation_rows, wait_ledger

from gasless.billing.schedule import ru_for_gas_limit

MIN_GAS_PRICE = 1_000_000_000
ORIGINAL_GAS = 8_000_000  # 4 RU; the cancel (a plain self-transfer) costs 1 RU


def _accepted(env: Any, tx: Any, lease: str) -> dict[str, Any]:
    response = env.relay(tx, lease)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


def test_replaced_intent_is_released_and_only_the_replacement_billed(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    env.faults(chain={"stalledShards": [1]})  # the original stays in the pool
    try:
        original = _accepted(env, env.build(sender, assignment, gas_limit=ORIGINAL_GAS), assignment["lease"])
        assert original["billing"]["billingClass"] == "plan"
        assert original["billing"]["ru"] == ru_for_gas_limit(ORIGINAL_GAS) == 4
        cancel = env.assign(sender, cancel=0)
        assert cancel["kind"] == "cancel" and cancel["pinNonce"] == 0
        replacement_tx = env.build(
            sender, cancel, nonce=0, receiver=sender.address, gas_price=MIN_GAS_PRICE + 1
        )
        replacement = _accepted(env, replacement_tx, cancel["lease"])
        assert replacement["billing"]["ru"] == 1
        (usage,) = period_usage(env)
        assert usage.account == sender.address and usage.ru_used == 5  # both reserved while in flight
    finally:
        env.faults(chain={"stalledShards": []})

    done = env.wait_state(replacement["txHash"], ("EXECUTED", "FINALIZED"))
    assert done["txHash"] == replacement["txHash"]
    dead = env.wait_state(original["txHash"], ("DEAD",))
    assert dead["deadReason"]
    rows = wait_ledger(env, [original["txHash"], replacement["txHash"]])
    gone, paid = rows[original["txHash"]], rows[replacement["txHash"]]
    assert gone.status == "dead" and gone.billed is False and gone.dead_reason == dead["deadReason"]
    assert gone.billing_class is None and gone.ru is None and gone.payg_micro is None
    assert paid.status == "success" and paid.billed is True and paid.billing_class == "plan" and paid.ru == 1
    assert gone.nonce == paid.nonce == 0 and gone.sender == paid.sender == sender.address
    states = {r.intent_pk: r.state for r in reservation_rows(env)}
    assert states == {gone.intent_pk: "released", paid.intent_pk: "settled"}
    (usage,) = period_usage(env)
    assert usage.ru_used == 1  # the dead intent's 4 RU given back
    assert [r.tx_hash for r in ledger(env) if r.billed] == [replacement["txHash"]]
    # Released and settled once: later tracker rounds change nothing.
    env.localnet.wait_rounds(5)
    assert period_usage(env)[0].ru_used == 1
