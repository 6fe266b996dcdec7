"""The x402 purchase flow (docs/x402.md): the service is its own
facilitator, and a payment is a user-signed Relayed-V3 transaction calling the billing contract with USDC.

An unpaid request is answered 402 PAYMENT_REQUIRED with a challenge (a stateless quote and, ready to sign,
the payment transaction and its lease). A paid retry is checked in this order, and nothing is co-signed
before all of it holds:
1. the header decodes (x402 v2) and `accepted` verifies by recomputing its `extra.quoteMac`;
2. the payment id is looked up in the shared database: the same id with the same payload is answered
   from its record, with another payload PAYMENT_INVALID (a database that does not answer: 503);
3. the request, the quote's validity (QUOTE_EXPIRED), the transaction (sender, receiver, function,
   arguments, token and amount exactly the quote's; the payer's signature) and the pauses;
4. the payment record is written, then the transaction goes through the relay core (its checks, the
   co-signature and the commit point), then the answer waits for the contract's event in the mirror:
   200 with PAYMENT-RESPONSE within the 8 000 ms budget, else 202 and `GET /v1/x402/payments/{id}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rfc8785
from multiversx_sdk import Address, Transaction

from gasless.chain.calls import contract_call
from gasless.chain.codec import WireError, signing_bytes, tx_from_wire, verify_ed25519
from gasless.core.errors import CATALOGUE, ApiError
from gasless.mirror.repository import MirrorRepository
from gasless.purchases.builder import Call
from gasless.purchases.quotes import expiry_of
from gasless.purchases.service import PurchaseService
from gasless.relay.repository import IntentRepository
from gasless.x402.challenges import Kind, PaymentTerms, VerifiedPayment, X402Challenges, invalid
from gasless.x402.repository import PaymentRepository, PaymentRow
from gasless.x402.schemas import X402Pending, X402PurchaseRequest, X402PurchaseResult, X402TopupRequest

HTTP_BUDGET_MS = 8_000  # docs/x402.md: the HTTP budget
POLL_RETRY_MS = 1_000
COMPLETION_EVENTS: dict[str, str] = {"topup": "deposit", "purchase": "subscribed"}
# Relay refusals that mean the payment itself did not verify (the rest: it could not settle).
# Retryable for a relay, final for a payment: the challenge's lease is spent; a new challenge is needed.
NEEDS_NEW_CHALLENGE = {"LEASE_EXPIRED"}
NOT_VERIFIED = {
    "SENDER_SIGNATURE_INVALID",
    "MALFORMED_REQUEST",
    "TX_VERSION_UNSUPPORTED",
    "GUARDIAN_REQUIRED",
}


@dataclass
class Answer:
    """What a route sends: a status, a JSON body and headers (PAYMENT-RESPONSE, Location, Retry-After)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def payload_digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(rfc8785.dumps(document)).hexdigest()


