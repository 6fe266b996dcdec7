"""An entitlement that bills nothing: for `bench/relay.py --unbilled` only (setting `bench_unbilled`), so
one benchmark run measures the relay path with and without billing. Never enable it on a real host."""

from __future__ import annotations

from typing import Any

from multiversx_sdk import Transaction

from gasless.billing.decision import EntitlementDecision


class UnbilledEntitlement:
    """Every relay free and unaccounted: no contract view, no free-flow count, no limiter, no reservation
    (the reservation is skipped for a decision without an account)."""

    async def decide(
        self,
        tx: Transaction,
        sender: str,
        sponsor: Any | None,
        *,
        free_allowed: bool = True,
        account: str | None = None,
    ) -> EntitlementDecision:
        return EntitlementDecision("free", None)
