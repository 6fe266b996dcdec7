"""Request bodies as JSON, parsed one way for every route.

RFC 8259 leaves a repeated member name to the parser ("the names within an object SHOULD be unique"), and
Python's `json` keeps the last one silently: a relay body with two `tx` members was judged on one
transaction and could be read differently by anything else looking at the same bytes. Here a member
repeated in any object, at any depth, is `400 MALFORMED_REQUEST` with `details.field` naming it (`tx`,
`tx.nonce`, `policy.limits.ruPerSecond`, ...), and so are the non-JSON constants `NaN` and `Infinity`.

`parse_json` serves the routes that read their body themselves (relay, validate); `JsonBodyRoute` makes
FastAPI's own body decoding (every route with a pydantic body) use it. Every router is created with
`route_class=JsonBodyRoute` (`api_router`), and so is the app's own router.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from gasless.core.errors import ApiError


class _Repeated(ValueError):
    pass


class _Members(dict[str, Any]):
    """An object as parsed on the slow path: its members, and the names it repeats."""

    repeated: list[str]


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _Repeated
    return members


def _recording(pairs: list[tuple[str, Any]]) -> _Members:
    members = _Members(pairs)
    members.repeated = []
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            members.repeated.append(name)
        seen.add(name)
    return members


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _first_repeated(node: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The path of the first repeated member, outermost first, in document order."""
    if isinstance(node, _Members):
        if node.repeated:
            return (*path, node.repeated[0])
        children: Any = node.items()
    elif isinstance(node, list):
        children = ((str(index), value) for index, value in enumerate(node))
    else:
        return None
    for name, value in children:
        found = _first_repeated(value, (*path, name))
        if found is not None:
            return found
    return None


def parse_json(raw: bytes) -> Any:
    """The body's JSON document. `MALFORMED_REQUEST` when it is not JSON (`details.field = "body"`) or
    repeats a member name (`details.field` = the member's path)."""
    try:
        return json.loads(raw, object_pairs_hook=_unique, parse_constant=_not_json)
    except _Repeated:
        # Rare: parse again, recording the repeated names, to say which member it is.
        document = json.loads(raw, object_pairs_hook=_recording, parse_constant=_not_json)
        path = ".".join(_first_repeated(document) or ("body",))
        raise ApiError(
            "MALFORMED_REQUEST",
            detail=f"member `{path}` appears more than once; every member name must be unique",
            details={"field": path},
        ) from None
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: absurdly nested arrays
        raise ApiError(
            "MALFORMED_REQUEST", detail="body is not valid JSON", details={"field": "body"}
        ) from None


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
