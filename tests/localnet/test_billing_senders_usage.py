"""Billing contract model: authorised senders and their fee, usage settlement against PAYG escrow."""

from __future__ import annotations

import copy

import pytest
from contract_harness import ONE_USDC, Stack, deploy_stack, user_pubkey

from gasless.localnet.contracts.billing_state import SENDER_FEE_NOTICE_MS

FEE_PER_SENDER = 50 * 200  # seed: 50 RU x 200 micro-USDC
ROOT = bytes(range(100, 132))


@pytest.fixture
def stack() -> Stack:
    return deploy_stack()


def funded(stack: Stack, name: str, credits: int) -> bytes:
    user = stack.user(name)
    assert stack.tx(user, "deposit", usdc=credits).ok
    return user


# Senders ----------------------------------------------------------------------------------------------
def test_add_senders_charges_the_fee_per_new_sender(stack: Stack) -> None:
    alice = funded(stack, "alice", 10 * ONE_USDC)
    s1, s2 = user_pubkey("s1"), user_pubkey("s2")
    receipt = stack.tx(alice, "addSenders", 2 * FEE_PER_SENDER, [s1, s2])
    assert receipt.ok, receipt.error
    assert receipt.names() == ["senderAdded", "senderAdded", "senderFee"]
    added = stack.billing_events(receipt, "senderAdded")
    assert [(e.account, e.sender) for e in added] == [(alice, s1), (alice, s2)]
    (fee,) = stack.billing_events(receipt, "senderFee")
    assert (fee.amount, fee.sender_count, fee.fee_ru, fee.credits_after) == (
        2 * FEE_PER_SENDER,
        2,
        50,
        10 * ONE_USDC - 2 * FEE_PER_SENDER,
    )
    assert stack.view("getSenders", alice) == [[s1, s2]]
    assert stack.view("getAccountOfSender", s2) == [alice]
    assert stack.view("getAccountOfSender", user_pubkey("stranger")) == [None]
    assert stack.account(alice).sender_count == 2
    # Re-adding a sender of this account is a no-op and costs nothing; a new one is appended (oldest first).
    s3 = user_pubkey("s3")
    receipt = stack.tx(alice, "addSenders", FEE_PER_SENDER, [s2, s3, s3])
    assert receipt.ok, receipt.error
    assert stack.billing_events(receipt, "senderFee")[0].amount == FEE_PER_SENDER
    assert stack.view("getSenders", alice) == [[s1, s2, s3]]
    receipt = stack.tx(alice, "addSenders", 0, [s1])
    assert receipt.ok and receipt.events == []


def test_add_senders_fee_is_a_ceiling(stack: Stack) -> None:
    alice = funded(stack, "alice", 10 * ONE_USDC)
    receipt = stack.tx(alice, "addSenders", 2 * FEE_PER_SENDER - 1, [user_pubkey("s1"), user_pubkey("s2")])
    assert receipt.error == "ERR_PRICE_ABOVE_MAX"
    assert stack.view("getSenders", alice) == [[]]


def test_pending_sender_fee_increase_applies_only_after_the_notice(stack: Stack) -> None:
    alice = funded(stack, "alice", 10 * ONE_USDC)
    receipt = stack.tx(stack.owner, "setSenderFeeRu", 80)
    assert receipt.ok, receipt.error
    (tariff,) = stack.billing_events(receipt, "tariffChanged")
    start = stack.chain.now_ms
    assert (tariff.kind.__name__, tariff.value, tariff.effective_ms) == (
        "SenderFeeRu",
        80,
        start + SENDER_FEE_NOTICE_MS,
    )
    config = stack.view("getConfig")[0]
    assert (config.sender_fee_ru, config.pending_sender_fee.fee_ru) == (50, 80)
    assert config.pending_sender_fee.effective_ms == start + SENDER_FEE_NOTICE_MS
    stack.chain.advance(SENDER_FEE_NOTICE_MS - 1)
    # The quote made now (old fee) is still honoured.
    assert stack.tx(alice, "addSenders", FEE_PER_SENDER, [user_pubkey("s1")]).ok
    stack.chain.advance(1)
    config = stack.view("getConfig")[0]
    assert (config.sender_fee_ru, config.pending_sender_fee, config.sender_fee_micro) == (80, None, 80 * 200)
    # A user who signed the old fee as max_fee now gets ERR_PRICE_ABOVE_MAX.
    receipt = stack.tx(alice, "addSenders", FEE_PER_SENDER, [user_pubkey("s2")])
    assert receipt.error == "ERR_PRICE_ABOVE_MAX"
    assert stack.tx(alice, "addSenders", 80 * 200, [user_pubkey("s2")]).ok


