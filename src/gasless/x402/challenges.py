"""x402 challenges: the `accepts` entries a 402 offers, and the check of the entry a paid retry echoes.

An entry is a stateless quote (purchases/quotes.py): `extra.quoteMac` is the HMAC of the payment's terms
(kind, payer, beneficiary or plan, amount, asset, network, payTo) in a TTL bucket. A paid retry's `accepted`
is verified by recomputing that MAC from the entry itself, never by looking anything up: a tampered amount,
asset, network or payee, a MAC from the other environment or chain, or another payer fails it.

The wire objects are the `x402` package's models and header codecs (x402 v2: base64 JSON headers).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    declare_payment_identifier_extension,
    extract_payment_identifier,
    is_valid_payment_id,
)
from x402.http.utils import (
    decode_payment_signature_header,
    encode_payment_required_header,
    encode_payment_response_header,
)
from x402.schemas import (
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    ResourceInfo,
    SettleResponse,
)

from gasless.core.errors import ApiError
from gasless.purchases.quotes import QuoteSigner, SignedQuote

X402_VERSION = 2
SCHEME = "exact"
Kind = Literal["topup", "purchase"]
RESOURCE_PATHS: dict[str, str] = {"topup": "/v1/x402/topup", "purchase": "/v1/x402/purchase"}


@dataclass(frozen=True)
class PaymentTerms:
    """What one payment pays for: the MAC'd terms of its quote."""

    kind: Kind
    payer: str
    beneficiary: str
    amount: int  # micro-USDC attached to the payment transaction
    tier_id: int | None = None
    months: int | None = None
    price: int | None = None  # the plan's price (max_price of depositAndSubscribe)

    def as_json(self, *, asset: str, network: str, pay_to: str) -> dict[str, Any]:
        # Amounts as strings: RFC 8785 prints large integers as floats.
        terms: dict[str, Any] = {
            "kind": f"x402_{self.kind}",
            "payer": self.payer,
            "beneficiary": self.beneficiary,
            "amountMicroUsdc": str(self.amount),
            "asset": asset,
            "network": network,
            "payTo": pay_to,
        }
        if self.kind == "purchase":
            terms.update(tierId=self.tier_id, months=self.months, priceMicroUsdc=str(self.price))
        return terms


@dataclass(frozen=True)
class VerifiedPayment:
    """A paid retry whose `accepted` entry verified: its terms, quote and payment id."""

    terms: PaymentTerms
    quote_id: str
    bucket: int
    payment_id: str
    payload: PaymentPayload
    lease: str | None


def invalid(reason: str, detail: str, **details: Any) -> ApiError:
    return ApiError("PAYMENT_INVALID", detail=detail, details={"reason": reason, **details})


