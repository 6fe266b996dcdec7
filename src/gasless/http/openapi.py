"""The OpenAPI 3.1 document served at `/openapi.json`, generated from the routes.

FastAPI's generator supplies paths, parameters, request bodies and success schemas (routes set their own
`operation_id` and `response_model`). `build_document` then makes the result the contract the interface contract asks
for, for every route, including routes added later:

- one `Problem` schema (RFC 9457 plus `code`, whose enum is the error catalogue) and, per operation, the
  error statuses it answers, each `application/problem+json` referencing it; the statuses and codes come
  from `OPERATIONS` (keyed by operation id), or from `default_contract` for an operation not listed there;
- FastAPI's `422 HTTPValidationError` removed (a request that fails validation is 400 MALFORMED_REQUEST);
- the security schemes `nativeAuth`, `apiKey` and `x402`, and `security` on every operation (`[]` public);
- the response headers the interface contract names (`Relay-Request-Id` everywhere, `RateLimit-*` and `Retry-After` on
  429, `Cache-Control`/`ETag` on cached reads, `PAYMENT-REQUIRED` on 402);
- event streams documented as `text/event-stream`.

The document is built once, on the first request for it, and cached on the app; a process that builds
several apps with the same routes (API workers restarting, the test suite) generates it once.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel

from gasless.core.errors import CATALOGUE, PROBLEM_MEDIA_TYPE
from gasless.http.formats import COMPONENTS as FORMAT_COMPONENTS
from gasless.http.formats import exact_integer_bounds, resolve_markers
from gasless.http.operations import API_KEY, NATIVE_AUTH, OPERATIONS, X402, default_contract
from gasless.http.problems import REQUEST_ID_HEADER

API_VERSION = "1.0.0-draft.1"
EVENT_STREAM = "text/event-stream"
SCHEMAS = "#/components/schemas/"
HEADERS = "#/components/headers/"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# FastAPI's validation-error answer, which this API never gives (problems.py answers MALFORMED_REQUEST).
_FASTAPI_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")

# Security schemes ---------------------------------------------------------------------------------------
SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    NATIVE_AUTH: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "MultiversX native-auth token",
        "description": "A native-auth token whose embedded block hash is a recent shard-1 block "
        "(see `nativeAuth` in `GET /v1/network`). Only in the `Authorization` header, never in a URL.",
    },
    API_KEY: {
        "type": "apiKey",
        "in": "header",
        "name": "X-Api-Key",
        "description": "Sponsor API key (`gls_live_...` / `gls_test_...`); it selects the paying account.",
    },
    X402: {
        "type": "apiKey",
        "in": "header",
        "name": "PAYMENT-SIGNATURE",
        "description": "x402 v2 payment payload (base64 JSON) on the retried request.",
    },
}
# Header parameters a scheme already documents (and `Authorization`, which OpenAPI ignores as a parameter).
_SCHEME_HEADERS = {"authorization", "x-api-key", "payment-signature"}

# Response headers -----------------------------------------------------------------------------------------
HEADER_COMPONENTS: dict[str, dict[str, Any]] = {
    "RelayRequestId": {
        "description": "This request's id; the same value as a problem document's `instance`.",
        "required": True,
        "schema": {"type": "string", "pattern": "^req_[0-9a-f]+$"},
    },
    "RateLimitLimit": {
        "description": "Requests allowed in the current window of the limit that applies.",
        "schema": {"type": "integer", "minimum": 0},
    },
    "RateLimitRemaining": {
        "description": "Requests left in the current window.",
        "schema": {"type": "integer", "minimum": 0},
    },
    "RateLimitReset": {
        "description": "Seconds until the window resets.",
        "schema": {"type": "integer", "minimum": 0},
    },
    "RetryAfter": {
        "description": "Seconds to wait before retrying (absent on QUOTA_EXHAUSTED: waiting does not help).",
        "schema": {"type": "integer", "minimum": 1},
    },
    "CacheControl": {"description": "Caching directives of this read.", "schema": {"type": "string"}},
    "ETag": {
        "description": "Strong validator of the body, for `If-None-Match`.",
        "schema": {"type": "string"},
    },
    "PaymentResponse": {
        "description": "x402 v2 SettleResponse (base64 JSON): the settled payment (`success`, `transaction` = "
        "the payment's transaction hash, `payer`, `network`, `amount`); `success: false` with `errorReason` "
        "on a payment that could not settle.",
        "schema": {"type": "string"},
    },
    "PaymentRequired": {
        "description": "x402 v2 PaymentRequired (base64 JSON): the challenge (`accepts[0]` with asset, network, "
        "payTo, maxTimeoutSeconds and extra.quoteMac); on NO_ENTITLEMENT it points at `POST /v1/x402/topup`, built for "
        "the transaction's sender.",
        "schema": {"type": "string"},
    },
}
_RATE_LIMIT_HEADERS = {
    "RateLimit-Limit": "RateLimitLimit",
    "RateLimit-Remaining": "RateLimitRemaining",
    "RateLimit-Reset": "RateLimitReset",
}


# The document ---------------------------------------------------------------------------------------------
def problem_schema() -> dict[str, Any]:
    """RFC 9457 with the catalogue's members; extension members beyond these are allowed."""
    return {
        "title": "Problem",
        "description": "RFC 9457 problem document (`application/problem+json`). `type` is "
        "`{docs_url}/errors/<kebab-case-code>`; the catalogue is published as docs/errors.json.",
        "type": "object",
        "required": ["type", "title", "status", "detail", "code", "instance", "retryable"],
        "properties": {
            "type": {
                "type": "string",
                "format": "uri",
                "description": "`{docs_url}/errors/<kebab-case-code>`",
            },
            "title": {"type": "string"},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string"},
            "instance": {"type": "string", "description": "the request id (also `Relay-Request-Id`)"},
            "code": {"type": "string", "enum": list(CATALOGUE), "description": "stable error code"},
            "retryable": {"type": "boolean", "description": "the catalogue's retryable flag"},
            "resign": {
                "type": "string",
                "enum": ["NONE", "SAME_BYTES", "NEW_SIGNATURE_SAME_NONCE"],
                "description": "relay group only: what the client re-signs before retrying",
            },
            "details": {
                "type": "object",
                "additionalProperties": True,
                "description": "per-code members (the catalogue's `details`)",
            },
        },
    }


