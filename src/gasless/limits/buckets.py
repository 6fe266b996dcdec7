"""Request limits: token buckets and concurrency slots, in process or shared through Redis.

The route-class table (docs/api-conventions.md, "Route classes", the assignment limits included) is
`RouteLimitTable`: data, in one place. `RouteLimiter` applies one of its rules to a key and answers a
`Decision`, raising `RATE_LIMITED` (with the `RateLimit-*` headers) when the rule refuses. The embedded
default keeps buckets in process; with `settings.redis_url` the Redis backends (`redis_backend.py`) share
them between hosts. The HTTP side (dependencies, headers) is `route_classes.py`.

Every bucket admits by one rule (`admits`): a request pays its cost from the tokens the bucket holds, and
a request that costs more than the whole burst is admitted when the bucket is full, leaving the bucket in
debt. No request is refused for ever, a refusal's wait (`retry_after_ms`) is the time until it passes,
and over any window a bucket admits at most `burst + rate * t` plus the one overshoot of such a request.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from gasless.core.errors import ApiError

# The Starter's rate class: the request limits of an address without a running plan (classes 1..6 key the
# route-class table below; the contract's tiers name theirs).
DEFAULT_RATE_CLASS = 1

# A refused stream has no time at which a slot frees up; clients are told to look again after this long.
STREAM_RETRY_MS = 1_000


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_ms: int

    def headers(self) -> dict[str, str]:
        """`RateLimit-*` (seconds, rounded up); a refusal's `Retry-After` comes with its ApiError."""
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(max(0, self.remaining)),
            "RateLimit-Reset": str(math.ceil(self.reset_ms / 1000)),
        }


@dataclass(frozen=True)
class Rate:
    """A token bucket: `per_second` tokens refill a bucket of `burst` tokens."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if self.per_second <= 0 or self.burst < 1:
            raise ValueError("a rate needs per_second > 0 and burst >= 1")


# Tokens a bucket may lack and still admit: what floating-point refills lose (a wait computed to the
# millisecond must be enough, never one rounding short).
TOKEN_EPSILON = 1e-9


def admits(tokens: float, burst: int, cost: float) -> bool:
    """The one admission rule of every bucket (both backends; the Redis scripts spell it the same way).

    A request is admitted when the bucket holds its cost, or, for a request that costs more than the whole
    burst, when the bucket is full: the bucket then goes into debt and refills from below zero, so the
    long-run rate still holds. Without the second half such a request would be refused for ever, each
    refusal saying "retry shortly" (a relay of more RU than the compat burst of 5 would be)."""
    return tokens + TOKEN_EPSILON >= min(cost, float(burst))


def bucket_decision(rate: Rate, tokens: float, allowed: bool, cost: float) -> Decision:
    """The decision of a bucket holding `tokens` after a take of `cost` (shared by both backends). A
    refusal's wait is the time until `admits` holds for the same cost: the same request then passes."""
    missing = max(0.0, min(cost, float(rate.burst)) - tokens)
    retry_ms = 0 if allowed else max(1, math.ceil(missing / rate.per_second * 1000))
    reset_ms = math.ceil(max(0.0, rate.burst - tokens) / rate.per_second * 1000)
    return Decision(allowed, rate.burst, max(0, int(tokens)), retry_ms, reset_ms)


@dataclass(frozen=True)
class Take:
    """One dimension of an all-or-nothing take: `cost` tokens from `bucket`/`key` refilled at `rate`."""

    bucket: str
    key: str
    rate: Rate
    cost: float


@dataclass(frozen=True)
class MultiDecision:
    """The outcome of an all-or-nothing take: `refused` is the index of the first dimension that could not
    pay (None when every one did and all were taken); `decisions` has one Decision per dimension."""

    refused: int | None
    decisions: tuple[Decision, ...]

    @property
    def allowed(self) -> bool:
        return self.refused is None

    def tightest(self) -> Decision:
        """The dimension with the fewest remaining tokens relative to its limit (for RateLimit-*)."""
        return min(self.decisions, key=lambda d: d.remaining / max(1, d.limit))


class TokenBuckets:
    """`rate` tokens per second up to `burst`, per key; the least recently used keys are forgotten."""

    def __init__(
        self, rate: float, burst: int, *, max_keys: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str, cost: float = 1.0) -> Decision:
        now = self.clock()
        tokens, stamp = self._buckets.pop(key, (float(self.burst), now))
        # max(): a clock that steps back never mints tokens.
        tokens = min(float(self.burst), tokens + max(0.0, now - stamp) * self.rate)
        allowed = admits(tokens, self.burst, cost)
        if allowed:
            tokens -= cost
        self._buckets[key] = (tokens, max(now, stamp))
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return bucket_decision(Rate(self.rate, self.burst), tokens, allowed, cost)