class X402Challenges:
    def __init__(
        self,
        quotes: QuoteSigner,
        *,
        chain_id: str,
        contract: str,
        payment_token: str,
        base_url: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.quotes = quotes
        self.chain_id = chain_id
        self.contract = contract
        self.asset = payment_token
        self.base_url = base_url
        self.network = f"mvx:{chain_id}"
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # Challenges -------------------------------------------------------------------------------------------
    def sign(self, terms: PaymentTerms) -> SignedQuote:
        return self.quotes.sign(terms.as_json(asset=self.asset, network=self.network, pay_to=self.contract))

    def requirement(
        self, terms: PaymentTerms, quote: SignedQuote, *, template: dict[str, Any] | None = None
    ) -> PaymentRequirements:
        """One `accepts` entry: the serving network's asset, network and payee, the quote in `extra`, and
        (when the payer is known) the unsigned payment transaction and its lease, ready to sign."""
        extra: dict[str, Any] = {
            "quoteMac": quote.mac,
            "quoteId": quote.quote_id,
            "bucket": quote.bucket,
            "expiresAtMs": quote.expires_at_ms,
            "kind": terms.kind,
            "payer": terms.payer,
            "beneficiary": terms.beneficiary,
        }
        if terms.kind == "purchase":
            extra.update(tierId=terms.tier_id, months=terms.months, priceMicroUsdc=str(terms.price))
        if template is not None:
            extra.update(template)
        seconds = max(1, (quote.expires_at_ms - self.now_ms()) // 1000)
        return PaymentRequirements(
            scheme=SCHEME,
            network=self.network,
            asset=self.asset,
            amount=str(terms.amount),
            pay_to=self.contract,
            max_timeout_seconds=seconds,
            extra=extra,
        )

    def payment_required(self, kind: Kind, requirement: PaymentRequirements, error: str) -> PaymentRequired:
        return PaymentRequired(
            x402_version=X402_VERSION,
            error=error,
            resource=ResourceInfo(
                url=f"{self.base_url}{RESOURCE_PATHS[kind]}",
                description="USDC to credits" if kind == "topup" else "a plan of GET /v1/pricing",
                mime_type="application/json",
            ),
            accepts=[requirement],
            extensions={PAYMENT_IDENTIFIER: declare_payment_identifier_extension(required=True)},
        )

    def header(self, document: PaymentRequired) -> str:
        return encode_payment_required_header(document)

    def topup_header(self, payer: str, amount: int, *, error: str) -> str:
        """A complete `PAYMENT-REQUIRED` for a top-up of `payer`'s own account (no transaction template:
        `POST /v1/x402/topup` answers one with it)."""
        terms = PaymentTerms("topup", payer, payer, amount)
        return self.header(self.payment_required("topup", self.requirement(terms, self.sign(terms)), error))

    def purchase_header(
        self, payer: str, tier_id: int, months: int, price: int, amount: int, *, error: str
    ) -> str:
        terms = PaymentTerms("purchase", payer, payer, amount, tier_id, months, price)
        return self.header(
            self.payment_required("purchase", self.requirement(terms, self.sign(terms)), error)
        )

    # Paid retries -------------------------------------------------------------------------------------------
    @staticmethod
    def decode(value: str) -> PaymentPayload:
        """The `PAYMENT-SIGNATURE` header through the package's codec, after a strict base64 check (the
        codec's decoder skips characters outside the alphabet)."""
        try:
            base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise invalid("malformed_header", "the payment header is not base64") from exc
        try:
            payload = decode_payment_signature_header(value)
        except (ValueError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
            raise invalid("malformed_header", "the payment header is not an x402 PaymentPayload") from exc
        if not isinstance(payload, PaymentPayload) or payload.x402_version != X402_VERSION:
            raise invalid(
                "unsupported_version",
                "this service speaks x402 version 2",
                x402Version=getattr(payload, "x402_version", None),
            )
        return payload

    @staticmethod
    def payment_id(payload: PaymentPayload) -> str:
        """`extensions['payment-identifier'].info.id` (x402 v2), or `.id` as the interface contract writes it."""
        found = extract_payment_identifier(payload, validate=False)
        if found is None and payload.extensions:
            extension = payload.extensions.get(PAYMENT_IDENTIFIER)
            if isinstance(extension, dict) and isinstance(extension.get("id"), str):
                found = extension["id"]
        if found is None:
            raise invalid(
                "payment_id_missing", "a paid retry carries extensions['payment-identifier'] with an id"
            )
        if not is_valid_payment_id(found):
            raise invalid("payment_id_invalid", "a payment id is 16 to 128 letters, digits, '-' or '_'")
        return found

    def verify(self, kind: Kind, payload: PaymentPayload) -> VerifiedPayment:
        """The echoed entry against this network and its own MAC; expiry is checked after (QUOTE_EXPIRED)."""
        accepted = payload.accepted
        if accepted.scheme != SCHEME or accepted.network != self.network:
            raise invalid(
                "wrong_network",
                f"this service settles scheme {SCHEME!r} on {self.network}",
                scheme=accepted.scheme,
                network=accepted.network,
            )
        extra = accepted.extra or {}
        try:
            terms = self._terms(kind, accepted, extra)
            bucket, mac = extra["bucket"], extra["quoteMac"]
        except (KeyError, TypeError, ValueError) as exc:
            raise invalid("accepted_tampered", "`accepted` is not an entry this service offered") from exc
        canonical = terms.as_json(asset=accepted.asset, network=accepted.network, pay_to=accepted.pay_to)
        if not isinstance(mac, str) or not self.quotes.verify(canonical, bucket, mac):
            raise invalid(
                "accepted_tampered",
                "`accepted` does not verify: its quoteMac is not this environment's MAC of its terms",
            )
        if accepted.asset != self.asset or accepted.pay_to != self.contract:
            raise invalid("accepted_tampered", "`accepted` names another asset or payee")
        lease = extra.get("lease")
        if isinstance(payload.payload.get("lease"), str):
            lease = payload.payload["lease"]
        return VerifiedPayment(
            terms=terms,
            quote_id=QuoteSigner.quote_id_of(mac),
            bucket=int(bucket),
            payment_id=self.payment_id(payload),
            payload=payload,
            lease=lease if isinstance(lease, str) else None,
        )

    @staticmethod
    def _terms(kind: Kind, accepted: PaymentRequirements, extra: dict[str, Any]) -> PaymentTerms:
        if extra.get("kind") != kind:
            raise ValueError("another route's entry")
        amount = int(accepted.amount)
        if kind == "topup":
            return PaymentTerms("topup", str(extra["payer"]), str(extra["beneficiary"]), amount)
        tier_id, months = extra["tierId"], extra["months"]
        if not isinstance(tier_id, int) or not isinstance(months, int):
            raise ValueError("tierId and months are integers")
        return PaymentTerms(
            "purchase",
            str(extra["payer"]),
            str(extra["beneficiary"]),
            amount,
            tier_id,
            months,
            int(extra["priceMicroUsdc"]),
        )

    # Settlement ------------------------------------------------------------------------------------------
    def settle_header(
        self, *, success: bool, payer: str, tx_hash: str | None, amount: int, reason: str | None = None
    ) -> str:
        return encode_payment_response_header(
            SettleResponse(
                success=success,
                error_reason=reason,
                payer=payer,
                transaction=tx_hash or "",
                network=self.network,
                amount=str(amount),
            )
        )
