"""The compat facade's routes (unversioned, frozen): thin; errors are rendered once (http/problems) and
mapped to the kit's statuses by compat/rendering.CompatErrorMiddleware."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Path, Request
from fastapi.responses import JSONResponse

from gasless.compat.schemas import CompatHealth, CompatRelayed, CompatRelayerAddress, CompatRelayRequest
from gasless.errors import ApiError
from gasless.http.json_body import api_router
from gasless.relay.checks import parse_json_body
from gasless.relay.routes import read_body

router = api_router(tags=["compat"])


def compat(request: Request) -> Any:
    host = request.app.state.host
    if host.compat is None or not host.restored:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return host.compat


@router.get(
    "/health", operation_id="compatHealth", response_model=CompatHealth, summary="The kit's health probe"
)
async def health() -> CompatHealth:
    return CompatHealth(status="ok")


@router.get(
    "/relayer/address/{userAddress}",
    operation_id="compatRelayerAddress",
    response_model=CompatRelayerAddress,
    summary="The user's relayer (rendezvous hash over its shard's active relayers; stable; no lease)",
)
async def relayer_address(
    request: Request,
    userAddress: Annotated[str, Path(description="the user's erd1 address (anything else: 404)")],
) -> CompatRelayerAddress:
    return CompatRelayerAddress(relayerAddress=compat(request).relayer_for(userAddress))


@router.post(
    "/relay",
    operation_id="compatRelay",
    response_model=CompatRelayed,
    summary="Relay the kit's signed transaction; `txHash` as soon as the commit point is passed",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompatRelayRequest"}}},
        }
    },
)
async def relay(request: Request) -> JSONResponse:
    received_ms = int(time.time() * 1000)
    raw = await read_body(request)
    service = compat(request)
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise ApiError("MALFORMED_REQUEST", detail="the body is a JSON object", details={"field": "body"})
    try:
        tx_hash = await service.submit(body, request_id=request.state.request_id, received_ms=received_ms)
    except ApiError:
        raise
    except Exception as exc:  # rendered as INTERNAL inside the compat error map (a JSON `error`, 500)
        raise ApiError("INTERNAL", detail="internal error; nothing was sent") from exc
    return JSONResponse({"txHash": tx_hash})


EXTRA_SCHEMAS = (CompatRelayRequest,)
