"""`GET /v1/status`: public; the same document the feed publisher writes as `status.json`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from gasless.auth.deps import AccountAccess, account_access
from gasless.core.errors import ApiError
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery, WindowQuery
from gasless.limits.route_classes import PUBLIC_READ, private_read
from gasless.status.schemas import AccountOutagesPage, AccountRelayers, Status

dashboard_read = account_access("read", keys=True)  # native-auth owner/sender or a read key

router = api_router(tags=["status"])
STATUS_CACHE = "public, max-age=5"


def status_service(request: Request) -> Any:
    service = request.app.state.host.status
    if service is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return service


@router.get(
    "/v1/status",
    operation_id="getStatus",
    response_model=Status,
    dependencies=[PUBLIC_READ],
    summary="Components, measured latency per shard, float labels, open incidents, availability (measured only)",
)
async def get_status(request: Request) -> JSONResponse:
    document: Status = await status_service(request).status()
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": STATUS_CACHE})


def account_status(request: Request) -> Any:
    service = request.app.state.host.account_status
    if service is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return service


ACCOUNT_READ = private_read(dashboard_read)


@router.get(
    "/v1/account/{erd}/relayers",
    operation_id="listAccountRelayers",
    response_model=AccountRelayers,
    dependencies=[ACCOUNT_READ],
    summary="The relayers that served the account (default: the last 30 days), with counts and state",
)
async def list_account_relayers(
    request: Request, access: Annotated[AccountAccess, Depends(dashboard_read)], window: WindowQuery
) -> JSONResponse:
    document: AccountRelayers = await account_status(request).relayers(access.account, window)
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": "private, no-store"})


@router.get(
    "/v1/account/{erd}/outages",
    operation_id="listAccountOutages",
    response_model=AccountOutagesPage,
    dependencies=[ACCOUNT_READ],
    summary="Public incidents that overlapped the account's traffic, with its impact (relays, failures, latency)",
)
async def list_account_outages(
    request: Request,
    access: Annotated[AccountAccess, Depends(dashboard_read)],
    window: WindowQuery,
    page: PageQuery,
) -> JSONResponse:
    document: AccountOutagesPage = await account_status(request).outages(access.account, window, page)
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": "private, no-store"})
