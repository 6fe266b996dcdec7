"""The billing stages of a relay after entitlement: the free-flow limits, then the rate-class limiter.

Free flow (calls named in the contract's `free_operations`):
- one free transaction in flight per sender (FREE_FLOW_BUSY, `reason: in_flight`);
- flag calls (setAutoRenew, setPayg, releaseEscrow, renew) 10 per 24 h and 30 per 30 days per account
  (the sender's paying account, else the sender), counting flag calls only: past that the relay is billed
  as a normal one (`free: false`) when the sender has a paying account, otherwise FREE_FLOW_BARRED with
  `untilMs` (when the oldest counted flag call leaves its window);
- a platform-wide rate of free relays (RATE_LIMITED, scope `free_flow`) and a platform budget per 24 h
  (FREE_FLOW_UNAVAILABLE).
Counts come from the reservations table (one `free` reservation per co-signed free relay, not released,
with the function it called).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from multiversx_sdk import Transaction
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.billing.decision import EntitlementDecision
from gasless.billing.entitlement import BillingEntitlement
from gasless.billing.policy import FLAG_FUNCTIONS
from gasless.core.errors import ApiError
from gasless.db import reservations
from gasless.limits.accounts import AccountLimiter
from gasless.limits.buckets import Decision, Rate, Take

DAY_MS = 86_400_000
# What the billed path answers for an account that cannot pay a relay: past the free flag calls it is barred.
UNBILLABLE = frozenset({"NO_ENTITLEMENT", "QUOTA_EXHAUSTED", "PAYG_PRICE_ABOVE_MAX"})
MONTH_MS = 30 * DAY_MS


@dataclass(frozen=True)
class FreeFlowLimits:
    per_day: int = 10
    per_30_days: int = 30
    platform_per_day: int = 50_000
    platform_rate: Rate = Rate(20, 100)


class BillingGate:
    def __init__(
        self,
        engine: AsyncEngine,
        entitlement: BillingEntitlement,
        limiter: AccountLimiter,
        *,
        free_flow: FreeFlowLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.entitlement = entitlement
        self.limiter = limiter
        self.free_limits = free_flow or FreeFlowLimits()
        self.clock = clock

    async def free_flow(
        self,
        decision: EntitlementDecision,
        tx: Transaction,
        sender: str,
        sponsor: Any | None,
        free_in_flight: Sequence[Any],
        *,
        account: str | None = None,
    ) -> EntitlementDecision:
        """The decision for a free operation after the free-flow limits (maybe a paid one, `free: false`)."""
        if not decision.free:
            return decision
        busy = free_in_flight  # the sender's free-flow intents in flight (nonce, tx_hash)
        if busy and not any(int(r.nonce) == tx.nonce for r in busy):
            raise ApiError(
                "FREE_FLOW_BUSY",
                detail=f"the sender already has a free transaction in flight ({busy[0].tx_hash}); wait for it",
                details={"reason": "in_flight", "txHash": busy[0].tx_hash, "retryAfterMs": 1_000},
            )
        paying = await self.entitlement.mirror.paying_account(sender)
        account = paying[0] if paying is not None else sender
        now = int(self.clock() * 1000)
        day, month, platform_day, oldest_day, oldest_month = await self._counts(account, now)
        limits = self.free_limits
        flag_call = decision.function in FLAG_FUNCTIONS
        if flag_call and (day >= limits.per_day or month >= limits.per_30_days):
            if paying is not None or sponsor is not None:
                try:
                    return await self.entitlement.decide(
                        tx, sender, sponsor, free_allowed=False, account=account
                    )
                except ApiError as refusal:
                    if refusal.code not in UNBILLABLE:
                        raise
            until = (oldest_day + DAY_MS) if day >= limits.per_day else (oldest_month + MONTH_MS)
            raise ApiError(
                "FREE_FLOW_BARRED",
                detail=f"{account} used its free flag calls ({limits.per_day} per 24 h, {limits.per_30_days} "
                "per 30 days); buy a plan or wait",
                details={"untilMs": int(until), "account": account},
            )
        if platform_day >= limits.platform_per_day:
            raise ApiError(
                "FREE_FLOW_UNAVAILABLE",
                detail="the platform's free-transaction budget for the last 24 h is spent; retry later",
                details={"retryAfterMs": 60_000},
            )
        result = await self.limiter.backend.take_all([Take("free_flow", "all", limits.platform_rate, 1)])
        if not result.allowed:
            decision_ = result.decisions[0]
            raise ApiError(
                "RATE_LIMITED",
                detail="too many free relays on the platform right now; retry shortly",
                details={"retryAfterMs": max(1, decision_.retry_after_ms), "scope": "free_flow"},
                headers={**decision_.headers(), "RateLimit-Remaining": "0"},
            )
        return EntitlementDecision("free", account, ru=0, function=decision.function)

    async def flag_calls(self, account: str) -> tuple[int, int, int]:
        """The account's free flag calls in the last 24 h and 30 days (what the flags builder prices by), and
        when the next one is free again once they are used up (ms; now when some are left)."""
        now = int(self.clock() * 1000)
        day, month, _, oldest_day, oldest_month = await self._counts(account, now)
        limits = self.free_limits
        free_again = now
        if day >= limits.per_day:
            free_again = max(free_again, oldest_day + DAY_MS)
        if month >= limits.per_30_days:
            free_again = max(free_again, oldest_month + MONTH_MS)
        return day, month, free_again

    async def billable(self, tx: Transaction, sender: str) -> bool:
        """Whether a call past the free flag calls could be billed as a normal relay for `sender` (a paying
        account whose plan or pay-as-you-go covers it)."""
        try:
            await self.entitlement.decide(tx, sender, None, free_allowed=False)
        except ApiError as refusal:
            if refusal.code in UNBILLABLE:
                return False
            raise
        return True

    async def _counts(self, account: str, now: int) -> tuple[int, int, int, int, int]:
        free = (reservations.c.billing_class == "free") & (reservations.c.state != "released")
        mine = (
            free & (reservations.c.account == account) & reservations.c.function.in_(sorted(FLAG_FUNCTIONS))
        )
        async with self.engine.connect() as conn:
            day, oldest_day = (
                await conn.execute(
                    select(func.count(), func.min(reservations.c.created_at_ms)).where(
                        mine, reservations.c.created_at_ms > now - DAY_MS
                    )
                )
            ).one()
            month, oldest_month = (
                await conn.execute(
                    select(func.count(), func.min(reservations.c.created_at_ms)).where(
                        mine, reservations.c.created_at_ms > now - MONTH_MS
                    )
                )
            ).one()
            platform = (
                await conn.execute(
                    select(func.count()).where(free, reservations.c.created_at_ms > now - DAY_MS)
                )
            ).scalar_one()
        return int(day), int(month), int(platform), int(oldest_day or now), int(oldest_month or now)

    async def admit(
        self, decision: EntitlementDecision, tx: Transaction, shard: int, sponsor: Any | None
    ) -> Decision | None:
        """The rate-class limiter for the paying account (free relays have their own limits above)."""
        if decision.free or decision.account is None:
            return None
        classes = await self.entitlement.mirror.rate_classes()
        rate_class = classes.get(decision.rate_class) if decision.rate_class is not None else None
        return await self.limiter.admit(
            account=decision.account,
            rate_class=rate_class,
            ru=decision.ru,
            gas_limit=tx.gas_limit,
            shard=shard,
            key=sponsor,
        )
