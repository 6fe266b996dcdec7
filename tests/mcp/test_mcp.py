"""The MCP server through the SDK's own client, over streamable HTTP (`/mcp` on a real host) and over stdio
(a real `gasless mcp` process): tools and resources, validation, batches of 16 to finality, mixed and
oversized batches, `relay://pricing` byte for byte as `GET /v1/pricing`, tool errors as problem documents
(arguments of the wrong shape included), typed schemas, and `gasless mcp` started before its API."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import requests
from mcp import Client
from relay_kit import ServedApi, unthrottled_limits  # type: ignore[import-not-found]

from gasless.core.errors import CATALOGUE
from gasless.hosting.app import create_app
from gasless.mcp.schemas import STANDARD_FORMATS

TOOLS = {"validate_transaction", "relay_batch", "assign_relayer", "quote", "get_intent", "get_network"}


def run(coroutine: Any) -> Any:
    return anyio.run(lambda: coroutine)


async def _session(transport: Any, work: Any) -> Any:
    async with Client(transport) as client:
        return await work(client)


def with_client(transport: Any, work: Any) -> Any:
    return anyio.run(_session, transport, work)


def body(tx: Any, lease: str) -> dict[str, Any]:
    return {"tx": tx.to_dictionary(), "lease": lease}


def problem_of(result: Any, code: str) -> dict[str, Any]:
    """A tool error: `isError`, no structured content, its text the RFC 9457 problem document of `code`."""
    assert result.is_error, result
    assert result.structured_content is None, result
    problem = json.loads(result.content[0].text)
    assert problem["code"] == code, problem
    assert problem["status"] == CATALOGUE[code].status
    assert problem["type"].endswith("/errors/" + CATALOGUE[code].slug) and problem["title"]
    assert problem["instance"].startswith("req_"), problem
    return dict(problem)


# The keywords that constrain a value (JSON Schema 2020-12), as MCP hosts' schema linters count them.
CONSTRAINING = {
    *("type", "enum", "const", "pattern", "format", "minimum", "maximum", "minLength", "maxLength"),
    *("items", "prefixItems", "minItems", "maxItems", "properties", "required", "additionalProperties"),
    *("anyOf", "oneOf", "allOf", "not", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}


def untyped_nodes(schema: Any, path: str = "") -> list[str]:
    """Every schema node of `schema` that accepts any value, every `$ref`, every format of our own."""
    found: list[str] = []
    if not isinstance(schema, dict):
        return [f"{path}: {schema!r} is not a schema object"]
    if not CONSTRAINING & set(schema):
        found.append(f"{path}: no type")
    if "$ref" in schema:
        found.append(f"{path}: $ref")
    if isinstance(schema.get("format"), str) and schema["format"] not in STANDARD_FORMATS:
        found.append(f"{path}: format {schema['format']}")
    for key in ("properties", "patternProperties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            found += untyped_nodes(sub, f"{path}.{key}.{name}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for index, sub in enumerate(schema.get(key, [])):
            found += untyped_nodes(sub, f"{path}.{key}[{index}]")
    for key in ("items", "not", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += untyped_nodes(schema[key], f"{path}.{key}")
    return found


async def assign(client: Any, env: Any, sender: Any) -> dict[str, Any]:
    result = await client.call_tool(
        "assign_relayer", {"request": {"sender": sender.address, "proof": env.proof(sender)}}
    )
    assert not result.is_error, result
    return dict(result.structured_content)


def test_tools_and_resources_are_listed_with_the_routes_schemas(transport: Any, api: Any) -> None:
    served, _ = api

    async def work(client: Any) -> Any:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        resources = {str(r.uri): r for r in (await client.list_resources()).resources}
        return tools, resources

    tools, resources = with_client(transport, work)
    assert set(tools) == TOOLS
    assert set(resources) == {"relay://pricing", "relay://errors"}
    # The input schema of validate_transaction is the route's request schema from the OpenAPI document.
    document = requests.get(f"{served.url}/openapi.json", timeout=5).json()
    validate_body = document["paths"]["/v1/validate"]["post"]["requestBody"]["content"]["application/json"]
    assert "tx" in tools["validate_transaction"].input_schema["properties"]["request"]["properties"]
    assert validate_body["schema"]  # documented there too
    batch = tools["relay_batch"].input_schema["properties"]["requests"]
    assert batch["maxItems"] == 16 and batch["minItems"] == 1 and "$ref" not in json.dumps(batch)
    assert tools["get_intent"].output_schema["properties"]["state"]


def test_every_schema_node_is_typed(transport: Any, api: Any) -> None:
    """Inputs and outputs: no node that accepts anything, no `$ref`, no format a validator does not know;
    the output schemas are the routes' success schemas, their Address/TxHash/IntentId members with their
    patterns."""

    async def work(client: Any) -> Any:
        return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = with_client(transport, work)
    for name, tool in tools.items():
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", name
        assert untyped_nodes(tool.input_schema, f"{name}.input") == []
        assert untyped_nodes(tool.output_schema, f"{name}.output") == []
    validate_request = tools["validate_transaction"].input_schema["properties"]["request"]["properties"]
    assert {"type": "string", "minLength": 1, "maxLength": 2048} in validate_request["lease"]["anyOf"]
    assert {"type": "null"} in validate_request["intentKey"]["anyOf"]
    intent = tools["get_intent"].output_schema["properties"]
    assert intent["id"]["pattern"].startswith("^erd1") and intent["sender"]["pattern"].startswith("^erd1")
    assert intent["txHash"]["anyOf"][0]["pattern"] == "^[0-9a-fA-F]{64}$"
    assert tools["assign_relayer"].output_schema["properties"]["relayer"]["type"] == "string"
    outcome = tools["relay_batch"].output_schema["properties"]["results"]["items"]
    assert outcome["properties"]["problem"]["properties"]["code"]["enum"] == list(CATALOGUE)
    assert outcome["properties"]["relay"]["required"] == [
        "id",
        "txHash",
        "state",
        "duplicate",
        "relayer",
        "intent",
        "billing",
    ]


def test_validate_a_bad_transaction(transport: Any, api: Any) -> None:
    _, env = api
    sender = env.new_sender()

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, sender)
        tx = env.build(sender, assignment)
        tx.signature = b"\x01" * 64  # not the sender's signature
        bad = await client.call_tool("validate_transaction", {"request": body(tx, assignment["lease"])})
        malformed = await client.call_tool("validate_transaction", {"request": {"tx": "not an object"}})
        return bad, malformed

    bad, malformed = with_client(transport, work)
    assert not bad.is_error and bad.structured_content["ok"] is False
    assert [p["code"] for p in bad.structured_content["problems"]] == ["SENDER_SIGNATURE_INVALID"]
    assert json.loads(bad.content[0].text) == bad.structured_content  # the same JSON as text
    problem_of(malformed, "MALFORMED_REQUEST")


def test_arguments_of_the_wrong_shape_are_problem_documents(transport: Any, api: Any) -> None:
    """What the tool's input schema refuses never reaches a route: MALFORMED_REQUEST naming the argument."""

    async def work(client: Any) -> Any:
        calls = {
            "request": ("validate_transaction", {"request": "not an object"}),
            "missing": ("validate_transaction", {}),
            "requests": ("relay_batch", {"requests": {"tx": {}}}),
            "id": ("get_intent", {"id": 7}),
            "quote": ("quote", {"request": ["a", "list"]}),
        }
        answers = {label: await client.call_tool(tool, args) for label, (tool, args) in calls.items()}
        answers["unknown"] = await client.call_tool("relay_everything", {})
        return answers

    answers = with_client(transport, work)
    fields = {
        label: problem_of(answers[label], "MALFORMED_REQUEST") for label in answers if label != "unknown"
    }
    assert {label: p["details"]["field"] for label, p in fields.items()} == {
        "request": "request",
        "missing": "request",
        "requests": "requests",
        "id": "id",
        "quote": "request",
    }
    assert "https://errors.pydantic.dev" not in json.dumps(fields)
    assert "Field required" in fields["missing"]["detail"]
    unknown = problem_of(answers["unknown"], "NOT_FOUND")
    assert "relay_batch" in unknown["detail"]  # the tools it does have


