"""The payer's side of x402 v2 against this service, on the `x402` package's models and header codecs.

A 402 challenge's `accepts[0].extra` holds the payment transaction ready to sign (`transaction`) and its
lease; paying is signing that transaction once and retrying the same request with `PAYMENT-SIGNATURE`:

    required = read_challenge(response.headers)
    header, payment_id = pay_header(required, signer)
    retry with {"PAYMENT-SIGNATURE": header}; 202 -> poll GET /v1/x402/payments/{payment_id}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from x402.extensions.payment_identifier import (
    append_payment_identifier_to_extensions,
    generate_payment_id,
)
from x402.http.utils import (
    decode_payment_required_header,
    decode_payment_response_header,
    encode_payment_signature_header,
)
from x402.schemas import PaymentPayload, PaymentRequired, SettleResponse

from gasless.chain.codec import tx_from_wire, tx_to_wire
from gasless.client.keys import TxSigner

PAYMENT_SIGNATURE = "PAYMENT-SIGNATURE"


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    raise ValueError(f"no {name} header in the answer")


def read_challenge(headers: Mapping[str, str]) -> PaymentRequired:
    """The `PAYMENT-REQUIRED` header of a 402 answer."""
    required = decode_payment_required_header(_header(headers, "PAYMENT-REQUIRED"))
    if not isinstance(required, PaymentRequired):
        raise ValueError("the challenge is not x402 version 2")
    return required


def read_settlement(headers: Mapping[str, str]) -> SettleResponse:
    """The `PAYMENT-RESPONSE` header of a final answer."""
    return decode_payment_response_header(_header(headers, "PAYMENT-RESPONSE"))


def signed_payment(required: PaymentRequired, signer: TxSigner, *, index: int = 0) -> dict[str, Any]:
    """The challenge's payment transaction signed once by the payer, in the gateway's JSON form."""
    extra = required.accepts[index].extra or {}
    unsigned = extra.get("transaction")
    if not isinstance(unsigned, dict):
        raise ValueError("the challenge carries no transaction to sign (ask the paid route itself)")
    tx = tx_from_wire({**unsigned, "signature": "00" * 64})
    signer.sign_transaction(tx)
    return tx_to_wire(tx)


def pay_header(
    required: PaymentRequired,
    signer: TxSigner,
    *,
    payment_id: str | None = None,
    index: int = 0,
    transaction: dict[str, Any] | None = None,
) -> tuple[str, str]:
    """The `PAYMENT-SIGNATURE` value paying `accepts[index]`, and its payment id (reuse it on retries)."""
    payment_id = payment_id or generate_payment_id("pay_")
    extensions = append_payment_identifier_to_extensions(dict(required.extensions or {}), payment_id)
    payload = PaymentPayload(
        x402_version=2,
        resource=required.resource,
        accepted=required.accepts[index],
        payload={"transaction": transaction or signed_payment(required, signer, index=index)},
        extensions=extensions,
    )
    return encode_payment_signature_header(payload), payment_id
