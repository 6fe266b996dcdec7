"""Request bodies as JSON, parsed one way for every route.

RFC 8259 leaves a repeated member name to the parser ("the names within an object SHOULD be unique"), and
Python's `json` keeps the last one silently: a relay body with two `tx` members was judged on one
transaction and could be read differently by anything else looking at the same bytes. Here a member
repeated in any object, at any depth, is `400 MALFORMED_REQUEST` with `details.field` naming it (`tx`,
`tx.nonce`, `policy.limits.ruPerSecond`, ...), and so are the non-JSON constants `NaN` and `Infinity`.

`parse_json` (`gasless.http.json_text`) serves the routes that read their body themselves (relay,
validate); `JsonBodyRoute` makes FastAPI's own body decoding (every route with a pydantic body) use it.
Every router is created with `route_class=JsonBodyRoute` (`api_router`), and so is the app's own router.
"""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from gasless.http.json_text import parse_json


def _is_json(request: Request) -> bool:
    """FastAPI's rule for decoding a body as JSON: no content type, `application/json` or `+json`."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonBodyRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by `parse_json`, before FastAPI validates it (FastAPI turns
    any other exception from its own decoding into a bare 400 without `details.field`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def parse_first(request: Request) -> Response:
            request = _JsonRequest(request.scope, request.receive)
            if _is_json(request) and await request.body():
                await request.json()  # refused here, as a problem document
            return await handler(request)

        return parse_first


def api_router(**options: Any) -> APIRouter:
    """An APIRouter whose routes decode JSON bodies with `parse_json`."""
    return APIRouter(route_class=JsonBodyRoute, **options)
