"""Reusable FastAPI dependencies for the interface contract's authentication schemes; each is one line on a route.

 public              nothing is read (`dependencies=[Public]` documents it)
 NativeAuthCaller    `Authorization: Bearer <native-auth token>` -> Caller (401 UNAUTHENTICATED,
                     TOKEN_INVALID, TOKEN_EXPIRED)
 RelaySponsorKey     optional `X-Api-Key` with the `relay` scope -> SponsorKey | None, also kept on
                     `request.state.sponsor_key` (401 API_KEY_INVALID, 403 API_KEY_SCOPE)
 AccountRead         native-auth caller who is the `{erd}` account's owner or an authorised sender
 AccountWrite        the owner only (403 FORBIDDEN for a sender), account not suspended (ACCOUNT_SUSPENDED)
 AccountRevoke       the owner only, also on a suspended account (revoking only reduces exposure)
 DashboardRead       AccountRead, or a sponsor key of that account with the `read` scope
 OptionalBearer      the raw bearer token, if any (assign verifies it itself as a presence proof)

Every credential dependency first holds a browser `Origin` to the credentialed-route rule (403
ORIGIN_NOT_ALLOWED unless it is the app origin, or localhost on localnet; see gasless.auth.origins); the
optional ones only when the credential is actually sent. Credentials are never taken from the URL: a token
or key in the query string is refused, with a detail saying why. The two security-scheme objects make
FastAPI list `nativeAuth` (HTTP bearer) and `apiKey` (header `X-Api-Key`) in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Request
from fastapi.openapi.models import APIKey, APIKeyIn
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from gasless.auth.native_auth import BlockUnavailable, NativeAuthError
from gasless.auth.origins import origin_not_allowed
from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.core.errors import ApiError
from gasless.http.formats import AddressDoc
from gasless.keys.key_format import looks_like_key
from gasless.keys.schemas import ApiKeyScope
from gasless.keys.service import SponsorKey, invalid_key

TOKEN_QUERY_PARAMS = frozenset({"access_token", "token", "authorization"})
KEY_QUERY_PARAMS = frozenset({"api_key", "apikey", "x-api-key", "x_api_key"})
_BEARER_CHALLENGE = 'Bearer realm="gasless"'
_INVALID_TOKEN_CHALLENGE = 'Bearer realm="gasless", error="invalid_token"'

Mode = Literal["read", "write", "revoke"]


class NativeAuthScheme(SecurityBase):
    """The `Authorization` header as sent (OpenAPI: security scheme `nativeAuth`, HTTP bearer)."""

    def __init__(self) -> None:
        self.model = HTTPBearerModel(
            bearerFormat="MultiversX native-auth",
            description="A native-auth token for this host's app origin, on a recent shard-1 block "
            "(GET /v1/network `nativeAuth`). Never accepted in a URL.",
        )
        self.scheme_name = "nativeAuth"

    async def __call__(self, request: Request) -> str | None:
        return request.headers.get("authorization")


class ApiKeyScheme(SecurityBase):
    """The `X-Api-Key` header as sent (OpenAPI: security scheme `apiKey`)."""

    def __init__(self) -> None:
        self.model = APIKey(
            **{"in": APIKeyIn.header},  # type: ignore[arg-type]
            name="X-Api-Key",
            description="A sponsor API key (gls_live_... / gls_test_...). Never in Authorization or a URL.",
        )
        self.scheme_name = "apiKey"

    async def __call__(self, request: Request) -> str | None:
        return request.headers.get("x-api-key")


NATIVE_AUTH_SCHEME = NativeAuthScheme()
API_KEY_SCHEME = ApiKeyScheme()
AuthorizationHeader = Annotated[str | None, Depends(NATIVE_AUTH_SCHEME)]
ApiKeyHeader = Annotated[str | None, Depends(API_KEY_SCHEME)]


@dataclass(frozen=True)
class Caller:
    """A verified native-auth caller."""

    address: str
    origin: str
    expires_ms: int


@dataclass(frozen=True)
class AccountAccess:
    """How the request may use the `{erd}` account: role `owner`, `sender` (read-only) or `key`."""

    account: str
    role: Literal["owner", "sender", "key"]
    suspended: bool
    caller: Caller | None = None
    key: SponsorKey | None = None


def _host(request: Request) -> Any:
    return request.app.state.host


def public() -> None:
    """A public route: no credentials are read."""


def _hold_origin(request: Request) -> None:
    """A credentialed request from a browser page: only the allowed origins (ORIGIN_NOT_ALLOWED)."""
    origin = request.headers.get("origin")
    if origin is not None and not _host(request).origin_policy.allows_credentials(origin):
        raise origin_not_allowed(origin)


def _refuse_url_credentials(request: Request, *, tokens: bool) -> None:
    for name in request.query_params:
        lowered = name.lower()
        if tokens and lowered in TOKEN_QUERY_PARAMS:
            raise ApiError(
                "TOKEN_INVALID",
                detail=f"a native-auth token is never accepted in a URL (query parameter {name!r}): URLs "
                "end up in logs, proxies and browser history. Send it as 'Authorization: Bearer <token>' "
                "and treat this token as leaked.",
                details={"reason": "token_in_url"},
                headers={"WWW-Authenticate": _INVALID_TOKEN_CHALLENGE},
            )
        if lowered in KEY_QUERY_PARAMS:
            raise invalid_key(
                "key_in_url",
                f"an API key is never accepted in a URL (query parameter {name!r}): send it in the "
                "X-Api-Key header, and revoke this key since the URL may have been logged",
            )


def _key_as_bearer(authorization: str | None) -> bool:
    if authorization is None:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and looks_like_key(value.strip())


def _refuse_key_as_bearer(authorization: str | None) -> None:
    if _key_as_bearer(authorization):
        raise invalid_key(
            "bearer",
            "a sponsor API key goes in the X-Api-Key header, never in 'Authorization: Bearer'",
        )


async def _verify_native_auth(request: Request, authorization: str | None, *, accepts_key: bool) -> Caller:
    _hold_origin(request)
    _refuse_url_credentials(request, tokens=True)
    _refuse_key_as_bearer(authorization)
    if authorization is None:
        detail = "this route needs a native-auth token in 'Authorization: Bearer <token>'"
        if accepts_key:
            detail += ", or a sponsor API key with the 'read' scope in X-Api-Key"
        elif "x-api-key" in request.headers:
            detail += "; a sponsor API key is not accepted here"
        raise ApiError("UNAUTHENTICATED", detail=detail, headers={"WWW-Authenticate": _BEARER_CHALLENGE})
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            "TOKEN_INVALID",
            detail="the Authorization header must be 'Bearer <native-auth token>'",
            headers={"WWW-Authenticate": _INVALID_TOKEN_CHALLENGE},
        )
    verifier = _host(request).token_verifier  # 503 UPSTREAM_UNAVAILABLE while the host starts
    try:
        identity = await verifier.verify_async(token)
    except NativeAuthError as exc:
        raise ApiError(
            exc.code, detail=exc.message, headers={"WWW-Authenticate": _INVALID_TOKEN_CHALLENGE}
        ) from None
    except BlockUnavailable:
        # Neither good nor bad yet: the chain could not be asked about the token's block.
        raise ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail="the token's block could not be looked up on the chain",
            details={"retryAfterMs": 1_000},
        ) from None
    caller = Caller(address=identity.address, origin=identity.origin, expires_ms=identity.expires_ms)
    request.state.caller = caller
    return caller


async def native_auth_caller(request: Request, authorization: AuthorizationHeader) -> Caller:
    """The native-auth caller of a route that takes native-auth only."""
    return await _verify_native_auth(request, authorization, accepts_key=False)


async def optional_bearer(request: Request, authorization: AuthorizationHeader) -> str | None:
    """The bearer token if one was sent (unverified: the route decides what it proves)."""
    if authorization is not None:
        _hold_origin(request)
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


async def _resolve_key(request: Request, api_key: str, scope: ApiKeyScope) -> SponsorKey:
    key: SponsorKey = await _host(request).api_keys.resolve(api_key.strip())
    if not key.allows(scope):
        raise ApiError(
            "API_KEY_SCOPE",
            detail=f"this API key's policy does not include the {scope!r} scope",
            details={"requiredScope": scope, "keyScopes": list(key.policy.scopes)},
        )
    request.state.sponsor_key = key
    return key


def sponsor_key(scope: ApiKeyScope, *, required: bool) -> Callable[..., Any]:
    """A dependency resolving `X-Api-Key` (absent -> None, or 401 UNAUTHENTICATED when `required`)."""

    async def dependency(request: Request, api_key: ApiKeyHeader) -> SponsorKey | None:
        if api_key is not None or required:
            _hold_origin(request)
        _refuse_url_credentials(request, tokens=False)
        # Read directly, not through the nativeAuth scheme: these routes do not take native-auth.
        _refuse_key_as_bearer(request.headers.get("authorization"))
        if api_key is None:
            if required:
                raise ApiError("UNAUTHENTICATED", detail="this route needs a sponsor API key in X-Api-Key")
            return None
        return await _resolve_key(request, api_key, scope)

    return dependency


def _account_of_path(erd: str) -> str:
    try:
        return parse_address(erd).to_bech32()
    except InvalidAddress:
        raise ApiError(
            "MALFORMED_REQUEST", detail="erd is not a valid erd1 address", details={"field": "erd"}
        ) from None


async def _account_access(
    request: Request, erd: str, mode: Mode, authorization: str | None, api_key: str | None, *, keys: bool
) -> AccountAccess:
    if authorization is None and api_key is not None:  # a sponsor key used as a read key
        _hold_origin(request)
        _refuse_url_credentials(request, tokens=True)
        key = await _resolve_key(request, api_key, "read")
        account = _account_of_path(erd)
        if key.account != account:
            raise ApiError(
                "FORBIDDEN", detail="this API key belongs to another account", details={"role": None}
            )
        access = AccountAccess(account=account, role="key", suspended=False, key=key)
        request.state.account_access = access
        return access

    caller = await _verify_native_auth(request, authorization, accepts_key=keys)
    account = _account_of_path(erd)
    role = await _host(request).roles.role_of(caller.address, account)
    if role is None:
        detail = (
            f"{account} has no account in the billing contract"
            if caller.address == account
            else "the caller is neither this account nor one of its authorised senders"
        )
        raise ApiError("FORBIDDEN", detail=detail, details={"role": None})
    if mode != "read" and role.role != "owner":
        raise ApiError(
            "FORBIDDEN",
            detail="authorised senders have read-only access; only the account itself may change it",
            details={"role": role.role},
        )
    if mode == "write" and role.suspended:
        raise ApiError(
            "ACCOUNT_SUSPENDED",
            detail="the account is suspended: changes are refused until it is reinstated "
            "(credits are not lost; API keys can still be revoked)",
            details={"account": account},
        )
    access = AccountAccess(account=account, role=role.role, suspended=role.suspended, caller=caller)
    request.state.account_access = access
    return access


async def verify_read_credential(request: Request, authorization: str | None, api_key: str | None) -> None:
    """The credential of a DashboardRead, verified before the account it reads is known: an anonymous or
    forged caller learns nothing about the rest of the request (401/403 before any 400)."""
    if authorization is None and api_key is not None:
        _hold_origin(request)
        _refuse_url_credentials(request, tokens=True)
        await _resolve_key(request, api_key, "read")
        return
    await _verify_native_auth(request, authorization, accepts_key=True)


async def read_access_to(
    request: Request, account: str, authorization: str | None, api_key: str | None
) -> AccountAccess:
    """DashboardRead for an account named outside the path (`GET /v1/stream?account=`, a ticket's body):
    native-auth owner or sender, or a sponsor key of that account with the `read` scope."""
    return await _account_access(request, account, "read", authorization, api_key, keys=True)


# Documented as an Address; judged after the credential (an anonymous caller learns nothing from a 400).
ErdPath = Annotated[AddressDoc, Path(max_length=100, description="the account's bech32 address")]


def account_access(mode: Mode, *, keys: bool = False) -> Callable[..., Any]:
    """A dependency for routes under `/v1/account/{erd}/...` (`keys`: a read key is accepted too)."""
    if keys:
        if mode != "read":
            raise ValueError("a sponsor key only ever reads")

        async def with_keys(
            request: Request, erd: ErdPath, authorization: AuthorizationHeader, api_key: ApiKeyHeader
        ) -> AccountAccess:
            return await _account_access(request, erd, mode, authorization, api_key, keys=True)

        return with_keys

    async def native_only(
        request: Request, erd: ErdPath, authorization: AuthorizationHeader
    ) -> AccountAccess:
        return await _account_access(request, erd, mode, authorization, None, keys=False)

    return native_only


# For routes that take a credential of their own beside the schemes above (the stream ticket).
hold_origin = _hold_origin
refuse_url_credentials = _refuse_url_credentials

Public = Depends(public)
NativeAuthCaller = Annotated[Caller, Depends(native_auth_caller)]
OptionalBearer = Annotated[str | None, Depends(optional_bearer)]
relay_sponsor = sponsor_key("relay", required=False)  # also called directly by the relay's direct route
RelaySponsorKey = Annotated[SponsorKey | None, Depends(relay_sponsor)]
account_read = account_access("read")  # also handed to the private-read limit (one call per request)
AccountRead = Annotated[AccountAccess, Depends(account_read)]
AccountWrite = Annotated[AccountAccess, Depends(account_access("write"))]
AccountRevoke = Annotated[AccountAccess, Depends(account_access("revoke"))]
DashboardRead = Annotated[AccountAccess, Depends(account_access("read", keys=True))]