# Backends ------------------------------------------------------------------------------------------------
class RateLimiter(Protocol):
    async def take(self, bucket: str, key: str, rate: Rate, cost: float = 1.0) -> Decision:
        """Take `cost` tokens from `bucket`/`key` (created full), or refuse without taking any."""
        ...

    async def take_all(self, takes: list[Take]) -> MultiDecision:
        """Take every dimension or none (the first that cannot pay is `refused`)."""
        ...

    async def close(self) -> None: ...


class Slot(Protocol):
    async def release(self) -> None:
        """Give the slot back; calling it again does nothing."""
        ...


class ConcurrencyLimiter(Protocol):
    async def acquire(self, bucket: str, key: str, limit: int) -> tuple[Decision, Slot | None]:
        """A slot of `bucket`/`key` when fewer than `limit` are held, else a refusal and None."""
        ...

    async def close(self) -> None: ...


def refill(tokens: float, stamp: float, now: float, rate: Rate) -> tuple[float, float]:
    """A bucket's tokens at `now` (a clock that steps back never mints tokens)."""
    return min(float(rate.burst), tokens + max(0.0, now - stamp) * rate.per_second), max(now, stamp)


class LocalRateLimiter:
    """In-process buckets: one `TokenBuckets` per (bucket, rate)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.clock = clock
        self.max_keys = max_keys
        self._groups: dict[tuple[str, Rate], TokenBuckets] = {}

    async def take(self, bucket: str, key: str, rate: Rate, cost: float = 1.0) -> Decision:
        return self.take_now(bucket, key, rate, cost)

    def take_now(self, bucket: str, key: str, rate: Rate, cost: float = 1.0) -> Decision:
        group = self._groups.get((bucket, rate))
        if group is None:
            group = TokenBuckets(rate.per_second, rate.burst, max_keys=self.max_keys, clock=self.clock)
            self._groups[(bucket, rate)] = group
        return group.take(key, cost)

    async def take_all(self, takes: list[Take]) -> MultiDecision:
        return self.take_all_now(takes)

    def take_all_now(self, takes: list[Take]) -> MultiDecision:
        """Every take or none: all buckets are refilled and checked first, then all are debited."""
        now = self.clock()
        states: list[tuple[TokenBuckets, float, float]] = []
        refused: int | None = None
        for index, take in enumerate(takes):
            group = self._groups.get((take.bucket, take.rate))
            if group is None:
                group = TokenBuckets(
                    take.rate.per_second, take.rate.burst, max_keys=self.max_keys, clock=self.clock
                )
                self._groups[(take.bucket, take.rate)] = group
            tokens, stamp = group._buckets.pop(take.key, (float(take.rate.burst), now))
            tokens, stamp = refill(tokens, stamp, now, take.rate)
            if refused is None and not admits(tokens, take.rate.burst, take.cost):
                refused = index
            states.append((group, tokens, stamp))
        decisions = []
        for take, (group, tokens, stamp) in zip(takes, states, strict=True):
            if refused is None:
                tokens -= take.cost
            group._buckets[take.key] = (tokens, stamp)
            if len(group._buckets) > group.max_keys:
                group._buckets.popitem(last=False)
            decisions.append(
                bucket_decision(
                    take.rate,
                    tokens,
                    refused is None or admits(tokens, take.rate.burst, take.cost),
                    take.cost,
                )
            )
        return MultiDecision(refused, tuple(decisions))

    async def close(self) -> None:
        return None


@dataclass
class _LocalSlot:
    owner: LocalConcurrencyLimiter
    name: tuple[str, str]
    released: bool = False

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        held = self.owner.held.get(self.name, 0) - 1
        if held > 0:
            self.owner.held[self.name] = held
        else:
            self.owner.held.pop(self.name, None)


class LocalConcurrencyLimiter:
    """In-process counters of held slots."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], int] = {}

    async def acquire(self, bucket: str, key: str, limit: int) -> tuple[Decision, Slot | None]:
        name = (bucket, key)
        held = self.held.get(name, 0)
        if held >= limit:
            return concurrency_decision(limit, held, allowed=False), None
        self.held[name] = held + 1
        return concurrency_decision(limit, held + 1, allowed=True), _LocalSlot(self, name)

    async def close(self) -> None:
        return None


