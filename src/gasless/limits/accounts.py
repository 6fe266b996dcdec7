"""The rate-class limiter: per ACCOUNT (never per sender), every dimension taken at once or not at all.

Dimensions of one relay (docs/billing.md):
- `ru`     RU per second, sustained and burst                 -> RATE_LIMITED (scope `account`)
- `gas.N`  gas per second in the sender's shard N, and burst   -> GAS_BUDGET_EXCEEDED
- `ruh`    RU per hour (a bucket of one hour's RU refilled evenly) -> HOURLY_BURN_EXCEEDED
- `key.*`  a sponsor key's own tighter RU/s and RU/h            -> RATE_LIMITED (scope `api_key`) /
                                                                  HOURLY_BURN_EXCEEDED
- `platform` the platform-wide admission budget in RU/s         -> RATE_LIMITED (scope `platform`),
                                                                  logged and counted when it binds
The backend is `LocalRateLimiter` on the embedded default and `RedisRateLimiter` (one Lua script) when
Redis is configured, so hosts a and b share the buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from gasless.core.errors import ApiError
from gasless.limits.buckets import Decision, MultiDecision, Rate, RateLimiter, Take

log = structlog.get_logger("gasless.billing")


@dataclass(frozen=True)
class PlatformBudget:
    """The platform-wide admission budget (RU per second and burst; settings)."""

    ru_per_second: float = 2_000
    burst: int = 6_000


class AccountLimiter:
    def __init__(
        self, backend: RateLimiter, *, platform: PlatformBudget | None = None, on_platform_bind: Any = None
    ) -> None:
        self.backend = backend
        self.platform = platform or PlatformBudget()
        self.on_platform_bind = on_platform_bind  # metric hook: called once per refusal

    def takes(
        self, *, account: str, rate_class: Any, ru: int, gas_limit: int, shard: int, key: Any | None
    ) -> list[tuple[Take, str]]:
        """The dimensions of one relay as (take, dimension name)."""
        out: list[tuple[Take, str]] = []
        if rate_class is not None:
            rc_id = int(rate_class.id)
            out += [
                (
                    Take(
                        f"ru.{rc_id}", account, Rate(int(rate_class.ru_per_sec), int(rate_class.ru_burst)), ru
                    ),
                    "ru",
                ),
                (
                    Take(
                        f"gas.{rc_id}.{shard}",
                        account,
                        Rate(int(rate_class.gas_per_sec_per_shard), int(rate_class.gas_burst_per_shard)),
                        gas_limit,
                    ),
                    "gas",
                ),
                (
                    Take(
                        f"ruh.{rc_id}",
                        account,
                        Rate(int(rate_class.ru_per_hour) / 3600, int(rate_class.ru_per_hour)),
                        ru,
                    ),
                    "ruh",
                ),
            ]
        if key is not None:
            limits = key.policy.limits
            if limits.ruPerSecond is not None:
                # A key's burst is its rate with room for the largest transaction of the schedule.
                rate = Rate(limits.ruPerSecond, max(25, limits.ruPerSecond))
                out.append((Take(f"key.ru.{rate.per_second}", key.key_id, rate, ru), "key_ru"))
            if limits.ruPerHour is not None:
                rate = Rate(limits.ruPerHour / 3600, limits.ruPerHour)
                out.append((Take(f"key.ruh.{limits.ruPerHour}", key.key_id, rate, ru), "key_ruh"))
        out.append(
            (
                Take("platform", "all", Rate(self.platform.ru_per_second, self.platform.burst), max(ru, 1)),
                "platform",
            )
        )
        return out

    async def admit(
        self, *, account: str, rate_class: Any, ru: int, gas_limit: int, shard: int, key: Any | None = None
    ) -> Decision:
        """Take every dimension or raise the refusing dimension's error; the tightest decision when admitted
        (its `RateLimit-*` headers describe the account's RU/s bucket)."""
        takes = self.takes(
            account=account, rate_class=rate_class, ru=ru, gas_limit=gas_limit, shard=shard, key=key
        )
        result: MultiDecision = await self.backend.take_all([take for take, _ in takes])
        if result.allowed:
            return result.decisions[0]
        index = result.refused
        assert index is not None
        decision = result.decisions[index]
        raise self._refusal(takes[index][1], decision, account, shard)

    def _refusal(self, dimension: str, decision: Decision, account: str, shard: int) -> ApiError:
        retry_ms = max(1, decision.retry_after_ms)
        headers = {**decision.headers(), "RateLimit-Remaining": "0"}
        if dimension == "gas":
            return ApiError(
                "GAS_BUDGET_EXCEEDED",
                detail=f"the account's gas-per-second budget in shard {shard} is spent",
                details={"retryAfterMs": retry_ms, "shard": shard},
                headers=headers,
            )
        if dimension in ("ruh", "key_ruh"):
            return ApiError(
                "HOURLY_BURN_EXCEEDED",
                detail="the RU per hour of the rate class is spent"
                if dimension == "ruh"
                else "the RU per hour of this API key is spent",
                details={"retryAfterMs": retry_ms, "scope": "account" if dimension == "ruh" else "api_key"},
                headers=headers,
            )
        if dimension == "platform":
            log.warning("platform admission budget binds", account=account)
            if self.on_platform_bind is not None:
                self.on_platform_bind()
            return ApiError(
                "RATE_LIMITED",
                detail="the platform-wide admission budget is spent; retry shortly",
                details={"retryAfterMs": retry_ms, "scope": "platform"},
                headers=headers,
            )
        return ApiError(
            "RATE_LIMITED",
            detail="faster than the account's rate class allows"
            if dimension == "ru"
            else "faster than this API key's limits allow",
            details={"retryAfterMs": retry_ms, "scope": "account" if dimension == "ru" else "api_key"},
            headers=headers,
        )
