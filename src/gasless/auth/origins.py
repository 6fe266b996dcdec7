"""Browser origins and CORS, as a pure ASGI middleware (it never buffers a body, so SSE streams pass).

Two route classes, by what the request carries:

 public        no credentials read: any origin; the answer allows it (`*`, never credentials mode)
 credentialed  routes that take native-auth or a sponsor key (and the relay/assign routes when such a
               credential is present): only the profile's app origin, plus localhost origins on localnet.
               The credential dependencies (gasless.auth.deps) refuse another browser origin with 403
               ORIGIN_NOT_ALLOWED before looking at the credential.

Preflights (`OPTIONS` with `Access-Control-Request-Method`) are answered here, before routing: a foreign
origin asking to send `Authorization` or `X-Api-Key` gets 403 ORIGIN_NOT_ALLOWED; otherwise 204 with the
methods the path has, the headers the API reads and a 10-minute max age. Requests without an `Origin`
header (servers, curl) are never refused; every response carries `Vary: Origin`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.core.errors import ApiError
from gasless.http.problems import problem_response

ALLOW_HEADERS = (
    "Authorization",
    "X-Api-Key",
    "Idempotency-Key",
    "Last-Event-ID",
    "Content-Type",
    "If-None-Match",
    "PAYMENT-SIGNATURE",
)
EXPOSE_HEADERS = (
    "Relay-Request-Id",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "Retry-After",
    "ETag",
    "PAYMENT-REQUIRED",
    "PAYMENT-RESPONSE",
    "WWW-Authenticate",
)
PREFLIGHT_MAX_AGE_S = 600
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})
_LOCALHOST = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?")


def normalise_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class OriginPolicy:
    """Which browser origins may call credentialed routes."""

    def __init__(self, app_origins: Iterable[str], *, allow_localhost: bool) -> None:
        self.app_origins = frozenset(normalise_origin(origin) for origin in app_origins)
        self.allow_localhost = allow_localhost

    @classmethod
    def from_settings(cls, settings: Any) -> OriginPolicy:
        return cls([settings.network.app_origin], allow_localhost=settings.profile == "localnet")

    def allows_credentials(self, origin: str) -> bool:
        origin = normalise_origin(origin)
        if origin in self.app_origins:
            return True
        return self.allow_localhost and _LOCALHOST.fullmatch(origin) is not None


class OriginMiddleware:
    def __init__(self, app: ASGIApp, *, router: Any, policy: OriginPolicy, docs_url: str) -> None:
        self.app = app
        self.router = router  # read per preflight: routers included later are seen too
        self.policy = policy
        self.docs_url = docs_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, _with_cors(send, allow_origin=None))
            return
        allowed = self.policy.allows_credentials(origin)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(scope, receive, send, headers, origin, allowed)
            return
        await self.app(scope, receive, _with_cors(send, allow_origin=origin if allowed else "*"))

    async def _preflight(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, origin: str, allowed: bool
    ) -> None:
        method = headers["access-control-request-method"].strip().upper()
        requested = {
            name.strip().lower()
            for name in headers.get("access-control-request-headers", "").split(",")
            if name.strip()
        }
        if requested & _CREDENTIAL_HEADERS and not allowed:
            await refuse_origin(scope, receive, send, origin, self.docs_url)
            return
        methods = self._methods(scope) or [method]
        response_headers = [
            ("access-control-allow-origin", origin if allowed else "*"),
            ("access-control-allow-methods", ", ".join(methods)),
            ("access-control-allow-headers", ", ".join(ALLOW_HEADERS)),
            ("access-control-max-age", str(PREFLIGHT_MAX_AGE_S)),
            ("vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        ]
        await send(
            {
                "type": "http.response.start",
                "status": 204,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response_headers],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    def _methods(self, scope: Scope) -> list[str]:
        """The methods some route serves at this path (plus OPTIONS), by Starlette's route matching."""
        methods = {
            method
            for method in _METHODS
            if any(
                route.matches({**scope, "method": method})[0] is Match.FULL for route in self.router.routes
            )
        }
        return sorted(methods | {"OPTIONS"}) if methods else []


async def refuse_origin(scope: Scope, receive: Receive, send: Send, origin: str, docs_url: str) -> None:
    """403 ORIGIN_NOT_ALLOWED; `*` so the refused page can still read why (it reveals nothing)."""
    response = problem_response(Request(scope), origin_not_allowed(origin), docs_url)
    await response(scope, receive, _with_cors(send, allow_origin="*"))


def origin_not_allowed(origin: str) -> ApiError:
    shown = origin if len(origin) <= 100 else origin[:100] + "..."
    return ApiError(
        "ORIGIN_NOT_ALLOWED",
        detail=f"browser origin {shown!r} may not call this route with credentials; routes that take "
        "native-auth or an API key accept only the service's app origin",
    )


def _with_cors(send: Send, *, allow_origin: str | None) -> Send:
    """`send` adding Vary: Origin, and the allow/expose headers when a browser origin is answered."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            vary = [part.strip() for value in headers.getlist("vary") for part in value.split(",")]
            if not any(part.lower() == "origin" for part in vary):
                headers["vary"] = ", ".join([*filter(None, vary), "Origin"])
            if allow_origin is not None:
                headers["access-control-allow-origin"] = allow_origin
                headers["access-control-expose-headers"] = ", ".join(EXPOSE_HEADERS)
        await send(message)

    return wrapped
