"""The Redis backend's all-or-nothing take: shared by two limiters (hosts a and b), a refusal takes nothing."""

from __future__ import annotations

import asyncio
import secrets
from types import SimpleNamespace

from redis.asyncio import Redis

from gasless.core.errors import ApiError
from gasless.limits.accounts import AccountLimiter
from gasless.limits.redis_backend import RedisRateLimiter

RATE_CLASS = SimpleNamespace(
    id=1,
    ru_per_sec=1,
    ru_burst=15,
    gas_per_sec_per_shard=20_000_000,
    gas_burst_per_shard=200_000_000,
    max_gas_limit=100_000_000,
    ru_per_hour=300,
)


async def _scenario(url: str) -> None:
    redis = Redis.from_url(url)
    namespace = f"test-billing-{secrets.token_hex(6)}"
    clock = [1_000.0]
    host_a = AccountLimiter(RedisRateLimiter(redis, namespace, clock=lambda: clock[0]))
    host_b = AccountLimiter(RedisRateLimiter(redis, namespace, clock=lambda: clock[0]))
    try:
        for limiter in (host_a, host_b) * 7:
            await limiter.admit(account="acct", rate_class=RATE_CLASS, ru=1, gas_limit=1, shard=2)
        # 14 RU taken across both hosts: a 15-RU relay is refused on either, and takes no gas.
        for limiter in (host_a, host_b):
            try:
                await limiter.admit(
                    account="acct", rate_class=RATE_CLASS, ru=15, gas_limit=100_000_000, shard=2
                )
            except ApiError as error:
                assert error.code == "RATE_LIMITED" and error.details["scope"] == "account"
            else:
                raise AssertionError("admitted past the shared burst")
        await host_b.admit(account="acct", rate_class=RATE_CLASS, ru=1, gas_limit=200_000_000 - 14, shard=2)
        try:
            await host_a.admit(account="acct", rate_class=RATE_CLASS, ru=0, gas_limit=1, shard=2)
        except ApiError as error:
            assert error.code == "GAS_BUDGET_EXCEEDED"
        else:
            raise AssertionError("the shard's gas burst was spent")
    finally:
        keys = [key async for key in redis.scan_iter(match=f"{namespace}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def test_shared_all_or_nothing(redis_url: str) -> None:
    asyncio.run(_scenario(redis_url))
