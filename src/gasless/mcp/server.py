"""The MCP server: tools and resources over the service's own HTTP routes (spec: "An MCP server exposes
tools over the same functions").

Tools answer the route's success document as structured content; a refusal is a tool error whose structured
content is the route's RFC 9457 problem document (with its catalogue `code`). Tool input schemas are the
routes' request schemas from the OpenAPI document, generated from the same pydantic models.

No `from __future__ import annotations` here: the SDK reads the tools' annotations at registration, and
they name schemas built inside `build_mcp_server`.
"""

import json
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote as url_quote

import mcp.types as mcp_types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field, WithJsonSchema

from gasless import __version__
from gasless.errors import ApiError, catalogue_document, problem_document
from gasless.mcp.api import API_KEY_HEADER, ApiAnswer, ApiCaller
from gasless.mcp.schemas import MAX_BATCH, request_schema
from gasless.relay.schemas import Assignment, Intent, Network, RelayQuote, ValidateResponse

INSTRUCTIONS = (
    "Gasless relaying on MultiversX: the user signs one Relayed-V3 transaction naming a relayer of the "
    "sender's shard, and the service co-signs, broadcasts and follows it; the user needs no gas. Call "
    "assign_relayer just before signing (it returns the relayer and a lease), build the transaction with that "
    "relayer, have the user sign it once, then relay_batch. Errors are RFC 9457 problems with a stable `code`; "
    "the resource relay://errors lists them, relay://pricing is the pricing document."
)


def tool_error(problem: Any) -> mcp_types.CallToolResult:
    """A refusal as a tool error: the problem document as structured content and as text."""
    return mcp_types.CallToolResult(
        isError=True,
        structuredContent=problem,
        content=[mcp_types.TextContent(type="text", text=json.dumps(problem, separators=(",", ":")))],
    )


class Caller:
    """Who the tool call comes from: the sponsor key and client address of the MCP HTTP request (mounted),
    or the key `gasless mcp` was configured with (stdio)."""

    def __init__(self, default_api_key: str | None) -> None:
        self.default_api_key = default_api_key

    def of(self, ctx: Context | None) -> tuple[str | None, tuple[str, int] | None]:
        request = None
        if ctx is not None:
            try:
                request = ctx.request_context.request
            except ValueError:
                request = None
        if request is None or not hasattr(request, "headers"):
            return self.default_api_key, None
        client = getattr(request, "client", None)
        address = (client.host, client.port) if client is not None else None
        return request.headers.get(API_KEY_HEADER) or self.default_api_key, address