def test_a_batch_of_16_relays_to_finality(transport: Any, api: Any) -> None:
    served, env = api
    sender = env.new_sender()

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, sender)
        requests_ = [body(env.build(sender, assignment, nonce=n), assignment["lease"]) for n in range(16)]
        return await client.call_tool("relay_batch", {"requests": requests_})

    result = with_client(transport, work)
    assert not result.is_error, result
    outcome = result.structured_content
    assert outcome["relayed"] == 16 and outcome["refused"] == 0
    assert [r["index"] for r in outcome["results"]] == list(range(16))
    ids = [r["relay"]["id"] for r in outcome["results"]]
    assert ids == [f"{sender.address}:{n}" for n in range(16)]

    async def finalized(client: Any) -> list[str]:
        deadline = time.monotonic() + 30
        while True:
            states = []
            for ident in ids:
                intent = await client.call_tool("get_intent", {"id": ident})
                states.append(intent.structured_content["state"])
            if set(states) == {"FINALIZED"} or time.monotonic() > deadline:
                return states
            await anyio.sleep(0.2)

    assert with_client(transport, finalized) == ["FINALIZED"] * 16
    assert requests.get(f"{served.url}/v1/relay/{ids[-1]}", timeout=5).json()["outcome"] == "success"


def test_a_mixed_batch_answers_each_transaction(transport: Any, api: Any) -> None:
    _, env = api
    sender, stranger = env.new_sender(), env.new_sender(plan=False)

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, sender)
        other = await assign(client, env, stranger)
        bad_signature = env.build(sender, assignment, nonce=1)
        bad_signature.signature = b"\x02" * 64
        batch = [
            body(env.build(sender, assignment, nonce=0), assignment["lease"]),
            body(bad_signature, assignment["lease"]),
            body(env.build(stranger, other), other["lease"]),  # no plan: NO_ENTITLEMENT
            {"tx": {"nonce": 1}},
        ]
        return await client.call_tool("relay_batch", {"requests": batch})

    result = with_client(transport, work)
    assert not result.is_error
    outcome = result.structured_content
    assert outcome["relayed"] == 1 and outcome["refused"] == 3
    first, second, third, fourth = outcome["results"]
    assert first["status"] in (200, 202) and first["relay"]["duplicate"] is False
    assert second["status"] == 422 and second["problem"]["code"] == "SENDER_SIGNATURE_INVALID"
    assert third["status"] == 402 and third["problem"]["code"] == "NO_ENTITLEMENT"
    assert fourth["status"] == 400 and fourth["problem"]["code"] == "MALFORMED_REQUEST"


