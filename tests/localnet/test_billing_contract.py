"""Billing contract model: deposits and the gas-funding swap, plan purchases, renewals, PAYG escrow."""

from __future__ import annotations

import copy

import pytest
from contract_harness import (
    EGLD,
    GENESIS_MS,
    ONE_USDC,
    PAIR_USDC_RESERVE,
    PAIR_WEGLD_RESERVE,
    USDC,
    WEGLD,
    Stack,
    deploy_stack,
)

from gasless.localnet.contracts.billing_state import DAY_MS, MONTH_MS
from gasless.localnet.vm import Payment

REF = bytes(range(32))
STARTER, BUILDER, GROWTH, SCALE, ENTERPRISE, AGENT_PRO, AGENT_FLEET, AGENT_METERED = range(1, 9)


@pytest.fixture
def stack() -> Stack:
    return deploy_stack()


def expected_swap_out(
    usdc_in: int, usdc_reserve: int = PAIR_USDC_RESERVE, wegld_reserve: int = PAIR_WEGLD_RESERVE
) -> int:
    with_fee = usdc_in * 99_700
    return with_fee * wegld_reserve // (usdc_reserve * 100_000 + with_fee)


def world_picture(stack: Stack, *pubkeys: bytes) -> dict[tuple[bytes, str], int]:
    addresses = (*pubkeys, stack.billing_address, stack.pair_address, stack.wrapper_address, stack.gas_tank)
    return {(a, t): stack.chain.balance(a, t) for a in addresses for t in (EGLD, USDC, WEGLD)}


# Deposits ---------------------------------------------------------------------------------------------
def test_deposit_credits_the_account_and_funds_the_gas_tank_with_egld(stack: Stack) -> None:
    alice = stack.user("alice", usdc=500 * ONE_USDC)
    receipt = stack.tx(alice, "deposit", usdc=100 * ONE_USDC)
    assert receipt.ok, receipt.error
    share = 10 * ONE_USDC  # 1 000 bps
    egld = expected_swap_out(share)
    assert stack.chain.balance(alice, USDC) == 400 * ONE_USDC
    assert stack.chain.balance(stack.billing_address, USDC) == 90 * ONE_USDC
    assert stack.chain.balance(stack.pair_address, USDC) == PAIR_USDC_RESERVE + share
    assert stack.chain.balance(stack.gas_tank, EGLD) == egld
    assert stack.chain.balance(stack.billing_address, EGLD) == 0
    assert stack.chain.balance(stack.billing_address, WEGLD) == 0
    assert stack.pair.state.second_reserve == PAIR_USDC_RESERVE + share
    assert stack.pair.state.first_reserve == PAIR_WEGLD_RESERVE - egld
    account = stack.account(alice)
    assert account.credits_micro == 100 * ONE_USDC
    assert account.created_ms == GENESIS_MS
    assert receipt.names() == ["swap", "gasFunded", "deposit"]
    (funded,) = stack.billing_events(receipt, "gasFunded")
    assert (funded.gas_tank, funded.usdc_swapped, funded.egld_out) == (stack.gas_tank, share, egld)
    (deposit,) = stack.billing_events(receipt, "deposit")
    assert (deposit.account, deposit.payer, deposit.amount, deposit.credits_after) == (
        alice,
        alice,
        100 * ONE_USDC,
        100 * ONE_USDC,
    )
    config = stack.view("getConfig")[0]
    assert config.swap_window_spent_micro == share


def test_deposit_for_credits_the_beneficiary(stack: Stack) -> None:
    alice, bob = stack.user("alice"), stack.user("bob", usdc=0)
    receipt = stack.tx(alice, "depositFor", bob, usdc=5 * ONE_USDC)
    assert receipt.ok, receipt.error
    assert stack.account(bob).credits_micro == 5 * ONE_USDC
    assert stack.account(alice) is None
    (deposit,) = stack.billing_events(receipt, "deposit")
    assert (deposit.account, deposit.payer) == (bob, alice)


