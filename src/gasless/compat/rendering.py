"""The kit's view of the one problem renderer: on the compat paths every error answer keeps its RFC 9457
problem document (with the catalogue `code`), gains the `error` string the kit reads, and takes one of the
statuses the kit knows (compat rule 4): 400 for any validation failure (and RELAYER_RETIRED, whose `error`
says to delete `.relayer_cache.json`), 403 for NO_ENTITLEMENT and SENDER_NOT_AUTHORIZED, 404 for an unknown
address or path, 429 for quota cases (`error` starting `Quota exceeded`), 500 for everything else (503-class
conditions included). Framework answers (a body too large, bad JSON, a limit) pass through the same map.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.errors import PROBLEM_MEDIA_TYPE

COMPAT_EXACT = ("/health", "/relay")
COMPAT_PREFIX = "/relayer/address/"
QUOTA = frozenset({"QUOTA_EXHAUSTED", "RATE_LIMITED", "GAS_BUDGET_EXCEEDED", "TOO_MANY_IN_FLIGHT"})
REGISTRATION = frozenset({"NO_ENTITLEMENT", "SENDER_NOT_AUTHORIZED"})


def is_compat_path(path: str) -> bool:
    return path in COMPAT_EXACT or path.startswith(COMPAT_PREFIX)


def compat_status(code: str, status: int) -> int:
    if code == "NOT_FOUND":
        return 404
    if code in REGISTRATION:
        return 403
    if code in QUOTA:
        return 429
    if status >= 500:
        return 500
    return 400


def compat_error(code: str, detail: str) -> str:
    if code in QUOTA:
        return f"Quota exceeded: {detail}"
    if code in REGISTRATION:
        return f"{detail} (register first: buy a plan or top up; see GET /v1/pricing)"
    return detail


def compat_problem(document: dict[str, Any], status: int) -> tuple[int, dict[str, Any]]:
    code = str(document.get("code", "INTERNAL"))
    mapped = compat_status(code, status)
    detail = str(document.get("detail") or document.get("title") or code)
    return mapped, {**document, "status": mapped, "error": compat_error(code, detail)}


class CompatErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_compat_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

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
