"""The pricing document (schema version `pricing-v1`) and the tariff history entries.

Money (micro-USDC), RU, gas and atto amounts are decimal strings (docs/purchases.md,
docs/schemas/pricing-v1.json); ids, versions and durations (`...Ms`) are JSON integers.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gasless.http.formats import DECIMAL_PATTERN
from gasless.http.pages import Page

PRICING_SCHEMA_VERSION = "pricing-v1"
Audience = Literal["human", "agent"]
DecimalString = Annotated[str, Field(pattern=DECIMAL_PATTERN, description="an integer in decimal")]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PricingTier(_Doc):
    """A plan tier as the contract configures it."""

    id: int = Field(ge=0, le=4_294_967_295)
    name: str
    audience: Audience
    available: bool = Field(description="can be bought now (false: TIER_NOT_PURCHASABLE)")
    rateClass: int = Field(ge=1, le=255, description="the rate class the tier's plan relays under")
    priceMicroUsdc: Annotated[DecimalString, Field(description="price per month")]
    includedRu: Annotated[DecimalString, Field(description="Relay Units included per period (0: none)")]
    periodMs: int = Field(ge=0, description="length of one period; 0: no period (pay-as-you-go tier)")
    payg: bool = Field(description="relays are paid per RU from the account's escrow")


class PricingRateClass(_Doc):
    id: int = Field(ge=1, le=255)
    ruPerSecond: DecimalString
    ruBurst: DecimalString
    gasPerSecondPerShard: DecimalString
    gasBurstPerShard: DecimalString
    maxGasLimit: Annotated[DecimalString, Field(description="largest gas limit of one tx")]
    ruPerHour: DecimalString


class PricingRateClasses(_Doc):
    policyVersion: int = Field(ge=0, description="the contract's policy version these values belong to")
    classes: list[PricingRateClass]


class RuScheduleStep(_Doc):
    maxGasLimit: Annotated[DecimalString, Field(description="inclusive ceiling")]
    ru: DecimalString


class RuSchedule(_Doc):
    version: str = Field(description="changes are announced with their schedule version")
    steps: list[RuScheduleStep] = Field(
        description="a transaction pays the RU of the first step its gas limit fits"
    )
    feeRelevantFields: list[str] = Field(
        description="transaction fields the schedule prices (gasLimit); any other fee-relevant field a "
        "transaction sets is refused with UNSUPPORTED_TX_FIELD"
    )


class DepositBounds(_Doc):
    minMicroUsdc: DecimalString
    maxMicroUsdc: Annotated[DecimalString, Field(description="0 means unlimited")]


class SenderFee(_Doc):
    """The fee in force for each authorised sender added (`addSenders`); an increase is published only once
    it is in force (it takes effect 172 800 000 ms after it is set)."""

    ru: DecimalString
    microUsdc: DecimalString


class HowToBuy(_Doc):
    freeOperations: list[str] = Field(description="contract calls relayed free of charge")
    paymentToken: str = Field(description="the token deposits and purchases are paid in")
    contract: str = Field(description="the billing contract")
    prepare: dict[str, str] = Field(description="the routes that build the unsigned purchase calls")
    x402: str = Field(description="the x402 discovery document (pay over HTTP)")


class PricingDocument(_Doc):
    """What the service sells and on which terms, from the billing contract's views."""

    schemaVersion: Literal["pricing-v1"]
    policyVersion: int = Field(ge=0)
    chainId: str
    ruPriceMicroUsdc: Annotated[DecimalString, Field(description="pay-as-you-go price of one RU")]
    tiers: list[PricingTier]
    rateClasses: PricingRateClasses
    ruSchedule: RuSchedule
    deposit: DepositBounds
    senderFee: SenderFee
    howToBuy: HowToBuy


class TariffEntry(_Doc):
    """One change of the tariff (append-only on chain, `getTariffHistory`)."""

    seq: int = Field(ge=1)
    timestampMs: int = Field(ge=0, description="when the change was made (block time)")
    effectiveMs: int = Field(ge=0, description="when it takes effect")
    kind: str = Field(description="what changed, e.g. TierPrice, RateClassRuPerSec, SenderFeeRu, RuPrice")
    subjectId: int = Field(ge=0, description="the tier or rate class it concerns (0: contract-wide)")
    value: DecimalString
    policyVersion: int = Field(ge=0)


class TariffHistoryPage(Page[TariffEntry]):
    """A page of tariff entries, newest first."""
