"""In-process token buckets (the embedded default). Issue-level Redis buckets share the same interface."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_ms: int


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
        tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
        allowed = tokens >= cost
        if allowed:
            tokens -= cost
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        missing = max(0.0, cost - tokens)
        retry_ms = 0 if allowed else math.ceil(missing / self.rate * 1000)
        reset_ms = math.ceil((self.burst - tokens) / self.rate * 1000)
        return Decision(allowed, self.burst, int(tokens), retry_ms, reset_ms)
