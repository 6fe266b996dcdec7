"""Registry routes: public cached reads (the registry is a mirror; the contract's getRelayerState is the
authority)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query, Request, Response

from gasless.core.errors import ApiError
from gasless.http.caching import cached_json
from gasless.http.formats import Address
from gasless.http.json_body import api_router
from gasless.limits.route_classes import PUBLIC_READ
from gasless.registry.schemas import RelayerPublicDetail, RelayerRegistry, RelayerStateName

router = api_router(tags=["registry"])
REGISTRY_CACHE = "public, max-age=5"


def registry(request: Request) -> Any:
    service = request.app.state.host.registry
    if service is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return service


@router.get(
    "/v1/relayers",
    operation_id="listRelayers",
    response_model=RelayerRegistry,
    dependencies=[PUBLIC_READ],
    summary="The relayers: shard, state (the contract's), assignability, service statistics; never a balance",
)
async def list_relayers(
    request: Request,
    shard: Annotated[int | None, Query(ge=0, le=2, description="only this shard")] = None,
    state: Annotated[RelayerStateName | None, Query(description="only this state")] = None,
) -> Response:
    document = await registry(request).registry(shard, state)
    return cached_json(request, document.model_dump(mode="json"), cache_control=REGISTRY_CACHE)


@router.get(
    "/v1/relayers/{address}",
    operation_id="getRelayer",
    response_model=RelayerPublicDetail,
    dependencies=[PUBLIC_READ],
    summary="One relayer with its state history",
)
async def get_relayer(request: Request, address: Annotated[Address, Path()]) -> Response:
    document = await registry(request).detail(address)
    return cached_json(request, document.model_dump(mode="json"), cache_control=REGISTRY_CACHE)
