"""Account mirror routes: thin adapters to the account services."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from gasless.accounts.senders import AccountSendersPage
from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.errors import ApiError
from gasless.http_cache import ACCOUNT_MIRROR_CACHE, cached_json
from gasless.pages import PageQuery
from gasless.route_limits import PUBLIC_READ

router = APIRouter(tags=["accounts"])


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
    "/v1/account/{erd}/senders",
    operation_id="listAccountSenders",
    response_model=AccountSendersPage,
    dependencies=[PUBLIC_READ],
    summary="The account's authorised senders, oldest first",
)
async def list_account_senders(
    request: Request, erd: Annotated[str, Path(max_length=100)], page: PageQuery
) -> Response:
    result = await _host(request).senders.page(_account(erd), page)
    return cached_json(request, result, cache_control=ACCOUNT_MIRROR_CACHE)
