"""Redis backends of the limiters: buckets and stream slots shared by every host of one environment.

Each decision is one Lua script (one round trip, atomic). Time is Redis's own clock (`TIME`), so hosts
with slightly different clocks refill one bucket consistently; tests pass an explicit clock instead.
Keys are `<prefix>:<env>:<chainId>:rate|conc:<bucket>:<key>` and expire once they carry no information (a
bucket when it would be full again, a slot set when its last lease lapses).

When Redis does not answer, decisions fall back to in-process limits (each host then limits on its own)
rather than refusing every request: the limits protect the service, they must not take it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gasless.limits.buckets import (
    Decision,
    LocalConcurrencyLimiter,
    LocalRateLimiter,
    MultiDecision,
    Rate,
    Slot,
    Take,
    admits,
    bucket_decision,
    concurrency_decision,
)

log = structlog.get_logger("gasless.limits.buckets")

# KEYS[1] bucket; ARGV: per_second, burst, cost, now_ms ("" = Redis TIME). Returns {allowed, tokens}.
# Admission is `buckets.admits`: the cost, or the whole burst for a request costing more (the bucket then
# goes into debt: `tokens` below zero, refilled from there), less `TOKEN_EPSILON` (1e-9) of rounding.
# Numbers are stored with 17 significant digits (`exact`): a millisecond stamp from Redis TIME keeps its
# fraction, so a wait computed to the millisecond is enough.
_TAKE = """
local function exact(x) return string.format('%.17g', x) end
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(state[1])
local stamp = tonumber(state[2])
if tokens == nil or stamp == nil then
  tokens = burst
  stamp = now
end
if now > stamp then
  tokens = math.min(burst, tokens + (now - stamp) * rate / 1000)
  stamp = now
end
local allowed = 0
if tokens + 1e-9 >= math.min(cost, burst) then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', exact(tokens), 'stamp', exact(stamp))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, exact(tokens)}
"""

# All-or-nothing over n buckets. KEYS: the buckets; ARGV[1] now_ms ("" = Redis TIME), then per bucket
# (per_second, burst, cost). Returns {refused index (1-based, 0 = none), tokens...}.
_TAKE_ALL = """
local function exact(x) return string.format('%.17g', x) end
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local n = #KEYS
local tokens = {}
local stamps = {}
local refused = 0
for i = 1, n do
  local rate = tonumber(ARGV[2 + (i - 1) * 3])
  local burst = tonumber(ARGV[3 + (i - 1) * 3])
  local cost = tonumber(ARGV[4 + (i - 1) * 3])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'stamp')
  local tk = tonumber(state[1])
  local st = tonumber(state[2])
  if tk == nil or st == nil then
    tk = burst
    st = now
  end
  if now > st then
    tk = math.min(burst, tk + (now - st) * rate / 1000)
    st = now
  end
  if refused == 0 and tk + 1e-9 < math.min(cost, burst) then
    refused = i
  end
  tokens[i] = tk
  stamps[i] = st
end
local out = {refused}
for i = 1, n do
  local rate = tonumber(ARGV[2 + (i - 1) * 3])
  local burst = tonumber(ARGV[3 + (i - 1) * 3])
  local cost = tonumber(ARGV[4 + (i - 1) * 3])
  local tk = tokens[i]
  if refused == 0 then
    tk = tk - cost
  end
  redis.call('HSET', KEYS[i], 'tokens', exact(tk), 'stamp', exact(stamps[i]))
  redis.call('PEXPIRE', KEYS[i], math.ceil((burst - tk) / rate * 1000) + 1000)
  out[i + 1] = exact(tk)
end
return out
"""

# KEYS[1] lease set; ARGV: limit, lease_ms, lease id, now_ms ("" = Redis TIME). Returns {acquired, held}.
_ACQUIRE = """
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then
  return {0, held}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return {1, held + 1}