@pytest.mark.parametrize(
    ("amount", "error"),
    [
        (ONE_USDC, None),
        (ONE_USDC - 1, "ERR_DEPOSIT_BELOW_MIN"),
        (10_000 * ONE_USDC, None),
        (10_000 * ONE_USDC + 1, "ERR_DEPOSIT_ABOVE_MAX"),
    ],
)
def test_deposit_bounds(stack: Stack, amount: int, error: str | None) -> None:
    alice = stack.user("alice", usdc=20_000 * ONE_USDC)
    before = world_picture(stack, alice)
    receipt = stack.tx(alice, "deposit", usdc=amount)
    assert receipt.error == error
    if error:
        assert world_picture(stack, alice) == before
        assert stack.account(alice) is None


def test_deposit_max_zero_means_unlimited(stack: Stack) -> None:
    assert stack.tx(stack.owner, "setDepositBounds", ONE_USDC, 0).ok
    alice = stack.user("alice", usdc=20_000 * ONE_USDC)
    assert stack.tx(alice, "deposit", usdc=15_000 * ONE_USDC).ok
    assert stack.account(alice).credits_micro == 15_000 * ONE_USDC


def test_deposit_refuses_other_tokens(stack: Stack) -> None:
    alice = stack.user("alice")
    stack.chain.fund(alice, **{WEGLD: 10**18})
    assert stack.tx(alice, "deposit", payments=[Payment(WEGLD, 10**18)]).error == "ERR_BAD_PAYMENT_TOKEN"
    assert stack.tx(alice, "deposit", payments=[Payment(EGLD, 10**17)]).error == "ERR_BAD_PAYMENT_TOKEN"
    assert stack.tx(alice, "deposit").error == "ERR_BAD_PAYMENT_TOKEN"


def test_deposits_paused_and_global_pause(stack: Stack) -> None:
    alice = stack.user("alice")
    assert stack.tx(stack.owner, "setDepositsPaused", True).ok
    assert stack.view("getPauseState")[0].deposits_paused is True
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).error == "ERR_DEPOSITS_PAUSED"
    assert stack.tx(alice, "depositAndSubscribe", STARTER, 1, 9 * ONE_USDC, REF, usdc=9 * ONE_USDC).error == (
        "ERR_DEPOSITS_PAUSED"
    )
    assert stack.tx(stack.owner, "setPaused", True).ok
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).error == "ERR_PAUSED"
    assert stack.tx(alice, "subscribe", STARTER, 1, 9 * ONE_USDC, REF).error == "ERR_PAUSED"
    assert stack.tx(stack.owner, "setPaused", False).ok
    assert stack.tx(stack.owner, "setDepositsPaused", False).ok
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).ok


def test_freshly_deployed_contract_is_paused() -> None:
    stack = deploy_stack(unpaused=False)
    alice = stack.user("alice")
    assert stack.view("getPauseState")[0].paused is True
    assert stack.tx(alice, "deposit", usdc=5 * ONE_USDC).error == "ERR_PAUSED"
    receipt = stack.tx(stack.owner, "setPaused", False)
    assert receipt.ok
    (changed,) = stack.billing_events(receipt, "pauseChanged")
    assert (changed.paused, changed.deposits_paused) == (False, False)


@pytest.mark.parametrize("how", ["admin", "owner_tx"])
def test_paused_venue_reverts_the_whole_deposit(stack: Stack, how: str) -> None:
    alice = stack.user("alice")
    if how == "admin":
        stack.pair.set_paused(True)
    else:
        assert stack.chain.call(stack.owner, stack.pair_address, "pause").ok
    before = world_picture(stack, alice)
    billing_before = copy.deepcopy(stack.billing.state)
    pair_before = copy.deepcopy(stack.pair.state)
    receipt = stack.tx(alice, "deposit", usdc=50 * ONE_USDC)
    assert receipt.error == "ERR_SWAP_VENUE_PAUSED"
    assert world_picture(stack, alice) == before
    assert stack.billing.state == billing_before
    assert stack.pair.state == pair_before
    receipt = stack.tx(alice, "depositAndSubscribe", STARTER, 1, 9 * ONE_USDC, REF, usdc=9 * ONE_USDC)
    assert receipt.error == "ERR_SWAP_VENUE_PAUSED"
    assert stack.account(alice) is None