class X402Service:
    def __init__(
        self,
        challenges: X402Challenges,
        purchases: PurchaseService,
        payments: PaymentRepository,
        *,
        relay: Any,  # gasless.relay.service.RelayService (the relay core: checks, co-signature, commit point)
        intents: IntentRepository,
        mirror_repo: MirrorRepository,
        host_id: str,
        budget_ms: int = HTTP_BUDGET_MS,
        poll_interval_s: float = 0.1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.challenges = challenges
        self.purchases = purchases
        self.payments = payments
        self.relay = relay
        self.intents = intents
        self.mirror_repo = mirror_repo
        self.host_id = host_id
        self.budget_ms = budget_ms
        self.poll_interval_s = poll_interval_s
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # Challenges -------------------------------------------------------------------------------------------
    async def terms_of(self, kind: Kind, request: X402TopupRequest | X402PurchaseRequest) -> PaymentTerms:
        """The request's terms, refused as the builders refuse (bounds, tier, placement, pauses)."""
        await self.purchases.require_open(deposit=True)
        config = await self.purchases.config()
        if isinstance(request, X402TopupRequest):
            self.purchases.check_deposit(config, request.amountMicroUsdc)
            return PaymentTerms(
                "topup", request.payer, request.beneficiary or request.payer, request.amountMicroUsdc
            )
        price, _ = await self.purchases.plan_price(request.payer, request.tierId, request.months)
        amount = await self.purchases.x402_amount(price)
        self.purchases.check_deposit(config, amount)
        return PaymentTerms(
            "purchase", request.payer, request.payer, amount, request.tierId, request.months, price
        )

    def call_of(self, terms: PaymentTerms, quote_id: str) -> Call:
        if terms.kind == "purchase":
            assert terms.tier_id is not None and terms.months is not None and terms.price is not None
            return Call(
                "depositAndSubscribe",
                [terms.tier_id, terms.months, terms.price, bytes.fromhex(quote_id)],
                [terms.tier_id, terms.months, str(terms.price), quote_id],
                payment_amount=terms.amount,
            )
        if terms.beneficiary == terms.payer:
            return Call("deposit", [], [], payment_amount=terms.amount)
        return Call(
            "depositFor",
            [Address.new_from_bech32(terms.beneficiary)],
            [terms.beneficiary],
            payment_amount=terms.amount,
        )

    async def challenge(self, kind: Kind, request: X402TopupRequest | X402PurchaseRequest) -> ApiError:
        """402 PAYMENT_REQUIRED: one `accepts` entry with the quote and the payment transaction to sign."""
        terms = await self.terms_of(kind, request)
        quote = self.challenges.sign(terms)
        call = self.call_of(terms, quote.quote_id)
        config = await self.purchases.config()
        free = call.function in self.purchases.free_operations(config)
        prepared, assignment = await self.purchases.builder.build(terms.payer, [call], kinds=[(free, None)])
        template = {
            "function": call.function,
            "transaction": prepared[0].transaction.model_dump(mode="json", exclude_none=True),
            "lease": assignment.lease,
            "relayer": assignment.relayer,
        }
        requirement = self.challenges.requirement(terms, quote, template=template)
        document = self.challenges.payment_required(kind, requirement, "PAYMENT-SIGNATURE header is required")
        return ApiError(
            "PAYMENT_REQUIRED",
            detail=f"pay {terms.amount} micro-USDC of {self.challenges.asset} with the transaction in the "
            "PAYMENT-REQUIRED header's accepts[0].extra, signed once, then retry with PAYMENT-SIGNATURE",
            details={
                "x402Version": 2,
                "accepts": [requirement.model_dump(mode="json", by_alias=True, exclude_none=True)],
            },
            headers={"PAYMENT-REQUIRED": self.challenges.header(document), "Cache-Control": "no-store"},
        )

    # Paid retries -------------------------------------------------------------------------------------------
    async def pay(
        self,
        kind: Kind,
        request: X402TopupRequest | X402PurchaseRequest,
        header: str,
        *,
        request_id: str,
        received_ms: int,
    ) -> Answer:
        deadline_ms = received_ms + self.budget_ms
        payload = self.challenges.decode(header)
        verified = self.challenges.verify(kind, payload)
        digest = payload_digest(payload.model_dump(mode="json", by_alias=True, exclude_none=True))
        existing = await self.payments.get(verified.payment_id)
        if existing is not None:
            return await self._replay(existing, digest, verified, request_id, deadline_ms)
        self._match_request(request, verified.terms)
        if self.challenges.quotes.expired(verified.bucket):
            raise ApiError(
                "QUOTE_EXPIRED",
                detail="the quote in `accepted` has expired; ask for a new challenge (retry without payment)",
                details={"expiresAtMs": expiry_of(verified.bucket), "quoteId": verified.quote_id},
            )
        tx, wire = self._payment_transaction(verified)
        if verified.lease is None:
            raise invalid(
                "lease_missing", "the payment carries no lease (accepted.extra.lease or payload.lease)"
            )
        await self.purchases.require_open(deposit=True, fresh=True)  # docs/x402.md: before any co-signature
        now = self.now_ms()
        record = {
            "payment_id": verified.payment_id,
            "kind": kind,
            "payload_digest": digest,
            "payer": verified.terms.payer,
            "beneficiary": verified.terms.beneficiary,
            "amount_micro": verified.terms.amount,
            "quote_id": verified.quote_id,
            "terms": {
                "tierId": verified.terms.tier_id,
                "months": verified.terms.months,
                "priceMicroUsdc": None if verified.terms.price is None else str(verified.terms.price),
            },
            "state": "pending",
            "host_id": self.host_id,
            "created_at_ms": now,
            "updated_at_ms": now,
        }
        if not await self.payments.insert(record):  # another request with this id won the write
            existing = await self.payments.get(verified.payment_id)
            if existing is None:
                raise ApiError("UPSTREAM_UNAVAILABLE", detail="the payment record vanished; retry")
            return await self._replay(existing, digest, verified, request_id, deadline_ms)
        row = await self.payments.get(verified.payment_id)
        assert row is not None
        return await self._settle(row, wire, verified.lease, request_id, deadline_ms)

    async def _replay(
        self, row: PaymentRow, digest: str, verified: VerifiedPayment, request_id: str, deadline_ms: int
    ) -> Answer:
        if row.payload_digest != digest or row.kind != verified.terms.kind:
            raise invalid(
                "payment_id_reused",
                "this payment id was used with another payment payload",
                paymentId=row.payment_id,
            )
        if row.state != "pending" or row.tx_hash is not None:
            return await self._follow(row, deadline_ms)
        # Pending and not co-signed yet (a request in flight, or a host that stopped before its relay
        # answered): the relay core is idempotent on the same signed bytes, so the payment goes on.
        _, wire = self._payment_transaction(verified)
        assert verified.lease is not None
        return await self._settle(row, wire, verified.lease, request_id, deadline_ms)

    async def _settle(
        self, row: PaymentRow, wire: dict[str, Any], lease: str, request_id: str, deadline_ms: int
    ) -> Answer:
        raw = json.dumps({"tx": wire, "lease": lease}, separators=(",", ":")).encode()
        try:
            _, response = await self.relay.relay(
                raw, idempotency_key=None, sponsor=None, request_id=request_id, received_ms=self.now_ms()
            )
        except ApiError as refusal:  # the relay core refused: nothing was co-signed
            entry = CATALOGUE.get(refusal.code)
            if entry is not None and entry.retryable and refusal.code not in NEEDS_NEW_CHALLENGE:
                await self.payments.forget(row.payment_id, row.payload_digest)
                raise
            code = "PAYMENT_INVALID" if refusal.code in NOT_VERIFIED else "PAYMENT_FAILED"
            failure = {
                "code": code,
                "reason": refusal.code,
                "detail": f"the payment could not settle: {refusal.detail}",
                "txHash": None,
            }
            final = await self.payments.finish(row.payment_id, "failed", failure, self.now_ms())
            return self._answer(final)
        await self.payments.attach(row.payment_id, response.txHash, response.id, self.now_ms())
        attached = await self.payments.get(row.payment_id)
        assert attached is not None
        return await self._follow(attached, deadline_ms)

    async def _follow(self, row: PaymentRow, deadline_ms: int) -> Answer:
        """Wait (within the HTTP budget) for the payment to become final; 202 past it."""
        while True:
            row = await self.complete(row)
            if row.state != "pending" or self.now_ms() >= deadline_ms:
                return self._answer(row)
            await asyncio.sleep(self.poll_interval_s)

    async def complete(self, row: PaymentRow) -> PaymentRow:
        """Make a pending record final when the chain and the mirror say so (idempotent, any host)."""
        if row.state != "pending" or row.tx_hash is None:
            return row
        intent = await self.intents.by_hash(row.tx_hash)
        if intent is None:
            return row
        if intent.state == "DEAD" or intent.outcome == "fail":
            reason = "dead" if intent.state == "DEAD" else "reverted"
            failure = {
                "code": "PAYMENT_FAILED",
                "reason": reason,
                "detail": f"the payment transaction {row.tx_hash} {'was dropped' if reason == 'dead' else 'failed on chain'}"
                + (f" ({intent.dead_reason})" if intent.dead_reason else ""),
                "txHash": row.tx_hash,
            }
            return await self.payments.finish(row.payment_id, "failed", failure, self.now_ms())
        if intent.outcome != "success":
            return row
        event = await self.mirror_repo.event_of(row.tx_hash, COMPLETION_EVENTS[row.kind])
        if event is None:
            return row
        result = X402PurchaseResult(
            paymentId=row.payment_id,
            kind=row.kind,  # type: ignore[arg-type]
            status="success",
            payer=row.payer,
            beneficiary=row.beneficiary,
            amountMicroUsdc=str(row.amount_micro),
            asset=self.challenges.asset,
            network=self.challenges.network,
            quoteId=row.quote_id,
            txHash=row.tx_hash,
            intentId=row.intent_id or "",
            tierId=row.terms.get("tierId"),
            months=row.terms.get("months"),
            priceMicroUsdc=row.terms.get("priceMicroUsdc"),
            settledAtMs=self.now_ms(),
        )
        return await self.payments.finish(
            row.payment_id, "success", result.model_dump(mode="json"), self.now_ms()
        )

    def _answer(self, row: PaymentRow) -> Answer:
        if row.state == "success":
            assert row.result is not None
            header = self.challenges.settle_header(
                success=True, payer=row.payer, tx_hash=row.tx_hash, amount=row.amount_micro
            )
            return Answer(200, row.result, {"PAYMENT-RESPONSE": header, "Cache-Control": "private, no-store"})
        if row.state == "failed":
            assert row.result is not None
            code = row.result.get("code", "PAYMENT_FAILED")
            header = self.challenges.settle_header(
                success=False,
                payer=row.payer,
                tx_hash=row.result.get("txHash"),
                amount=row.amount_micro,
                reason=str(row.result.get("reason")),
            )
            raise ApiError(
                code,
                detail=str(row.result.get("detail")),
                details={"reason": row.result.get("reason"), "paymentId": row.payment_id},
                headers={"PAYMENT-RESPONSE": header},
            )
        poll = f"/v1/x402/payments/{row.payment_id}"
        pending = X402Pending(
            paymentId=row.payment_id,
            kind=row.kind,  # type: ignore[arg-type]
            status="pending",
            txHash=row.tx_hash,
            intentId=row.intent_id,
            pollUrl=poll,
            retryAfterMs=POLL_RETRY_MS,
        )
        return Answer(
            202,
            pending.model_dump(mode="json"),
            {"Location": poll, "Retry-After": str(POLL_RETRY_MS // 1000), "Cache-Control": "no-store"},
        )

    async def status(self, payment_id: str) -> Answer:
        row = await self.payments.get(payment_id)
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"no x402 payment {payment_id}")
        return self._answer(await self.complete(row))

    # Checks of a paid retry ------------------------------------------------------------------------------
    @staticmethod
    def _match_request(request: X402TopupRequest | X402PurchaseRequest, terms: PaymentTerms) -> None:
        """The retried request asks for what the quote priced."""
        if isinstance(request, X402TopupRequest):
            asked = (request.payer, request.beneficiary or request.payer, request.amountMicroUsdc)
            quoted = (terms.payer, terms.beneficiary, terms.amount)
        else:
            asked = (request.payer, request.tierId, request.months)
            quoted = (terms.payer, terms.tier_id, terms.months)
        if asked != quoted:
            raise invalid("request_mismatch", "the request differs from the one the accepted quote priced")

    def _payment_transaction(self, verified: VerifiedPayment) -> tuple[Transaction, dict[str, Any]]:
        """The signed payment transaction, checked against the quote: sender, receiver, value, function,
        arguments, token and amount exactly as quoted (compared as the call's data bytes), and the payer's
        own signature."""
        wire = verified.payload.payload.get("transaction")
        if not isinstance(wire, dict):
            raise invalid("transaction_missing", "payload.transaction holds the signed payment transaction")
        try:
            tx = tx_from_wire(wire, allow_unknown=False)
        except WireError as exc:
            raise invalid("transaction_malformed", f"payload.transaction: {exc}") from exc
        terms = verified.terms
        call = self.call_of(terms, verified.quote_id)
        expected = contract_call(
            abi=self.purchases.builder.abi,
            chain_id=self.challenges.chain_id,
            sender=Address.new_from_bech32(terms.payer),
            contract=Address.new_from_bech32(self.challenges.contract),
            function=call.function,
            arguments=call.arguments,
            gas_limit=tx.gas_limit,
            nonce=tx.nonce,
            payment_token=self.challenges.asset,
            payment_amount=call.payment_amount,
        )
        mismatch = [
            name
            for name, ours, theirs in (
                ("sender", expected.sender.to_bech32(), tx.sender.to_bech32()),
                ("receiver", expected.receiver.to_bech32(), tx.receiver.to_bech32()),
                ("value", expected.value, tx.value),
                ("data", expected.data, tx.data),
                ("chainID", expected.chain_id, tx.chain_id),
            )
            if ours != theirs
        ]
        if mismatch:
            raise invalid(
                "transaction_mismatch",
                "the payment transaction is not the quoted payment (its "
                + ", ".join(mismatch)
                + " differ): the call, token, amount, receiver and payer must be the quote's",
                fields=mismatch,
            )
        if not tx.signature or not verify_ed25519(
            tx.sender.get_public_key(), signing_bytes(tx), tx.signature
        ):
            raise invalid("signature_invalid", "the payment transaction is not signed by the payer")
        return tx, wire
