"""The Status document (`GET /v1/status`, also the feed file `status.json`); docs/status.md."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gasless.incidents.schemas import Incident

ComponentState = Literal["operational", "degraded", "outage"]
FloatLabel = Literal["ok", "low", "critical"]


class ProbeResult(BaseModel):
    atMs: int
    outcome: Literal["success", "fail", "dead", "timeout", "refused"]
    inclusionMs: int | None = None
    code: str | None = Field(default=None, description="the refusal's catalogue code")


class Component(BaseModel):
    id: str = Field(description="`api`, `relaying-shard-<n>`, `gateways`, `contract`, `exchange-venue`")
    name: str
    shard: int | None = None
    status: ComponentState
    reason: str | None = Field(default=None, description="why it is not operational")
    probe: ProbeResult | None = Field(default=None, description="the synthetic probe's last transfer here")


class ShardLatency(BaseModel):
    shard: int
    addedP50Ms: int | None
    addedP99Ms: int | None
    inclusionP50Ms: int | None
    inclusionP95Ms: int | None
    inclusionP99Ms: int | None
    samples: int
    windowMs: int
    measuredFromMs: int | None = Field(default=None, description="the first measured bucket in the window")


class AvailabilityDay(BaseModel):
    dayStartMs: int = Field(description="00:00 UTC of the day")
    availabilityPct: float | None = Field(description="null for a day without data")
    incidents: int = Field(description="published incidents touching the day")


class Status(BaseModel):
    """Measured values only: no uptime promise, no SLA; synthetic probe traffic is excluded."""

    overall: ComponentState
    components: list[Component]
    latency: list[ShardLatency] = Field(description="per shard, the last hour (1-minute rollups)")
    floatPerShard: dict[str, FloatLabel] = Field(description="relayer float per shard; never a balance")
    openIncidents: list[Incident]
    latency30d: list[ShardLatency] = Field(description="per shard, 30 days (or since measuredFromMs)")
    availabilityDaily90: list[AvailabilityDay] = Field(description="the last 90 UTC days, oldest first")
    availability30d: float | None = Field(
        description="percent of valid relay requests answered BROADCAST or a correct 4xx over 30 days; null "
        "until 30 days of data exist"
    )
    relays24h: int
    generatedAtMs: int


class Telemetry(BaseModel):
    """The feed file `telemetry.json`."""

    latency30d: list[ShardLatency]
    availabilityDaily90: list[AvailabilityDay]
    generatedAtMs: int


class AccountRelayer(BaseModel):
    address: str
    shard: int
    state: Literal["active", "draining", "retired"] = Field(
        description="the relayer's state (the contract's)"
    )
    relays: int
    succeeded: int
    failed: int
    dead: int
    lastRelayAtMs: int | None


class AccountRelayers(BaseModel):
    """The relayers that served the account in the window (default: the last 30 days)."""

    account: str
    fromMs: int
    toMs: int
    items: list[AccountRelayer]


class OutageImpact(BaseModel):
    relays: int = Field(description="the account's relays during the incident")
    failures: int = Field(description="of which failed on chain or were dropped")
    addedP50Ms: int | None = Field(description="added latency of those relays (from the rollups)")
    addedP99Ms: int | None


class AccountOutage(BaseModel):
    incident: Incident
    impact: OutageImpact


class AccountOutagesPage(BaseModel):
    items: list[AccountOutage]
    nextCursor: str | None