def concurrency_decision(limit: int, held: int, *, allowed: bool) -> Decision:
    # No time frees a slot; Reset and Retry-After carry the advice to look again shortly.
    return Decision(allowed, limit, limit - held, 0 if allowed else STREAM_RETRY_MS, STREAM_RETRY_MS)


# The route-class table ----------------------------------------------------------------------------------
def _frozen(values: dict[int, Rate] | dict[int, int]) -> Mapping[int, Rate] | Mapping[int, int]:
    return MappingProxyType(values)


@dataclass(frozen=True)
class RouteLimitTable:
    """The request limits of docs/api-conventions.md; a rate without a burst of its own bursts one period's
    allowance.

    Names are the bucket names (Redis keys carry them). Rate classes 1..6 index the per-class rules.
    """

    public_read_ip: Rate = Rate(20, 60)
    relay_events_ip: int = 20
    quote_ip: Rate = Rate(2, 2)
    quote_account: Rate = Rate(5, 5)
    prepare_ip: Rate = Rate(2, 10)
    x402_ip: Rate = Rate(1, 1)
    x402_payer: Rate = Rate(6 / 60, 6)
    private_read_class: Mapping[int, Rate] = field(
        default_factory=lambda: _frozen(
            {c: Rate(r, 4 * r) for c, r in {1: 5, 2: 10, 3: 20, 4: 40, 5: 80, 6: 10}.items()}
        )
    )
    stream_class: Mapping[int, int] = field(
        default_factory=lambda: _frozen({1: 2, 2: 3, 3: 5, 4: 10, 5: 20, 6: 2})
    )
    stream_ip: int = 5
    account_write: Rate = Rate(1, 5)
    assign_ip: Rate = Rate(10, 10)
    assign_sender: Rate = Rate(2, 10)
    compat_sender: Rate = Rate(1, 5)  # compat relay: 1 RU/s per sender, burst 5 (a relay takes its RU)

    def rate(self, rule: str, rate_class: int | None = None) -> Rate:
        value = getattr(self, rule)
        if isinstance(value, Rate):
            return value
        if rate_class is None or rate_class not in value:
            raise ValueError(f"rule {rule} needs a rate class 1..6, got {rate_class}")
        return value[rate_class]  # type: ignore[no-any-return]

    def concurrency(self, rule: str, rate_class: int | None = None) -> int:
        value = getattr(self, rule)
        if isinstance(value, int):
            return value
        if rate_class is None or rate_class not in value:
            raise ValueError(f"rule {rule} needs a rate class 1..6, got {rate_class}")
        return value[rate_class]  # type: ignore[no-any-return]


class RouteLimiter:
    """The table applied through a backend; a refusal is `RATE_LIMITED` with `details.scope`."""

    def __init__(self, table: RouteLimitTable, rates: RateLimiter, streams: ConcurrencyLimiter) -> None:
        self.table = table
        self.rates = rates
        self.streams = streams

    def _bucket(self, rule: str, rate_class: int | None) -> str:
        # Only per-class rules keep a bucket per class; the others ignore the caller's class.
        per_class = not isinstance(getattr(self.table, rule), Rate | int)
        return f"{rule}.{rate_class}" if per_class else rule

    async def check(
        self, rule: str, key: str, scope: str, *, rate_class: int | None = None, cost: float = 1.0
    ) -> Decision:
        decision = await self.rates.take(
            self._bucket(rule, rate_class), key, self.table.rate(rule, rate_class), cost
        )
        if not decision.allowed:
            raise refusal(decision, scope, f"too many requests per {scope}")
        return decision

    async def hold(
        self, rule: str, key: str, scope: str, *, rate_class: int | None = None
    ) -> tuple[Decision, Slot]:
        decision, slot = await self.streams.acquire(
            self._bucket(rule, rate_class), key, self.table.concurrency(rule, rate_class)
        )
        if slot is None:
            raise refusal(decision, scope, f"too many concurrent streams per {scope}")
        return decision, slot

    async def close(self) -> None:
        await self.rates.close()
        await self.streams.close()


def refusal(decision: Decision, scope: str, detail: str) -> ApiError:
    return ApiError(
        "RATE_LIMITED",
        detail=detail,
        details={"retryAfterMs": max(1, decision.retry_after_ms), "scope": scope},
        headers={**decision.headers(), "RateLimit-Remaining": "0"},
    )


def local_route_limiter(table: RouteLimitTable | None = None) -> RouteLimiter:
    return RouteLimiter(table or RouteLimitTable(), LocalRateLimiter(), LocalConcurrencyLimiter())
