"""Account mirror routes: thin adapters to the account services."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from gasless.accounts.mirror_reads import KIND_LIST, parse_kinds
from gasless.accounts.schemas import Account, PurchasesPage, Quota
from gasless.accounts.senders import AccountSendersPage
from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.core.errors import ApiError
from gasless.http.caching import ACCOUNT_MIRROR_CACHE, cached_json
from gasless.http.formats import Address
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery, WindowQuery
from gasless.limits.route_classes import PUBLIC_READ

router = api_router(tags=["accounts"])
ErdPath = Annotated[Address, Path(description="the account's address")]


def _host(request: Request) -> Any:
    return request.app.state.host


def _account(erd: str) -> str:
    try:
        return parse_address(erd).to_bech32()
    except InvalidAddress:
        raise ApiError(
            "MALFORMED_REQUEST", detail="erd is not a valid erd1 address", details={"field": "erd"}
        ) from None


@router.get(
    "/v1/account/{erd}",
    operation_id="getAccount",
    response_model=Account,
    dependencies=[PUBLIC_READ],
    summary="The account's contract record (credits, escrow, plan blocks, flags), mirrored",
)
async def get_account(request: Request, erd: ErdPath) -> Response:
    result = await _host(request).account_reads_service.account(_account(erd))
    return cached_json(request, result, cache_control=ACCOUNT_MIRROR_CACHE)


@router.get(
    "/v1/account/{erd}/quota",
    operation_id="getQuota",
    response_model=Quota,
    dependencies=[PUBLIC_READ],
    summary="Derived quota state of the account that pays for erd (an account or an authorised sender)",
)
async def get_quota(request: Request, erd: ErdPath) -> Response:
    result = await _host(request).account_reads_service.quota(_account(erd))
    return cached_json(request, result, cache_control=ACCOUNT_MIRROR_CACHE)


@router.get(
    "/v1/account/{erd}/senders",
    operation_id="listAccountSenders",
    response_model=AccountSendersPage,
    dependencies=[PUBLIC_READ],
    summary="The account's authorised senders, oldest first",
)
async def list_account_senders(request: Request, erd: ErdPath, page: PageQuery) -> Response:
    result = await _host(request).senders.page(_account(erd), page)
    return cached_json(request, result, cache_control=ACCOUNT_MIRROR_CACHE)


@router.get(
    "/v1/account/{erd}/purchases",
    operation_id="listAccountPurchases",
    response_model=PurchasesPage,
    dependencies=[PUBLIC_READ],
    summary="The account's purchase timeline from finalised contract events, newest first",
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
)
async def list_account_purchases(
    request: Request,
    erd: ErdPath,
    page: PageQuery,
    window: WindowQuery,
    kind: Annotated[
        str | None,
        Query(description="comma-separated PurchaseKind values", json_schema_extra=KIND_LIST.schema()),
    ] = None,
    format: Annotated[Literal["json", "csv"], Query(description="csv streams every matching row")] = "json",
) -> Response:
    account = _account(erd)
    kinds = parse_kinds(kind)
    reads = _host(request).account_reads_service
    if format == "csv":
        if page.cursor is not None:
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="format=csv streams every row: no cursor",
                details={"field": "cursor"},
            )
        stream = await reads.purchases_csv(account, kinds, window)
        return StreamingResponse(
            stream,
            media_type="text/csv; charset=utf-8",
            headers={
                "Content-Disposition": f'attachment; filename="purchases-{account}.csv"',
                "Cache-Control": "no-store",
            },
        )
    result = await reads.purchases(account, kinds, window, page)
    return cached_json(request, result, cache_control=ACCOUNT_MIRROR_CACHE)
