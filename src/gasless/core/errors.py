"""The error catalogue (published as docs/errors.json) as data, the one exception type, and RFC 9457 rendering.

Every error the API answers is an `ApiError` whose code is in `CATALOGUE`; `problem_document` is the only
place that turns one into `application/problem+json`. The catalogue is versioned and published as JSON
(`catalogue_document`, written to `docs/errors.json`).

ApiError
 - carries: code (catalogue key), detail (human text), details (per-code members), headers
 - rendered: type = {docs_url}/errors/<kebab-case-code>, title, status, detail, code, instance, details
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

CATALOGUE_VERSION = "1.0.0-draft.1"
PROBLEM_MEDIA_TYPE = "application/problem+json"

Group = Literal["relay", "purchase", "platform", "x402"]
Resign = Literal["NONE", "SAME_BYTES", "NEW_SIGNATURE_SAME_NONCE"]


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    status: int
    retryable: bool
    group: Group
    condition: str
    resign: Resign | None = None  # relay group only
    details: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return self.code.lower().replace("_", "-")

    @property
    def title(self) -> str:
        return self.code.replace("_", " ").capitalize()

    def type_uri(self, docs_url: str) -> str:
        return f"{docs_url.rstrip('/')}/errors/{self.slug}"


def _e(
    code: str,
    status: int,
    retryable: bool,
    group: Group,
    condition: str,
    *,
    resign: Resign | None = None,
    details: tuple[str, ...] = (),
) -> ErrorSpec:
    return ErrorSpec(code, status, retryable, group, condition.replace("`", ""), resign, details)


_SPECS: tuple[ErrorSpec, ...] = (
    # relay group
    _e(
        "MALFORMED_REQUEST",
        400,
        False,
        "relay",
        "body does not match the endpoint schema",
        resign="NONE",
        details=("field",),
    ),
    _e(
        "VARIANTS_NOT_SUPPORTED",
        400,
        False,
        "relay",
        "several signed variants of one transaction",
        resign="NONE",
    ),
    _e(
        "RELAYER_SIGNATURE_PRESENT",
        400,
        False,
        "relay",
        "transaction already had `relayerSignature`",
        resign="NONE",
    ),
    _e(
        "CHAIN_ID_MISMATCH",
        400,
        False,
        "relay",
        "signed for another network than the host serves",
        resign="NONE",
    ),
    _e("TX_VERSION_UNSUPPORTED", 400, False, "relay", "transaction `version` not relayed", resign="NONE"),
    _e(
        "TX_OPTIONS_UNSUPPORTED",
        400,
        False,
        "relay",
        "`options` has an unsupported bit (the guarded bit is fine)",
        resign="NONE",
    ),
    _e("LEASE_MISSING", 400, False, "relay", "no lease from assign", resign="NONE"),
    _e("LEASE_INVALID", 403, False, "relay", "lease did not verify", resign="NONE"),
    _e("LEASE_MISMATCH", 409, False, "relay", "lease does not belong to this transaction", resign="NONE"),
    _e(
        "LEASE_EXPIRED",
        409,
        True,
        "relay",
        "lease older than its validity window; when `renewable` is true renew and resend the same bytes, otherwise assign again and sign again",
        resign="SAME_BYTES",
        details=("renewable",),
    ),
    _e(
        "NONCE_PIN_MISMATCH",
        409,
        False,
        "relay",
        "nonce is not the one the assignment pinned (`assignment.pinNonce`)",
        resign="NONE",
    ),
    _e(
        "RESIGN_REQUIRED",
        409,
        False,
        "relay",
        "assigned relayer can no longer be used",
        resign="NEW_SIGNATURE_SAME_NONCE",
        details=("assignment",),
    ),
    _e(
        "RESIGN_SAME_NONCE",
        409,
        False,
        "relay",
        "replacement for same nonce needed at a higher gas price",
        resign="NEW_SIGNATURE_SAME_NONCE",
        details=("assignment", "minGasPrice"),
    ),
    _e(
        "REPLACEMENT_UNDERPRICED",
        422,
        False,
        "relay",
        "replacement does not pay enough to displace the pooled one",
        resign="NONE",
        details=("minGasPrice",),
    ),
    _e(
        "INTENT_ALREADY_EXECUTED",
        409,
        False,
        "relay",
        "that nonce already executed",
        resign="NONE",
        details=("intent.txHash",),
    ),
    _e("NOTHING_TO_CANCEL", 409, False, "relay", "no in-flight intent to cancel", resign="NONE"),
    _e(
        "NONCE_TOO_LOW",
        409,
        False,
        "relay",
        "nonce below the account nonce",
        resign="NONE",
        details=("onchainNonce", "poolLastNonce", "expectedNonce"),
    ),
    _e(
        "NONCE_IN_FLIGHT",
        409,
        True,
        "relay",
        "another intent holds this nonce",
        resign="SAME_BYTES",
        details=("occupiedBy", "pinnedNonce"),
    ),
    _e("NONCE_GAP", 409, False, "relay", "nonce skips ahead of account nonce and pool", resign="NONE"),
    _e("TOO_MANY_IN_FLIGHT", 429, True, "relay", "sender has 64 unsettled intents", resign="NONE"),
    _e("RELAYER_UNKNOWN", 422, False, "relay", "`relayer` is not one of the service's", resign="NONE"),
    _e("RELAYER_SHARD_MISMATCH", 422, False, "relay", "relayer not in the sender's shard", resign="NONE"),
    _e(
        "RELAYER_RETIRED",
        410,
        False,
        "relay",
        "relayer retired (normally `RESIGN_REQUIRED` on the native path)",
        resign="NONE",
    ),
    _e(
        "GAS_PRICE_OUT_OF_RANGE",
        422,
        False,
        "relay",
        "gas price outside minimum to twice the minimum",
        resign="NONE",
        details=("limit", "actual", "bound"),
    ),
    _e(
        "GAS_LIMIT_TOO_LOW",
        422,
        False,
        "relay",
        "below movement gas",
        resign="NONE",
        details=("limit", "actual"),
    ),
    _e(
        "GAS_LIMIT_TOO_HIGH",
        422,
        False,
        "relay",
        "above the rate-class ceiling",
        resign="NONE",
        details=("limit", "actual"),
    ),
    _e(
        "GAS_OVERPROVISIONED",
        422,
        False,
        "relay",
        "far above simulated need; up to 1.9 times the simulated processing gas above movement gas is accepted",
        resign="NONE",
        details=("limit", "actual"),
    ),
    _e(
        "DATA_TOO_LARGE",
        422,
        False,
        "relay",
        "data above 4 096 bytes on a self-serve account",
        resign="NONE",
        details=("limit", "actual"),
    ),
    _e(
        "RECEIVER_NOT_ALLOWED",
        403,
        False,
        "relay",
        "receiver not allowed on this path; NFT, SFT, Meta-ESDT and multi-token transfers must be paid by the sender's own plan or a plan naming the sender; for a sponsor key add the contract to the key's receiver list",
        resign="NONE",
    ),
    _e("SENDER_SIGNATURE_INVALID", 422, False, "relay", "sender signature does not verify", resign="NONE"),
    _e(
        "GUARDIAN_SIGNATURE_INVALID", 422, False, "relay", "guardian signature does not verify", resign="NONE"
    ),
    _e("GUARDIAN_REQUIRED", 422, False, "relay", "sender is guarded, transaction is not", resign="NONE"),
    _e(
        "GUARDIAN_MISMATCH",
        422,
        False,
        "relay",
        "guardian is not the sender's active guardian",
        resign="NONE",
    ),
    _e(
        "GUARDIAN_IS_RELAYER", 422, False, "relay", "guardian and relayer are the same address", resign="NONE"
    ),
    _e("INSUFFICIENT_SENDER_BALANCE", 422, False, "relay", "sender cannot cover `value`", resign="NONE"),
    _e(
        "SIMULATION_FAILED",
        422,
        False,
        "relay",
        "simulation says it would fail on chain",
        resign="NONE",
        details=("returnMessage",),
    ),
    _e(
        "SWAP_VENUE_PAUSED",
        503,
        True,
        "relay",
        "exchange venue paused; nothing charged; never affects relaying an existing plan",
        resign="SAME_BYTES",
    ),
    _e(
        "CONTRACT_PAUSED",
        503,
        True,
        "relay",
        "contract paused for this kind of call; nothing charged",
        resign="SAME_BYTES",
        details=("scope",),
    ),
    _e(
        "ASSIGN_PROOF_REQUIRED",
        401,
        False,
        "relay",
        "assign without a presence proof",
        resign="NONE",
        details=("serverTimeMs",),
    ),
    _e(
        "ASSIGN_PROOF_INVALID",
        401,
        False,
        "relay",
        "proof did not verify",
        resign="NONE",
        details=("serverTimeMs",),
    ),
    _e(
        "FREE_FLOW_BUSY",
        409,
        True,
        "relay",
        "sender already has a free transaction in flight",
        resign="SAME_BYTES",
        details=("reason",),
    ),
    _e(
        "FREE_FLOW_BARRED",
        403,
        False,
        "relay",
        "sender temporarily barred from the free flow",
        resign="NONE",
        details=("untilMs",),
    ),
    _e(
        "FREE_FLOW_UNAVAILABLE",
        503,
        True,
        "relay",
        "free-transaction budget for the period spent",
        resign="SAME_BYTES",
    ),
    _e(
        "INTENT_ALREADY_SUBMITTED",
        409,
        False,
        "relay",
        "logical idempotency key already used; `intent` is the first submission",
        resign="NONE",
        details=("intent",),
    ),
    _e(
        "HOURLY_BURN_EXCEEDED",
        429,
        True,
        "relay",
        "RU per hour of the rate class passed",
        resign="SAME_BYTES",
    ),
    _e(
        "SIGNER_TIMEOUT", 503, True, "relay", "signer did not commit before its deadline", resign="SAME_BYTES"
    ),
    _e(
        "NO_ENTITLEMENT",
        402,
        False,
        "relay",
        "no plan can pay; `details.reason` `NO_ACCOUNT` means the sender has no plan and a sponsor key did not reach the route",
        resign="NONE",
        details=("reason",),
    ),
    _e(
        "SENDER_NOT_AUTHORIZED",
        403,
        False,
        "relay",
        "sender not authorised to spend the paying account's plan",
        resign="NONE",
        details=("reason", "account"),
    ),
    _e(
        "QUOTA_EXHAUSTED",
        429,
        False,
        "relay",
        "plan's included RU used up; no `Retry-After`",
        resign="NONE",
        details=("reason",),
    ),
    _e(
        "RATE_LIMITED",
        429,
        True,
        "relay",
        "faster than the rate class allows; scope values include `platform` and `free_flow`",
        resign="SAME_BYTES",
        details=("retryAfterMs", "scope"),
    ),
    _e(
        "GAS_BUDGET_EXCEEDED",
        429,
        True,
        "relay",
        "gas-per-second budget in the shard spent",
        resign="SAME_BYTES",
        details=("retryAfterMs",),
    ),
    _e("NO_RELAYER_AVAILABLE", 503, True, "relay", "no healthy relayer in that shard", resign="SAME_BYTES"),
    _e(
        "UPSTREAM_UNAVAILABLE",
        503,
        True,
        "relay",
        "gateway, node or database unavailable before commit",
        resign="SAME_BYTES",
    ),
    _e("SIGNER_UNAVAILABLE", 503, True, "relay", "signer unreachable", resign="SAME_BYTES"),
    _e("SIGNER_FENCED", 503, True, "relay", "signer fenced itself", resign="SAME_BYTES"),
    _e("INTERNAL", 500, True, "relay", "unexpected failure before the commit point", resign="SAME_BYTES"),
    # purchase group
    _e(
        "PRICE_ABOVE_MAX",
        409,
        False,
        "purchase",
        "price at execution above the signed `max_price` (also the reverted `ERR_PRICE_ABOVE_MAX` of `addSenders`)",
    ),
    _e(
        "TIER_NOT_PURCHASABLE",
        422,
        False,
        "purchase",
        "tier cannot be bought now (`available` false in the pricing document)",
    ),
    _e(
        "QUEUED_BLOCK_EXISTS",
        409,
        False,
        "purchase",
        "a plan is already queued; a more expensive tier takes effect now and credits the queued block back",
    ),
    _e(
        "DOWNGRADE_NOT_IMMEDIATE",
        409,
        False,
        "purchase",
        "a plan without a period cannot start while a period plan runs",
    ),
    _e("INSUFFICIENT_CREDITS", 402, False, "purchase", "credits do not cover the purchase"),
    _e("DEPOSIT_BELOW_MIN", 422, False, "purchase", "below `deposit.minMicroUsdc`"),
    _e("DEPOSIT_ABOVE_MAX", 422, False, "purchase", "above `deposit.maxMicroUsdc` (0 means unlimited)"),
    _e(
        "SWAP_BUDGET_EXHAUSTED",
        503,
        True,
        "purchase",
        "rolling swap budget for deposits used up",
        details=("retryAfterMs",),
    ),
    _e(
        "PAYG_PRICE_ABOVE_MAX",
        409,
        False,
        "purchase",
        "pay-as-you-go price above the account's `max_payg_price`",
    ),
    _e(
        "DEPLOY_NOT_ALLOWED",
        403,
        False,
        "purchase",
        "deployments and upgrades not relayed for the account unless allow-listed",
    ),
    _e("UNSUPPORTED_TX_FIELD", 422, False, "purchase", "fee-relevant field the RU schedule does not price"),
    _e("QUOTE_EXPIRED", 409, False, "purchase", "quote presented with the payment expired"),
    _e(
        "RENEW_NOT_APPLICABLE",
        409,
        False,
        "purchase",
        "'renew now' would do nothing",
        details=("predictedOutcome",),
    ),
    # platform group
    _e("UNAUTHENTICATED", 401, False, "platform", "no credentials presented"),
    _e("TOKEN_INVALID", 401, False, "platform", "token did not verify"),
    _e("TOKEN_EXPIRED", 401, False, "platform", "token past its validity"),
    _e("ORIGIN_NOT_ALLOWED", 403, False, "platform", "browser origin not allowed"),
    _e("CHALLENGE_INVALID", 401, False, "platform", "signed challenge did not verify"),
    _e("API_KEY_INVALID", 401, False, "platform", "key unknown, revoked or from another environment"),
    _e("API_KEY_SCOPE", 403, False, "platform", "key valid but not allowed this"),
    _e("STREAM_TICKET_INVALID", 401, False, "platform", "stream ticket did not verify"),
    _e("FORBIDDEN", 403, False, "platform", "authenticated but not permitted"),
    _e("ADMIN_ONLY", 403, False, "platform", "route not part of the public API"),
    _e("ACTION_SIGNATURE_INVALID", 403, False, "platform", "per-action signature did not verify"),
    _e("ACCOUNT_SUSPENDED", 403, False, "platform", "account suspended; credits are not lost"),
    _e("NOT_FOUND", 404, False, "platform", "no such resource"),
    _e("PAYLOAD_TOO_LARGE", 413, False, "platform", "body larger than the endpoint accepts"),
    _e("CURSOR_INVALID", 400, False, "platform", "cursor malformed or no longer valid"),
    _e("IDEMPOTENCY_KEY_REUSED", 422, False, "platform", "idempotency key used with a different body"),
    _e("IDEMPOTENCY_IN_PROGRESS", 409, True, "platform", "first request with the key still running"),
    _e("LIMIT_REACHED", 409, False, "platform", "a per-account limit is full"),
    _e(
        "WEBHOOK_URL_NOT_ALLOWED",
        422,
        False,
        "platform",
        "webhook URL cannot be registered (must be public HTTPS on port 443)",
    ),
    # x402 group
    _e(
        "PAYMENT_REQUIRED",
        402,
        False,
        "x402",
        "resource needs payment; the response describes how via `accepts`",
    ),
    _e(
        "PAYMENT_INVALID",
        402,
        False,
        "x402",
        "payment did not verify, or the same payment id was used with another payload",
    ),
    _e("PAYMENT_FAILED", 402, False, "x402", "payment verified but could not be settled"),
)

CATALOGUE: dict[str, ErrorSpec] = {spec.code: spec for spec in _SPECS}


@dataclass
class ApiError(Exception):
    """An answer other than success: a catalogue code, a human detail, per-code details and headers."""

    code: str
    detail: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.code not in CATALOGUE:
            raise ValueError(f"unknown error code {self.code}")
        super().__init__(self.code)
        spec = self.spec
        if spec.status == 429 and spec.retryable:
            # A 429 carries Retry-After (seconds) and details.retryAfterMs; QUOTA_EXHAUSTED does not.
            retry_ms = int(self.details.setdefault("retryAfterMs", 1_000))
            self.headers.setdefault("Retry-After", str(max(1, math.ceil(retry_ms / 1000))))
        elif spec.status == 503 and spec.retryable:
            # Every retryable 503 says when to come back, 1 s unless the raiser knows better (bench/chaos.py
            # found the database-down answers of the relay path without it).
            retry_ms = int(self.details.setdefault("retryAfterMs", 1_000))
            self.headers.setdefault("Retry-After", str(max(1, math.ceil(retry_ms / 1000))))

    @property
    def spec(self) -> ErrorSpec:
        return CATALOGUE[self.code]

    @property
    def status(self) -> int:
        return self.spec.status


def problem_document(error: ApiError, *, docs_url: str, request_id: str) -> dict[str, Any]:
    """The RFC 9457 problem document of an error (the only place one is built)."""
    spec = error.spec
    document: dict[str, Any] = {
        "type": spec.type_uri(docs_url),
        "title": spec.title,
        "status": spec.status,
        "detail": error.detail or spec.condition,
        "code": spec.code,
        "instance": request_id,
        "retryable": spec.retryable,
    }
    if spec.resign is not None:
        document["resign"] = spec.resign
    if error.details:
        document["details"] = error.details
    return document


def catalogue_document(docs_url: str) -> dict[str, Any]:
    """The machine-readable catalogue published next to the reference."""
    return {
        "version": CATALOGUE_VERSION,
        "errors": [
            {
                "code": spec.code,
                "group": spec.group,
                "status": spec.status,
                "retryable": spec.retryable,
                **({"resign": spec.resign} if spec.resign is not None else {}),
                "details": list(spec.details),
                "title": spec.title,
                "condition": spec.condition,
                "type": spec.type_uri(docs_url),
            }
            for spec in _SPECS
        ],
    }
