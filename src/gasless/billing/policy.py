"""The per-transaction admission policy: the self-serve data ceiling and the per-account allow-lists."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_DATA_BYTES_SELF_SERVE = 4_096  # docs/billing.md: the self-serve data ceiling (more only by allow-list)
# The account's flag calls (docs/billing.md, "Free flow"): free up to the per-account free flag limits, only
# for an address with an on-chain account; `renew` is free only for the signer's own account.
FLAG_FUNCTIONS = frozenset({"setAutoRenew", "setPayg", "releaseEscrow", "renew"})
# The billing contract's errors that mean a catalogue condition: a failed execution reports the code on its
# intent (`failure`) and usage row (`failureCode`), e.g. an addSenders fee raised above the signed max_fee.
CONTRACT_FAILURES = {
    "ERR_PRICE_ABOVE_MAX": "PRICE_ABOVE_MAX",
    "ERR_INSUFFICIENT_CREDITS": "INSUFFICIENT_CREDITS",
    "ERR_PAUSED": "CONTRACT_PAUSED",
    "ERR_DEPOSITS_PAUSED": "CONTRACT_PAUSED",
    "ERR_SWAP_VENUE_PAUSED": "SWAP_VENUE_PAUSED",
    "ERR_SWAP_BUDGET_EXHAUSTED": "SWAP_BUDGET_EXHAUSTED",
    "ERR_DEPOSIT_BELOW_MIN": "DEPOSIT_BELOW_MIN",
    "ERR_DEPOSIT_ABOVE_MAX": "DEPOSIT_ABOVE_MAX",
    "ERR_TIER_NOT_PURCHASABLE": "TIER_NOT_PURCHASABLE",
    "ERR_DOWNGRADE_NOT_IMMEDIATE": "DOWNGRADE_NOT_IMMEDIATE",
    "ERR_QUEUED_BLOCK_EXISTS": "QUEUED_BLOCK_EXISTS",
    "ERR_RENEW_NOT_APPLICABLE": "RENEW_NOT_APPLICABLE",
    "ERR_ACCOUNT_SUSPENDED": "ACCOUNT_SUSPENDED",
}


@dataclass(frozen=True)
class AdmissionPolicy:
    """Operator settings of the admission policy (allow-lists are per account)."""

    deploy_allowlist: frozenset[str] = frozenset()
    data_allowlist: frozenset[str] = frozenset()

    @classmethod
    def of(cls, deploy: Iterable[str] = (), data: Iterable[str] = ()) -> AdmissionPolicy:
        return cls(frozenset(deploy), frozenset(data))
