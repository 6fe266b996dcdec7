"""The compat facade's routes (unversioned, frozen): thin; errors are rendered once (http/problems) and
mapped to the kit's statuses by compat/rendering.CompatErrorMiddleware."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Path, Request
from fastapi.responses import JSONResponse

from gasless.compat.rendering import NO_SIGN_UP
from gasless.compat.schemas import CompatHealth, CompatRelayed, CompatRelayerAddress, CompatRelayRequest
from gasless.core.errors import ApiError
from gasless.hosting.host import readiness
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
    "/health",
    operation_id="compatHealth",
    response_model=CompatHealth,
    summary="The kit's health probe: ok only when the host is ready to relay (as `GET /readyz`)",
)
async def health(request: Request) -> CompatHealth:
    checks = await readiness(request.app.state.host)
    failing = {name: value for name, value in checks.items() if value != "ok"}
    if failing:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail="not ready to relay ("
            + ", ".join(f"{name}: {value}" for name, value in failing.items())
            + "); retry shortly",
            details={"retryAfterMs": 1_000},
        )
    return CompatHealth(status="ok")


# The kit's registration flow (scripts/register.ts, and src/validator.ts on a 403 whose `error` mentions it)
# posts `/challenge`, then relays with the `challengeNonce`. This relayer has nothing of the kind: every
# method on these paths answers 404 with an `error` that says so and how to get a plan.
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/challenge", methods=_ALL_METHODS, include_in_schema=False)
@router.api_route("/challenge/{rest:path}", methods=_ALL_METHODS, include_in_schema=False)
@router.api_route("/register", methods=_ALL_METHODS, include_in_schema=False)
@router.api_route("/register/{rest:path}", methods=_ALL_METHODS, include_in_schema=False)
async def no_sign_up() -> None:
    raise ApiError("NOT_FOUND", detail=NO_SIGN_UP)


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
