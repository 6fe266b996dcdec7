"""Request and response shapes of the purchase builders (docs/purchases.md).

A builder answers unsigned transactions for the user to sign once and relay; money, RU and gas of the
purchase quote are decimal strings (docs/purchases.md), `feeMicroUsdc` and `ru` of a prepared
transaction are integers (operational values).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gasless.http.formats import DECIMAL_PATTERN, AddressDoc, CheckedAddress
from gasless.relay.schemas import Assignment

MAX_MONTHS = 12  # the contract's MAX_MONTHS
MAX_SENDERS = 50  # per addSenders / removeSenders call (one transaction's data stays small)
DecimalString = Annotated[str, Field(pattern=DECIMAL_PATTERN, description="an integer in decimal")]
MicroUsdcAmount = Annotated[int, Field(ge=0, le=2**53 - 1, description="micro-USDC")]


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


class PrepareSubscribeRequest(_Request):
    payer: CheckedAddress = Field(description="the paying address: it signs, pays and receives the plan")
    tierId: int = Field(ge=0, le=4_294_967_295, description="a tier of GET /v1/pricing")
    months: int = Field(default=1, ge=1, le=MAX_MONTHS)
    payWith: Literal["auto", "credits", "usdc"] = Field(
        default="auto",
        description="`auto`: the account's credits when they cover the price (subscribe), else USDC "
        "(depositAndSubscribe); `credits`: credits only (INSUFFICIENT_CREDITS when short); `usdc`: USDC",
    )
    maxPriceMicroUsdc: MicroUsdcAmount | None = Field(
        default=None, description="refuse (PRICE_ABOVE_MAX) when the price is above this"
    )


class PrepareDepositRequest(_Request):
    payer: CheckedAddress = Field(description="the address that signs and pays the USDC")
    amountMicroUsdc: Annotated[int, Field(ge=1, le=2**53 - 1, description="USDC to deposit, in micro-USDC")]
    beneficiary: CheckedAddress | None = Field(
        default=None, description="the account credited (depositFor); the payer when absent (deposit)"
    )


class PaygChange(_Request):
    """`setPayg(enabled, budget, auto_topup, max_payg_price)`, in that order."""

    enabled: bool
    budgetMicroUsdc: MicroUsdcAmount = 0
    autoTopup: bool = False
    maxPaygPriceMicroUsdc: MicroUsdcAmount = Field(default=0, description="per RU; 0: no cap")


class PrepareFlagsRequest(_Request):
    """One unsigned transaction per requested change, in this order: autoRenew, payg, releaseEscrow,
    renew. At least one change (else 400 MALFORMED_REQUEST)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["autoRenew"], "properties": {"autoRenew": {"type": "boolean"}}},
                {"required": ["payg"], "properties": {"payg": {"type": "object"}}},
                {"required": ["releaseEscrow"], "properties": {"releaseEscrow": {"const": True}}},
                {"required": ["renew"], "properties": {"renew": {"const": True}}},
                {"required": ["renewFor"], "properties": {"renewFor": {"type": "string"}}},
            ]
        }
    )

    address: CheckedAddress = Field(description="the account (it signs every transaction)")
    autoRenew: bool | None = Field(default=None, description="setAutoRenew(enabled)")
    payg: PaygChange | None = None
    releaseEscrow: bool = Field(default=False, description="releaseEscrow(): escrow back to credits")
    renew: bool = Field(default=False, description="renew(address): renew the running plan now")
    renewFor: CheckedAddress | None = Field(
        default=None,
        description="renew(this account) instead of the signer's own (billed: free only for oneself)",
    )


class PrepareSendersRequest(_Request):
    """Senders to add (addSenders) or to remove (removeSenders): one of the two, not both."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["add"],
                    "properties": {"add": {"minItems": 1}, "remove": {"maxItems": 0}},
                },
                {
                    "required": ["remove"],
                    "properties": {"remove": {"minItems": 1}, "add": {"maxItems": 0}},
                },
            ]
        }
    )

    account: CheckedAddress = Field(description="the account (it signs)")
    add: list[CheckedAddress] = Field(default_factory=list, max_length=MAX_SENDERS)
    remove: list[CheckedAddress] = Field(default_factory=list, max_length=MAX_SENDERS)


class ContractCall(BaseModel):
    """What the transaction calls: the contract, the function and its arguments as given to the ABI."""

    contract: AddressDoc
    function: str
    args: list[Any] = Field(description="the call's arguments, in order (amounts as decimal strings)")
    paymentToken: str | None = Field(default=None, description="the token sent with the call")
    paymentAmount: DecimalString | None = None


class UnsignedTransaction(BaseModel):
    """The transaction to sign, in the gateway's JSON form (`relayer` set; no signatures)."""

    model_config = ConfigDict(extra="allow")

    nonce: int
    value: str
    receiver: AddressDoc
    sender: AddressDoc
    relayer: AddressDoc
    gasPrice: int
    gasLimit: int
    data: str | None = None
    chainID: str
    version: int
    options: int | None = None


class PreparedTransaction(BaseModel):
    transaction: UnsignedTransaction
    assignment: Assignment
    contractCall: ContractCall
    free: bool = Field(description="relayed free of charge (a free operation within the free flow)")
    ru: int | None = Field(default=None, description="Relay Units the relay is billed (when not free)")
    feeMicroUsdc: int = Field(
        ge=0, description="what the call itself charges beyond its relay (addSenders: the fee ceiling)"
    )


class PreparedTransactions(BaseModel):
    """One unsigned transaction per requested change, consecutive nonces, one assignment."""

    transactions: list[PreparedTransaction]
    assignment: Assignment


class PurchaseQuote(BaseModel):
    """A stateless quote: `quoteMac` is an HMAC over the quote's canonical JSON (RFC 8785) with its TTL
    bucket; `quoteId` is derived from the MAC and is the contract `ref` of the purchase."""

    quoteId: str = Field(pattern="^[0-9a-f]{64}$", description="32 bytes in hex: the contract `ref`")
    quoteMac: str = Field(pattern="^[A-Za-z0-9_-]{43}$", description="base64url HMAC-SHA256")
    payer: AddressDoc
    tierId: int
    months: int
    priceMicroUsdc: DecimalString
    maxPrice: DecimalString = Field(description="equals priceMicroUsdc: the max_price the user signs")
    chainId: str
    bucket: int = Field(description="the TTL bucket: floor(issued ms / 120 000)")
    expiresAtMs: int


class PreparedPurchase(BaseModel):
    quote: PurchaseQuote
    transaction: UnsignedTransaction
    assignment: Assignment
    contractCall: ContractCall
    free: bool
    ru: int | None = None
    feeMicroUsdc: int = Field(ge=0, description="0: the purchase's price is the quote's")
    payWith: Literal["credits", "usdc"] = Field(
        description="`credits`: subscribe from the account's credits; `usdc`: depositAndSubscribe"
    )
