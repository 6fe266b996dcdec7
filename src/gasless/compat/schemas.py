"""Shapes of the compat facade: what the existing starter kit sends and reads (docs/compat.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gasless.http.formats import AddressDoc, TxHashDoc


class CompatHealth(BaseModel):
    status: str = Field(description="`ok`")


class CompatRelayerAddress(BaseModel):
    relayerAddress: AddressDoc = Field(
        description="the user's relayer: stable while that relayer is not retired"
    )


class CompatRelayRequest(BaseModel):
    """`transaction` is the MultiversX JS SDK's plain object; other members are tolerated and ignored."""

    model_config = ConfigDict(extra="allow")

    transaction: dict[str, Any] = Field(
        description="nonce, value, receiver, sender, relayer, gasPrice, gasLimit, data (base64), chainID, "
        "version, options, signature (hex): the signed Relayed-V3 inner transaction"
    )
    challengeNonce: str | None = Field(default=None, description="accepted and ignored")


class CompatRelayed(BaseModel):
    txHash: TxHashDoc


class CompatError(BaseModel):
    """Every compat error: a problem document (RFC 9457, with the catalogue `code`) that also carries the
    `error` string the kit reads."""

    model_config = ConfigDict(extra="allow")

    error: str
    code: str
    status: int
    title: str
    detail: str
