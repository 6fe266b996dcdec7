"""Notice routes: the account's merged log and its acknowledgement (native-auth owner or sender, or a read
key; only the owner or a read key acknowledges; private-read limits)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from gasless.auth.deps import AccountAccess, account_access
from gasless.core.errors import ApiError
from gasless.db.types import INT64_MAX
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery
from gasless.limits.route_classes import private_read
from gasless.notices.schemas import NoticeAck, NoticePage

router = api_router(tags=["notices"])
dashboard_read = account_access("read", keys=True)
ACCOUNT_READ = private_read(dashboard_read)
Access = Annotated[AccountAccess, Depends(dashboard_read)]
NO_STORE = "private, no-store"


def _notices(request: Request) -> Any:
    return request.app.state.host.notices


@router.get(
    "/v1/account/{erd}/notices",
    operation_id="listNotices",
    response_model=NoticePage,
    dependencies=[ACCOUNT_READ],
    summary="The account's notices and the global ones, newest first, with their acknowledgement",
)
async def list_notices(
    request: Request,
    access: Access,
    page: PageQuery,
    sinceSeq: Annotated[int, Query(ge=0, le=INT64_MAX, description="only notices with a greater seq")] = 0,
    unacknowledged: Annotated[bool, Query(description="only notices above the acknowledgement mark")] = False,
) -> JSONResponse:
    document: NoticePage = await _notices(request).page(
        access.account, since_seq=sinceSeq, unacknowledged=unacknowledged, page=page
    )
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": NO_STORE})


@router.post(
    "/v1/account/{erd}/notices/ack",
    operation_id="ackNotices",
    status_code=204,
    response_class=Response,
    dependencies=[ACCOUNT_READ],
    summary="Acknowledge every notice up to a seq (idempotent; the mark never goes back)",
)
async def ack_notices(request: Request, access: Access, body: NoticeAck) -> Response:
    if access.role == "sender":
        raise ApiError(
            "FORBIDDEN",
            detail="authorised senders read the account's notices; only the account (or its read key) acknowledges",
            details={"role": access.role},
        )
    await _notices(request).ack(access.account, body.upToSeq)
    return Response(status_code=204, headers={"Cache-Control": NO_STORE})
