"""Purchase builders: public, no proof needed (route class "prepare routes": 2 req/s, burst 10 per IP)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gasless.core.errors import ApiError
from gasless.http.json_body import api_router
from gasless.limits.route_classes import PREPARE
from gasless.purchases.schemas import (
    PrepareDepositRequest,
    PreparedPurchase,
    PreparedTransaction,
    PreparedTransactions,
    PrepareFlagsRequest,
    PrepareSendersRequest,
    PrepareSubscribeRequest,
)

router = api_router(tags=["purchases"])


def purchases(request: Request) -> Any:
    host = request.app.state.host
    if host.purchases is None or not host.restored:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return host.purchases


@router.post(
    "/v1/subscribe/prepare",
    operation_id="prepareSubscribe",
    response_model=PreparedPurchase,
    dependencies=[PREPARE],
    summary="A quote and the unsigned subscribe or depositAndSubscribe call that buys a plan (relayed free)",
)
async def prepare_subscribe(request: Request, body: PrepareSubscribeRequest) -> PreparedPurchase:
    prepared: PreparedPurchase = await purchases(request).prepare_subscribe(body)
    return prepared


@router.post(
    "/v1/deposit/prepare",
    operation_id="prepareDeposit",
    response_model=PreparedTransaction,
    dependencies=[PREPARE],
    summary="The unsigned deposit or depositFor call: USDC to credits (relayed free)",
)
async def prepare_deposit(request: Request, body: PrepareDepositRequest) -> PreparedTransaction:
    prepared: PreparedTransaction = await purchases(request).prepare_deposit(body)
    return prepared


@router.post(
    "/v1/flags/prepare",
    operation_id="prepareFlags",
    response_model=PreparedTransactions,
    dependencies=[PREPARE],
    summary="Unsigned setAutoRenew / setPayg / releaseEscrow / renew calls, one per change, consecutive nonces",
)
async def prepare_flags(request: Request, body: PrepareFlagsRequest) -> PreparedTransactions:
    prepared: PreparedTransactions = await purchases(request).prepare_flags(body)
    return prepared


@router.post(
    "/v1/senders/prepare",
    operation_id="prepareSenders",
    response_model=PreparedTransaction,
    dependencies=[PREPARE],
    summary="The unsigned addSenders (billed, with its fee ceiling) or removeSenders (free) call",
)
async def prepare_senders(request: Request, body: PrepareSendersRequest) -> PreparedTransaction:
    prepared: PreparedTransaction = await purchases(request).prepare_senders(body)
    return prepared