def test_sender_fee_decrease_applies_at_once(stack: Stack) -> None:
    alice = funded(stack, "alice", 10 * ONE_USDC)
    receipt = stack.tx(stack.owner, "setSenderFeeRu", 10)
    (tariff,) = stack.billing_events(receipt, "tariffChanged")
    assert tariff.effective_ms == stack.chain.now_ms
    assert stack.tx(alice, "addSenders", 10 * 200, [user_pubkey("s1")]).ok


def test_sender_belongs_to_one_account(stack: Stack) -> None:
    alice, bob = funded(stack, "alice", 10 * ONE_USDC), funded(stack, "bob", 10 * ONE_USDC)
    shared = user_pubkey("shared")
    assert stack.tx(alice, "addSenders", FEE_PER_SENDER, [shared]).ok
    before = copy.deepcopy(stack.billing.state)
    assert (
        stack.tx(bob, "addSenders", 10 * FEE_PER_SENDER, [user_pubkey("b1"), shared]).error
        == "ERR_SENDER_TAKEN"
    )
    assert stack.billing.state == before
    assert stack.tx(bob, "removeSenders", [shared]).error == "ERR_NOT_A_SENDER"
    receipt = stack.tx(alice, "removeSenders", [shared])
    assert receipt.ok, receipt.error
    (removed,) = stack.billing_events(receipt, "senderRemoved")
    assert (removed.account, removed.sender) == (alice, shared)
    assert stack.view("getAccountOfSender", shared) == [None]
    assert stack.tx(bob, "addSenders", FEE_PER_SENDER, [shared]).ok
    assert stack.view("getAccountOfSender", shared) == [bob]


def test_add_senders_refusals(stack: Stack) -> None:
    nobody = stack.user("nobody")
    assert stack.tx(nobody, "addSenders", 10**9, [user_pubkey("s1")]).error == "ERR_UNKNOWN_ACCOUNT"
    assert stack.tx(stack.owner, "setDepositBounds", 1, 0).ok
    poor = funded(stack, "poor", FEE_PER_SENDER - 1)
    assert stack.tx(poor, "addSenders", 10**9, [user_pubkey("s1")]).error == "ERR_INSUFFICIENT_CREDITS"
    assert stack.tx(poor, "addSenders", 10**9, []).error == "ERR_NO_SENDERS"
    assert stack.tx(poor, "removeSenders", []).error == "ERR_NO_SENDERS"


# Usage settlement -------------------------------------------------------------------------------------
def payg_account(
    stack: Stack, name: str, credits: int, escrow: int, *, auto_topup: bool = False, max_price: int = 0
) -> bytes:
    user = funded(stack, name, credits)
    assert stack.tx(user, "setPayg", True, escrow, auto_topup, max_price).ok
    return user


