"""Route-class limits as one-line FastAPI dependencies, and the middleware that writes `RateLimit-*`.

    @router.get(..., dependencies=[PUBLIC_READ])             # 20 req/s, burst 60 per IP
    @router.post(..., dependencies=[account_rate("account_write", caller=AuthenticatedCaller)])

A dependency records its decision on `request.state`; `RateLimitHeadersMiddleware` writes the most
restrictive decision of the request as `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` on
whatever response the route produced (a model, a `Response`, a stream, a problem). A refusal is the
`RATE_LIMITED` ApiError, carrying the same headers plus `Retry-After`.

Client IP is `request.client.host`: behind a proxy, uvicorn's `--forwarded-allow-ips` (or
`FORWARDED_ALLOW_IPS`) must name the proxy so that this is the caller's address, not the proxy's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.limits.buckets import DEFAULT_RATE_CLASS, Decision, RouteLimiter

STATE_KEY = "rate_limit"


@dataclass(frozen=True)
class Caller:
    """Who an authenticated request acts for: the account and its rate class (1..6) when known."""

    account: str
    rate_class: int | None = None


def client_key(request: Request) -> str:
    """The caller's IP as a bucket key; an IPv6 caller is keyed by its /64 (one host's usual allocation)."""
    host = request.client.host if request.client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def record(request: Request, decision: Decision) -> None:
    """Keep the decision closest to refusing (the one a client should pace itself by)."""
    current: Decision | None = request.scope.setdefault("state", {}).get(STATE_KEY)
    if current is None or (decision.remaining, -decision.reset_ms) < (current.remaining, -current.reset_ms):
        request.scope["state"][STATE_KEY] = decision


def limiter_of(request: Request) -> RouteLimiter:
    return request.app.state.host.limits  # type: ignore[no-any-return]


async def enforce(
    request: Request, rule: str, key: str, scope: str, *, rate_class: int | None = None
) -> None:
    """Apply `rule` to `key` inside a route or service call (e.g. x402's per-payer limit)."""
    record(request, await limiter_of(request).check(rule, key, scope, rate_class=rate_class))


def ip_rate(rule: str) -> Any:
    """A token-bucket rule of the table keyed by client IP."""

    async def limit_by_ip(request: Request) -> None:
        await enforce(request, rule, client_key(request), "ip")

    return Depends(limit_by_ip)


def account_rate(rule: str, caller: Callable[..., Awaitable[Caller]]) -> Any:
    """A token-bucket rule keyed by the authenticated account (`caller` is the auth dependency); per-class
    rules use the caller's rate class."""

    # `Depends(caller)` as a default, not inside `Annotated`: with postponed annotations FastAPI resolves
    # annotation strings from the module's globals, where the closure's `caller` does not exist.
    async def limit_by_account(request: Request, who: Caller = Depends(caller)) -> None:  # noqa: B008
        await enforce(request, rule, who.account, "account", rate_class=who.rate_class)

    return Depends(limit_by_account)


async def limit_private_read(request: Request, account: str) -> None:
    """ "Private reads": per account, by the account's rate class (5/10/20/40/80/10 req/s, burst x4)."""
    mirror = request.app.state.host.mirror
    rate_class = DEFAULT_RATE_CLASS if mirror is None else await mirror.rate_class_of(account)
    await enforce(request, "private_read_class", account, "account", rate_class=rate_class)


def private_read(
    access: Callable[..., Awaitable[Any]], account_of: Callable[[Any], str] | None = None
) -> Any:
    """The private-read limit of a route whose credential dependency is `access` (the same callable the
    route takes, so FastAPI runs it once); `account_of` picks the account from what it returns."""
    pick = account_of or (lambda who: str(who.account))

    async def limit_read(request: Request, who: Any = Depends(access)) -> None:  # noqa: B008 - see account_rate
        await limit_private_read(request, pick(who))

    return Depends(limit_read)


def ip_streams(rule: str) -> Any:
    """A concurrency rule keyed by client IP: the slot is held until the response (stream) has ended."""

    async def hold_by_ip(request: Request) -> AsyncIterator[None]:
        decision, slot = await limiter_of(request).hold(rule, client_key(request), "ip")
        record(request, decision)
        try:
            yield
        finally:
            await slot.release()

    return Depends(hold_by_ip)


def account_streams(caller: Callable[..., Awaitable[Caller]]) -> Any:
    """`GET /v1/stream`: concurrent streams per account by rate class, and per IP."""

    async def hold_by_account(
        request: Request,
        who: Caller = Depends(caller),  # noqa: B008 - see account_rate
    ) -> AsyncIterator[None]:
        limiter = limiter_of(request)
        by_ip, ip_slot = await limiter.hold("stream_ip", client_key(request), "ip")
        try:
            by_account, account_slot = await limiter.hold(
                "stream_class", who.account, "account", rate_class=who.rate_class
            )
        except BaseException:
            await ip_slot.release()
            raise
        record(request, by_ip)
        record(request, by_account)
        try:
            yield
        finally:
            await account_slot.release()
            await ip_slot.release()

    return Depends(hold_by_account)


# The route classes wired today (the others are built with the factories above when their routes exist).
PUBLIC_READ = ip_rate("public_read_ip")
PREPARE = ip_rate("prepare_ip")
X402_PURCHASE_IP = ip_rate("x402_ip")
ASSIGN_IP = ip_rate("assign_ip")
RELAY_EVENTS = ip_streams("relay_events_ip")


class RateLimitHeadersMiddleware:
    """Pure ASGI: adds the recorded decision's `RateLimit-*` headers to the response start (headers an
    error already carries are kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                decision: Decision | None = state.get(STATE_KEY)
                if decision is not None:
                    headers = MutableHeaders(scope=message)
                    for name, value in decision.headers().items():
                        if name not in headers:
                            headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