def test_swap_budget_exhaustion_and_window_reset(stack: Stack) -> None:
    assert stack.tx(stack.owner, "setSwapConfig", 1_000, 15 * ONE_USDC).ok
    alice = stack.user("alice")
    assert stack.tx(alice, "deposit", usdc=100 * ONE_USDC).ok  # swaps 10
    receipt = stack.tx(alice, "deposit", usdc=100 * ONE_USDC)  # would swap 10 more: 20 > 15
    assert receipt.error == "ERR_SWAP_BUDGET_EXHAUSTED"
    assert stack.tx(alice, "deposit", usdc=50 * ONE_USDC).ok  # 5 more: exactly 15
    assert stack.account(alice).credits_micro == 150 * ONE_USDC
    stack.chain.advance(DAY_MS - 1)
    assert stack.tx(alice, "deposit", usdc=ONE_USDC).error == "ERR_SWAP_BUDGET_EXHAUSTED"
    stack.chain.advance(1)
    assert stack.tx(alice, "deposit", usdc=100 * ONE_USDC).ok
    config = stack.view("getConfig")[0]
    assert (config.swap_window_start_ms, config.swap_window_spent_micro) == (
        GENESIS_MS + DAY_MS,
        10 * ONE_USDC,
    )


def test_zero_swap_share_skips_the_venue(stack: Stack) -> None:
    assert stack.tx(stack.owner, "setSwapConfig", 0, 0).ok
    stack.pair.set_paused(True)
    alice = stack.user("alice")
    receipt = stack.tx(alice, "deposit", usdc=100 * ONE_USDC)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["deposit"]
    assert stack.chain.balance(stack.billing_address, USDC) == 100 * ONE_USDC


# Purchases --------------------------------------------------------------------------------------------
def funded(stack: Stack, name: str, credits: int) -> bytes:
    user = stack.user(name)
    assert stack.tx(user, "deposit", usdc=credits).ok
    return user


def test_subscribe_starts_now_from_credits(stack: Stack) -> None:
    alice = funded(stack, "alice", 100 * ONE_USDC)
    receipt = stack.tx(alice, "subscribe", BUILDER, 3, 87 * ONE_USDC, REF)
    assert receipt.ok, receipt.error
    account = stack.account(alice)
    assert account.credits_micro == 13 * ONE_USDC
    running = account.running
    assert (running.tier_id, running.start_ms, running.end_ms) == (
        BUILDER,
        GENESIS_MS,
        GENESIS_MS + 3 * MONTH_MS,
    )
    assert (running.included_ru, running.months, running.price_paid_micro, bytes(running.ref)) == (
        150_000,
        3,
        87 * ONE_USDC,
        REF,
    )
    assert account.queued is None
    (event,) = stack.billing_events(receipt, "subscribed")
    assert (event.account, event.tier_id, event.months, event.price) == (alice, BUILDER, 3, 87 * ONE_USDC)
    assert (event.start_ms, event.end_ms, bytes(event.ref), event.queued) == (
        GENESIS_MS,
        GENESIS_MS + 3 * MONTH_MS,
        REF,
        False,
    )
    assert event.kind.__name__ == "Start"


def test_same_or_cheaper_tier_queues_and_only_one_block_may_queue(stack: Stack) -> None:
    alice = funded(stack, "alice", 200 * ONE_USDC)
    assert stack.tx(alice, "subscribe", BUILDER, 1, 29 * ONE_USDC, REF).ok
    stack.chain.advance(1_000)
    receipt = stack.tx(alice, "subscribe", STARTER, 2, 18 * ONE_USDC, REF)
    assert receipt.ok, receipt.error
    (event,) = stack.billing_events(receipt, "subscribed")
    assert event.queued is True and event.kind.__name__ == "Queue"
    queued = stack.account(alice).queued
    assert (queued.tier_id, queued.start_ms, queued.end_ms) == (
        STARTER,
        GENESIS_MS + MONTH_MS,
        GENESIS_MS + 3 * MONTH_MS,
    )
    before = copy.deepcopy(stack.billing.state)
    assert stack.tx(alice, "subscribe", BUILDER, 1, 29 * ONE_USDC, REF).error == "ERR_QUEUED_BLOCK_EXISTS"
    assert stack.billing.state == before
    # Once the running block ends, the queued block runs.
    stack.chain.advance(MONTH_MS)
    account = stack.account(alice)
    assert (account.running.tier_id, account.queued) == (STARTER, None)


