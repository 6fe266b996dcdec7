"""The kit's view of the one problem renderer: on the kit's paths every error answer keeps its RFC 9457
problem document (with the catalogue `code`), gains the `error` string the kit reads, and takes one of the
statuses the kit knows (docs/compat.md, "Statuses and error bodies"): 400 for any validation failure
(and RELAYER_RETIRED, whose `error` says to delete `.relayer_cache.json`), 403 for NO_ENTITLEMENT and
SENDER_NOT_AUTHORIZED, 404 for an unknown address or path, 429 for quota cases (`error` starting `Quota
exceeded`), 500 for everything else (503-class conditions included). Framework answers (a body too large, bad JSON, a limit) pass through the same map.

The kit's paths are the facade's three routes, the calls its registration flow makes (`/challenge`,
`/register`) and anything under them; a trailing slash is dropped before routing, so `/relay/` is served as
`/relay` (never a redirect, which the facade does not emit).

The `error` texts say what to do without the words the kit acts on: the kit starts its own registration
(`POST /challenge`) when a 403's `error` contains "register", and this service has no registration.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.core.errors import PROBLEM_MEDIA_TYPE

# First path segments the kit calls: the facade's routes and its registration flow's.
KIT_SEGMENTS = frozenset({"health", "relay", "relayer", "challenge", "register"})
# Substrings the kit reads in an `error` as an instruction to act (src/validator.ts: a 403 whose `error`
# contains "register" starts auto-registration); no compat text may contain one.
KIT_COMMAND_WORDS = ("register",)
QUOTA = frozenset({"QUOTA_EXHAUSTED", "RATE_LIMITED", "GAS_BUDGET_EXCEEDED", "TOO_MANY_IN_FLIGHT"})
PAYMENT = frozenset({"NO_ENTITLEMENT", "SENDER_NOT_AUTHORIZED"})

HOW_TO_PAY = (
    "Plans and prices: GET /v1/pricing. Buy a plan for the sender's address with POST /v1/subscribe/prepare "
    "(or gasless buy --pem <wallet.pem> --tier Starter), or deposit credits with POST /v1/deposit/prepare"
)
NO_SIGN_UP = (
    "This relayer needs no registration and has no challenge: a relayed transaction is paid by a plan or "
    f"credits of its sender. {HOW_TO_PAY}; then post the signed transaction to POST /relay (a "
    "challengeNonce is accepted and ignored)."
)
FACADE_ROUTES = "GET /health, GET /relayer/address/{userAddress} and POST /relay"


def is_compat_path(path: str) -> bool:
    """A path of the kit's: its first segment is one the kit calls (`/relay`, `/relay/`, `/relayer/...`)."""
    return path.split("/", 2)[1] in KIT_SEGMENTS if path.startswith("/") else False


def compat_route_path(path: str) -> str:
    """The path a kit's request is routed as: without trailing slashes."""
    return path.rstrip("/") or "/"


def compat_status(code: str, status: int) -> int:
    if code == "NOT_FOUND":
        return 404
    if code in PAYMENT:
        return 403
    if code in QUOTA:
        return 429
    if status >= 500:
        return 500
    return 400


def compat_error(code: str, detail: str, details: dict[str, Any] | None = None) -> str:
    """The kit's `error` string: what happened and what to do."""
    if code in QUOTA:
        retry_ms = (details or {}).get("retryAfterMs")
        if isinstance(retry_ms, int) and code != "QUOTA_EXHAUSTED":
            wait = max(1, math.ceil(retry_ms / 1000))
            return f"Quota exceeded: {detail}; send the same transaction again after {wait} s"
        return f"Quota exceeded: {detail}"
    if code in PAYMENT:
        return f"Payment needed: {detail.rstrip('.')}. {HOW_TO_PAY}; then send the same transaction again."
    if code == "NOT_FOUND" and detail == "no such resource":
        return f"no such resource: this relayer serves {FACADE_ROUTES}"
    return detail


def compat_problem(document: dict[str, Any], status: int) -> tuple[int, dict[str, Any]]:
    code = str(document.get("code", "INTERNAL"))
    mapped = compat_status(code, status)
    detail = str(document.get("detail") or document.get("title") or code)
    details = document.get("details") if isinstance(document.get("details"), dict) else None
    return mapped, {**document, "status": mapped, "error": compat_error(code, detail, details)}


class CompatErrorMiddleware:
    """On the kit's paths: routes the path without trailing slashes, and rewrites every problem answer
    into the kit's status with its `error` string."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_compat_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        routed = compat_route_path(scope["path"])
        if routed != scope["path"]:
            scope = {**scope, "path": routed, "raw_path": routed.encode()}
        # HEAD is answered as GET without its body, here: the problem a GET would get is rewritten from its
        # body, which a HEAD answer no longer carries further in.
        head = scope.get("method") == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}
        held: dict[str, Any] = {}
        chunks: list[bytes] = []
        downstream = send

        async def send(message: Message) -> None:  # noqa: F811 - the same send, bodiless for HEAD
            if head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await downstream(message)

        async def rewrite(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(
                    PROBLEM_MEDIA_TYPE.encode()
                ):
                    held["start"] = message
                    return
                await send(message)
                return
            if message["type"] == "http.response.body" and "start" in held:
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                start = held.pop("start")
                try:
                    document = json.loads(b"".join(chunks))
                except ValueError:
                    document = {"code": "INTERNAL", "title": "Internal error", "detail": "internal error"}
                status, body = compat_problem(document, start["status"])
                payload = json.dumps(body, separators=(",", ":")).encode()
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(payload)).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
                return
            await send(message)

        await self.app(scope, receive, rewrite)
