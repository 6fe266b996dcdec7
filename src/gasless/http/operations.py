"""What the OpenAPI document says about each operation beyond FastAPI's generation: its error statuses
and codes, its security, whether it is a cached read. Keyed by operation id; `default_contract` covers an
operation that is not listed yet (read from its shape), so a new route is documented sensibly at once and
listed here when it answers more (specific codes, 402, 409, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NATIVE_AUTH = "nativeAuth"
API_KEY = "apiKey"
X402 = "x402"

PUBLIC: tuple[tuple[str, ...], ...] = ()
# Each entry is one alternative; an empty alternative means "or nothing" (the credential is optional).
OPTIONAL_API_KEY: tuple[tuple[str, ...], ...] = ((), (API_KEY,))
OPTIONAL_NATIVE_AUTH: tuple[tuple[str, ...], ...] = ((), (NATIVE_AUTH,))
NATIVE_AUTH_ONLY: tuple[tuple[str, ...], ...] = ((NATIVE_AUTH,),)
NATIVE_AUTH_OR_API_KEY: tuple[tuple[str, ...], ...] = ((NATIVE_AUTH,), (API_KEY,))
# Optional: an unpaid request is the flow's first step, answered with the 402 challenge.
X402_PAYMENT: tuple[tuple[str, ...], ...] = ((), (X402,))


@dataclass(frozen=True)
class OperationContract:
    """What the document says about one operation beyond FastAPI's generation.

    `problems` maps an HTTP status to the catalogue codes the operation answers with it (each code's
    catalogue status must be that status). `security` lists the accepted alternatives (`PUBLIC` = none
    needed). `cached` reads document `Cache-Control` and `ETag`.
    """

    problems: Mapping[int, tuple[str, ...]]
    security: tuple[tuple[str, ...], ...] = PUBLIC
    cached: bool = False
    events: tuple[str, ...] = ()  # the `event:` names of an event stream


_TOKEN_ERRORS = ("UNAUTHENTICATED", "TOKEN_INVALID", "TOKEN_EXPIRED")
# Native-auth routes also refuse a sponsor key sent as `Authorization: Bearer` or in the URL.
_NATIVE_ROUTE_401 = (*_TOKEN_ERRORS, "API_KEY_INVALID")
_STARTING = ("UPSTREAM_UNAVAILABLE",)  # the host restores its state (or lost the network) before serving
_INTENT_READ: Mapping[int, tuple[str, ...]] = {
    400: ("MALFORMED_REQUEST",),
    404: ("NOT_FOUND",),
    429: ("RATE_LIMITED",),
    500: ("INTERNAL",),
    503: _STARTING,
}
_RELAY_400 = (
    "MALFORMED_REQUEST",
    "VARIANTS_NOT_SUPPORTED",
    "RELAYER_SIGNATURE_PRESENT",
    "CHAIN_ID_MISMATCH",
    "TX_VERSION_UNSUPPORTED",
    "TX_OPTIONS_UNSUPPORTED",
    "LEASE_MISSING",
)
_RELAY_422 = (
    "REPLACEMENT_UNDERPRICED",
    "RELAYER_UNKNOWN",
    "RELAYER_SHARD_MISMATCH",
    "GAS_PRICE_OUT_OF_RANGE",
    "GAS_LIMIT_TOO_LOW",
    "GAS_LIMIT_TOO_HIGH",
    "GAS_OVERPROVISIONED",
    "DATA_TOO_LARGE",
    "SENDER_SIGNATURE_INVALID",
    "GUARDIAN_SIGNATURE_INVALID",
    "GUARDIAN_REQUIRED",
    "GUARDIAN_MISMATCH",
    "GUARDIAN_IS_RELAYER",
    "INSUFFICIENT_SENDER_BALANCE",
    "SIMULATION_FAILED",
    "UNSUPPORTED_TX_FIELD",
    "IDEMPOTENCY_KEY_REUSED",
)

# Each operation's error statuses and codes, plus 400 MALFORMED_REQUEST where there is input, 413 on bodies,
# 500, and 503 UPSTREAM_UNAVAILABLE on routes that need the relay core (answered while the host is still starting).
OPERATIONS: dict[str, OperationContract] = {
    # Meta
    "getHealth": OperationContract({500: ("INTERNAL",)}),
    "getReadiness": OperationContract({500: ("INTERNAL",)}),  # its 503 is a Health document
    "getOpenApi": OperationContract({500: ("INTERNAL",)}),
    "getNetwork": OperationContract(
        {429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING}, cached=True
    ),
    # Relay
    "assignRelayer": OperationContract(
        {
            400: ("MALFORMED_REQUEST",),
            401: ("ASSIGN_PROOF_REQUIRED", "ASSIGN_PROOF_INVALID", *_TOKEN_ERRORS),
            403: ("ORIGIN_NOT_ALLOWED",),
            409: ("RESIGN_REQUIRED", "NOTHING_TO_CANCEL"),
            410: ("RELAYER_RETIRED",),
            413: ("PAYLOAD_TOO_LARGE",),
            422: ("RELAYER_UNKNOWN",),
            429: ("RATE_LIMITED",),
            500: ("INTERNAL",),
            503: ("NO_RELAYER_AVAILABLE", "SIGNER_UNAVAILABLE", "SIGNER_FENCED", *_STARTING),
        },
        security=OPTIONAL_NATIVE_AUTH,
    ),
    "relayTransaction": OperationContract(
        {
            400: _RELAY_400,
            401: ("API_KEY_INVALID",),
            402: ("NO_ENTITLEMENT",),
            403: (
                "LEASE_INVALID",
                "RECEIVER_NOT_ALLOWED",
                "FREE_FLOW_BARRED",
                "SENDER_NOT_AUTHORIZED",
                "DEPLOY_NOT_ALLOWED",
                "API_KEY_SCOPE",
                "ORIGIN_NOT_ALLOWED",
            ),
            409: (
                "LEASE_MISMATCH",
                "LEASE_EXPIRED",
                "NONCE_PIN_MISMATCH",
                "RESIGN_REQUIRED",
                "RESIGN_SAME_NONCE",
                "INTENT_ALREADY_EXECUTED",
                "NONCE_TOO_LOW",
                "NONCE_IN_FLIGHT",
                "NONCE_GAP",
                "FREE_FLOW_BUSY",
                "INTENT_ALREADY_SUBMITTED",
                "IDEMPOTENCY_IN_PROGRESS",
            ),
            410: ("RELAYER_RETIRED",),
            413: ("PAYLOAD_TOO_LARGE",),
            422: _RELAY_422,
            429: (
                "TOO_MANY_IN_FLIGHT",
                "HOURLY_BURN_EXCEEDED",
                "QUOTA_EXHAUSTED",
                "RATE_LIMITED",
                "GAS_BUDGET_EXCEEDED",
            ),
            500: ("INTERNAL",),
            503: (
                "CONTRACT_PAUSED",
                "SWAP_VENUE_PAUSED",
                "FREE_FLOW_UNAVAILABLE",
                "SIGNER_TIMEOUT",
                "NO_RELAYER_AVAILABLE",
                "UPSTREAM_UNAVAILABLE",
                "SIGNER_UNAVAILABLE",
                "SIGNER_FENCED",
            ),
        },
        security=OPTIONAL_API_KEY,
    ),
    "getRelayStatus": OperationContract(_INTENT_READ, cached=True),
    "getIntent": OperationContract(_INTENT_READ, cached=True),
    "getIntentByTxHash": OperationContract(_INTENT_READ, cached=True),
    "streamRelayEvents": OperationContract(_INTENT_READ, events=("intent",)),
    "quoteRelay": OperationContract(
        {
            400: ("MALFORMED_REQUEST", "CHAIN_ID_MISMATCH", "TX_VERSION_UNSUPPORTED"),
            413: ("PAYLOAD_TOO_LARGE",),
            422: ("GAS_LIMIT_TOO_LOW", "GAS_LIMIT_TOO_HIGH", "UNSUPPORTED_TX_FIELD"),
            429: ("RATE_LIMITED",),
            500: ("INTERNAL",),
            503: _STARTING,
        }
    ),
    "validateTransaction": OperationContract(
        {
            400: ("MALFORMED_REQUEST",),
            413: ("PAYLOAD_TOO_LARGE",),
            429: ("RATE_LIMITED",),
            500: ("INTERNAL",),
            503: _STARTING,
        }
    ),
    # Account reads and keys
    "getMe": OperationContract(
        {
            401: _NATIVE_ROUTE_401,
            403: ("FORBIDDEN", "ORIGIN_NOT_ALLOWED"),
            429: ("RATE_LIMITED",),
            500: ("INTERNAL",),
            503: _STARTING,
        },
        security=NATIVE_AUTH_ONLY,
    ),
    "listAccountSenders": OperationContract(
        {
            400: ("MALFORMED_REQUEST", "CURSOR_INVALID"),
            404: ("NOT_FOUND",),
            429: ("RATE_LIMITED",),
            500: ("INTERNAL",),
            503: _STARTING,
        },
        cached=True,
    ),
}


# Contract mirror reads (docs/mirror.md) and the usage proof (docs/usage.md, docs/settlement.md).
_MIRROR_READ: dict[int, tuple[str, ...]] = {
    400: ("MALFORMED_REQUEST",),
    404: ("NOT_FOUND",),
    429: ("RATE_LIMITED",),
    500: ("INTERNAL",),
    503: _STARTING,
}
OPERATIONS.update(
    {
        "getAccount": OperationContract(_MIRROR_READ, cached=True),
        "getQuota": OperationContract({k: v for k, v in _MIRROR_READ.items() if k != 404}, cached=True),
        "listAccountPurchases": OperationContract(
            {**_MIRROR_READ, 400: ("MALFORMED_REQUEST", "CURSOR_INVALID")}, cached=True
        ),
        "getUsageProof": OperationContract(
            {
                400: ("MALFORMED_REQUEST",),
                401: (*_NATIVE_ROUTE_401, "API_KEY_INVALID"),
                403: ("FORBIDDEN", "API_KEY_SCOPE", "ORIGIN_NOT_ALLOWED"),
                404: ("NOT_FOUND",),
                # Not yet committed in an on-chain root: the interface contract names no code (docs/settlement.md).
                409: ("IDEMPOTENCY_IN_PROGRESS",),
                429: ("RATE_LIMITED",),
                500: ("INTERNAL",),
                503: _STARTING,
            },
            security=NATIVE_AUTH_OR_API_KEY,
        ),
    }
)


def _key_route(*extra: int) -> OperationContract:
    """Keys routes (docs/auth.md, "Sponsor API keys"): native-auth, owner writes."""
    problems: dict[int, tuple[str, ...]] = {
        400: ("MALFORMED_REQUEST",),
        401: _NATIVE_ROUTE_401,
        403: ("FORBIDDEN", "ACCOUNT_SUSPENDED", "ORIGIN_NOT_ALLOWED"),
        429: ("RATE_LIMITED",),
        500: ("INTERNAL",),
        503: _STARTING,
    }
    by_status = {404: ("NOT_FOUND",), 409: ("LIMIT_REACHED",), 413: ("PAYLOAD_TOO_LARGE",)}
    problems.update({status: by_status[status] for status in extra})
    return OperationContract(problems, security=NATIVE_AUTH_ONLY)


def _signed_action(contract: OperationContract) -> OperationContract:
    """Routes that also need a per-action signature (gasless.auth.actions)."""
    problems = dict(contract.problems)
    problems[401] = (*problems.get(401, ()), "CHALLENGE_INVALID")
    problems[403] = (*problems.get(403, ()), "ACTION_SIGNATURE_INVALID")
    return dataclasses.replace(contract, problems=problems)


OPERATIONS.update(
    {
        "listApiKeys": _key_route(),
        # Schema failures are 400 MALFORMED_REQUEST, as everywhere (no catalogue code is a 422 for them).
        "createApiKey": _signed_action(_key_route(409, 413)),
        "updateApiKey": _key_route(404, 413),
        "revokeApiKey": _key_route(404),
    }
)

# Streams (docs/streams.md): native-auth or a read key; `GET /v1/stream` also
# takes a single-use ticket in the query (the empty alternative: no header credential).
_STREAM_PROBLEMS: dict[int, tuple[str, ...]] = {
    400: ("MALFORMED_REQUEST",),
    401: (*_NATIVE_ROUTE_401, "STREAM_TICKET_INVALID"),
    403: ("FORBIDDEN", "API_KEY_SCOPE", "ORIGIN_NOT_ALLOWED"),
    429: ("RATE_LIMITED",),
    500: ("INTERNAL",),
    503: _STARTING,
}
OPERATIONS.update(
    {
        "createStreamTicket": OperationContract(
            {**_STREAM_PROBLEMS, 401: _NATIVE_ROUTE_401, 413: ("PAYLOAD_TOO_LARGE",)},
            security=NATIVE_AUTH_OR_API_KEY,
        ),
        "streamAccountEvents": OperationContract(
            _STREAM_PROBLEMS,
            security=((NATIVE_AUTH,), (API_KEY,), ()),
            events=("intents", "quota", "account", "notices", "incidents", "pricing", "reset"),
        ),
    }
)


def _webhook_route(*extra: int, url: bool = False, idempotent: bool = False) -> OperationContract:
    """Webhook routes: as the key routes, plus WEBHOOK_URL_NOT_ALLOWED where a URL is judged and the
    Idempotency-Key answers where the header is accepted."""
    contract = _key_route(*extra)
    problems = dict(contract.problems)
    if url:
        problems[422] = ("WEBHOOK_URL_NOT_ALLOWED",)
    if idempotent:
        problems[409] = (*problems.get(409, ()), "IDEMPOTENCY_IN_PROGRESS")
        problems[422] = (*problems.get(422, ()), "IDEMPOTENCY_KEY_REUSED")
    return OperationContract(problems, security=NATIVE_AUTH_ONLY)


OPERATIONS.update(
    {
        "listWebhooks": _webhook_route(),
        "createWebhook": _webhook_route(409, 413, url=True, idempotent=True),
        "getWebhook": _webhook_route(404),
        "updateWebhook": _webhook_route(404, 413, url=True),
        "deleteWebhook": _webhook_route(404),
        "testWebhook": _webhook_route(404, idempotent=True),
        "rotateWebhookSecret": _webhook_route(404),
        "listWebhookDeliveries": _webhook_route(404),
    }
)

_DEFAULT_401 = {NATIVE_AUTH: _TOKEN_ERRORS, API_KEY: ("API_KEY_INVALID",), X402: ()}


def default_contract(path: str, operation: Mapping[str, Any]) -> OperationContract:
    """The contract of an operation `OPERATIONS` does not list, read from its shape.

    Input (parameters or a body) can be malformed (400); a payment can be asked for or refused (402); a
    path parameter names something that may not exist (404); a body can be too large (413); every `/v1/` route class is rate limited (429); a
    credential can be refused (401/403); anything can fail unexpectedly (500) or meet a host that is still
    starting (503).
    """
    params = operation.get("parameters", [])
    body = "requestBody" in operation
    problems: dict[int, tuple[str, ...]] = {}
    if params or body:
        problems[400] = ("MALFORMED_REQUEST",)
    security = security_of(operation)
    required = [alt for alt in security if alt]
    if required:
        codes = tuple(
            dict.fromkeys(code for alt in required for s in alt for code in _DEFAULT_401.get(s, ()))
        )
        if codes:
            problems[401] = codes
        problems[403] = ("FORBIDDEN", "ORIGIN_NOT_ALLOWED")
    if any(X402 in alt for alt in required):
        problems[402] = ("PAYMENT_REQUIRED", "PAYMENT_INVALID", "PAYMENT_FAILED")
    if any(p.get("in") == "path" for p in params):
        problems[404] = ("NOT_FOUND",)
    if body:
        problems[413] = ("PAYLOAD_TOO_LARGE",)
    if path.startswith("/v1/"):
        problems[429] = ("RATE_LIMITED",)
    problems[500] = ("INTERNAL",)
    problems[503] = _STARTING
    return OperationContract(problems, security=security)


def security_of(operation: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(requirement) for requirement in operation.get("security", ()))


# Usage reads (docs/usage.md): native-auth owner/sender or a sponsor key with `read`.
def _usage_route(*extra: int) -> OperationContract:
    problems: dict[int, tuple[str, ...]] = {
        400: ("MALFORMED_REQUEST",),
        401: _NATIVE_ROUTE_401,
        403: ("FORBIDDEN", "API_KEY_SCOPE", "ORIGIN_NOT_ALLOWED"),
        429: ("RATE_LIMITED",),
        500: ("INTERNAL",),
        503: _STARTING,
    }
    if 404 in extra:
        problems[404] = ("NOT_FOUND",)
    return OperationContract(problems, security=NATIVE_AUTH_OR_API_KEY)


OPERATIONS.update(
    {
        "listUsage": dataclasses.replace(
            _usage_route(),
            problems={**_usage_route().problems, 400: ("MALFORMED_REQUEST", "CURSOR_INVALID")},
        ),
        "getUsageSummary": _usage_route(),
        "getUsageLatency": _usage_route(),
        "listAccountRelayers": _usage_route(),
        "listAccountOutages": dataclasses.replace(
            _usage_route(),
            problems={**_usage_route().problems, 400: ("MALFORMED_REQUEST", "CURSOR_INVALID")},
        ),
        "getUsageRow": _usage_route(404),
        # Notices (dashboard reads): acknowledging is the owner's or a read key's (a sender: 403).
        "listNotices": dataclasses.replace(
            _usage_route(),
            problems={**_usage_route().problems, 400: ("MALFORMED_REQUEST", "CURSOR_INVALID")},
        ),
        "ackNotices": dataclasses.replace(
            _usage_route(), problems={**_usage_route().problems, 413: ("PAYLOAD_TOO_LARGE",)}
        ),
        # Notification preferences (docs/notices.md): as the key routes.
        "getNotificationPrefs": _key_route(),
        "putNotificationPrefs": _key_route(413),
    }
)


# Incidents (docs/incidents.md): public cached reads; a malformed id is simply not found.
OPERATIONS.update(
    {
        "listIncidents": OperationContract(
            {
                400: ("MALFORMED_REQUEST", "CURSOR_INVALID"),
                429: ("RATE_LIMITED",),
                500: ("INTERNAL",),
                503: _STARTING,
            },
            cached=True,
        ),
        "getIncident": OperationContract(_INTENT_READ, cached=True),
    }
)


# Pricing (docs/purchases.md): public cached reads built from the contract's views.
OPERATIONS.update(
    {
        "getPricing": OperationContract(
            {400: ("MALFORMED_REQUEST",), 429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING},
            cached=True,
        ),
        "getTariffHistory": OperationContract(
            {
                400: ("MALFORMED_REQUEST", "CURSOR_INVALID"),
                429: ("RATE_LIMITED",),
                500: ("INTERNAL",),
                503: _STARTING,
            },
            cached=True,
        ),
    }
)


# Purchase builders (docs/purchases.md): public, limited per IP; nothing is built when refused.
_PREPARE_COMMON: Mapping[int, tuple[str, ...]] = {
    400: ("MALFORMED_REQUEST",),
    413: ("PAYLOAD_TOO_LARGE",),
    429: ("RATE_LIMITED",),
    500: ("INTERNAL",),
    503: ("CONTRACT_PAUSED", "SWAP_VENUE_PAUSED", "NO_RELAYER_AVAILABLE", "SIGNER_FENCED", *_STARTING),
}
OPERATIONS.update(
    {
        "prepareSubscribe": OperationContract(
            {
                **_PREPARE_COMMON,
                402: ("INSUFFICIENT_CREDITS",),
                409: ("QUEUED_BLOCK_EXISTS", "DOWNGRADE_NOT_IMMEDIATE", "PRICE_ABOVE_MAX"),
                422: (
                    "TIER_NOT_PURCHASABLE",
                    "DEPOSIT_BELOW_MIN",
                    "DEPOSIT_ABOVE_MAX",
                    "INSUFFICIENT_SENDER_BALANCE",
                ),
                503: (*_PREPARE_COMMON[503], "SWAP_BUDGET_EXHAUSTED"),
            }
        ),
        "prepareDeposit": OperationContract(
            {
                **_PREPARE_COMMON,
                422: ("DEPOSIT_BELOW_MIN", "DEPOSIT_ABOVE_MAX", "INSUFFICIENT_SENDER_BALANCE"),
                503: (*_PREPARE_COMMON[503], "SWAP_BUDGET_EXHAUSTED"),
            }
        ),
        "prepareFlags": OperationContract(
            {**_PREPARE_COMMON, 402: ("NO_ENTITLEMENT",), 409: ("RENEW_NOT_APPLICABLE",)}
        ),
        "prepareSenders": OperationContract(
            {**_PREPARE_COMMON, 402: ("NO_ENTITLEMENT", "INSUFFICIENT_CREDITS")}
        ),
    }
)

# x402 (docs/x402.md). A relay refusal that a retry may cure passes through with its own code
# (the payment record is dropped, so the same payment id can be retried); the others make the payment
# PAYMENT_FAILED (or PAYMENT_INVALID when the payment itself did not verify).
_X402_PAID: Mapping[int, tuple[str, ...]] = {
    400: ("MALFORMED_REQUEST",),
    402: ("PAYMENT_REQUIRED", "PAYMENT_INVALID", "PAYMENT_FAILED"),
    409: ("QUOTE_EXPIRED", "NONCE_IN_FLIGHT", "FREE_FLOW_BUSY"),
    413: ("PAYLOAD_TOO_LARGE",),
    422: ("DEPOSIT_BELOW_MIN", "DEPOSIT_ABOVE_MAX", "INSUFFICIENT_SENDER_BALANCE"),
    429: ("RATE_LIMITED", "TOO_MANY_IN_FLIGHT", "HOURLY_BURN_EXCEEDED", "GAS_BUDGET_EXCEEDED"),
    500: ("INTERNAL",),
    503: (
        "CONTRACT_PAUSED",
        "SWAP_VENUE_PAUSED",
        "SWAP_BUDGET_EXHAUSTED",
        "FREE_FLOW_UNAVAILABLE",
        "NO_RELAYER_AVAILABLE",
        "SIGNER_TIMEOUT",
        "SIGNER_UNAVAILABLE",
        "SIGNER_FENCED",
        *_STARTING,
    ),
}
OPERATIONS.update(
    {
        "x402Topup": OperationContract(_X402_PAID, security=X402_PAYMENT),
        "x402Purchase": OperationContract(
            {
                **_X402_PAID,
                409: (*_X402_PAID[409], "QUEUED_BLOCK_EXISTS", "DOWNGRADE_NOT_IMMEDIATE"),
                422: (*_X402_PAID[422], "TIER_NOT_PURCHASABLE"),
            },
            security=X402_PAYMENT,
        ),
        "getX402Payment": OperationContract(
            {
                400: ("MALFORMED_REQUEST",),
                402: ("PAYMENT_INVALID", "PAYMENT_FAILED"),
                404: ("NOT_FOUND",),
                429: ("RATE_LIMITED",),
                500: ("INTERNAL",),
                503: _STARTING,
            }
        ),
        "getX402Supported": OperationContract({429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING}),
        "getX402Descriptor": OperationContract({429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING}),
    }
)

# The starter-kit facade (docs/compat.md, "Statuses and error bodies"): only 200, 400, 403, 404, 429 and 500;
# every error is a problem document with the catalogue code and the kit's `error` string.
_COMPAT_400 = (
    "MALFORMED_REQUEST",
    "PAYLOAD_TOO_LARGE",
    "GAS_PRICE_OUT_OF_RANGE",
    "GAS_LIMIT_TOO_HIGH",
    "RELAYER_UNKNOWN",
    "RELAYER_RETIRED",
    "RELAYER_SHARD_MISMATCH",
    "SENDER_SIGNATURE_INVALID",
    "NONCE_TOO_LOW",
    "SIMULATION_FAILED",
    "GAS_OVERPROVISIONED",
)
OPERATIONS.update(
    {
        "compatHealth": OperationContract({500: ("INTERNAL", "UPSTREAM_UNAVAILABLE")}),
        "compatRelayerAddress": OperationContract(
            {404: ("NOT_FOUND",), 500: ("INTERNAL", "NO_RELAYER_AVAILABLE", *_STARTING)}
        ),
        "compatRelay": OperationContract(
            {
                400: _COMPAT_400,
                403: ("NO_ENTITLEMENT", "SENDER_NOT_AUTHORIZED"),
                404: ("NOT_FOUND",),
                429: ("RATE_LIMITED", "QUOTA_EXHAUSTED", "GAS_BUDGET_EXCEEDED", "TOO_MANY_IN_FLIGHT"),
                500: ("INTERNAL", "UPSTREAM_UNAVAILABLE", "NO_RELAYER_AVAILABLE", "SIGNER_UNAVAILABLE"),
            }
        ),
    }
)

# The relayer registry (docs/architecture.md, `registry/`).
OPERATIONS.update(
    {
        "listRelayers": OperationContract(
            {400: ("MALFORMED_REQUEST",), 429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING},
            cached=True,
        ),
        "getRelayer": OperationContract(
            {
                400: ("MALFORMED_REQUEST",),
                404: ("NOT_FOUND",),
                429: ("RATE_LIMITED",),
                500: ("INTERNAL",),
                503: _STARTING,
            },
            cached=True,
        ),
    }
)

OPERATIONS.update(
    {"getStatus": OperationContract({429: ("RATE_LIMITED",), 500: ("INTERNAL",), 503: _STARTING})}
)
