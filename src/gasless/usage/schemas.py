"""Usage rows, the single-row view and the usage summary, named as the interface contract names them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gasless.http.formats import AddressDoc, IntentIdDoc, TxHashDoc
from gasless.relay.schemas import IntentLatency, IntentState

UsageStatus = Literal["success", "failed", "dead"]
BillingClass = Literal["plan", "payg", "sponsor", "free"]
USAGE_STATUSES: tuple[str, ...] = ("success", "failed", "dead")
BILLING_CLASSES: tuple[str, ...] = ("plan", "payg", "sponsor", "free")
ROW_STATES: tuple[str, ...] = ("COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED", "DEAD", "REJECTED")


class SettlementBatch(BaseModel):
    batchId: int
    state: Literal["built", "submitted", "committed", "failed"]
    usageRoot: str = Field(description="hex SHA-256 Merkle root of the batch's ledger rows")
    rowCount: int
    totalRu: int
    leafIndex: int | None
    txHash: str | None = Field(description="the settleUsage transaction, once submitted")
    createdAtMs: int
    submittedAtMs: int | None
    committedAtMs: int | None


class GatewayAck(BaseModel):
    gateway: str | None = Field(description="the acknowledging gateway when known (null: not recorded)")
    atMs: int
    first: bool


class UsageRow(BaseModel):
    """The interface contract's UsageRow: one terminal intent of the ledger, as `GET /v1/usage` lists it (with
    `includeInFlight=true` also an in-flight intent, `inFlight`, or a submission refused before the commit
    point, `state: REJECTED`, `rejectCode`) and as `GET /v1/usage/{txHash}` answers it, that route adding
    `settlement` and `acknowledgements`."""

    txHash: TxHashDoc | None = Field(
        description="64-hex hash; null only for a REJECTED submission without one"
    )
    id: IntentIdDoc = Field(description="`<sender>:<nonce>`")
    sender: AddressDoc
    nonce: int
    receiver: str | None
    function: str | None = Field(description="the called function, null for a plain transfer")
    relayer: str | None
    senderShard: int
    status: UsageStatus | None = Field(description="terminal status; null for in-flight and REJECTED rows")
    state: IntentState = Field(description="the intent's state (EXECUTED/FINALIZED/DEAD for ledger rows)")
    inFlight: bool
    billed: bool
    billingClass: BillingClass | None = Field(description="null when `billed` is false")
    ru: int | None = Field(description="Relay Units billed; null when `billed` is false")
    paygMicro: int | None = Field(description="pay-as-you-go micro-USDC billed; null when not billed")
    periodId: int | None = Field(description="the plan period (its start, ms); null when not billed or PAYG")
    apiKeyId: str | None = Field(description="the sponsor key that paid; null when not billed")
    gasLimit: int | None
    gasPrice: int | None
    receivedAtMs: int | None
    cosignedAtMs: int | None
    broadcastAtMs: int | None
    executedBlockTsMs: int | None
    finalizedAtMs: int | None
    terminalAtMs: int | None = Field(description="the ordering time: executedBlockTsMs, else terminal time")
    latency: IntentLatency
    deadReason: str | None = None
    failureCode: str | None = Field(
        default=None,
        description="a failed execution's catalogue code when the contract's error names one (e.g. "
        "PRICE_ABOVE_MAX: an addSenders fee above the signed max_fee)",
    )
    route: Literal["native", "compat", "probe"] = Field(
        default="native",
        description="the API the relay came through: the native API, the compat facade, or the synthetic probe",
    )
    rejectCode: str | None = None
    batchId: int | None = Field(default=None, description="the settlement batch, once the row is in one")
    settlement: SettlementBatch | None = Field(
        default=None,
        description="`GET /v1/usage/{txHash}` only: the settlement batch the row is in (null before, and in "
        "listings)",
    )
    acknowledgements: list[GatewayAck] | None = Field(
        default=None,
        description="`GET /v1/usage/{txHash}` only: the gateway acknowledgements kept (null in listings)",
    )


class UsageRowsPage(BaseModel):
    items: list[UsageRow]
    nextCursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


class LatencyPercentiles(BaseModel):
    p50Ms: int | None
    p95Ms: int | None
    p99Ms: int | None


class UsageTotals(BaseModel):
    ru: int = Field(description="RU of billed rows")
    paygMicro: int = Field(description="pay-as-you-go micro-USDC of billed rows")
    txCount: int = Field(description="billed rows")
    failCount: int = Field(description="billed rows with status failed")
    txCountByStatus: dict[str, int] = Field(
        description="every row of the period by status: success, failed, dead, rejected"
    )
    ruByClass: dict[str, int]


class UsageBucket(BaseModel):
    startMs: int
    ru: int
    paygMicro: int
    txCount: int = Field(description="billed rows ending in the bucket")
    failCount: int
    inclusion: LatencyPercentiles


class UsageTop(BaseModel):
    address: str
    ru: int
    txCount: int


class UsageSummary(BaseModel):
    account: str
    periodId: int
    periodEndMs: int = Field(description="exclusive end of the period (periodId + 2 592 000 000)")
    bucket: Literal["hour", "day"]
    totals: UsageTotals
    series: list[UsageBucket] = Field(description="buckets with at least one row, oldest first")
    topSenders: list[UsageTop] = Field(description="at most 10, by billed RU then billed tx count")
    topReceivers: list[UsageTop]


class LatencyBin(BaseModel):
    leMs: int | None = Field(description="upper bound of the bin (inclusive); null: the overflow bin")
    count: int


class LatencySample(BaseModel):
    txHash: str
    addedMs: int | None
    inclusionMs: int | None
    terminalAtMs: int


class LatencyGroup(BaseModel):
    key: str = Field(description="the shard, relayer, sender or first-acknowledging gateway")
    count: int = Field(description="intents measured in the window")
    added: LatencyPercentiles
    inclusion: LatencyPercentiles
    bins: list[LatencyBin] = Field(description="a histogram of inclusionMs; the last bin is the overflow")
    samples: list[LatencySample] = Field(description="at most 48 recent intents, with their hashes")


class UsageLatency(BaseModel):
    """`GET /v1/usage/latency`: percentiles from the rollups (1-minute for 1h/24h, 1-hour for 7d/30d),
    within `relativeError` of the exact values; a group without data is absent."""

    account: str
    window: Literal["1h", "24h", "7d", "30d"]
    windowMs: int
    groupBy: Literal["shard", "relayer", "sender", "gateway"]
    rollupMs: int = Field(description="the rollup read: 60 000 (1-minute) or 3 600 000 (1-hour)")
    fromMs: int
    toMs: int
    relativeError: float
    groups: list[LatencyGroup]
    sloTargetInclusionP99Ms: None = Field(default=None, description="no latency promise is published")