def test_a_batch_of_17_is_refused_whole(transport: Any, api: Any) -> None:
    served, env = api
    sender = env.new_sender()

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, sender)
        batch = [body(env.build(sender, assignment, nonce=n), assignment["lease"]) for n in range(17)]
        empty = await client.call_tool("relay_batch", {"requests": []})
        return await client.call_tool("relay_batch", {"requests": batch}), empty

    result, empty = with_client(transport, work)
    assert problem_of(result, "MALFORMED_REQUEST")["details"] == {
        "field": "requests",
        "limit": 16,
        "actual": 17,
    }
    assert problem_of(empty, "MALFORMED_REQUEST")["details"]["actual"] == 0
    # Nothing was relayed: not even the first of the 17.
    assert requests.get(f"{served.url}/v1/intents/{sender.address}/0", timeout=5).status_code == 404


def test_resources_are_the_served_documents(transport: Any, api: Any) -> None:
    served, _ = api

    async def work(client: Any) -> Any:
        pricing = await client.read_resource("relay://pricing")
        errors = await client.read_resource("relay://errors")
        return pricing.contents[0].text, errors.contents[0].text

    pricing, errors = with_client(transport, work)
    assert pricing.encode() == requests.get(f"{served.url}/v1/pricing", timeout=5).content
    catalogue = json.loads(errors)
    codes = {entry["code"] for entry in catalogue["errors"]}
    assert {"NO_ENTITLEMENT", "MALFORMED_REQUEST", "PAYMENT_REQUIRED"} <= codes


def test_quote_and_network_tools(transport: Any, api: Any) -> None:
    _, env = api
    sender = env.new_sender()

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, sender)
        tx = env.build(sender, assignment)
        quote = await client.call_tool("quote", {"request": {"tx": tx.to_dictionary()}})
        network = await client.call_tool("get_network", {})
        missing = await client.call_tool("get_intent", {"id": "ab" * 32})
        return quote, network, missing

    quote, network, missing = with_client(transport, work)
    assert quote.structured_content["ru"] == "1" and not quote.is_error
    assert network.structured_content["chainId"] == "localnet"
    assert problem_of(missing, "NOT_FOUND")["detail"].startswith("no intent")