def test_more_expensive_tier_takes_effect_now_and_credits_the_queued_block_back(stack: Stack) -> None:
    alice = funded(stack, "alice", 500 * ONE_USDC)
    assert stack.tx(alice, "subscribe", BUILDER, 1, 29 * ONE_USDC, REF).ok
    assert stack.tx(alice, "subscribe", STARTER, 2, 18 * ONE_USDC, REF).ok
    assert stack.account(alice).credits_micro == (500 - 29 - 18) * ONE_USDC
    stack.chain.advance(5_000)
    receipt = stack.tx(alice, "subscribe", GROWTH, 1, 99 * ONE_USDC, REF)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["queuedBlockCredited", "subscribed"]
    (credited,) = stack.billing_events(receipt, "queuedBlockCredited")
    assert (credited.tier_id, credited.amount, credited.credits_after) == (
        STARTER,
        18 * ONE_USDC,
        (500 - 29) * ONE_USDC,
    )
    (event,) = stack.billing_events(receipt, "subscribed")
    assert event.kind.__name__ == "Upgrade" and event.queued is False
    account = stack.account(alice)
    assert account.queued is None
    assert (account.running.tier_id, account.running.start_ms) == (GROWTH, GENESIS_MS + 5_000)
    assert account.credits_micro == (500 - 29 - 99) * ONE_USDC


def test_upgrade_counts_the_credited_back_block_towards_the_price(stack: Stack) -> None:
    alice = funded(stack, "alice", 29 * ONE_USDC + 9 * ONE_USDC * 12)
    assert stack.tx(alice, "subscribe", BUILDER, 1, 29 * ONE_USDC, REF).ok
    assert stack.tx(alice, "subscribe", STARTER, 12, 108 * ONE_USDC, REF).ok
    assert stack.account(alice).credits_micro == 0
    assert stack.tx(alice, "subscribe", GROWTH, 1, 99 * ONE_USDC, REF).ok
    assert stack.account(alice).credits_micro == 9 * ONE_USDC


def test_payg_tier_cannot_start_while_a_period_plan_runs(stack: Stack) -> None:
    alice = funded(stack, "alice", 100 * ONE_USDC)
    assert stack.tx(alice, "subscribe", AGENT_PRO, 1, 49 * ONE_USDC, REF).ok
    assert stack.tx(alice, "subscribe", AGENT_METERED, 1, 0, REF).error == "ERR_DOWNGRADE_NOT_IMMEDIATE"
    stack.chain.advance(MONTH_MS)  # the period plan ended: the PAYG tier may start
    receipt = stack.tx(alice, "subscribe", AGENT_METERED, 1, 0, REF)
    assert receipt.ok, receipt.error
    running = stack.account(alice).running
    assert (running.tier_id, running.end_ms, running.price_paid_micro) == (AGENT_METERED, 0, 0)
    # A period tier bought while the PAYG block runs starts at once.
    assert stack.tx(alice, "subscribe", STARTER, 1, 9 * ONE_USDC, REF).ok
    assert stack.account(alice).running.tier_id == STARTER


