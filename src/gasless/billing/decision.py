"""Who pays for a relay: the `Entitlement` seam the relay core calls, and its decision.

The billing implementation of the seam is `gasless.billing.entitlement.BillingEntitlement`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from multiversx_sdk import Transaction


@dataclass(frozen=True)
class EntitlementDecision:
    """Who pays for a relay and what the reservation at the commit point needs.

    `billing_class` is the class asked for (`plan`, `payg`, `sponsor` or `free`); a plan whose period cap
    is spent falls back to pay-as-you-go at the commit point when `payg_price_micro` is set.
    """

    billing_class: str  # plan | payg | sponsor | free
    account: str | None
    auth_mode: str = "signed_tx"
    ru: int = 0
    rate_class: int | None = None
    period_id: int | None = None  # the running plan period's start (ms); None without a period cap
    included_ru: int | None = None  # the period cap
    payg_price_micro: int | None = None  # per RU, when pay-as-you-go may pay
    payg_cap_micro: int | None = None  # escrow (and budget) available to pay-as-you-go
    api_key_id: str | None = None
    function: str | None = None
    # What the paying account holds (billing.advice.Holdings.as_json), for the commit point's refusals.
    holdings: dict[str, Any] | None = None

    @property
    def free(self) -> bool:
        return self.billing_class == "free"

    def as_json(self) -> dict[str, Any]:
        """Stored with the intent: the public members (BillingInfo) plus what the reservation reads."""
        return {
            "authMode": self.auth_mode,
            "billingClass": self.billing_class,
            "account": self.account,
            "ru": self.ru,
            "free": self.free,
            "rateClass": self.rate_class,
            "periodId": self.period_id,
            "includedRu": self.included_ru,
            "paygPriceMicro": self.payg_price_micro,
            "paygCapMicro": self.payg_cap_micro,
            "apiKeyId": self.api_key_id,
            "function": self.function,
            **({"holdings": self.holdings} if self.holdings is not None else {}),
        }


class Entitlement(Protocol):
    async def decide(
        self,
        tx: Transaction,
        sender: str,
        sponsor: Any | None,
        *,
        free_allowed: bool = True,
        account: str | None = None,
    ) -> EntitlementDecision:
        """The paying side of this relay, or ApiError (NO_ENTITLEMENT, CONTRACT_PAUSED, ...). `sponsor` is
        the verified sponsor key (gasless.keys.service.SponsorKey) when one came with the request;
        `free_allowed=False` bills a free operation as a normal relay (free-flow limits passed); `account`
        is the account the request names as payer (SENDER_NOT_AUTHORIZED unless it pays for the sender)."""
        ...
