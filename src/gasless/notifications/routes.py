"""Notification preference routes (native-auth; owner writes at 1 req/s, burst 5) and the e-mail
verification link, which is not part of the versioned API: it is opened from a mail, in a browser."""

from __future__ import annotations

import html
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from gasless.auth.deps import AccountAccess, AccountWrite, account_access
from gasless.core.errors import ApiError
from gasless.http.json_body import api_router
from gasless.keys.routes import WRITE_LIMIT
from gasless.limits.route_classes import private_read
from gasless.notifications.links import VERIFY_PATH
from gasless.notifications.schemas import NotificationPrefs, NotificationPrefsUpdate

router = api_router(tags=["notifications"])
links_router = APIRouter(include_in_schema=False)
# The owner only, even suspended (the preferences hold the owner's address: not for authorised senders).
owner_read = account_access("revoke")
OwnerRead = Annotated[AccountAccess, Depends(owner_read)]
PRIVATE_READ = private_read(owner_read)
NO_STORE = "private, no-store"


def _service(request: Request) -> Any:
    return request.app.state.host.notifications


@router.get(
    "/v1/account/{erd}/notifications",
    operation_id="getNotificationPrefs",
    response_model=NotificationPrefs,
    dependencies=[PRIVATE_READ],
    summary="Thresholds, the e-mail channel and its verification state, per-kind e-mail switches",
)
async def get_notification_prefs(request: Request, access: OwnerRead) -> JSONResponse:
    document: NotificationPrefs = await _service(request).get(access.account)
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": NO_STORE})


@router.put(
    "/v1/account/{erd}/notifications",
    operation_id="putNotificationPrefs",
    response_model=NotificationPrefs,
    dependencies=[WRITE_LIMIT],
    summary="Replace the preferences; a new address is pending until the link mailed to it is opened",
)
async def put_notification_prefs(
    request: Request, access: AccountWrite, body: NotificationPrefsUpdate
) -> JSONResponse:
    document: NotificationPrefs = await _service(request).put(access.account, body)
    return JSONResponse(document.model_dump(mode="json"), headers={"Cache-Control": NO_STORE})


_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><meta name="referrer" content="no-referrer">
<style>body{{font:16px system-ui,sans-serif;max-width:36em;margin:4em auto;padding:0 1em;color:#1b1f24}}
h1{{font-size:1.4em}}</style></head><body><h1>{title}</h1><p>{message}</p></body></html>"""


@links_router.get(VERIFY_PATH)
async def verify_email(request: Request, token: Annotated[str, Query(min_length=1, max_length=2_048)]) -> Any:
    """The link of a verification mail: HTML for a browser, a problem document (or JSON) otherwise."""
    browser = "text/html" in request.headers.get("accept", "")
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    try:
        account, address = await _service(request).verify(token)
    except ApiError as exc:
        if not browser:
            raise
        reason = (exc.details or {}).get("reason", "")
        page = _PAGE.format(
            title="This link does not work",
            message=html.escape(f"{exc.detail} ({reason})" if reason else exc.detail or ""),
        )
        return HTMLResponse(page, status_code=401, headers=headers)
    if browser:
        message = f"{address} now receives the notices of {account}."
        return HTMLResponse(
            _PAGE.format(title="Address confirmed", message=html.escape(message)), headers=headers
        )
    return JSONResponse({"account": account, "address": address, "status": "verified"}, headers=headers)
