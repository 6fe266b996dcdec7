"""Request and response shapes of the relay routes, named as the spec names them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gasless.http.formats import INT64_MAX, SAFE_INT_MAX

IntentState = Literal["COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED", "DEAD", "REJECTED"]
LeaseKindName = Literal["std", "sponsor", "cancel", "free"]


class IntentLatency(BaseModel):
    """Derived figures (ms, except the round count); null when an input timestamp is null."""

    acceptToCosignMs: int | None = None
    cosignToBroadcastMs: int | None = None
    addedMs: int | None = None
    inclusionMs: int | None = None
    finalityMs: int | None = None
    totalMs: int | None = None
    roundsToInclusion: int | None = None


class Intent(BaseModel):
    """One relayed transaction's status, keyed by sender and nonce."""

    id: str = Field(description="`<sender>:<nonce>`")
    sender: str
    nonce: int = Field(ge=0)
    txHash: str | None
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
    replacedBy: str | None = None
    rejection: dict[str, Any] | None = Field(
        default=None, description="code and detail of a REJECTED submission"
    )


class AssignProof(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["key", "sponsor"] = "key"
    serverTimeMs: int | None = Field(
        default=None, ge=0, le=SAFE_INT_MAX, description="the signed server time, Unix ms"
    )
    signature: str | None = Field(
        default=None,
        description="hex raw Ed25519 signature over `relay/assign/v1|<chainId>|<sender>|<serverTimeMs>`",
    )


class AssignRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sender: str
    proof: AssignProof | None = None
    renewFor: dict[str, Any] | None = Field(
        default=None, description="the already signed transaction (wire form) whose lease expired"
    )
    cancel: int | None = Field(
        default=None, ge=0, le=INT64_MAX, description="nonce (int64) of the in-flight intent to cancel"
    )


class Assignment(BaseModel):
    relayer: str
    shard: int
    lease: str
    kind: LeaseKindName
    pinNonce: int | None = None
    issuedAtMs: int
    expiresAtMs: int
    renewable: bool
    serverTimeMs: int


class BillingInfo(BaseModel):
    authMode: Literal["signed_tx", "api_key"]
    billingClass: Literal["plan", "payg", "sponsor", "free"] | None = None
    account: str | None = None
    ru: int | None = Field(default=None, description="Relay Units this relay costs (RU schedule v1)")
    free: bool = Field(default=False, description="relayed free (a free operation within the free flow)")


class RelayResponse(BaseModel):
    id: str
    txHash: str
    state: IntentState
    duplicate: bool
    relayer: str
    intent: Intent
    billing: BillingInfo


class RelayRequest(BaseModel):
    """The documented shape; the route parses the raw body itself to reject unknown members exactly."""

    model_config = ConfigDict(extra="forbid")

    tx: dict[str, Any]
    lease: str
    intentKey: str | None = None


class QuoteRelayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tx: dict[str, Any]


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
    model_config = ConfigDict(extra="forbid")

    tx: dict[str, Any]
    lease: str | None = None
    intentKey: str | None = None


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
    txHash: str | None = None


class NetworkNativeAuth(BaseModel):
    """What a headless client needs to build a native-auth token this host accepts."""

    shard: int
    blockHash: str | None = Field(description="a recent shard-1 block hash to embed in the token")
    blockNonce: int | None
    blockTimestampMs: int | None
    origins: list[str]
    maxTtlSeconds: int


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