def test_settle_usage_debits_escrow_capped_at_the_escrow(stack: Stack) -> None:
    alice = payg_account(stack, "alice", 10 * ONE_USDC, 2 * ONE_USDC)
    bob = payg_account(stack, "bob", 10 * ONE_USDC, 5 * ONE_USDC)
    charges = [
        {"account": alice, "ru": 1_000, "payg_micro": 3 * ONE_USDC},  # more than the 2 USDC escrow
        {"account": bob, "ru": 500, "payg_micro": ONE_USDC},
    ]
    receipt = stack.tx(stack.owner, "settleUsage", 7, ROOT, 1_234, 1_500, charges)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["paygSettled", "paygSettled", "usageSettled"]
    settled = stack.billing_events(receipt, "paygSettled")
    assert [(e.account, e.batch_id, e.ru, e.amount, e.requested, e.escrow_after) for e in settled] == [
        (alice, 7, 1_000, 2 * ONE_USDC, 3 * ONE_USDC, 0),
        (bob, 7, 500, ONE_USDC, ONE_USDC, 4 * ONE_USDC),
    ]
    (batch,) = stack.billing_events(receipt, "usageSettled")
    assert (batch.batch_id, bytes(batch.usage_root), batch.row_count, batch.total_ru) == (
        7,
        ROOT,
        1_234,
        1_500,
    )
    assert stack.account(alice).credits_micro == 8 * ONE_USDC  # credits untouched without auto top-up
    view = stack.view("getSettlement", 7)[0]
    assert (bytes(view.usage_root), view.row_count, view.total_ru, view.settled_ms) == (
        ROOT,
        1_234,
        1_500,
        stack.chain.now_ms,
    )
    assert stack.view("getSettlement", 8) == [None]
    before = copy.deepcopy(stack.billing.state)
    assert stack.tx(stack.owner, "settleUsage", 7, ROOT, 1, 1, []).error == "ERR_BATCH_EXISTS"
    assert stack.billing.state == before


def test_settle_usage_tops_up_from_credits_and_caps_at_the_max_payg_price(stack: Stack) -> None:
    alice = payg_account(stack, "alice", 10 * ONE_USDC, ONE_USDC, auto_topup=True, max_price=300)
    charges = [{"account": alice, "ru": 10_000, "payg_micro": 5 * ONE_USDC}]  # cap: 10 000 x 300 = 3 USDC
    receipt = stack.tx(stack.owner, "settleUsage", 1, ROOT, 10, 10_000, charges)
    assert receipt.ok, receipt.error
    assert receipt.names() == ["escrowMoved", "paygSettled", "usageSettled"]
    (moved,) = stack.billing_events(receipt, "escrowMoved")
    assert (moved.amount, moved.credits_after, moved.escrow_after) == (
        2 * ONE_USDC,
        7 * ONE_USDC,
        3 * ONE_USDC,
    )
    (settled,) = stack.billing_events(receipt, "paygSettled")
    assert (settled.amount, settled.escrow_after) == (3 * ONE_USDC, 0)
    account = stack.account(alice)
    assert (account.credits_micro, account.escrow_micro) == (7 * ONE_USDC, 0)


def test_root_only_batch_and_unknown_account(stack: Stack) -> None:
    receipt = stack.tx(stack.owner, "settleUsage", 2, ROOT, 0, 0, [])
    assert receipt.ok and receipt.names() == ["usageSettled"]
    charges = [{"account": user_pubkey("ghost"), "ru": 1, "payg_micro": 1}]
    assert stack.tx(stack.owner, "settleUsage", 3, ROOT, 1, 1, charges).error == "ERR_UNKNOWN_ACCOUNT"
    assert stack.view("getSettlement", 3) == [None]


def test_usage_root_must_have_32_bytes(stack: Stack) -> None:
    from gasless.chain.abi import encode_args, load_billing_abi

    args = encode_args(load_billing_abi(), "settleUsage", [4, ROOT, 0, 0, []])
    args[1] = args[1][:31]
    receipt = stack.chain.call(stack.owner, stack.billing_address, "settleUsage", args)
    assert receipt.error == "argument decode error (usage_root): expected 32 bytes"
