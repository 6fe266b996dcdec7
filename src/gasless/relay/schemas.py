"""Request and response shapes of the relay routes, named as the interface contract names them."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from gasless.chain.codec import UINT64_MAX
from gasless.http.formats import (
    AMOUNT_DIGITS,
    AMOUNT_PATTERN,
    BASE64_PATTERN,
    INT64_MAX,
    SIGNATURE_PATTERN,
    UINT32_MAX,
    VISIBLE_ASCII_KEY_PATTERN,
    Address,
    AddressDoc,
    Int64,
    IntentIdDoc,
    SafeInt,
    TxHashDoc,
    component_ref,
    ref,
)
from gasless.relay.leases import MAX_LEASE_CHARS

IntentState = Literal["COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED", "DEAD", "REJECTED"]
LeaseKindName = Literal["std", "sponsor", "cancel", "free"]


# Transactions on the wire ----------------------------------------------------------------------------------
# The gateway's JSON form, judged by chain/codec.py (tx_from_wire) with the ranges of gasless.http.formats;
# these schemas document exactly what it accepts. A member may be absent; the optional ones may also be null
# or "" (the SDK's `to_dictionary()` writes "" for an absent address, signature or data). `chainID` is the
# one this host serves (filled in per host by `transaction_schemas`).
Wire = Annotated[dict[str, Any], WithJsonSchema(component_ref("Transaction"))]
SignedWire = Annotated[dict[str, Any], WithJsonSchema(component_ref("SignedTransaction"))]
_NULL: dict[str, Any] = {"type": "null"}
_EMPTY: dict[str, Any] = {"type": "string", "maxLength": 0}


def _uint(maximum: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "maximum": maximum, "description": description}


def transaction_schemas(chain_id: str) -> dict[str, dict[str, Any]]:
    """The components `Transaction` (quote: signed or not) and `SignedTransaction` (relay, validate's
    reference, assign's `renewFor`) for a host serving `chain_id`."""
    signature = {"type": "string", "pattern": SIGNATURE_PATTERN, "description": "64 bytes, hex"}
    base64 = {"type": "string", "pattern": BASE64_PATTERN, "description": "standard base64 (padded)"}
    optional_address = {"anyOf": [ref("Address"), _EMPTY, _NULL]}
    properties: dict[str, Any] = {
        "nonce": {"anyOf": [_uint(INT64_MAX, "int64; absent or null is 0"), _NULL]},
        "value": {
            "anyOf": [
                {
                    "type": "string",
                    "pattern": AMOUNT_PATTERN,
                    "maxLength": AMOUNT_DIGITS,
                    "description": f"atto, decimal without leading zeros, at most {AMOUNT_DIGITS} digits; "
                    "absent, null or empty is 0",
                },
                _NULL,
            ]
        },
        "receiver": ref("Address"),
        "sender": ref("Address"),
        "senderUsername": {"anyOf": [base64, _NULL]},
        "receiverUsername": {"anyOf": [base64, _NULL]},
        # uint64, the network's type: above the network's ceiling (it is far below 2^53) is 422
        # GAS_LIMIT_TOO_HIGH / GAS_PRICE_OUT_OF_RANGE, not a malformed body.
        "gasPrice": _uint(UINT64_MAX, "uint64; above twice the network minimum is GAS_PRICE_OUT_OF_RANGE"),
        "gasLimit": _uint(UINT64_MAX, "uint64; above the network ceiling is GAS_LIMIT_TOO_HIGH"),
        "data": {"anyOf": [base64, _NULL]},
        "chainID": {"type": "string", "const": chain_id, "description": "the chain this host serves"},
        "version": _uint(UINT32_MAX, "uint32"),
        "options": {"anyOf": [_uint(UINT32_MAX, "uint32; absent or null is 0"), _NULL]},
        "guardian": optional_address,
        "guardianSignature": {"anyOf": [signature, _EMPTY, _NULL]},
        "signature": {"anyOf": [signature, _EMPTY, _NULL]},
        "relayer": optional_address,
        "relayerSignature": {"anyOf": [signature, _EMPTY, _NULL]},
    }
    unsigned = {
        "title": "Transaction",
        "description": "A transaction in the gateway's JSON form, signed or not (POST /v1/quote). Unknown "
        "members are refused.",
        "type": "object",
        "properties": properties,
        "required": ["sender", "receiver", "gasPrice", "gasLimit", "chainID", "version"],
        "additionalProperties": False,
    }
    signed = copy.deepcopy(unsigned)
    signed["title"] = "SignedTransaction"
    signed["description"] = (
        "The user-signed Relayed-V3 transaction of POST /v1/relay: version 2, options 0 to 3 (hash signing, "
        "guarded), naming the assigned relayer, without a relayer signature. A missing or wrong sender "
        "signature is 422 SENDER_SIGNATURE_INVALID; the network's own limits (gas price, gas limit, data "
        "size, balance) are 422 as well."
    )
    signed["properties"].update(
        {
            "version": {
                "type": "integer",
                "enum": [2],
                "description": "2 (TX_VERSION_UNSUPPORTED otherwise)",
            },
            "options": {
                "anyOf": [{"type": "integer", "enum": [0, 1, 2, 3]}, _NULL],
                "description": "bit 0 hash signing, bit 1 guarded (TX_OPTIONS_UNSUPPORTED otherwise)",
            },
            "relayer": ref("Address"),
            "relayerSignature": {
                "anyOf": [_EMPTY, _NULL],
                "description": "absent or empty (RELAYER_SIGNATURE_PRESENT otherwise)",
            },
        }
    )
    signed["required"] = [*unsigned["required"], "relayer"]
    return {"Transaction": unsigned, "SignedTransaction": signed}


class IntentLatency(BaseModel):
    """Derived figures (ms, except the round count); null when an input timestamp is null."""

    acceptToCosignMs: int | None = None
    cosignToBroadcastMs: int | None = None
    addedMs: int | None = None
    inclusionMs: int | None = None
    finalityMs: int | None = None
    totalMs: int | None = None
    roundsToInclusion: int | None = None


class IntentFailure(BaseModel):
    """The contract's error of a failed execution and, when it names a catalogue condition, its code."""

    code: str | None = Field(description="catalogue code (e.g. PRICE_ABOVE_MAX), null when none applies")
    message: str = Field(description="the error the chain reported (e.g. ERR_PRICE_ABOVE_MAX)")


class Intent(BaseModel):
    """One relayed transaction's status, keyed by sender and nonce."""

    id: IntentIdDoc = Field(description="`<sender>:<nonce>`")
    sender: AddressDoc
    nonce: Int64
    txHash: TxHashDoc | None
    state: IntentState
    final: bool
    receivedAtMs: int | None
    cosignedAtMs: int | None
    broadcastAtMs: int | None
    executedBlockTsMs: int | None
    finalizedAtMs: int | None
    latency: IntentLatency
    crossShard: bool
    receiver: str | None = None
    relayer: str | None = None
    gasLimit: int | None = None
    gasPrice: int | None = None
    outcome: Literal["success", "fail"] | None = Field(
        default=None, description="execution status on chain once executed"
    )
    deadReason: str | None = None
    failure: IntentFailure | None = Field(
        default=None, description="why a failed execution failed (outcome `fail`), when the chain says"
    )
    replacedBy: str | None = None
    rejection: dict[str, Any] | None = Field(
        default=None, description="code and detail of a REJECTED submission"
    )


class AssignProof(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    kind: Literal["key", "sponsor"] = "key"
    serverTimeMs: SafeInt | None = Field(default=None, description="the signed server time, Unix ms")
    signature: str | None = Field(
        default=None,
        description="hex raw Ed25519 signature (128 hex characters) over "
        "`relay/assign/v1|<chainId>|<sender>|<serverTimeMs>`; one that does not verify, whatever its "
        "shape, is 401 ASSIGN_PROOF_INVALID",
    )


class AssignRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    sender: Address
    proof: AssignProof | None = None
    renewFor: SignedWire | None = Field(
        default=None, description="the already signed transaction (wire form) whose lease expired"
    )
    cancel: Int64 | None = Field(default=None, description="nonce (int64) of the in-flight intent to cancel")
    withNextNonce: bool = Field(
        default=False,
        description="also answer `nextNonce`, the sender's next usable nonce (read from the network for this "
        "request), so a client needs no gateway of its own",
    )


class Assignment(BaseModel):
    relayer: AddressDoc
    shard: int
    lease: str
    kind: LeaseKindName
    pinNonce: int | None = None
    issuedAtMs: int
    expiresAtMs: int
    renewable: bool
    serverTimeMs: int
    nextNonce: int | None = Field(
        default=None,
        description="the sender's next usable nonce: past its account nonce, the network's pool and this "
        "service's intents in flight; only when the request asked for it (`withNextNonce: true`)",
    )


class BillingInfo(BaseModel):
    authMode: Literal["signed_tx", "api_key"]
    billingClass: Literal["plan", "payg", "sponsor", "free"] | None = None
    account: str | None = None
    ru: int | None = Field(default=None, description="Relay Units this relay costs (RU schedule v1)")
    free: bool = Field(default=False, description="relayed free (a free operation within the free flow)")


class RelayResponse(BaseModel):
    id: IntentIdDoc
    txHash: TxHashDoc
    state: IntentState
    duplicate: bool
    relayer: AddressDoc
    intent: Intent
    billing: BillingInfo


class RelayRequest(BaseModel):
    """The documented shape; the route parses the raw body itself to reject unknown members exactly."""

    model_config = ConfigDict(extra="forbid")

    tx: SignedWire
    lease: str = Field(
        min_length=1,
        max_length=MAX_LEASE_CHARS,
        description="the lease from POST /v1/relay/assign, as it was issued (opaque; one that does not "
        "verify, whatever its shape, is 403 LEASE_INVALID)",
    )
    intentKey: str | None = Field(
        default=None,
        pattern=VISIBLE_ASCII_KEY_PATTERN,
        description="logical idempotency key: 16 to 128 visible ASCII characters (`Idempotency-Key` wins)",
    )
    account: Address | None = Field(
        default=None,
        description="the account the sender expects to pay (its own or one naming it as an authorised "
        "sender); SENDER_NOT_AUTHORIZED otherwise. Ignored when a sponsor key pays.",
    )


class QuoteRelayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tx: Wire


class RelayQuote(BaseModel):
    ru: str
    priceMicroUsdc: str
    ruScheduleVersion: str
    gasLimit: str
    movementGas: str
    maxFeeAtto: str = Field(description="network fee the relayer pays at most (the whole gas limit used)")
    billingClass: Literal["plan", "payg", "sponsor", "free"] | None = None
    free: bool


class ValidateRequest(BaseModel):
    """What `POST /v1/relay` would receive. The body must be an object with an object `tx` (else 400
    MALFORMED_REQUEST); everything `POST /v1/relay` would refuse in it (a member of another type or
    range, an unknown member, `variants`, ... see RelayRequest and SignedTransaction) is answered 200 with
    `ok: false` and that refusal listed in `problems`."""

    model_config = ConfigDict(extra="allow")

    tx: dict[str, Any] = Field(
        description="the transaction, judged as POST /v1/relay judges it (see SignedTransaction)"
    )
    lease: Any = Field(default=None, description="as in RelayRequest; judged, not required")
    intentKey: Any = Field(default=None, description="as in RelayRequest; judged, not required")


class ValidateProblem(BaseModel):
    type: str
    title: str
    status: int
    detail: str | None = None
    code: str
    details: dict[str, Any] = {}


class ValidateResponse(BaseModel):
    ok: bool
    problems: list[ValidateProblem]
    txHash: TxHashDoc | None = None


class NetworkNativeAuth(BaseModel):
    """What a headless client needs to build a native-auth token this host accepts."""

    shard: int
    blockHash: str | None = Field(description="a recent shard-1 block hash to embed in the token")
    blockNonce: int | None
    blockTimestampMs: int | None
    origins: list[str]
    maxTtlMs: int = Field(description="the longest token lifetime this host accepts")


class NetworkShard(BaseModel):
    """Measured figures of one shard (never estimated): latency over `windowMs` from the rollups, with the
    number of intents measured; null when nothing was measured."""

    shard: int
    addedP50Ms: int | None
    addedP99Ms: int | None
    inclusionP50Ms: int | None
    inclusionP95Ms: int | None
    inclusionP99Ms: int | None
    samples: int = Field(description="intents measured in the window")
    windowMs: int
    lastBlockTsMs: int | None = Field(description="the shard's newest block (chain time)")
    stalled: bool = Field(description="no new block for more than 10 rounds")
    relays24h: int = Field(description="terminal intents of the shard in the last 24 h")


class NetworkPause(BaseModel):
    paused: bool = Field(description="the contract's global pause (getPauseState)")
    depositsPaused: bool


class NetworkVenue(BaseModel):
    state: Literal["active", "paused"]


class Network(BaseModel):
    """The network this host serves (`GET /v1/network`)."""

    chainId: str
    env: Literal["live", "test"]
    network: str
    numShards: int
    roundDurationMs: int
    epoch: int
    minGasPrice: int
    minGasLimit: int
    gasPerDataByte: int
    maxGasPerTx: int
    nativeAuth: NetworkNativeAuth
    contractPause: NetworkPause | None = Field(description="null when no billing contract is configured")
    swapVenue: NetworkVenue | None = Field(description="null when no exchange venue is configured")
    shards: list[NetworkShard]