@pytest.mark.parametrize(
    ("tier", "months", "max_price", "error"),
    [
        (STARTER, 1, 9 * ONE_USDC - 1, "ERR_PRICE_ABOVE_MAX"),
        (SCALE, 1, 299 * ONE_USDC, "ERR_INSUFFICIENT_CREDITS"),
        (ENTERPRISE, 1, 10**12, "ERR_TIER_NOT_PURCHASABLE"),
        (99, 1, 10**12, "ERR_UNKNOWN_TIER"),
        (STARTER, 0, 10**12, "ERR_BAD_MONTHS"),
        (STARTER, 13, 10**12, "ERR_BAD_MONTHS"),
    ],
)
def test_purchase_refusals(stack: Stack, tier: int, months: int, max_price: int, error: str) -> None:
    alice = funded(stack, "alice", 100 * ONE_USDC)
    before = copy.deepcopy(stack.billing.state)
    receipt = stack.tx(alice, "subscribe", tier, months, max_price, REF)
    assert receipt.error == error
    assert receipt.events == []
    assert stack.billing.state == before


def test_deposit_and_subscribe_is_one_atomic_call(stack: Stack) -> None:
    alice = stack.user("alice", usdc=100 * ONE_USDC)
    receipt = stack.tx(alice, "depositAndSubscribe", GROWTH, 1, 99 * ONE_USDC, REF, usdc=99 * ONE_USDC)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["swap", "gasFunded", "deposit", "subscribed"]
    account = stack.account(alice)
    assert (account.credits_micro, account.running.tier_id) == (0, GROWTH)
    before = world_picture(stack, alice)
    receipt = stack.tx(alice, "depositAndSubscribe", SCALE, 1, 1 * ONE_USDC, REF, usdc=ONE_USDC)
    assert receipt.error == "ERR_PRICE_ABOVE_MAX"
    assert world_picture(stack, alice) == before


def test_suspended_account_cannot_buy(stack: Stack) -> None:
    alice = funded(stack, "alice", 100 * ONE_USDC)
    receipt = stack.tx(stack.owner, "setAccountSuspended", alice, True)
    assert receipt.ok
    assert stack.billing_events(receipt, "accountSuspended")[0].suspended is True
    assert stack.tx(alice, "subscribe", STARTER, 1, 9 * ONE_USDC, REF).error == "ERR_ACCOUNT_SUSPENDED"
    assert stack.account(alice).credits_micro == 100 * ONE_USDC  # credits are not lost


def test_grant_gives_a_plan_without_payment(stack: Stack) -> None:
    bob = stack.user("bob", usdc=50 * ONE_USDC)
    receipt = stack.tx(stack.owner, "grant", bob, ENTERPRISE, 2)
    assert receipt.ok, receipt.error
    (event,) = stack.billing_events(receipt, "granted")
    assert (event.account, event.tier_id, event.months, event.end_ms, event.queued) == (
        bob,
        ENTERPRISE,
        2,
        GENESIS_MS + 2 * MONTH_MS,
        False,
    )
    account = stack.account(bob)
    assert (account.credits_micro, account.running.tier_id, account.running.price_paid_micro) == (
        0,
        ENTERPRISE,
        0,
    )
    # A cheaper purchase queues behind the granted Enterprise block.
    assert stack.tx(bob, "deposit", usdc=50 * ONE_USDC).ok
    receipt = stack.tx(bob, "subscribe", SCALE, 1, 299 * ONE_USDC, REF)
    assert receipt.error == "ERR_INSUFFICIENT_CREDITS"
    receipt = stack.tx(bob, "subscribe", STARTER, 1, 9 * ONE_USDC, REF)
    assert stack.billing_events(receipt, "subscribed")[0].kind.__name__ == "Queue"


