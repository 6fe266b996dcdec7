"""Tool input and output schemas, taken from the service's own OpenAPI document (itself generated from the
pydantic models the HTTP routes use), with every `$ref` inlined so each tool schema stands alone.

MCP hosts hold these schemas to what a tool takes and answers (the TypeScript SDK validates every
structured result against the tool's output schema), so each one is made portable here:

- every `$ref` is inlined (a client does not resolve references into a document it never saw);
- a `format` that is not one of JSON Schema's own (`erd-address`, `intent-id`) is dropped: validators warn
  on formats they do not know, and the `pattern` beside it, with its description, carries the rule;
- no node is left without a type: `validate_transaction` takes `lease` and `intentKey` as POST /v1/relay
  types them (the route judges any value and lists a wrong one among its problems, so its OpenAPI schema
  leaves them open), and `relay_batch` answers a schema written out here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

REF_PREFIX = "#/components/schemas/"
MAX_BATCH = 16  # interface contract: `relay_batch` over MCP, 16 transactions

# JSON Schema 2020-12's own formats (section 7.3); every other is a name only its author knows.
STANDARD_FORMATS = frozenset(
    {
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uuid",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)


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


def portable(schema: Any) -> Any:
    """`schema` without the formats only this service defines (see the module's docstring)."""
    if isinstance(schema, list):
        return [portable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    # A string under `format` is the keyword (a member named `format` under `properties` is a schema).
    return {
        key: portable(value)
        for key, value in schema.items()
        if not (key == "format" and isinstance(value, str) and value not in STANDARD_FORMATS)
    }


def tool_schema(document: Mapping[str, Any], schema: Any) -> dict[str, Any]:
    return dict(portable(inline(document, schema)))


def operation(document: Mapping[str, Any], operation_id: str) -> Mapping[str, Any]:
    for item in document["paths"].values():
        for candidate in item.values():
            if isinstance(candidate, dict) and candidate.get("operationId") == operation_id:
                return candidate
    raise KeyError(f"no operation {operation_id} in the document")


def request_schema(document: Mapping[str, Any], operation_id: str) -> dict[str, Any]:
    """The JSON body schema of an operation."""
    body = operation(document, operation_id)["requestBody"]["content"]["application/json"]["schema"]
    return tool_schema(document, body)


def response_schema(document: Mapping[str, Any], operation_id: str, status: str = "200") -> dict[str, Any]:
    content = operation(document, operation_id)["responses"][status]["content"]
    return tool_schema(document, content["application/json"]["schema"])


def parameter_schema(document: Mapping[str, Any], operation_id: str, name: str) -> dict[str, Any]:
    for parameter in operation(document, operation_id).get("parameters", []):
        if parameter.get("name") == name:
            schema = tool_schema(document, parameter["schema"])
            if "description" in parameter:
                schema["description"] = parameter["description"]
            return schema
    raise KeyError(f"no parameter {name} in {operation_id}")


def component(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    return tool_schema(document, {"$ref": REF_PREFIX + name})


def _or_null(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema`, or null (a member that may be left out is typed, not open)."""
    branches = schema.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        return {"anyOf": copy.deepcopy(branches)}
    shape = {key: value for key, value in schema.items() if key not in ("title", "description", "default")}
    return {"anyOf": [shape, {"type": "null"}]}


def validate_input_schema(document: Mapping[str, Any]) -> dict[str, Any]:
    """`validate_transaction`'s `request`: the route's body, its judged `lease` and `intentKey` typed as
    POST /v1/relay types them (or null: validation does not require them)."""
    schema = request_schema(document, "validateTransaction")
    relay = request_schema(document, "relayTransaction")["properties"]
    members = schema.get("properties", {})
    for name in ("lease", "intentKey"):
        if name in members and name in relay:
            judged = members[name]
            members[name] = {
                **_or_null(relay[name]),
                "default": None,
                "description": f"as POST /v1/relay takes it ({relay[name].get('description', name)}); "
                f"{judged.get('description', 'judged, not required')}",
            }
    return schema


def batch_input_schema(document: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_BATCH,
        "items": request_schema(document, "relayTransaction"),
        "description": f"1 to {MAX_BATCH} relay requests (as POST /v1/relay takes them), relayed one after "
        "the other in this order, each with its own outcome",
    }


def batch_output_schema(document: Mapping[str, Any]) -> dict[str, Any]:
    """`relay_batch`'s answer: one outcome an item, in order, each the route's answer to it."""
    relay = response_schema(document, "relayTransaction")
    problem = component(document, "Problem")
    count = {"type": "integer", "minimum": 0, "maximum": MAX_BATCH}
    outcome = {
        "type": "object",
        "description": "POST /v1/relay's answer to one item: `relay` when it was relayed (200 or 202), "
        "`problem` when it was refused (nothing was sent for it)",
        "properties": {
            "index": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_BATCH - 1,
                "description": "the item's position in `requests`",
            },
            "status": {"type": "integer", "minimum": 200, "maximum": 599, "description": "the HTTP status"},
            "relay": relay,
            "problem": problem,
        },
        "required": ["index", "status"],
        "oneOf": [{"required": ["relay"]}, {"required": ["problem"]}],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "title": "RelayBatchResult",
        "properties": {
            "results": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": outcome},
            "relayed": {**count, "description": "items relayed"},
            "refused": {**count, "description": "items refused"},
        },
        "required": ["results", "relayed", "refused"],
        "additionalProperties": False,
    }


def package_document() -> dict[str, Any]:
    """The relay operations' OpenAPI document as this package builds it, for `gasless mcp` when the API
    does not answer at start. The one difference from a host's own: the transaction's `chainID` is not
    pinned to a chain (a host writes its chain as a `const`; which chain the API serves is unknown here)."""
    from fastapi import FastAPI

    from gasless.http.openapi import build_document
    from gasless.relay import routes as relay_routes
    from gasless.relay.schemas import transaction_schemas

    app = FastAPI(openapi_url=None)
    app.include_router(relay_routes.router)
    extra = transaction_schemas("")
    for definition in extra.values():
        chain = definition.get("properties", {}).get("chainID")
        if isinstance(chain, dict):
            chain.pop("const", None)
            chain["minLength"] = 1
            chain["description"] = "the chain the API serves (`chainId` of get_network)"
    return build_document(app, relay_routes.EXTRA_SCHEMAS, extra)
