"""HTTP side of the error catalogue: request ids and the handlers that render every failure as RFC 9457.

Whatever goes wrong in a route ends here: an ApiError as itself, a request that does not match its schema
as MALFORMED_REQUEST (with `details.field`), an unknown path or method as NOT_FOUND, anything else as
INTERNAL. No other code builds an error body.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gasless.core.errors import PROBLEM_MEDIA_TYPE, ApiError, problem_document
from gasless.http.formats import (
    ADDRESS_PATTERN,
    INTENT_ID_PATTERN,
    INTENT_OR_HASH_PATTERN,
    TX_HASH_PATTERN,
)

log = structlog.get_logger("gasless.http")
REQUEST_ID_HEADER = "Relay-Request-Id"

_ADDRESS_FORM = "an erd1 address (erd1 and 58 lower-case bech32 characters)"
_INTENT_FORM = "an intent id `<erd1...>:<nonce>` (an address, a colon, the nonce in decimal)"
_HASH_FORM = "a transaction hash (64 hexadecimal characters)"
# The shared formats' patterns and the form each expects, in words (a refusal names the form, not a regex).
FORMS = {
    ADDRESS_PATTERN: _ADDRESS_FORM,
    TX_HASH_PATTERN: _HASH_FORM,
    INTENT_ID_PATTERN: _INTENT_FORM,
    INTENT_OR_HASH_PATTERN: f"{_INTENT_FORM} or {_HASH_FORM}",
}


def new_request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def request_id_of(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = new_request_id()
        request.state.request_id = rid
    return str(rid)


class RequestIdMiddleware:
    """Every request gets an id: the problem `instance`, the `Relay-Request-Id` header, the log context.

    Pure ASGI (no BaseHTTPMiddleware): it sits on the hot path, and a task group per request costs more
    than the relay checks themselves.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        rid = state.get("request_id") or new_request_id()
        state["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")


class ProblemRecorder:
    """Appends each problem this host answered to a file, one per line (O_APPEND: lines from several
    processes never interleave). The suite's error-coverage guard reads what the service really answered:
    `CODE STATUS` for an HTTP error response the problem renderer sent, `CODE - mcp` for a tool error of
    the MCP layer (a problem document inside a 200, which does not count as answering the code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _append(self, lines: str) -> None:
        if lines:
            with self.path.open("a", encoding="ascii") as out:
                out.write(lines)

    def answered(self, code: str, status: int) -> None:
        """An error response with this code and HTTP status left the problem renderer."""
        self._append(f"{code} {status}\n")

    def record(self, codes: Iterable[str]) -> None:
        """Problems rendered outside an HTTP error response (MCP tool errors)."""
        self._append("".join(f"{code} - mcp\n" for code in codes))


def problem_response(request: Request, error: ApiError, docs_url: str) -> JSONResponse:
    recorder: ProblemRecorder | None = getattr(request.app.state, "problem_recorder", None)
    if recorder is not None:
        recorder.answered(error.code, error.status)
    rid = request_id_of(request)
    body = problem_document(error, docs_url=docs_url, request_id=rid)
    headers = {**error.headers, REQUEST_ID_HEADER: rid}
    return JSONResponse(body, status_code=error.status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _field_of(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return ""
    location = [
        str(part) for part in errors[0].get("loc", ()) if part not in ("body", "query", "path", "header")
    ]
    return ".".join(location)


def install_problem_handlers(app: FastAPI, docs_url: str, record_file: Path | None = None) -> None:
    app.state.problem_recorder = ProblemRecorder(record_file) if record_file is not None else None

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem_response(request, exc, docs_url)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        field = _field_of(exc)
        first = exc.errors()[0] if exc.errors() else {}
        message = first.get("msg", "invalid request")
        if first.get("type") == "string_pattern_mismatch":
            # Not the regular expression itself (an int64 range spelled out is hundreds of characters): the
            # expected form in words where the pattern is one of the shared formats.
            pattern = (first.get("ctx") or {}).get("pattern")
            form = FORMS.get(pattern) if isinstance(pattern, str) else None
            message = (
                f"expected {form}"
                if form
                else "does not have the documented format (see its pattern in /openapi.json)"
            )
        error = ApiError(
            "MALFORMED_REQUEST", detail=f"{field or 'body'}: {message}", details={"field": field}
        )
        return problem_response(request, error, docs_url)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return problem_response(request, ApiError("PAYLOAD_TOO_LARGE"), docs_url)
        if exc.status_code in (404, 405):
            return problem_response(request, ApiError("NOT_FOUND", detail="no such resource"), docs_url)
        return problem_response(request, ApiError("MALFORMED_REQUEST", detail=str(exc.detail)), docs_url)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette sends this answer, then re-raises the exception to the server, which closes the
        # connection: the answer says so (`Connection: close`), so it is a complete response and a client
        # does not reuse a connection that is about to close.
        log.error("unexpected failure", error_type=type(exc).__name__)
        error = ApiError("INTERNAL", detail="unexpected failure", headers={"Connection": "close"})
        return problem_response(request, error, docs_url)
