"""The exchange venue models: constant-product pair with pause, EGLD wrapper."""

from __future__ import annotations

import math

import pytest
from contract_harness import (
    EGLD,
    ONE_EGLD,
    ONE_USDC,
    PAIR_USDC_RESERVE,
    PAIR_WEGLD_RESERVE,
    USDC,
    WEGLD,
    WRAPPER_LOCKED_EGLD,
    Receipt,
    Stack,
    decode_events,
    deploy_stack,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from gasless.chain.abi import decode_outputs, encode_args, load_pair_abi, load_wrapper_abi
from gasless.localnet.vm import Payment

PAIR = load_pair_abi()
WRAPPER = load_wrapper_abi()


@pytest.fixture
def stack() -> Stack:
    return deploy_stack(seeded=False, unpaused=False)


def swap(
    stack: Stack, caller: bytes, token_in: str, amount: int, token_out: str, minimum: int = 1
) -> Receipt:
    args = encode_args(PAIR, "swapTokensFixedInput", [token_out, minimum])
    return stack.chain.call(
        caller, stack.pair_address, "swapTokensFixedInput", args, [Payment(token_in, amount)]
    )


def pair_view(stack: Stack, name: str, *values: object) -> list:
    return decode_outputs(
        PAIR, name, stack.chain.query(stack.pair_address, name, encode_args(PAIR, name, list(values)))
    )


def constant_product_out(amount_in: int, reserve_in: int, reserve_out: int) -> int:
    return amount_in * 997 * reserve_out // (reserve_in * 1000 + amount_in * 997)


def test_swap_usdc_for_wegld_follows_the_constant_product_with_fee(stack: Stack) -> None:
    alice = stack.user("alice", usdc=1_000 * ONE_USDC)
    quoted = pair_view(stack, "getAmountOut", USDC, 300 * ONE_USDC)[0]
    expected = constant_product_out(300 * ONE_USDC, PAIR_USDC_RESERVE, PAIR_WEGLD_RESERVE)
    assert (
        quoted == expected and 9.9 * ONE_EGLD < expected < 10 * ONE_EGLD
    )  # 30 USDC per EGLD, less fee and impact
    receipt = swap(stack, alice, USDC, 300 * ONE_USDC, WEGLD)
    assert receipt.ok, receipt.error
    (payment,) = decode_outputs(PAIR, "swapTokensFixedInput", receipt.returned)
    assert (payment.token_identifier, payment.token_nonce, payment.amount) == (WEGLD, 0, expected)
    assert stack.chain.balance(alice, WEGLD) == expected
    assert stack.chain.balance(alice, USDC) == 700 * ONE_USDC
    reserves = pair_view(stack, "getReservesAndTotalSupply")
    assert reserves[:2] == [PAIR_WEGLD_RESERVE - expected, PAIR_USDC_RESERVE + 300 * ONE_USDC]
    assert stack.chain.balance(stack.pair_address, WEGLD) == reserves[0]
    assert stack.chain.balance(stack.pair_address, USDC) == reserves[1]
    ((name, event),) = decode_events(PAIR, receipt.events)
    assert name == "swap"
    assert (event.caller, event.token_in, event.token_out, event.amount_in, event.amount_out) == (
        alice,
        USDC,
        WEGLD,
        300 * ONE_USDC,
        expected,
    )
    assert (event.reserve_in_after, event.reserve_out_after) == (reserves[1], reserves[0])


def test_swap_wegld_for_usdc(stack: Stack) -> None:
    bob = stack.user("bob", usdc=0)
    stack.chain.fund(bob, **{WEGLD: 2 * ONE_EGLD})
    receipt = swap(stack, bob, WEGLD, 2 * ONE_EGLD, USDC)
    assert receipt.ok, receipt.error
    assert stack.chain.balance(bob, USDC) == constant_product_out(
        2 * ONE_EGLD, PAIR_WEGLD_RESERVE, PAIR_USDC_RESERVE
    )


def test_swap_refusals_move_nothing(stack: Stack) -> None:
    alice = stack.user("alice", usdc=1_000 * ONE_USDC)
    stack.chain.fund(alice, **{"OTHER-abcdef": 10})
    expected = constant_product_out(30 * ONE_USDC, PAIR_USDC_RESERVE, PAIR_WEGLD_RESERVE)
    assert swap(stack, alice, USDC, 30 * ONE_USDC, WEGLD, expected + 1).error == "ERR_SLIPPAGE_EXCEEDED"
    assert swap(stack, alice, USDC, 30 * ONE_USDC, USDC).error == "ERR_UNKNOWN_TOKEN"
    assert swap(stack, alice, "OTHER-abcdef", 10, WEGLD).error == "ERR_BAD_PAYMENT_TOKEN"
    assert swap(stack, alice, USDC, 1, WEGLD, 0).ok  # tiny but non-zero output
    assert stack.chain.balance(alice, USDC) == 1_000 * ONE_USDC - 1
    args = encode_args(PAIR, "swapTokensFixedInput", [WEGLD, 1])
    receipt = stack.chain.call(alice, stack.pair_address, "swapTokensFixedInput", args, [Payment(EGLD, 10)])
    assert receipt.error == "ERR_BAD_PAYMENT_TOKEN"


def test_pause_and_resume(stack: Stack) -> None:
    alice = stack.user("alice", usdc=1_000 * ONE_USDC)
    assert stack.chain.call(alice, stack.pair_address, "pause").error == "ERR_NOT_OWNER"
    receipt = stack.chain.call(stack.owner, stack.pair_address, "pause")
    assert receipt.ok
    assert decode_events(PAIR, receipt.events)[0][1].state.__name__ == "Inactive"
    assert pair_view(stack, "getState")[0].__name__ == "Inactive"
    assert stack.pair.is_paused()
    assert swap(stack, alice, USDC, 30 * ONE_USDC, WEGLD).error == "ERR_SWAP_VENUE_PAUSED"
    assert stack.chain.balance(alice, USDC) == 1_000 * ONE_USDC
    assert stack.chain.call(stack.owner, stack.pair_address, "resume").ok
    assert pair_view(stack, "getState")[0].__name__ == "Active"
    stack.pair.set_paused(True)  # the localnet admin API path
    assert swap(stack, alice, USDC, 30 * ONE_USDC, WEGLD).error == "ERR_SWAP_VENUE_PAUSED"
    stack.pair.set_paused(False)
    assert swap(stack, alice, USDC, 30 * ONE_USDC, WEGLD).ok


def test_pair_token_views_and_reserve_sync(stack: Stack) -> None:
    assert pair_view(stack, "getFirstTokenId") == [WEGLD]
    assert pair_view(stack, "getSecondTokenId") == [USDC]
    assert pair_view(stack, "getTotalFeePercent") == [300]
    stack.pair.sync_reserves(5 * ONE_EGLD, 150 * ONE_USDC)
    assert pair_view(stack, "getReservesAndTotalSupply") == [
        5 * ONE_EGLD,
        150 * ONE_USDC,
        math.isqrt(5 * ONE_EGLD * 150 * ONE_USDC),
    ]


def test_wrapper_wraps_and_unwraps_one_to_one(stack: Stack) -> None:
    alice = stack.user("alice")
    stack.chain.fund(alice, egld=5 * ONE_EGLD)
    start = stack.chain.balance(alice, EGLD)
    receipt = stack.chain.call(alice, stack.wrapper_address, "wrapEgld", [], [Payment(EGLD, 3 * ONE_EGLD)])
    assert receipt.ok, receipt.error
    (payment,) = decode_outputs(WRAPPER, "wrapEgld", receipt.returned)
    assert (payment.token_identifier, payment.amount) == (WEGLD, 3 * ONE_EGLD)
    assert stack.chain.balance(alice, WEGLD) == 3 * ONE_EGLD
    assert stack.chain.balance(alice, EGLD) == start - 3 * ONE_EGLD
    locked = decode_outputs(
        WRAPPER, "getLockedEgldBalance", stack.chain.query(stack.wrapper_address, "getLockedEgldBalance")
    )
    assert locked == [WRAPPER_LOCKED_EGLD + 3 * ONE_EGLD]
    assert stack.chain.call(alice, stack.wrapper_address, "unwrapEgld", [], [Payment(WEGLD, ONE_EGLD)]).ok
    assert stack.chain.balance(alice, WEGLD) == 2 * ONE_EGLD
    assert stack.chain.balance(alice, EGLD) == start - 2 * ONE_EGLD
    token = decode_outputs(
        WRAPPER, "getWrappedEgldTokenId", stack.chain.query(stack.wrapper_address, "getWrappedEgldTokenId")
    )
    assert token == [WEGLD]


def test_wrapper_refusals(stack: Stack) -> None:
    alice = stack.user("alice", usdc=100)
    receipt = stack.chain.call(alice, stack.wrapper_address, "wrapEgld", [], [Payment(USDC, 100)])
    assert receipt.error == "function does not accept ESDT payment"
    assert stack.chain.call(alice, stack.wrapper_address, "wrapEgld").error == "ERR_ZERO_AMOUNT"
    receipt = stack.chain.call(alice, stack.wrapper_address, "unwrapEgld", [], [Payment(USDC, 100)])
    assert receipt.error == "ERR_BAD_PAYMENT_TOKEN"
    stack.chain.fund(alice, **{WEGLD: WRAPPER_LOCKED_EGLD + 1})
    receipt = stack.chain.call(
        alice, stack.wrapper_address, "unwrapEgld", [], [Payment(WEGLD, WRAPPER_LOCKED_EGLD + 1)]
    )
    assert receipt.error == "insufficient funds"
    assert stack.chain.balance(alice, WEGLD) == WRAPPER_LOCKED_EGLD + 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(min_value=1, max_value=10**24)), min_size=1, max_size=12)
)
def test_swaps_never_lower_the_product_and_reserves_match_balances(trades: list[tuple[bool, int]]) -> None:
    stack = deploy_stack(seeded=False, unpaused=False)
    trader = stack.user("trader", usdc=10**15)
    stack.chain.fund(trader, **{WEGLD: 10**26})
    product = stack.pair.state.first_reserve * stack.pair.state.second_reserve
    for sell_usdc, size in trades:
        token_in, token_out = (USDC, WEGLD) if sell_usdc else (WEGLD, USDC)
        amount = size % 10**13 + 1 if sell_usdc else size
        receipt = swap(stack, trader, token_in, amount, token_out, 0)
        assert receipt.ok or receipt.error in ("ERR_ZERO_OUTPUT", "ERR_INSUFFICIENT_LIQUIDITY")
        new_product = stack.pair.state.first_reserve * stack.pair.state.second_reserve
        assert new_product >= product
        product = new_product
        assert stack.chain.balance(stack.pair_address, WEGLD) == stack.pair.state.first_reserve
        assert stack.chain.balance(stack.pair_address, USDC) == stack.pair.state.second_reserve
