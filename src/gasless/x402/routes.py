"""x402 routes: discovery (`/.well-known/x402`, `GET /v1/x402/supported`), the two paid routes and payment
polling. Limits: the paid routes 1 req/s per IP and 6 paid retries per minute per payer."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader

from gasless.core.errors import ApiError
from gasless.http.json_body import api_router
from gasless.limits.route_classes import PUBLIC_READ, X402_PURCHASE_IP, enforce
from gasless.x402.challenges import Kind
from gasless.x402.schemas import (
    PAYMENT_ID_PATTERN,
    X402Descriptor,
    X402Pending,
    X402PurchaseRequest,
    X402PurchaseResult,
    X402Supported,
    X402TopupRequest,
)
from gasless.x402.service import Answer

router = api_router(tags=["x402"])

# The x402 v2 header; `X-PAYMENT` (v1's name) is read too, and its payload must still be version 2.
payment_signature = APIKeyHeader(
    name="PAYMENT-SIGNATURE",
    scheme_name="x402",
    auto_error=False,
    description="x402 v2 PaymentPayload, base64 JSON, on the paid retry",
)
PaymentHeader = Annotated[str | None, Depends(payment_signature)]
PAID_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"model": X402Pending, "description": "co-signed; not final within the 8 000 ms budget: poll"},
}


def x402(request: Request) -> Any:
    host = request.app.state.host
    if host.x402 is None or not host.restored:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return host.x402


def respond(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)


async def paid_route(
    request: Request, kind: Kind, body: X402TopupRequest | X402PurchaseRequest, header: str | None
) -> JSONResponse:
    received_ms = int(time.time() * 1000)
    service = x402(request)
    header = header or request.headers.get("X-PAYMENT")
    if not header:
        raise await service.challenge(kind, body)
    # 6 paid retries per minute per payer (the payer of the payment: the request's, which must match it).
    await enforce(request, "x402_payer", body.payer, "payer")
    answer = await service.pay(
        kind, body, header, request_id=request.state.request_id, received_ms=received_ms
    )
    return respond(answer)


@router.post(
    "/v1/x402/topup",
    operation_id="x402Topup",
    response_model=X402PurchaseResult,
    dependencies=[X402_PURCHASE_IP],
    responses=PAID_RESPONSES,
    summary="USDC to credits over x402: 402 with a challenge, then the paid retry (deposit / depositFor)",
)
async def topup(request: Request, body: X402TopupRequest, header: PaymentHeader = None) -> JSONResponse:
    return await paid_route(request, "topup", body, header)


@router.post(
    "/v1/x402/purchase",
    operation_id="x402Purchase",
    response_model=X402PurchaseResult,
    dependencies=[X402_PURCHASE_IP],
    responses=PAID_RESPONSES,
    summary="A plan over x402: 402 with a challenge, then the paid retry (depositAndSubscribe)",
)
async def purchase(request: Request, body: X402PurchaseRequest, header: PaymentHeader = None) -> JSONResponse:
    return await paid_route(request, "purchase", body, header)


@router.get(
    "/v1/x402/payments/{paymentId}",
    operation_id="getX402Payment",
    response_model=X402PurchaseResult,
    dependencies=[PUBLIC_READ],
    responses={202: {"model": X402Pending, "description": "still pending"}},
    summary="An x402 payment: 200 final (with PAYMENT-RESPONSE), 202 pending, 404 unknown",
)
async def payment(
    request: Request,
    paymentId: Annotated[str, Path(pattern=PAYMENT_ID_PATTERN, min_length=16, max_length=128)],
) -> JSONResponse:
    return respond(await x402(request).status(paymentId))


@router.get(
    "/v1/x402/supported",
    operation_id="getX402Supported",
    response_model=X402Supported,
    dependencies=[PUBLIC_READ],
    summary="What this service settles as its own x402 facilitator, and its signers (active relayers)",
)
async def supported(request: Request) -> X402Supported:
    host = request.app.state.host
    service = x402(request)
    signers = sorted(r.address for r in host.relayers.all() if r.state == "active") if host.relayers else []
    return X402Supported(
        kinds=[{"x402Version": 2, "scheme": "exact", "network": service.challenges.network}],  # type: ignore[list-item]
        extensions=["payment-identifier"],
        signers={"mvx:*": signers},
    )


@router.get(
    "/.well-known/x402",
    operation_id="getX402Descriptor",
    response_model=X402Descriptor,
    dependencies=[PUBLIC_READ],
    summary="x402 discovery (advisory: a live 402 challenge is authoritative)",
)
async def descriptor(request: Request) -> X402Descriptor:
    challenges = x402(request).challenges
    base = challenges.base_url
    return X402Descriptor(
        x402Version=2,
        kind="both",
        name="gasless",
        description="Gasless relaying for MultiversX: credits and plans paid in USDC over x402; the service "
        "is its own facilitator (the payment is a user-signed Relayed-V3 transaction to the billing contract).",
        networks=[challenges.network],
        assets=[challenges.asset],
        resources=[
            {"url": f"{base}/v1/x402/topup", "method": "POST", "description": "USDC to credits"},  # type: ignore[list-item]
            {"url": f"{base}/v1/x402/purchase", "method": "POST", "description": "a plan of GET /v1/pricing"},  # type: ignore[list-item]
        ],
        facilitator={
            "baseUrl": base,
            "endpoints": {
                "supported": f"{base}/v1/x402/supported",
                "payments": f"{base}/v1/x402/payments/{{paymentId}}",
            },
            "schemes": ["exact"],
        },
    )
