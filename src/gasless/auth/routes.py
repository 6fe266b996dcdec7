"""Identity (`GET /v1/me`) and the public port's answer to the operator's admin paths."""

from __future__ import annotations

from fastapi import Request

from gasless.auth.deps import NativeAuthCaller, native_auth_caller
from gasless.auth.schemas import Me, MeAccount
from gasless.core.errors import ApiError
from gasless.http.json_body import api_router
from gasless.limits.route_classes import private_read

router = api_router(tags=["account"])
ADMIN_PREFIX = "/v1/admin"
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.get(
    "/v1/me",
    operation_id="getMe",
    response_model=Me,
    # The caller's own address is the account these reads count against.
    dependencies=[private_read(native_auth_caller, account_of=lambda caller: str(caller.address))],
    summary="The native-auth caller and the accounts it may see (owner or read-only sender)",
)
async def get_me(request: Request, caller: NativeAuthCaller) -> Me:
    roles = await request.app.state.host.roles.accounts_of(caller.address)
    return Me(
        address=caller.address,
        tokenExpiresMs=caller.expires_ms,
        accounts=[MeAccount(address=r.account, role=r.role, suspended=r.suspended) for r in roles],
    )


admin_router = api_router()


@admin_router.api_route(ADMIN_PREFIX, methods=_ALL_METHODS, include_in_schema=False)
@admin_router.api_route(ADMIN_PREFIX + "/{path:path}", methods=_ALL_METHODS, include_in_schema=False)
async def admin_only() -> None:
    # Whatever the credentials: the operator's surface is the admin port and the CLI, never this port.
    raise ApiError(
        "ADMIN_ONLY",
        detail="this route is not part of the public API; operators use the admin port or the gasless CLI",
    )