def _header_ref(name: str) -> dict[str, str]:
    return {"$ref": f"{HEADERS}{name}"}


def _problem_response(status: int, codes: Iterable[str]) -> dict[str, Any]:
    codes = tuple(codes)
    headers: dict[str, Any] = {REQUEST_ID_HEADER: _header_ref("RelayRequestId")}
    if status == 429:
        headers["Retry-After"] = _header_ref("RetryAfter")
        headers.update({name: _header_ref(ref) for name, ref in _RATE_LIMIT_HEADERS.items()})
    elif status == 503:
        headers["Retry-After"] = _header_ref("RetryAfter")
    if {"NO_ENTITLEMENT", "PAYMENT_REQUIRED", "INSUFFICIENT_CREDITS"} & set(codes):
        headers["PAYMENT-REQUIRED"] = _header_ref("PaymentRequired")
    if {"PAYMENT_FAILED", "PAYMENT_INVALID"} & set(codes):
        headers["PAYMENT-RESPONSE"] = _header_ref("PaymentResponse")
    return {
        "description": "Problem: " + ", ".join(codes) if codes else "Problem",
        "headers": headers,
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": f"{SCHEMAS}Problem"}}},
        "x-error-codes": list(codes),
    }


def _scheme_name(scheme: Mapping[str, Any]) -> str | None:
    """Our name for a scheme FastAPI generated from a `fastapi.security` dependency, if it is one of ours."""
    kind = scheme.get("type")
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
        return NATIVE_AUTH
    if kind == "apiKey" and scheme.get("in") == "header":
        header = str(scheme.get("name", "")).lower()
        if header == "x-api-key":
            return API_KEY
        if header in ("payment-signature", "x-payment"):
            return X402
    return None


