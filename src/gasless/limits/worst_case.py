"""Retryable means it can pass: the check that no bucket refuses a request for ever.

A refusal marked `retryable: true` (a 429 or 503 with `Retry-After`) promises that the same request, sent
again unchanged, can pass later. For a token bucket that holds when every request a front can send is
admitted by some wait. A front lists, for every bucket a request can meet, the most one request takes from
it (`WorstCase`: one `Take` per dimension, all taken together, as `take_all` does); `unpassable` plays each
on a real backend with a clock it moves itself, from three starts (a full bucket, an emptied one, and one the
same request has just paid for), and retries after exactly the wait each refusal states. It answers the
cases that still do not pass: a bucket whose burst is below the request's cost, under a rule that admits
only what the bucket holds, is one (a compat relay above 10 000 000 gas was refused that way for ever).

Any front can call it: `route_table_cases(table, costs)` for the route-class table, and for other
buckets the `Take`s of one request (e.g. `AccountLimiter.takes(...)` of the largest relay a rate class
allows). `tests/limits/test_retryable_can_pass.py` runs it for `/v1/*` and the compat facade.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gasless.limits.buckets import Rate, RateLimiter, RouteLimitTable, Take


@dataclass(frozen=True)
class WorstCase:
    """The largest single request on some buckets: its takes, all paid together or none."""

    name: str
    takes: tuple[Take, ...]


def route_table_cases(table: RouteLimitTable, costs: Mapping[str, float] | None = None) -> list[WorstCase]:
    """A case per token bucket of the route-class table (per rate class for per-class rules); a request
    takes 1 token unless `costs` names its rule with more (the compat relay takes its RU). Concurrency
    rules have no cost: a slot frees when a stream ends."""
    costs = costs or {}
    cases: list[WorstCase] = []
    for rule, value in vars(table).items():
        cost = float(costs.get(rule, 1))
        if isinstance(value, Rate):
            cases.append(WorstCase(rule, (Take(rule, "worst", value, cost),)))
        elif isinstance(value, Mapping):
            for rate_class, rate in value.items():
                if isinstance(rate, Rate):
                    name = f"{rule}.{rate_class}"
                    cases.append(WorstCase(name, (Take(name, "worst", rate, cost),)))
    return cases


async def unpassable(
    cases: list[WorstCase],
    backend: Callable[[Callable[[], float]], RateLimiter],
    *,
    rounds: int | None = None,
) -> list[str]:
    """The cases whose request is still refused after waiting what its refusals say (at most `rounds`
    waits, by default twice the number of its dimensions plus two: each dimension may need its own wait,
    and a wait computed to the millisecond may leave a token short by a rounding). `backend` builds the
    backend under test on the clock it is given (seconds)."""
    now = [1_000_000.0]
    limiter = backend(lambda: now[0])
    stuck: list[str] = []
    for case in cases:
        for start in ("full", "emptied", "just paid"):
            key = f"{case.name}:{start}:{uuid.uuid4().hex}"
            takes = [replace(take, key=f"{take.key}:{key}") for take in case.takes]
            if start == "emptied":
                # Other traffic took the whole burst of every dimension.
                await limiter.take_all([replace(take, cost=float(take.rate.burst)) for take in takes])
            elif start == "just paid":
                await _until_admitted(limiter, takes, now, rounds or 2 * len(takes) + 2)
            if not await _until_admitted(limiter, takes, now, rounds or 2 * len(takes) + 2):
                stuck.append(f"{case.name} ({start})")
    await limiter.close()
    return stuck


async def _until_admitted(limiter: RateLimiter, takes: list[Take], now: list[float], rounds: int) -> bool:
    for _ in range(rounds + 1):
        result = await limiter.take_all(takes)
        if result.allowed:
            return True
        assert result.refused is not None
        now[0] += result.decisions[result.refused].retry_after_ms / 1000
    return False
