"""Billing contract model under random call sequences: failures change nothing, and the money adds up."""

from __future__ import annotations

import copy
from typing import Any

from contract_harness import EGLD, ONE_USDC, USDC, WEGLD, Stack, deploy_stack, user_pubkey
from hypothesis import given, settings
from hypothesis import strategies as st

from gasless.localnet.contracts.billing_state import DAY_MS

USERS = ("alice", "bob")

operation = st.one_of(
    st.tuples(
        st.just("deposit"), st.sampled_from(USERS), st.integers(0, 800).map(lambda n: n * ONE_USDC // 2)
    ),
    st.tuples(
        st.just("subscribe"), st.sampled_from(USERS), st.integers(1, 8), st.integers(0, 13), st.booleans()
    ),
    st.tuples(st.just("setPayg"), st.sampled_from(USERS), st.booleans(), st.integers(0, 60 * ONE_USDC)),
    st.tuples(st.just("releaseEscrow"), st.sampled_from(USERS)),
    st.tuples(st.just("setAutoRenew"), st.sampled_from(USERS), st.booleans()),
    st.tuples(st.just("renew"), st.sampled_from(USERS)),
    st.tuples(st.just("addSenders"), st.sampled_from(USERS), st.integers(0, 3), st.integers(0, 5)),
    st.tuples(
        st.just("settle"), st.sampled_from(USERS), st.integers(0, 100_000), st.integers(0, 30 * ONE_USDC)
    ),
    st.tuples(st.just("advance"), st.integers(0, 40 * DAY_MS)),
)


def run(stack: Stack, users: dict[str, bytes], op: tuple[Any, ...], batch: int) -> Any:
    kind, *rest = op
    if kind == "advance":
        stack.chain.advance(rest[0])
        return None
    user = users[rest[0]]
    if kind == "deposit":
        return stack.tx(user, "deposit", usdc=rest[1]) if rest[1] else stack.tx(user, "deposit")
    if kind == "subscribe":
        tier, months, generous = rest[1:]
        return stack.tx(user, "subscribe", tier, months, 10**12 if generous else 5 * ONE_USDC, bytes(32))
    if kind == "setPayg":
        return stack.tx(user, "setPayg", rest[1], rest[2], True, 250)
    if kind == "releaseEscrow":
        return stack.tx(user, "releaseEscrow")
    if kind == "setAutoRenew":
        return stack.tx(user, "setAutoRenew", rest[1])
    if kind == "renew":
        return stack.tx(users["bob"], "renew", user)
    if kind == "addSenders":
        senders = [user_pubkey(f"sender-{i}") for i in range(rest[1])]
        return stack.tx(user, "addSenders", rest[2] * 10_000, senders)
    charges = [{"account": user, "ru": rest[1], "payg_micro": rest[2]}]
    return stack.tx(stack.owner, "settleUsage", batch, bytes(32), 1, rest[1], charges)


@settings(max_examples=100, deadline=None)
@given(st.lists(operation, min_size=1, max_size=25))
def test_random_calls_keep_the_books_balanced(ops: list[tuple[Any, ...]]) -> None:
    stack = deploy_stack()
    users = {name: stack.user(name, usdc=5_000 * ONE_USDC) for name in USERS}
    deposited = swapped = spent = 0
    for user in users.values():  # both start with an account, so most calls get past the first checks
        receipt = stack.tx(user, "deposit", usdc=300 * ONE_USDC)
        deposited += 300 * ONE_USDC
        swapped += stack.billing_events(receipt, "gasFunded")[0].usdc_swapped
    for batch, op in enumerate(ops):
        before = (copy.deepcopy(stack.billing.state), copy.deepcopy(stack.pair.state))
        balances = {(a, t): stack.chain.balance(a, t) for a in users.values() for t in (USDC, EGLD, WEGLD)}
        receipt = run(stack, users, op, batch)
        if receipt is None:
            continue
        if not receipt.ok:
            assert receipt.events == []
            assert (stack.billing.state, stack.pair.state) == before
            assert {k: stack.chain.balance(*k) for k in balances} == balances
            continue
        for name, fields in stack.events(receipt):
            if name == "deposit":
                deposited += fields.amount
            elif name == "gasFunded":
                swapped += fields.usdc_swapped
            elif name in ("subscribed", "renewed"):
                spent += fields.price
            elif name in ("senderFee", "paygSettled"):
                spent += fields.amount
            elif name == "queuedBlockCredited":
                spent -= fields.amount
    held = sum(a.credits_micro + a.escrow_micro for a in stack.billing.state.accounts.values())
    assert held == deposited - spent
    assert stack.chain.balance(stack.billing_address, USDC) == deposited - swapped
    assert stack.chain.balance(stack.billing_address, EGLD) == 0
    assert stack.chain.balance(stack.billing_address, WEGLD) == 0
    for account in stack.billing.state.accounts.values():
        assert account.credits_micro >= 0 and account.escrow_micro >= 0
