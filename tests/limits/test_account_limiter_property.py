"""Property: the all-or-nothing account limiter never admits more than burst + rate * t in any dimension."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from gasless.core.errors import ApiError
from gasless.limits.accounts import AccountLimiter, PlatformBudget
from gasless.limits.buckets import LocalRateLimiter

RATE_CLASS = SimpleNamespace(
    id=1,
    ru_per_sec=1,
    ru_burst=15,
    gas_per_sec_per_shard=20_000_000,
    gas_burst_per_shard=200_000_000,
    max_gas_limit=100_000_000,
    ru_per_hour=300,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=3, allow_nan=False),  # seconds since the previous request
            st.sampled_from([(1, 50_000), (3, 5_000_000), (15, 100_000_000), (10, 50_000_000)]),
        ),
        min_size=1,
        max_size=80,
    )
)
def test_never_more_than_burst_plus_rate(requests: list[tuple[float, tuple[int, int]]]) -> None:
    now = [1_000.0]
    limiter = AccountLimiter(
        LocalRateLimiter(clock=lambda: now[0]), platform=PlatformBudget(ru_per_second=1_000, burst=10_000)
    )
    admitted_ru = 0
    admitted_gas = 0
    for gap, (ru, gas) in requests:
        now[0] += gap
        try:
            asyncio.run(limiter.admit(account="erd1a", rate_class=RATE_CLASS, ru=ru, gas_limit=gas, shard=1))
        except ApiError as error:
            assert error.code in ("RATE_LIMITED", "GAS_BUDGET_EXCEEDED", "HOURLY_BURN_EXCEEDED")
            continue
        admitted_ru += ru
        admitted_gas += gas
        elapsed = now[0] - 1_000.0
        assert admitted_ru <= RATE_CLASS.ru_burst + RATE_CLASS.ru_per_sec * elapsed + 1e-6
        assert admitted_gas <= RATE_CLASS.gas_burst_per_shard + RATE_CLASS.gas_per_sec_per_shard * elapsed + 1
        assert admitted_ru <= RATE_CLASS.ru_per_hour + RATE_CLASS.ru_per_hour / 3600 * elapsed + 1e-6


def test_all_or_nothing_refusal_takes_nothing() -> None:
    now = [0.0]
    limiter = AccountLimiter(LocalRateLimiter(clock=lambda: now[0]))
    # 14 RU leave 1 in the RU bucket; a 15-RU relay is refused and must not drain the gas bucket.
    for _ in range(14):
        asyncio.run(limiter.admit(account="a", rate_class=RATE_CLASS, ru=1, gas_limit=1, shard=0))
    for _ in range(5):
        try:
            asyncio.run(
                limiter.admit(account="a", rate_class=RATE_CLASS, ru=15, gas_limit=100_000_000, shard=0)
            )
        except ApiError as error:
            assert error.code == "RATE_LIMITED" and error.details["scope"] == "account"
    # Nothing was taken by the refusals: the last RU and the whole remaining gas burst still fit, at once.
    asyncio.run(limiter.admit(account="a", rate_class=RATE_CLASS, ru=1, gas_limit=200_000_000 - 14, shard=0))