"""

# KEYS[1] lease set; ARGV: lease_ms, lease id, now_ms. Extends a lease that still exists.
_RENEW = """
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local renewed = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
end
return renewed
"""


def _now_arg(clock: Callable[[], float] | None) -> str:
    return "" if clock is None else repr(clock() * 1000)


class _Health:
    """During an outage, Redis is tried again at most once per `retry_s` (a request must not wait for a
    connect timeout each time); the outage is logged once, not once per request."""

    def __init__(self, what: str, retry_s: float = 1.0) -> None:
        self.what = what
        self.retry_s = retry_s
        self.failing = False
        self.skip_until = 0.0

    def skip(self) -> bool:
        return self.failing and time.monotonic() < self.skip_until

    def failed(self, exc: Exception) -> None:
        self.skip_until = time.monotonic() + self.retry_s
        if not self.failing:
            self.failing = True
            log.warning(f"redis unreachable; {self.what} fall back to this host", error=type(exc).__name__)

    def ok(self) -> None:
        if self.failing:
            self.failing = False
            log.info(f"redis reachable again; {self.what} are shared")


class RedisRateLimiter:
    def __init__(self, redis: Redis, namespace: str, *, clock: Callable[[], float] | None = None) -> None:
        self.redis = redis
        self.namespace = namespace
        self.clock = clock
        self._take = redis.register_script(_TAKE)
        self._take_all = redis.register_script(_TAKE_ALL)
        self._fallback = LocalRateLimiter()
        self._health = _Health("rate limits")

    def key(self, bucket: str, key: str) -> str:
        return f"{self.namespace}:rate:{bucket}:{key}"

    async def take(self, bucket: str, key: str, rate: Rate, cost: float = 1.0) -> Decision:
        if self._health.skip():
            return self._fallback.take_now(bucket, key, rate, cost)
        try:
            allowed, tokens = await self._take(
                keys=[self.key(bucket, key)],
                args=[repr(float(rate.per_second)), rate.burst, repr(float(cost)), _now_arg(self.clock)],
            )
        except (RedisError, OSError) as exc:
            self._health.failed(exc)
            return self._fallback.take_now(bucket, key, rate, cost)
        self._health.ok()
        return bucket_decision(rate, float(tokens), bool(int(allowed)), cost)

    async def take_all(self, takes: list[Take]) -> MultiDecision:
        """Every take or none, in one script (atomic across hosts)."""
        if self._health.skip():
            return self._fallback.take_all_now(takes)
        args: list[str | int] = [_now_arg(self.clock)]
        for take in takes:
            args += [repr(float(take.rate.per_second)), take.rate.burst, repr(float(take.cost))]
        try:
            answer = await self._take_all(keys=[self.key(t.bucket, t.key) for t in takes], args=args)
        except (RedisError, OSError) as exc:
            self._health.failed(exc)
            return self._fallback.take_all_now(takes)
        self._health.ok()
        refused = int(answer[0]) - 1
        ok = refused < 0
        decisions = tuple(
            bucket_decision(t.rate, float(tokens), ok or admits(float(tokens), t.rate.burst, t.cost), t.cost)
            for t, tokens in zip(takes, answer[1:], strict=True)
        )
        return MultiDecision(None if ok else refused, decisions)

    async def close(self) -> None:
        return None


@dataclass(eq=False)
class _RedisSlot:
    owner: RedisConcurrencyLimiter
    key: str
    lease_id: str
    released: bool = False

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.owner.held.discard(self)
        try:
            await self.owner.redis.zrem(self.key, self.lease_id)
        except (RedisError, OSError):
            pass  # the lease lapses on its own


class RedisConcurrencyLimiter:
    """Slots are leases in a sorted set (score = expiry); a renewal loop extends the leases this host holds,
    so the slots of a host that dies free themselves within `lease_ms`."""

    def __init__(
        self,
        redis: Redis,
        namespace: str,
        *,
        lease_ms: int = 30_000,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.redis = redis
        self.namespace = namespace
        self.lease_ms = lease_ms
        self.clock = clock
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self.held: set[_RedisSlot] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._fallback = LocalConcurrencyLimiter()
        self._health = _Health("stream limits")

    def key(self, bucket: str, key: str) -> str:
        return f"{self.namespace}:conc:{bucket}:{key}"

    async def acquire(self, bucket: str, key: str, limit: int) -> tuple[Decision, Slot | None]:
        if self._health.skip():
            return await self._fallback.acquire(bucket, key, limit)
        name = self.key(bucket, key)
        lease_id = secrets.token_hex(12)
        try:
            acquired, held = await self._acquire(
                keys=[name], args=[limit, self.lease_ms, lease_id, _now_arg(self.clock)]
            )
        except (RedisError, OSError) as exc:
            self._health.failed(exc)
            return await self._fallback.acquire(bucket, key, limit)
        self._health.ok()
        if not int(acquired):
            return concurrency_decision(limit, int(held), allowed=False), None
        slot = _RedisSlot(self, name, lease_id)
        self.held.add(slot)
        self._start_renewer()
        return concurrency_decision(limit, int(held), allowed=True), slot

    def _start_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_forever(), name="stream-slot-renewer")

    async def renew(self) -> None:
        """Extend every lease this host holds (one pipelined round trip)."""
        slots = list(self.held)
        if not slots:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for slot in slots:
                await self._renew(
                    keys=[slot.key], args=[self.lease_ms, slot.lease_id, _now_arg(self.clock)], client=pipe
                )
            await pipe.execute()

    async def _renew_forever(self) -> None:
        while self.held:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.renew()
            except (RedisError, OSError) as exc:
                self._health.failed(exc)

    async def close(self) -> None:
        """Stop renewing; the leases still held are released (a host shutting down frees its slots)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(BaseException):
                await self._renewer
        for slot in list(self.held):
            await slot.release()


def redis_namespace(prefix: str, env: str, chain_id: str) -> str:
    return f"{prefix}:{env}:{chain_id}"


def redis_backends(redis: Redis, namespace: str) -> tuple[RedisRateLimiter, RedisConcurrencyLimiter]:
    return RedisRateLimiter(redis, namespace), RedisConcurrencyLimiter(redis, namespace)
