"""Tool input and output schemas, taken from the service's own OpenAPI document (itself generated from the
pydantic models the HTTP routes use), with every `$ref` inlined so each tool schema stands alone."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

REF_PREFIX = "#/components/schemas/"
MAX_BATCH = 16  # spec: `relay_batch` over MCP, 16 transactions


def inline(document: Mapping[str, Any], schema: Any, seen: tuple[str, ...] = ()) -> Any:
    """`schema` with each component reference replaced by the component (recursive references stop at
    their second visit with a permissive `{}`; the service's schemas have none today)."""
    if isinstance(schema, list):
        return [inline(document, item, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(REF_PREFIX):
        name = ref.removeprefix(REF_PREFIX)
        if name in seen:
            return {}
        target = copy.deepcopy(document["components"]["schemas"][name])
        kept = {key: value for key, value in schema.items() if key != "$ref"}
        return {**inline(document, target, (*seen, name)), **kept}
    return {key: inline(document, value, seen) for key, value in schema.items()}


def operation(document: Mapping[str, Any], operation_id: str) -> Mapping[str, Any]:
    for item in document["paths"].values():
        for candidate in item.values():
            if isinstance(candidate, dict) and candidate.get("operationId") == operation_id:
                return candidate
    raise KeyError(f"no operation {operation_id} in the document")


def request_schema(document: Mapping[str, Any], operation_id: str) -> dict[str, Any]:
    """The JSON body schema of an operation."""
    body = operation(document, operation_id)["requestBody"]["content"]["application/json"]["schema"]
    return dict(inline(document, body))


def response_schema(document: Mapping[str, Any], operation_id: str, status: str = "200") -> dict[str, Any]:
    content = operation(document, operation_id)["responses"][status]["content"]
    return dict(inline(document, content["application/json"]["schema"]))


def component(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    return dict(inline(document, {"$ref": REF_PREFIX + name}))