def _normalise_security(document: dict[str, Any]) -> None:
    """Rename generated schemes to ours so every operation's `security` names only the three schemes."""
    components = document.setdefault("components", {})
    generated = components.pop("securitySchemes", {})
    renames = {name: _scheme_name(scheme) or name for name, scheme in generated.items()}
    unknown = sorted(name for name, ours in renames.items() if ours not in SECURITY_SCHEMES)
    if unknown:
        raise ValueError(f"security schemes outside nativeAuth/apiKey/x402: {unknown}")
    for operation in _operations(document):
        if "security" in operation:
            operation["security"] = [
                {renames.get(name, name): scopes for name, scopes in requirement.items()}
                for requirement in operation["security"]
            ]
    components["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)


def _operations(document: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for item in document.get("paths", {}).values():
        for method, operation in item.items():
            if method in _METHODS:
                yield operation


def _is_fastapi_validation_error(response: Mapping[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return schema.get("$ref") == f"{SCHEMAS}HTTPValidationError"


def _event_stream_content(declared: Mapping[str, Any], events: tuple[str, ...]) -> dict[str, Any]:
    """One Server-Sent Event: OpenAPI 3.1 has no `itemSchema`, so, as tools read a 3.1 stream, the
    schema describes each event, and `data` carries the JSON document the route declared."""
    data: dict[str, Any] = {"type": "string", "contentMediaType": "application/json"}
    declared_schema = declared.get(EVENT_STREAM, {}).get("schema")
    if declared_schema:
        data["contentSchema"] = declared_schema
    event: dict[str, Any] = {"type": "string"}
    if events:
        event["enum"] = list(events)
    schema = {
        "type": "object",
        "description": "One Server-Sent Event (`event:`, `id:`, `data:` lines); comment lines are keep-alives.",
        "required": ["data"],
        "properties": {
            "event": event,
            "id": {"type": "string"},
            "data": data,
            "retry": {"type": "integer", "minimum": 0},
        },
    }
    return {EVENT_STREAM: {"schema": schema}}


def _apply_contract(path: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status in [s for s, r in responses.items() if _is_fastapi_validation_error(r)]:
        del responses[status]
    op_id = operation.get("operationId")
    contract = (OPERATIONS.get(op_id) if op_id else None) or default_contract(path, operation)
    operation["security"] = [{name: [] for name in alternative} for alternative in contract.security]
    _tidy_parameters(operation)

    statuses = dict(contract.problems)
    for status, response in responses.items():
        # A status the route declares itself without a body of its own is a problem too.
        if status.isdigit() and int(status) >= 400 and "content" not in response:
            statuses.setdefault(int(status), ())
    for status, codes in sorted(statuses.items()):
        declared = responses.get(str(status))
        if declared is not None and _has_own_content(declared):
            continue  # e.g. readiness answers 503 with a Health document
        responses[str(status)] = _problem_response(status, codes)

    if contract.cached:
        _add_revalidation(operation, responses)
    for status, response in responses.items():
        headers = response.setdefault("headers", {})
        headers.setdefault(REQUEST_ID_HEADER, _header_ref("RelayRequestId"))
        if not status.startswith("2"):
            continue
        if EVENT_STREAM in response.get("content", {}):
            response["content"] = _event_stream_content(response["content"], contract.events)
        if 429 in statuses:  # limited routes also say where the caller stands on success
            headers.update({name: _header_ref(ref) for name, ref in _RATE_LIMIT_HEADERS.items()})
        if contract.cached:
            headers["Cache-Control"] = _header_ref("CacheControl")
            headers["ETag"] = _header_ref("ETag")
        if status == "200" and "PAYMENT_FAILED" in statuses.get(402, ()):
            headers["PAYMENT-RESPONSE"] = _header_ref("PaymentResponse")  # a settled x402 payment
    operation["responses"] = dict(sorted(responses.items()))


def _add_revalidation(operation: dict[str, Any], responses: dict[str, Any]) -> None:
    """A cached read answers `304 Not Modified` (no body, same validators) when `If-None-Match` matches."""
    parameters = operation.setdefault("parameters", [])
    if not any(p.get("in") == "header" and p.get("name", "").lower() == "if-none-match" for p in parameters):
        parameters.append(
            {
                "name": "If-None-Match",
                "in": "header",
                "required": False,
                "description": "ETag(s) the client holds; a match answers 304 without a body.",
                "schema": {"type": "string"},
            }
        )
    responses["304"] = {
        "description": "Not Modified: the representation the client holds (`If-None-Match`) is current.",
        "headers": {
            REQUEST_ID_HEADER: _header_ref("RelayRequestId"),
            "Cache-Control": _header_ref("CacheControl"),
            "ETag": _header_ref("ETag"),
        },
    }


def _tidy_parameters(operation: dict[str, Any]) -> None:
    """Credentials are documented by the security schemes, not as parameters (OpenAPI ignores an
    `Authorization` parameter anyway); an optional parameter is absent rather than null."""
    kept = []
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "header" and parameter.get("name", "").lower() in _SCHEME_HEADERS:
            continue
        schema = parameter.get("schema", {})
        variants = schema.get("anyOf")
        if variants and {"type": "null"} in variants:
            rest = [v for v in variants if v != {"type": "null"}]
            others = {k: v for k, v in schema.items() if k != "anyOf"}
            parameter["schema"] = {**others, **rest[0]} if len(rest) == 1 else {**others, "anyOf": rest}
        kept.append(parameter)
    if kept:
        operation["parameters"] = kept
    else:
        operation.pop("parameters", None)


def _has_own_content(response: Mapping[str, Any]) -> bool:
    content = response.get("content", {})
    return bool(content) and PROBLEM_MEDIA_TYPE not in content


# Documents built in this process, by what they were built from (`_built_from`): FastAPI's generator costs
# 0.5-0.9 s of CPU a build, about half of building a host's app, and every app of a process has the same
# routes. A few entries at most (one per chain id in practice).
_BUILT: dict[tuple[Any, ...], dict[str, Any]] = {}
_BUILT_KEPT = 8
_BUILT_LOCK = threading.Lock()  # documents are also built off the event loop (`openapi_document`)


def _built_from(
    app: FastAPI, models: tuple[type[BaseModel], ...], extra_schemas: Mapping[str, Mapping[str, Any]] | None
) -> tuple[Any, ...]:
    """Everything the generator reads, per route as FastAPI resolves it (included routers' prefixes and
    dependencies applied): two apps with equal keys have the same document. The endpoint is keyed by its
    code, so an app-local route (a closure made again for each app) matches its twin in another app."""
    routes = []
    for context in iter_route_contexts(app.routes):
        if not isinstance(context.original_route, APIRoute):
            continue  # the generator documents API routes only (`/mcp` is a plain route, made per app)
        endpoint = getattr(context, "endpoint", None)
        routes.append(
            (
                type(context.original_route),
                getattr(context, "path", None),
                tuple(sorted(getattr(context, "methods", None) or ())),
                getattr(endpoint, "__code__", endpoint),
                *(
                    repr(getattr(context, name, None))
                    for name in (
                        "operation_id",
                        "response_model",
                        "responses",
                        "status_code",
                        "response_class",
                        "response_description",
                        "dependencies",
                        "tags",
                        "summary",
                        "description",
                        "deprecated",
                        "include_in_schema",
                        "openapi_extra",
                        "callbacks",
                    )
                ),
            )
        )
    return (
        tuple(routes),
        app.title,
        repr(app.openapi_tags),
        repr(app.servers),
        app.separate_input_output_schemas,
        models,
        json.dumps(extra_schemas, sort_keys=True, default=repr),
    )


def build_document(
    app: FastAPI,
    extra_models: Iterable[type[BaseModel]] = (),
    extra_schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The whole document for `app` (`install_openapi` caches it on the app), a copy of the one built for an
    app with the same routes earlier in this process if there was one. `extra_schemas` are components
    written as JSON schemas (named by their key), beside the shared formats (`Address`, `TxHash`,
    `IntentId`, http/formats.py)."""
    models = tuple(extra_models)
    key = _built_from(app, models, extra_schemas)
    with _BUILT_LOCK:
        built = _BUILT.get(key)
    if built is None:
        built = _generate(app, models, extra_schemas)
        with _BUILT_LOCK:
            while len(_BUILT) >= _BUILT_KEPT:
                _BUILT.pop(next(iter(_BUILT)))
            _BUILT[key] = built
    return copy.deepcopy(built)


def _generate(
    app: FastAPI,
    extra_models: tuple[type[BaseModel], ...],
    extra_schemas: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    document = get_openapi(
        title=app.title,
        version=API_VERSION,
        openapi_version="3.1.0",
        summary="Relays user-signed MultiversX Relayed-V3 transactions without the user holding gas.",
        description=(
            "Every error is an RFC 9457 problem document (`application/problem+json`) with a stable `code` "
            "from the error catalogue; every response carries `Relay-Request-Id`."
        ),
        routes=app.routes,
        tags=app.openapi_tags,
        servers=app.servers,
        separate_input_output_schemas=app.separate_input_output_schemas,
    )
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in extra_models:
        # Bodies that routes parse themselves (to refuse unknown members exactly) are still documented.
        schema = model.model_json_schema(ref_template=SCHEMAS + "{model}")
        for name, definition in schema.pop("$defs", {}).items():
            schemas.setdefault(name, definition)
        schemas[model.__name__] = schema
    for name, definition in {**FORMAT_COMPONENTS, **(extra_schemas or {})}.items():
        schemas[name] = copy.deepcopy(dict(definition))
    document = resolve_markers(document)  # pydantic's stand-ins for `$ref`s to the format components
    document = exact_integer_bounds(document)
    components = document["components"]
    schemas = components["schemas"]
    _normalise_security(document)
    for path, item in document.get("paths", {}).items():
        for operation in item.values():
            _apply_contract(path, operation)
    for name in _FASTAPI_VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    schemas["Problem"] = problem_schema()
    components["schemas"] = dict(sorted(schemas.items()))
    components["headers"] = copy.deepcopy(HEADER_COMPONENTS)
    return document


def install_openapi(
    app: FastAPI,
    extra_models: Iterable[type[BaseModel]] = (),
    extra_schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Serve the document at `GET /openapi.json` (built on first use, then cached) and make `app.openapi`
    return it. The app must be created with `openapi_url=None` so FastAPI's own route does not shadow this."""
    models = tuple(extra_models)
    building = asyncio.Lock()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app, models, extra_schemas)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get(
        "/openapi.json",
        operation_id="getOpenApi",
        tags=["meta"],
        summary="This OpenAPI 3.1 document",
        response_class=JSONResponse,
        responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}},
    )
    async def openapi_document() -> JSONResponse:
        if app.openapi_schema is None:
            # The first build takes seconds of CPU: off the event loop, so the host's timers (the signer
            # fence's renewal, the trackers) keep running meanwhile.
            async with building:
                if app.openapi_schema is None:
                    await asyncio.to_thread(openapi)
        return JSONResponse(openapi())


# The committed snapshot (tests/http/openapi_snapshot.json, refreshed by tools/snapshot_openapi.py) ------------
SNAPSHOT_REFRESH = ".venv/bin/python tools/snapshot_openapi.py"


def contract_snapshot(document: Mapping[str, Any]) -> dict[str, Any]:
    """What a client relies on by name: per path and method the operation id, its security alternatives
    and its response statuses; the component schema names; the security scheme names."""
    operations = {}
    for path, item in document["paths"].items():
        for method in _METHODS:
            if method in item:
                operation = item[method]
                operations[f"{method.upper()} {path}"] = {
                    "operationId": operation.get("operationId"),
                    "security": [sorted(requirement) for requirement in operation.get("security", [])],
                    "responses": sorted(operation.get("responses", {})),
                }
    components = document.get("components", {})
    return {
        "openapi": document["openapi"],
        "version": document["info"]["version"],
        "operations": dict(sorted(operations.items())),
        "schemas": sorted(components.get("schemas", {})),
        "securitySchemes": sorted(components.get("securitySchemes", {})),
    }


def snapshot_differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Every difference between two snapshots, one readable line each (empty when they are equal)."""
    lines = []
    for key in ("openapi", "version"):
        if expected.get(key) != actual.get(key):
            lines.append(f"{key}: {expected.get(key)!r} -> {actual.get(key)!r}")
    before, after = expected.get("operations", {}), actual.get("operations", {})
    for name in sorted(before.keys() - after.keys()):
        lines.append(f"operation removed: {name} ({before[name].get('operationId')})")
    for name in sorted(after.keys() - before.keys()):
        lines.append(f"operation added: {name} ({after[name].get('operationId')})")
    for name in sorted(before.keys() & after.keys()):
        for field_name in sorted(before[name].keys() | after[name].keys()):
            old, new = before[name].get(field_name), after[name].get(field_name)
            if old != new:
                lines.append(f"{name}: {field_name} {old!r} -> {new!r}")
    for key in ("schemas", "securitySchemes"):
        old_names, new_names = set(expected.get(key, [])), set(actual.get(key, []))
        lines += [f"{key} removed: {name}" for name in sorted(old_names - new_names)]
        lines += [f"{key} added: {name}" for name in sorted(new_names - old_names)]
    if not lines and dict(expected) != dict(actual):
        lines.append("snapshots differ (order or an unknown member)")
    return lines