# Renewals ---------------------------------------------------------------------------------------------
def test_renew(stack: Stack) -> None:
    alice = funded(stack, "alice", 30 * ONE_USDC)
    carol = stack.user("carol")
    assert stack.tx(alice, "subscribe", STARTER, 1, 9 * ONE_USDC, REF).ok
    assert stack.tx(carol, "renew", alice).error == "ERR_RENEW_NOT_APPLICABLE"  # auto-renew off
    receipt = stack.tx(alice, "setAutoRenew", True)
    assert stack.billing_events(receipt, "autoRenewChanged")[0].enabled is True
    assert stack.tx(carol, "renew", alice).error == "ERR_RENEW_NOT_APPLICABLE"  # more than 24 h left
    stack.chain.advance(MONTH_MS - DAY_MS)
    receipt = stack.tx(carol, "renew", alice)  # anyone may call
    assert receipt.ok, receipt.error
    (event,) = stack.billing_events(receipt, "renewed")
    assert (event.tier_id, event.months, event.price, event.start_ms, event.end_ms, event.credits_after) == (
        STARTER,
        1,
        9 * ONE_USDC,
        GENESIS_MS + MONTH_MS,
        GENESIS_MS + 2 * MONTH_MS,
        12 * ONE_USDC,
    )
    assert stack.account(alice).queued.start_ms == GENESIS_MS + MONTH_MS
    assert stack.tx(carol, "renew", alice).error == "ERR_RENEW_NOT_APPLICABLE"  # already queued


def test_renewal_skipped_when_credits_are_short(stack: Stack) -> None:
    alice = funded(stack, "alice", 10 * ONE_USDC)
    assert stack.tx(alice, "subscribe", STARTER, 1, 9 * ONE_USDC, REF).ok
    assert stack.tx(alice, "setAutoRenew", True).ok
    stack.chain.advance(MONTH_MS + 5)  # ended
    receipt = stack.tx(alice, "renew", alice)
    assert receipt.ok, receipt.error
    (skipped,) = stack.billing_events(receipt, "renewalSkipped")
    assert (skipped.reason.__name__, skipped.price, skipped.credits) == (
        "InsufficientCredits",
        9 * ONE_USDC,
        ONE_USDC,
    )
    assert stack.tx(alice, "deposit", usdc=10 * ONE_USDC).ok
    receipt = stack.tx(alice, "renew", alice)
    (event,) = stack.billing_events(receipt, "renewed")
    assert event.start_ms == stack.chain.now_ms  # an ended block renews from now
    assert stack.account(alice).running.end_ms == stack.chain.now_ms + MONTH_MS


def test_renew_of_unknown_account_is_not_applicable(stack: Stack) -> None:
    assert stack.tx(stack.user("x"), "renew", stack.user("nobody")).error == "ERR_RENEW_NOT_APPLICABLE"


# Pay-as-you-go escrow ---------------------------------------------------------------------------------
def test_set_payg_moves_budget_to_escrow_and_release_moves_it_back(stack: Stack) -> None:
    alice = funded(stack, "alice", 20 * ONE_USDC)
    assert stack.tx(alice, "setPayg", True, 25 * ONE_USDC, False, 300).error == "ERR_INSUFFICIENT_CREDITS"
    receipt = stack.tx(alice, "setPayg", True, 15 * ONE_USDC, True, 300)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["paygChanged", "escrowMoved"]
    (moved,) = stack.billing_events(receipt, "escrowMoved")
    assert (moved.direction.__name__, moved.amount, moved.credits_after, moved.escrow_after) == (
        "ToEscrow",
        15 * ONE_USDC,
        5 * ONE_USDC,
        15 * ONE_USDC,
    )
    account = stack.account(alice)
    assert (account.payg.enabled, account.payg.budget_micro, account.payg.auto_topup) == (
        True,
        15 * ONE_USDC,
        True,
    )
    assert account.payg.max_payg_price_micro == 300
    receipt = stack.tx(alice, "releaseEscrow")
    (moved,) = stack.billing_events(receipt, "escrowMoved")
    assert (moved.direction.__name__, moved.amount, moved.escrow_after) == ("ToCredits", 15 * ONE_USDC, 0)
    assert stack.account(alice).credits_micro == 20 * ONE_USDC


def test_flags_need_an_account(stack: Stack) -> None:
    nobody = stack.user("nobody")
    assert stack.tx(nobody, "setAutoRenew", True).error == "ERR_UNKNOWN_ACCOUNT"
    assert stack.tx(nobody, "setPayg", False, 0, False, 0).error == "ERR_UNKNOWN_ACCOUNT"
    assert stack.tx(nobody, "releaseEscrow").error == "ERR_UNKNOWN_ACCOUNT"
