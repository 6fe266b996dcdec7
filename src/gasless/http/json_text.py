"""JSON documents parsed one way: a member name repeated in any object, at any depth, and the non-JSON
constants `NaN` and `Infinity` are refused as `400 MALFORMED_REQUEST` (`gasless.http.json_body` says why).

Apart from `json_body` (FastAPI's routes), so that what checks a relay body outside a server (the client and
the CLI) does not import the web framework."""

from __future__ import annotations

import json
from typing import Any

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
