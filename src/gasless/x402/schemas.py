"""Request and response shapes of the x402 routes (docs/x402.md).

The x402 wire objects themselves (PaymentRequired, PaymentPayload, SettleResponse) are the `x402` package's
models, carried base64-encoded in the `PAYMENT-*` headers; these are the JSON bodies around them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gasless.http.formats import DECIMAL_PATTERN, AddressDoc, CheckedAddress, TxHashDoc
from gasless.purchases.schemas import MAX_MONTHS

PAYMENT_ID_PATTERN = "^[A-Za-z0-9_-]{16,128}$"
DecimalString = Annotated[str, Field(pattern=DECIMAL_PATTERN, description="an integer in decimal")]


class _Request(BaseModel):
    # Strict: a boolean is not an amount and a string is not a number (JSON types as documented); a JSON
    # number with an integral value (5.0) is the integer it names, as JSON Schema's `integer` says.
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in data.items()}
        return data


class X402TopupRequest(_Request):
    """USDC to credits, paid over x402: `deposit` (the payer's own account) or `depositFor(beneficiary)`."""

    payer: CheckedAddress = Field(description="the address that signs the payment transaction and pays")
    amountMicroUsdc: Annotated[int, Field(ge=1, le=2**53 - 1, description="USDC to deposit, in micro-USDC")]
    beneficiary: CheckedAddress | None = Field(
        default=None, description="the account credited; the payer when absent"
    )


class X402PurchaseRequest(_Request):
    """A plan bought over x402: `depositAndSubscribe(tier_id, months, max_price, ref)` for the payer."""

    payer: CheckedAddress = Field(description="the address that signs, pays and receives the plan")
    tierId: int = Field(ge=0, le=4_294_967_295, description="a tier of GET /v1/pricing")
    months: int = Field(default=1, ge=1, le=MAX_MONTHS)


class X402PurchaseResult(BaseModel):
    """A settled x402 payment (also sent, as a SettleResponse, in `PAYMENT-RESPONSE`)."""

    paymentId: str = Field(pattern=PAYMENT_ID_PATTERN)
    kind: Literal["topup", "purchase"]
    status: Literal["success"]
    payer: AddressDoc
    beneficiary: AddressDoc
    amountMicroUsdc: DecimalString = Field(description="the USDC the payment moved to the contract")
    asset: str
    network: str = Field(description="CAIP-2: mvx:<chain id>")
    quoteId: str = Field(
        pattern="^[0-9a-f]{64}$", description="the quote, and the contract `ref` of a purchase"
    )
    txHash: TxHashDoc
    intentId: str
    tierId: int | None = None
    months: int | None = None
    priceMicroUsdc: DecimalString | None = None
    settledAtMs: int = Field(description="when the contract's event was mirrored")


class X402Pending(BaseModel):
    """The payment is co-signed and on its way; poll `pollUrl` (202 until it is final)."""

    paymentId: str = Field(pattern=PAYMENT_ID_PATTERN)
    kind: Literal["topup", "purchase"]
    status: Literal["pending"]
    txHash: TxHashDoc | None = None
    intentId: str | None = None
    pollUrl: str
    retryAfterMs: int


class X402Kind(BaseModel):
    x402Version: int
    scheme: str
    network: str


class X402Supported(BaseModel):
    """The facilitator's `supported` answer (x402 v2 section 7.3): what this service settles itself."""

    kinds: list[X402Kind]
    extensions: list[str]
    signers: dict[str, list[str]] = Field(description="CAIP-2 pattern -> the active relayers (co-signers)")


class X402Resource(BaseModel):
    url: str
    method: Literal["POST"]
    description: str


class X402Descriptor(BaseModel):
    """`/.well-known/x402`: advisory discovery (no official x402 spec; the live 402 is authoritative)."""

    x402Version: Literal[2]
    kind: Literal["both"] = Field(description="a resource server that is its own facilitator")
    name: str
    description: str
    networks: list[str]
    assets: list[str]
    resources: list[X402Resource]
    facilitator: dict[str, Any] = Field(description="baseUrl and endpoints (supported, payment polling)")