def sponsor_key(served: Any, owner: Any) -> str:
    """A real sponsor API key of `owner`'s account (native-auth and the per-action signature)."""
    from gasless.client.actions import action_headers
    from gasless.client.keys import UserKey
    from gasless.client.native_auth import make_native_auth_token

    native = requests.get(f"{served.url}/v1/network", timeout=5).json()["nativeAuth"]
    token = make_native_auth_token(
        owner.key, origin=native["origins"][0], block_hash=native["blockHash"], ttl_seconds=600
    )
    raw = json.dumps({"label": "mcp agent"}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    url = f"{served.url}/v1/account/{owner.address}/keys"
    challenge = requests.post(url, data=raw, headers=headers, timeout=10).json()
    signed = action_headers(UserKey(owner.key), "createApiKey", raw, challenge["details"])
    created = requests.post(url, data=raw, headers={**headers, **signed}, timeout=10)
    assert created.status_code == 201, created.text
    return str(created.json()["secret"])


def test_a_sponsor_key_pays_for_relays_made_through_mcp(transport: Any, api: Any) -> None:
    """Mounted: the MCP request's `X-Api-Key`; stdio: `gasless mcp --api-key` (GASLESS_API_KEY)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    served, env = api
    owner, stranger = env.new_sender(), env.new_sender(plan=False)
    secret = sponsor_key(served, owner)
    if isinstance(transport, str):
        http = httpx2.AsyncClient(headers={"X-Api-Key": secret})
        connect: Any = streamable_http_client(transport, http_client=http)
    else:
        transport.env = {**transport.env, "GASLESS_API_KEY": secret}
        connect = transport

    async def work(client: Any) -> Any:
        assignment = await assign(client, env, stranger)
        tx = env.build(stranger, assignment)
        return await client.call_tool("relay_batch", {"requests": [body(tx, assignment["lease"])]})

    result = with_client(connect, work)
    relayed = result.structured_content["results"][0]
    assert relayed["status"] in (200, 202), relayed
    assert relayed["relay"]["billing"]["authMode"] == "api_key"
    assert relayed["relay"]["billing"]["account"] == owner.address


def test_gasless_mcp_starts_before_its_api_and_answers_once_it_does(late_api: Any) -> None:
    """An MCP host starts `gasless mcp` before the API: the server starts anyway, lists its tools, answers
    each call UPSTREAM_UNAVAILABLE (a problem document), and answers for real once the API is up, in the
    same session (the API is probed in the background)."""
    url, serve, stdio = late_api

    async def work(client: Any) -> Any:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        before = await client.call_tool("get_network", {})
        batch = await client.call_tool("relay_batch", {"requests": [{"tx": {}}]})
        errors = await client.read_resource("relay://errors")  # local: answered whatever the API does
        await anyio.to_thread.run_sync(serve)
        deadline = time.monotonic() + 30
        while True:
            after = await client.call_tool("get_network", {})
            if not after.is_error or time.monotonic() > deadline:
                return tools, before, batch, errors, after
            await anyio.sleep(0.1)

    tools, before, batch, errors, after = with_client(stdio, work)
    assert tools == TOOLS
    problem = problem_of(before, "UPSTREAM_UNAVAILABLE")
    assert url in problem["detail"] and 0 < problem["details"]["retryAfterMs"] <= 2_000
    problem_of(batch, "UPSTREAM_UNAVAILABLE")  # the whole batch, not each item
    assert json.loads(errors.contents[0].text)["errors"]
    assert not after.is_error, after
    assert after.structured_content["chainId"] == "localnet"


def test_the_server_is_built_on_the_first_mcp_request_and_its_sessions_end_with_the_host(
    unpaused_localnet: Any, tmp_path: Path
) -> None:
    kit = sys.modules["gasless_tests_relay_conftest"]
    settings = kit.relay_settings(tmp_path, unpaused_localnet)
    served = ServedApi(create_app(settings, route_limits=unthrottled_limits())).start()
    try:
        mcp = served.app.state.host.mcp
        # Ready, serving its routes and its OpenAPI document, and no MCP server yet: start-up never pays for it.
        with urllib.request.urlopen(f"{served.url}/openapi.json", timeout=10) as answer:
            assert answer.status == 200
        assert mcp.server is None

        async def names(client: Any) -> list[str]:
            return [tool.name for tool in (await client.list_tools()).tools]

        assert "relay_batch" in with_client(f"{served.url}/mcp", names)
        assert mcp.server is not None
        assert with_client(f"{served.url}/mcp", names) == with_client(f"{served.url}/mcp", names)
    finally:
        served.stop()
    assert mcp._sessions is not None and mcp._sessions.done() and mcp._sessions.exception() is None
