"""RelayerRegistry and RelayerPublicDetail (the OpenAPI document's schemas): never a balance."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gasless.http.formats import AddressDoc

RelayerStateName = Literal["active", "draining", "retired"]


class RelayerStateChange(BaseModel):
    fromState: RelayerStateName | None = Field(description="null: the relayer's first state")
    toState: RelayerStateName
    atMs: int
    reason: str | None = Field(description="`contract` (a setRelayerState), `key loaded`, ...")


class RelayerStatistics(BaseModel):
    """Measured service figures of the last 24 h (relays this service co-signed with the relayer)."""

    windowMs: int
    relays: int = Field(description="co-signed in the window")
    executed: int = Field(description="of which executed on chain (success or failure)")
    failed: int = Field(description="of which failed on chain")
    dead: int = Field(description="of which dropped (never executed)")
    lastRelayAtMs: int | None


class RelayerPublic(BaseModel):
    address: AddressDoc
    shard: int
    state: RelayerStateName = Field(description="the contract's getRelayerState (the authority)")
    assignable: bool = Field(description="active and funded: new assignments may choose it")
    stateSinceMs: int | None
    statistics: RelayerStatistics


class RelayerRegistry(BaseModel):
    items: list[RelayerPublic]


class RelayerPublicDetail(RelayerPublic):
    stateHistory: list[RelayerStateChange] = Field(description="oldest first")