def build_mcp_server(
    document: dict[str, Any],
    api: ApiCaller,
    *,
    docs_url: str,
    api_key: str | None = None,
    on_problems: Callable[[list[str]], None] | None = None,
) -> MCPServer:
    """`document` is the service's OpenAPI document (tool input schemas); `api` reaches its routes;
    `on_problems` sees the codes of the problems the MCP layer renders itself (the API's own are recorded
    where it renders them: the error-coverage recorder)."""
    server: MCPServer = MCPServer(
        "gasless", version=__version__, instructions=INSTRUCTIONS, website_url=docs_url
    )
    caller = Caller(api_key)

    async def call(method: str, path: str, body: Any, ctx: Context | None) -> ApiAnswer:
        key, address = caller.of(ctx)
        return await api.call(method, path, body=body, api_key=key, client_address=address)

    def schema_of(operation_id: str) -> Any:
        return WithJsonSchema(request_schema(document, operation_id))

    @server.tool(
        description="What POST /v1/relay would answer for a signed transaction, without signing, storing or "
        "sending anything: `ok`, and every problem it would return (the same checks as POST /v1/validate).",
    )
    async def validate_transaction(
        request: Annotated[dict[str, Any], schema_of("validateTransaction")], ctx: Context
    ) -> ValidateResponse:  # or a tool error (CallToolResult)
        answer = await call("POST", "/v1/validate", request, ctx)
        if not answer.ok:
            return tool_error(answer.json())
        return ValidateResponse.model_validate(answer.json())

    batch_schema = {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_BATCH,
        "items": request_schema(document, "relayTransaction"),
        "description": f"1 to {MAX_BATCH} relay requests (as POST /v1/relay takes them), relayed one after "
        "the other in this order, each with its own outcome",
    }

    @server.tool(
        description=f"Relay 1 to {MAX_BATCH} signed transactions, each exactly as POST /v1/relay relays it and "
        "each with its own outcome: `relay` (the RelayResponse: its intent) or `problem` (the RFC 9457 "
        f"problem, nothing sent for it). {MAX_BATCH + 1} or more are refused whole.",
    )
    async def relay_batch(
        requests: Annotated[list[Any], WithJsonSchema(batch_schema)], ctx: Context
    ) -> dict[str, Any]:  # or a tool error (CallToolResult)
        if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_BATCH:
            size = len(requests) if isinstance(requests, list) else 0
            problem = problem_document(
                ApiError(
                    "MALFORMED_REQUEST",
                    detail=f"a batch holds 1 to {MAX_BATCH} transactions, not {size}; nothing was relayed",
                    details={"field": "requests", "limit": MAX_BATCH, "actual": size},
                ),
                docs_url=docs_url,
                request_id="",
            )
            if on_problems is not None:
                on_problems(["MALFORMED_REQUEST"])
            return tool_error(problem)
        results = []
        for index, item in enumerate(requests):
            answer = await call("POST", "/v1/relay", item, ctx)
            outcome: dict[str, Any] = {"index": index, "status": answer.status}
            outcome["relay" if answer.ok else "problem"] = answer.json()
            results.append(outcome)
        return {
            "results": results,
            "relayed": sum(1 for r in results if "relay" in r),
            "refused": sum(1 for r in results if "problem" in r),
        }

    @server.tool(
        description="A relayer of the sender's shard and a lease, just before the user signs (POST "
        "/v1/relay/assign): needs a presence proof signed by the sender's key.",
    )
    async def assign_relayer(
        request: Annotated[dict[str, Any], schema_of("assignRelayer")], ctx: Context
    ) -> Assignment:  # or a tool error (CallToolResult)
        answer = await call("POST", "/v1/relay/assign", request, ctx)
        return Assignment.model_validate(answer.json()) if answer.ok else tool_error(answer.json())

    @server.tool(
        description="The RU weight and price of a signed or unsigned transaction (POST /v1/quote); no "
        "reservation, no signature."
    )
    async def quote(
        request: Annotated[dict[str, Any], schema_of("quoteRelay")], ctx: Context
    ) -> RelayQuote:  # or a tool error (CallToolResult)
        answer = await call("POST", "/v1/quote", request, ctx)
        return RelayQuote.model_validate(answer.json()) if answer.ok else tool_error(answer.json())

    @server.tool(
        description="A relayed transaction's status: `id` is an IntentId (`<sender>:<nonce>`) or a transaction "
        "hash (GET /v1/relay/{id})."
    )
    async def get_intent(
        id: Annotated[str, Field(min_length=1, max_length=130, description="IntentId or TxHash")],
        ctx: Context,
    ) -> Intent:  # or a tool error (CallToolResult)
        answer = await call("GET", f"/v1/relay/{quote_path(id)}", None, ctx)
        return Intent.model_validate(answer.json()) if answer.ok else tool_error(answer.json())

    @server.tool(
        description="The network the service relays on (GET /v1/network): chain id, round duration, gas "
        "price, and a recent shard-1 block for native-auth."
    )
    async def get_network(ctx: Context) -> Network:  # or a tool error (CallToolResult)
        answer = await call("GET", "/v1/network", None, ctx)
        return Network.model_validate(answer.json()) if answer.ok else tool_error(answer.json())

    @server.resource(
        "relay://pricing",
        mime_type="application/json",
        description="The pricing document: the same bytes as GET /v1/pricing",
    )
    async def pricing() -> str:
        answer = await api.call("GET", "/v1/pricing")
        if not answer.ok:
            raise RuntimeError(
                f"GET /v1/pricing answered {answer.status}: {answer.body.decode(errors='replace')}"
            )
        return answer.body.decode()

    @server.resource(
        "relay://errors",
        mime_type="application/json",
        description="The error catalogue: every code with its HTTP status, retry flag and meaning",
    )
    def errors() -> str:
        return json.dumps(catalogue_document(docs_url), separators=(",", ":"))

    return server


def quote_path(value: str) -> str:
    return url_quote(value, safe=":")
