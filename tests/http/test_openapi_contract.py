"""The OpenAPI 3.1 document as a contract: valid, snapshotted, self-consistent, and served by the app."""

from __future__ import annotations

import copy
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import jsonschema
import pytest
from fastapi import Depends, FastAPI
from fastapi.security import APIKeyHeader, HTTPBearer
from fastapi.testclient import TestClient
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.versions.shortcuts import get_spec_version
from pydantic import BaseModel

from gasless.compat.rendering import compat_status, is_compat_path
from gasless.core.errors import CATALOGUE, PROBLEM_MEDIA_TYPE
from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.http.openapi import (
    SNAPSHOT_REFRESH,
    build_document,
    contract_snapshot,
    install_openapi,
    snapshot_differences,
)

SNAPSHOT = Path(__file__).parent / "openapi_snapshot.json"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# The only error-status answers that are not problem documents: readiness answers 503 with its Health.
NOT_PROBLEMS = {("getReadiness", "503")}
CACHED_READS = (
    "getNetwork",
    "getRelayStatus",
    "getIntent",
    "getIntentByTxHash",
    "listAccountSenders",
    "getAccount",
    "getQuota",
    "listAccountPurchases",
    "listIncidents",
    "getIncident",
    "getPricing",
    "getTariffHistory",
    "listRelayers",
    "getRelayer",
)
# The public names of request and response shapes of the implemented operations (a rename is a contract change).
CONTRACT_SCHEMAS = {
    "PricingDocument",
    "NotificationPrefs",
    "NotificationPrefsUpdate",
    "Intent",
    "Assignment",
    "AssignRequest",
    "RelayRequest",
    "RelayResponse",
    "RelayQuote",
    "QuoteRelayRequest",
    "ValidateRequest",
    "ValidateResponse",
    "Problem",
    "Health",
    "Network",
    "Account",
    "Quota",
    "UsageProof",
    "UsageRow",
    "Incident",
    "PrepareSubscribeRequest",
    "PrepareDepositRequest",
    "PrepareFlagsRequest",
    "PrepareSendersRequest",
    "PreparedPurchase",
    "PreparedTransaction",
    "PreparedTransactions",
    "X402Descriptor",
    "X402Supported",
    "X402TopupRequest",
    "X402PurchaseRequest",
    "X402PurchaseResult",
    "X402Pending",
    "RelayerRegistry",
    "RelayerPublicDetail",
    "Status",
    # Data conventions: the schemas every identifier refers to.
    "Address",
    "TxHash",
    "IntentId",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    # Nothing answers on the gateway port: the document needs no network, and no lifespan runs here.
    return create_app(Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{free_port()}"]))


@pytest.fixture
def document(app: FastAPI) -> dict[str, Any]:
    return app.openapi()


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local references are used: {ref}"
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve (at {part!r})"
        node = node[part]
    return node


def refs_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs_in(value)


# 1. Validity ---------------------------------------------------------------------------------------------
def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == "1.0.0-draft.1"
    assert str(get_spec_version(document)) == "OpenAPIV3.1"
    validate(document)
    assert list(OpenAPIV31SpecValidator(document).iter_errors()) == []


def test_served_document_is_the_built_one_and_is_cached(app: FastAPI, document: dict[str, Any]) -> None:
    client = TestClient(app)
    first = client.get("/openapi.json")
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/json"
    assert first.headers["Relay-Request-Id"].startswith("req_")
    assert first.json() == json.loads(json.dumps(document))
    assert app.openapi() is document  # built once
    assert client.get("/openapi.json").content == first.content


def test_apps_with_the_same_routes_share_one_generation_and_a_new_chain_gets_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gasless.http import openapi

    generated: list[str] = []
    generate = openapi._generate

    def counted(app: FastAPI, *args: Any) -> dict[str, Any]:
        generated.append(app.title)
        return generate(app, *args)

    monkeypatch.setattr(openapi, "_generate", counted)
    monkeypatch.setattr(openapi, "_BUILT", {})
    gateway = [f"http://127.0.0.1:{free_port()}"]
    first = create_app(Settings(data_dir=tmp_path / "a", gateway_urls=gateway)).openapi()
    second = create_app(Settings(data_dir=tmp_path / "b", gateway_urls=gateway)).openapi()
    assert len(generated) == 1 and second == first
    second["info"]["title"] = "changed"  # each app holds its own copy
    again = create_app(Settings(data_dir=tmp_path / "c", gateway_urls=gateway)).openapi()
    assert again == first and again["info"]["title"] == "gasless"
    mainnet = create_app(
        Settings(data_dir=tmp_path / "d", profile="mainnet", master_secret="m" * 32)
    ).openapi()
    assert len(generated) == 2
    chain_ids = {
        d["components"]["schemas"]["Transaction"]["properties"]["chainID"]["const"] for d in (first, mainnet)
    }
    assert chain_ids == {"localnet", "1"}


# 2. Snapshot ---------------------------------------------------------------------------------------------
def test_contract_matches_the_committed_snapshot(document: dict[str, Any]) -> None:
    expected = json.loads(SNAPSHOT.read_text())
    actual = contract_snapshot(document)
    changes = snapshot_differences(expected, actual)
    assert not changes and expected == actual, (
        "The OpenAPI contract changed:\n  "
        + "\n  ".join(changes)
        + f"\nIf the change is intended, refresh the snapshot with `{SNAPSHOT_REFRESH}` "
        f"and commit {SNAPSHOT.name} with it."
    )


@pytest.mark.parametrize(
    "mutate, expected_line",
    [
        (
            lambda s: s["operations"].pop("GET /v1/tx/{hash}"),
            "operation removed: GET /v1/tx/{hash} (getIntentByTxHash)",
        ),
        (
            lambda s: s["operations"].__setitem__("GET /v1/new", {"operationId": "getNew"}),
            "operation added: GET /v1/new (getNew)",
        ),
        (
            lambda s: s["operations"]["GET /v1/relay/{id}"].__setitem__("operationId", "getRelay"),
            "GET /v1/relay/{id}: operationId 'getRelayStatus' -> 'getRelay'",
        ),
        (
            lambda s: s["operations"]["POST /v1/relay"]["responses"].remove("402"),
            "POST /v1/relay: responses",
        ),
        (lambda s: s["schemas"].remove("Intent"), "schemas removed: Intent"),
        (lambda s: s["schemas"].append("IntentV2"), "schemas added: IntentV2"),
        (lambda s: s["securitySchemes"].remove("x402"), "securitySchemes removed: x402"),
        (lambda s: s.__setitem__("version", "1.0.0"), "version: '1.0.0-draft.1' -> '1.0.0'"),
    ],
)
def test_snapshot_comparison_reports_every_kind_of_change(
    document: dict[str, Any], mutate: Any, expected_line: str
) -> None:
    committed = contract_snapshot(document)
    changed = copy.deepcopy(committed)
    mutate(changed)  # what a change of the code would produce
    changes = snapshot_differences(committed, changed)
    assert any(line.startswith(expected_line) for line in changes), changes
    assert snapshot_differences(committed, copy.deepcopy(committed)) == []


# 3. References and problem responses ----------------------------------------------------------------------
def test_every_ref_resolves(document: dict[str, Any]) -> None:
    refs = set(refs_in(document))
    assert "#/components/schemas/Problem" in refs and "#/components/headers/RelayRequestId" in refs
    for ref in refs:
        resolve(document, ref)


def test_every_error_response_is_a_problem_document(document: dict[str, Any]) -> None:
    exceptions = set()
    for path, method, operation in operations(document):
        for status, response in operation["responses"].items():
            assert status.isdigit(), f"{method} {path}: only explicit statuses, got {status}"
            if int(status) < 400:
                continue
            if (operation["operationId"], status) in NOT_PROBLEMS:
                exceptions.add((operation["operationId"], status))
                continue
            assert response["content"] == {
                PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}
            }, f"{method.upper()} {path} {status}"
    assert exceptions == NOT_PROBLEMS
    ready_503 = document["paths"]["/readyz"]["get"]["responses"]["503"]
    assert ready_503["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Health"}


def test_no_fastapi_validation_error_is_documented(document: dict[str, Any]) -> None:
    assert not {"HTTPValidationError", "ValidationError"} & set(document["components"]["schemas"])
    assert "HTTPValidationError" not in json.dumps(document)
    for path, _method, operation in operations(document):
        if "422" in operation["responses"]:
            # 422 only where the catalogue has a 422 code for the route (never a schema failure).
            assert operation["operationId"] in (
                "relayTransaction",
                "quoteRelay",
                "assignRelayer",
                "createWebhook",  # WEBHOOK_URL_NOT_ALLOWED, IDEMPOTENCY_KEY_REUSED
                "updateWebhook",  # WEBHOOK_URL_NOT_ALLOWED
                "testWebhook",  # IDEMPOTENCY_KEY_REUSED
                "prepareSubscribe",  # TIER_NOT_PURCHASABLE, DEPOSIT_BELOW_MIN, DEPOSIT_ABOVE_MAX
                "prepareDeposit",  # DEPOSIT_BELOW_MIN, DEPOSIT_ABOVE_MAX
                "x402Topup",  # the deposit bounds, INSUFFICIENT_SENDER_BALANCE (on the challenge)
                "x402Purchase",  # and TIER_NOT_PURCHASABLE
            ), path


def test_listed_codes_belong_to_their_status(document: dict[str, Any]) -> None:
    for path, method, operation in operations(document):
        for status, response in operation["responses"].items():
            for code in response.get("x-error-codes", []):
                assert code in CATALOGUE, f"{method} {path}: {code}"
                expected = CATALOGUE[code].status
                if is_compat_path(path):  # the facade answers the kit's statuses (docs/compat.md)
                    expected = compat_status(code, expected)
                assert expected == int(status), f"{method} {path} {status}: {code}"


def test_every_operation_documents_malformed_input_and_internal_failure(document: dict[str, Any]) -> None:
    for path, method, operation in operations(document):
        responses = operation["responses"]
        if is_compat_path(path):
            # The frozen facade answers only the kit's statuses (docs/compat.md): an invalid address is 404,
            # a body too large is 400, and 503-class conditions are 500.
            assert set(responses) <= {"200", "400", "403", "404", "429", "500"}, f"{method} {path}"
            assert "INTERNAL" in responses["500"]["x-error-codes"], f"{method} {path}"
            continue
        # Input that can be malformed: anything but If-None-Match (any string is a valid list of tags).
        inputs = [p for p in operation.get("parameters", []) if p["name"] != "If-None-Match"]
        assert "MALFORMED_REQUEST" in responses.get("400", {}).get("x-error-codes", []) or not (
            inputs or "requestBody" in operation
        ), f"{method} {path}: input without 400"
        assert responses["500"]["x-error-codes"] == ["INTERNAL"], f"{method} {path}"
        if "requestBody" in operation:
            assert responses["413"]["x-error-codes"] == ["PAYLOAD_TOO_LARGE"], f"{method} {path}"
        if path.startswith("/v1/"):
            assert "RATE_LIMITED" in responses["429"]["x-error-codes"], f"{method} {path}"


def test_problem_schema_is_the_catalogue(document: dict[str, Any]) -> None:
    problem = document["components"]["schemas"]["Problem"]
    assert problem["properties"]["code"]["enum"] == list(CATALOGUE)
    assert {"type", "title", "status", "detail", "instance", "code", "details"} <= set(problem["properties"])
    assert problem["properties"]["details"]["type"] == "object"


def test_rendered_problems_match_the_problem_schema(app: FastAPI, document: dict[str, Any]) -> None:
    problem = document["components"]["schemas"]["Problem"]
    client = TestClient(app)
    answers = [
        client.get("/v1/nothing-here"),  # NOT_FOUND
        client.get("/v1/intents/erd1x/-1"),  # MALFORMED_REQUEST from FastAPI's validation
        client.get("/v1/relay/" + "ab" * 32),  # UPSTREAM_UNAVAILABLE: this host never becomes ready
    ]
    assert [a.status_code for a in answers] == [404, 400, 503]
    for answer in answers:
        assert answer.headers["content-type"] == PROBLEM_MEDIA_TYPE
        jsonschema.validate(answer.json(), problem)


# Security and headers -------------------------------------------------------------------------------------
def test_security_schemes_and_requirements(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes["nativeAuth"] == {**schemes["nativeAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"] == {**schemes["apiKey"], "type": "apiKey", "in": "header", "name": "X-Api-Key"}
    assert schemes["x402"] == {
        **schemes["x402"],
        "type": "apiKey",
        "in": "header",
        "name": "PAYMENT-SIGNATURE",
    }
    by_id = {operation["operationId"]: operation for _, _, operation in operations(document)}
    assert by_id["relayTransaction"]["security"] == [{}, {"apiKey": []}]
    assert by_id["assignRelayer"]["security"] == [{}, {"nativeAuth": []}]
    native_auth_only = {"getMe", "listApiKeys", "createApiKey", "updateApiKey", "revokeApiKey"} | {
        "listWebhooks",
        "createWebhook",
        "getWebhook",
        "updateWebhook",
        "deleteWebhook",
        "testWebhook",
        "rotateWebhookSecret",
        "listWebhookDeliveries",
        "getNotificationPrefs",
        "putNotificationPrefs",
    }
    assert all(by_id[op_id]["security"] == [{"nativeAuth": []}] for op_id in native_auth_only)
    # Streams: native-auth or a read key; the account stream also opens with a query ticket (no header).
    assert by_id["createStreamTicket"]["security"] == [{"nativeAuth": []}, {"apiKey": []}]
    assert by_id["streamAccountEvents"]["security"] == [{"nativeAuth": []}, {"apiKey": []}, {}]
    streams = {"createStreamTicket", "streamAccountEvents"}
    # Dashboard reads: native-auth or a sponsor key used as a read key.
    dashboard = {
        "listUsage",
        "getUsageRow",
        "getUsageSummary",
        "getUsageProof",
        "getUsageLatency",
        "listAccountRelayers",
        "listAccountOutages",
        "listNotices",
        "ackNotices",
    }
    assert all(by_id[op_id]["security"] == [{"nativeAuth": []}, {"apiKey": []}] for op_id in dashboard)
    # The x402 paid routes: the payment header, optional (an unpaid request is the flow's first step,
    # answered with the 402 challenge).
    paid = {"x402Topup", "x402Purchase"}
    assert all(by_id[op_id]["security"] == [{}, {"x402": []}] for op_id in paid)
    public = (
        set(by_id) - {"relayTransaction", "assignRelayer"} - native_auth_only - streams - dashboard - paid
    )
    assert public and all(by_id[op_id]["security"] == [] for op_id in public)
    for op_id, operation in by_id.items():
        headers = {p["name"].lower() for p in operation.get("parameters", []) if p["in"] == "header"}
        assert not headers & {"authorization", "x-api-key", "payment-signature"}, op_id


def test_response_headers(document: dict[str, Any]) -> None:
    for _path, _method, operation in operations(document):
        op_id = operation["operationId"]
        for status, response in operation["responses"].items():
            headers = response["headers"]
            assert headers["Relay-Request-Id"] == {"$ref": "#/components/headers/RelayRequestId"}
            if status == "429":
                assert {"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= set(
                    headers
                ), f"{op_id} 429"
            if status == "402":
                codes = set(response["x-error-codes"])
                # A challenge carries PAYMENT-REQUIRED; a settlement failure carries PAYMENT-RESPONSE.
                assert ("PAYMENT-REQUIRED" in headers) == bool(
                    codes & {"NO_ENTITLEMENT", "PAYMENT_REQUIRED", "INSUFFICIENT_CREDITS"}
                ), op_id
                assert ("PAYMENT-RESPONSE" in headers) == bool(
                    codes & {"PAYMENT_FAILED", "PAYMENT_INVALID"}
                ), op_id
                assert "PAYMENT-REQUIRED" in headers or "PAYMENT-RESPONSE" in headers, op_id
            cached = op_id in CACHED_READS
            if status == "200":
                assert ({"Cache-Control", "ETag"} <= set(headers)) is cached, op_id
            if status == "304":
                assert cached and "content" not in response, op_id
                assert {"Cache-Control", "ETag"} <= set(headers), op_id
        if op_id in CACHED_READS:
            assert "304" in operation["responses"], op_id
            names = [p["name"] for p in operation["parameters"] if p["in"] == "header"]
            assert "If-None-Match" in names, op_id
    assert document["components"]["headers"]["RelayRequestId"]["required"] is True


def test_event_stream_is_documented_as_text_event_stream(document: dict[str, Any]) -> None:
    ok = document["paths"]["/v1/relay/{id}/events"]["get"]["responses"]["200"]
    assert list(ok["content"]) == ["text/event-stream"]
    event = ok["content"]["text/event-stream"]["schema"]  # OpenAPI 3.1: the schema of one event
    assert event["properties"]["event"]["enum"] == ["intent"]
    assert event["properties"]["data"] == {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"$ref": "#/components/schemas/Intent"},
    }
    parameters = document["paths"]["/v1/relay/{id}/events"]["get"]["parameters"]
    assert {"name": "Last-Event-ID", "in": "header"}.items() <= parameters[1].items()
    assert parameters[1]["schema"]["type"] == "string"  # absent, never null


# Names and success shapes ---------------------------------------------------------------------------------
def test_schema_names_and_success_responses_are_the_contracts(document: dict[str, Any]) -> None:
    assert CONTRACT_SCHEMAS <= set(document["components"]["schemas"])
    by_id = {operation["operationId"]: operation for _, _, operation in operations(document)}

    def ok_schema(op_id: str, status: str = "200") -> Any:
        return by_id[op_id]["responses"][status]["content"]["application/json"]["schema"]

    def body_schema(op_id: str) -> Any:
        return by_id[op_id]["requestBody"]["content"]["application/json"]["schema"]

    ref = "#/components/schemas/"
    assert (
        ok_schema("relayTransaction")
        == ok_schema("relayTransaction", "202")
        == {"$ref": ref + "RelayResponse"}
    )
    assert ok_schema("assignRelayer") == {"$ref": ref + "Assignment"}
    for op_id in ("getRelayStatus", "getIntent", "getIntentByTxHash"):
        assert ok_schema(op_id) == {"$ref": ref + "Intent"}
    assert ok_schema("quoteRelay") == {"$ref": ref + "RelayQuote"}
    assert ok_schema("validateTransaction") == {"$ref": ref + "ValidateResponse"}
    assert ok_schema("getNetwork") == {"$ref": ref + "Network"}
    assert ok_schema("getHealth") == ok_schema("getReadiness") == {"$ref": ref + "Health"}
    assert body_schema("relayTransaction") == {"$ref": ref + "RelayRequest"}
    assert body_schema("assignRelayer") == {"$ref": ref + "AssignRequest"}
    assert body_schema("quoteRelay") == {"$ref": ref + "QuoteRelayRequest"}
    assert body_schema("validateTransaction") == {"$ref": ref + "ValidateRequest"}
    assert ok_schema("getUsageRow") == {"$ref": ref + "UsageRow"}
    assert document["components"]["schemas"]["RelayRequest"]["additionalProperties"] is False


# Formats: identifiers by reference, every integer with its range ---------------------------------------------
def test_identifier_schemas_carry_their_patterns(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["Address"]["pattern"] == "^erd1[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{58}$"
    assert schemas["TxHash"]["pattern"] == "^[0-9a-fA-F]{64}$"
    intent_id = schemas["IntentId"]["pattern"]
    assert intent_id.startswith(schemas["Address"]["pattern"][:-1] + ":")
    nonce = re.compile(intent_id)
    address = "erd1" + "q" * 58
    for value, valid in ((0, True), (2**63 - 1, True), (2**63, False), (10**19, False)):
        assert bool(nonce.fullmatch(f"{address}:{value}")) is valid, value
    assert not nonce.fullmatch(f"{address}:01")


def test_identifiers_are_documented_by_reference(document: dict[str, Any]) -> None:
    """Wherever an address, a hash or an intent id appears as a parameter, the parameter refers to the
    document's shared schema (so its pattern is the one place that says what is accepted)."""
    by_name = {
        "erd": "Address",
        "sender": "Address",
        "relayer": "Address",
        "account": "Address",
        "hash": "TxHash",
        "txHash": "TxHash",
    }
    ref = "#/components/schemas/"
    seen = set()
    for path, method, operation in operations(document):
        for parameter in operation.get("parameters", []):
            name, schema = parameter["name"], parameter["schema"]
            if name in by_name:
                assert schema["$ref"] == ref + by_name[name], f"{method} {path} {name}: {schema}"
                seen.add(name)
            if name == "id":
                assert schema["anyOf"] == [{"$ref": ref + "IntentId"}, {"$ref": ref + "TxHash"}], path
                seen.add(name)
    assert seen == {*by_name, "id"}
    schemas = document["components"]["schemas"]
    members = [
        ("AssignRequest", "sender", "Address"),
        ("StreamTicketCreate", "account", "Address"),
        ("SignedTransaction", "sender", "Address"),
        ("SignedTransaction", "receiver", "Address"),
        ("SignedTransaction", "relayer", "Address"),
        ("Transaction", "sender", "Address"),
        ("Intent", "id", "IntentId"),
        ("Intent", "sender", "Address"),
        ("RelayResponse", "id", "IntentId"),
        ("RelayResponse", "txHash", "TxHash"),
        ("RelayResponse", "relayer", "Address"),
        ("Assignment", "relayer", "Address"),
        ("UsageRow", "id", "IntentId"),
    ]
    for schema, member, target in members:
        assert schemas[schema]["properties"][member]["$ref"] == ref + target, (schema, member)
    assert schemas["RelayRequest"]["properties"]["tx"] == {"$ref": ref + "SignedTransaction"}
    assert schemas["QuoteRelayRequest"]["properties"]["tx"] == {"$ref": ref + "Transaction"}


def _request_schemas(document: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every schema a request carries (parameters and bodies), with the components they refer to."""
    for path, method, operation in operations(document):
        for parameter in operation.get("parameters", []):
            yield f"{method} {path} {parameter['name']}", parameter["schema"]
        for media in operation.get("requestBody", {}).get("content", {}).values():
            yield f"{method} {path} body", media["schema"]


def _integers(document: dict[str, Any], node: Any, where: str, seen: set[str]) -> Iterator[tuple[str, Any]]:
    if isinstance(node, list):
        for item in node:
            yield from _integers(document, item, where, seen)
    elif isinstance(node, dict):
        if "$ref" in node and node["$ref"] not in seen:
            seen.add(node["$ref"])
            yield from _integers(document, resolve(document, node["$ref"]), node["$ref"], seen)
        if node.get("type") == "integer":
            yield where, node
        for key, value in node.items():
            if key != "$ref":
                yield from _integers(document, value, f"{where}.{key}", seen)


def test_every_integer_a_request_carries_has_a_range(document: dict[str, Any]) -> None:
    found = 0
    for where, schema in _request_schemas(document):
        for place, integer in _integers(document, schema, where, set()):
            found += 1
            if "enum" in integer:
                continue
            assert isinstance(integer.get("minimum"), int), f"{place}: {integer}"
            assert isinstance(integer.get("maximum"), int), f"{place}: {integer}"
            # int64 at most (the database's columns), except a gas limit or price: uint64 as on the network,
            # and refused above the network's ceiling (422) before anything is stored.
            ceiling = 2**64 - 1 if place.endswith((".gasLimit", ".gasPrice")) else 2**63 - 1
            assert integer["maximum"] <= ceiling, f"{place}: {integer}"
    assert found >= 20


# Routes added later ---------------------------------------------------------------------------------------
class Thing(BaseModel):
    name: str


BEARER = HTTPBearer(auto_error=False)
SPONSOR_KEY = APIKeyHeader(name="X-Api-Key")
OTHER_KEY = APIKeyHeader(name="X-Other-Key")
# FastAPI names a generated scheme by its class: two APIKeyHeader instances need their own scheme_name.
PAYMENT = APIKeyHeader(name="PAYMENT-SIGNATURE", scheme_name="x402")


def test_a_route_added_later_gets_the_default_contract(app: FastAPI) -> None:
    @app.post("/v1/things/{thing}", operation_id="putThing", response_model=Thing)
    async def put_thing(thing: str, body: Thing, token: Annotated[Any, Depends(BEARER)]) -> Thing:
        return body

    @app.get("/v1/keys-only", operation_id="keysOnly", responses={409: {"description": "taken"}})
    async def keys_only(key: Annotated[Any, Depends(SPONSOR_KEY)]) -> dict[str, str]:
        return {}

    @app.post("/v1/paid", operation_id="paidThing", status_code=200)
    async def paid(body: Thing, payment: Annotated[Any, Depends(PAYMENT)]) -> Thing:
        return body

    document = app.openapi()
    validate(document)
    by_id = {operation["operationId"]: operation for _, _, operation in operations(document)}
    paid_op = by_id["paidThing"]
    assert paid_op["security"] == [{"x402": []}]
    assert paid_op["responses"]["402"]["x-error-codes"] == [
        "PAYMENT_REQUIRED",
        "PAYMENT_INVALID",
        "PAYMENT_FAILED",
    ]
    assert "PAYMENT-REQUIRED" in paid_op["responses"]["402"]["headers"]
    put = by_id["putThing"]
    assert put["security"] == [{"nativeAuth": []}]
    assert sorted(put["responses"]) == ["200", "400", "401", "403", "404", "413", "429", "500", "503"]
    assert put["responses"]["401"]["x-error-codes"] == ["UNAUTHENTICATED", "TOKEN_INVALID", "TOKEN_EXPIRED"]
    assert put["responses"]["413"]["content"][PROBLEM_MEDIA_TYPE]["schema"] == {
        "$ref": "#/components/schemas/Problem"
    }
    keys = by_id["keysOnly"]
    assert keys["security"] == [{"apiKey": []}]
    assert keys["responses"]["401"]["x-error-codes"] == ["API_KEY_INVALID"]
    assert keys["responses"]["409"]["content"][PROBLEM_MEDIA_TYPE]  # its own status, as a problem
    assert set(document["components"]["securitySchemes"]) == {"nativeAuth", "apiKey", "x402"}
    assert "Thing" in document["components"]["schemas"]


def test_a_security_scheme_outside_the_three_is_refused() -> None:
    app = FastAPI(openapi_url=None)

    @app.get("/v1/basic", operation_id="basic")
    async def basic(key: Annotated[Any, Depends(OTHER_KEY)]) -> dict[str, str]:
        return {}

    install_openapi(app)
    with pytest.raises(ValueError, match="APIKeyHeader"):
        build_document(app)
