"""Account mirror read models (member names are ours: the interface contract leaves them open; docs/mirror.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gasless.http.pages import Page


class PlanBlock(BaseModel):
    """A plan block as the contract holds it."""

    tierId: int
    tierName: str | None
    startMs: int
    endMs: int | None = Field(description="null for a block without a period (pay-as-you-go tiers)")
    includedRu: int = Field(description="RU included per 30-day period")
    months: int
    pricePaidMicro: int
    ref: str


class PaygSettings(BaseModel):
    enabled: bool
    budgetMicro: int
    autoTopup: bool
    maxPaygPriceMicro: int = Field(description="per RU; 0 = no cap")


class Account(BaseModel):
    """The contract's account record as mirrored from finalised events."""

    address: str
    creditsMicro: int
    escrowMicro: int
    runningPlan: PlanBlock | None
    queuedPlan: PlanBlock | None
    autoRenew: bool
    payg: PaygSettings
    suspended: bool
    createdMs: int
    senderCount: int
    mirroredHyperblockNonce: int = Field(
        description="the finalised hyperblock whose events last refreshed it"
    )


QuotaState = Literal["NO_ACCOUNT", "active", "payg", "halted"]
HaltReason = Literal["suspended", "no_plan", "plan_ended", "quota_exhausted"]


class Quota(BaseModel):
    """Derived service state of the account that pays for `address`, evaluated in shard-1 chain time."""

    address: str = Field(description="the address asked about")
    account: str | None = Field(description="the account that would be billed; null without one")
    resolvedFrom: Literal["account", "authorised_sender"] | None
    state: QuotaState
    haltReason: HaltReason | None = None
    evaluatedAtMs: int = Field(description="shard-1 chain time the state was evaluated at")
    tierId: int | None = None
    rateClass: int | None = None
    periodId: int | None = Field(default=None, description="the running period's start (ms)")
    periodStartMs: int | None = None
    periodEndMs: int | None = None
    includedRu: int | None = None
    usedRu: int | None = None
    remainingRu: int | None = None
    creditsMicro: int | None = None
    escrowMicro: int | None = None
    paygEnabled: bool | None = None


PurchaseKind = Literal[
    "deposit",
    "plan_purchase",
    "renewal",
    "renewal_skipped",
    "escrow_move",
    "payg_settlement",
    "sender_fee",
    "grant",
]


class PurchaseEvent(BaseModel):
    """One finalised contract event of the account's purchase timeline."""

    kind: PurchaseKind
    event: str = Field(description="the contract event it comes from")
    amountMicro: int | None
    tierId: int | None
    txHash: str
    eventIndex: int
    hyperblockNonce: int
    blockTsMs: int
    details: dict[str, Any]


class PurchasesPage(Page[PurchaseEvent]):
    """A page of the purchase timeline, newest first."""
