"""The request-body limit of every route (131 072 bytes), enforced before any route code runs.

Pure ASGI (no BaseHTTPMiddleware): a declared `Content-Length` above the limit is refused without reading
a byte; otherwise the body is counted as it streams in and refused as soon as it passes the limit, so a
chunked upload cannot make the host buffer more than the limit. An accepted body (at most 128 KiB) is
handed to the app in one message. A refusal is `413 PAYLOAD_TOO_LARGE` rendered by the one problem
renderer, with `Connection: close` since the rest of the body is never read.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.core.errors import ApiError
from gasless.http.problems import problem_response

MAX_REQUEST_BODY_BYTES = 131_072


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, docs_url: str, limit: int = MAX_REQUEST_BODY_BYTES) -> None:
        self.app = app
        self.docs_url = docs_url
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body arrived: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ApiError(
            "PAYLOAD_TOO_LARGE",
            detail=f"request body is larger than {self.limit} bytes",
            headers={"Connection": "close"},
        )
        await problem_response(Request(scope), error, self.docs_url)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            # A malformed length is the server's concern (h11/httptools refuse it); count the body instead.
            return int(text) if text.isascii() and text.isdigit() else None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    delivered = False

    async def replay() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, as the server reports it

    return replay
