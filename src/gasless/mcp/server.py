"""The MCP server: tools and resources over the service's own HTTP routes (interface contract: "An MCP server exposes
tools over the same functions").

A tool answers the route's success document as structured content (and the same JSON as text), under an
output schema that is the route's success schema. Every error is a tool error (`isError: true`) whose text
content is an RFC 9457 problem document with its catalogue `code`, and which carries no structured content:
hosts on the TypeScript SDK validate any structured content against the success-shaped output schema, even
on an error (SDK 1.x), so an error must not carry one. The problem is the route's own when the route
refused; the MCP layer renders the ones it finds itself, from the same catalogue: arguments that do not
match the tool's input schema (`MALFORMED_REQUEST`, `details.field`), an unknown tool (`NOT_FOUND`), an API
that does not answer (`UPSTREAM_UNAVAILABLE`), a failure of its own (`INTERNAL`).

Tool input schemas are the routes' request schemas from the OpenAPI document, generated from the same
pydantic models (`gasless.mcp.schemas`).

No `from __future__ import annotations` here: the SDK reads the tools' annotations at registration, and
they name schemas built inside `build_mcp_server`.
"""

import json
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote as url_quote

import mcp.types as mcp_types
import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError, WithJsonSchema

from gasless import __version__
from gasless.core.errors import CATALOGUE, ApiError, catalogue_document, problem_document
from gasless.http.problems import new_request_id
from gasless.mcp.api import API_KEY_HEADER, ApiAnswer, ApiCaller
from gasless.mcp.schemas import (
    MAX_BATCH,
    batch_input_schema,
    batch_output_schema,
    parameter_schema,
    request_schema,
    response_schema,
    validate_input_schema,
)

log = structlog.get_logger("gasless.mcp")

INSTRUCTIONS = (
    "Gasless relaying on MultiversX: the user signs one Relayed-V3 transaction naming a relayer of the "
    "sender's shard, and the service co-signs, broadcasts and follows it; the user needs no gas. Call "
    "assign_relayer just before signing (it returns the relayer and a lease), build the transaction with that "
    "relayer, have the user sign it once, then relay_batch. A tool error's text is an RFC 9457 problem "
    "document with a stable `code`; the resource relay://errors lists them, relay://pricing is the pricing "
    "document."
)
JSONRPC_INTERNAL_ERROR = -32603

CallToolResult = mcp_types.CallToolResult


def _json(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"))


def success(document: dict[str, Any]) -> CallToolResult:
    """The route's success document: structured content, and the same JSON as text."""
    return CallToolResult(
        structuredContent=document, content=[mcp_types.TextContent(type="text", text=_json(document))]
    )


def tool_error(problem: dict[str, Any]) -> CallToolResult:
    """A refusal: `isError`, the problem document as text, no structured content (see the module)."""
    return CallToolResult(isError=True, content=[mcp_types.TextContent(type="text", text=_json(problem))])


def is_problem(document: Any) -> bool:
    return (
        isinstance(document, dict)
        and document.get("code") in CATALOGUE
        and isinstance(document.get("status"), int)
        and isinstance(document.get("instance"), str)
        and bool(document["instance"])
    )


def problem_of(answer: ApiAnswer) -> dict[str, Any]:
    """The route's refusal; UPSTREAM_UNAVAILABLE when what answered is not the API's problem document."""
    try:
        document = answer.json()
    except ValueError:
        document = None
    if not is_problem(document):
        raise ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail=f"the API answered HTTP {answer.status} without a problem document",
        )
    return dict(document)


def http_request(ctx: Context | None) -> Any:
    """The HTTP request of a mounted MCP call (None over stdio)."""
    if ctx is None:
        return None
    try:
        request = ctx.request_context.request
    except ValueError:
        return None
    return request if hasattr(request, "headers") else None


class Caller:
    """Who the tool call comes from: the sponsor key and client address of the MCP HTTP request (mounted),
    or the key `gasless mcp` was configured with (stdio)."""

    def __init__(self, default_api_key: str | None) -> None:
        self.default_api_key = default_api_key

    def of(self, ctx: Context | None) -> tuple[str | None, tuple[str, int] | None]:
        request = http_request(ctx)
        if request is None:
            return self.default_api_key, None
        client = getattr(request, "client", None)
        address = (client.host, client.port) if client is not None else None
        return request.headers.get(API_KEY_HEADER) or self.default_api_key, address


def request_id_of(ctx: Context | None) -> str:
    """A problem's `instance`: the MCP HTTP request's id (its `Relay-Request-Id`), else a new one."""
    request = http_request(ctx)
    state = getattr(request, "state", None)
    rid = getattr(state, "request_id", None) if state is not None else None
    return str(rid) if rid else new_request_id()


def malformed_arguments(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    field = ".".join(str(part) for part in first.get("loc", ()))
    message = first.get("msg", "invalid arguments")
    return ApiError(
        "MALFORMED_REQUEST",
        detail=f"{field or 'arguments'}: {message} (see the tool's inputSchema)",
        details={"field": field},
    )


class GaslessMCPServer(MCPServer):
    """The SDK's server, with every tool failure answered as a problem document (see the module)."""

    def __init__(
        self,
        *args: Any,
        docs_url: str,
        on_problems: Callable[[list[str]], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.docs_url = docs_url
        self.on_problems = on_problems
        self.tool_names = frozenset(tool.name for tool in kwargs.get("tools") or ())

    def render(self, error: ApiError, ctx: Context | None) -> CallToolResult:
        """A problem the MCP layer finds itself, as a tool error (its code recorded like the API's)."""
        if self.on_problems is not None:
            self.on_problems([error.code])
        return tool_error(problem_document(error, docs_url=self.docs_url, request_id=request_id_of(ctx)))

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if name not in self.tool_names:
            known = ", ".join(sorted(self.tool_names))
            error = ApiError("NOT_FOUND", detail=f"no tool {name!r}; the tools are {known}")
            return self.render(error, context)
        try:
            return await super().call_tool(name, arguments, context)
        except MCPError:
            raise
        except Exception as exc:
            return self.render(self.error_of(name, exc), context)

    @staticmethod
    def error_of(name: str, exc: Exception) -> ApiError:
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, ApiError):
                return cause
            cause = cause.__cause__
        if not isinstance(exc, UnexpectedToolError) and isinstance(exc, ToolError):
            if isinstance(exc.__cause__, ValidationError):
                return malformed_arguments(exc.__cause__)
        log.error("mcp tool failed", tool=name, error_type=type(exc.__cause__ or exc).__name__)
        return ApiError("INTERNAL", detail=f"the tool {name} failed unexpectedly")


def build_mcp_server(
    document: dict[str, Any],
    api: ApiCaller,
    *,
    docs_url: str,
    api_key: str | None = None,
    on_problems: Callable[[list[str]], None] | None = None,
) -> MCPServer:
    """`document` is the service's OpenAPI document (tool schemas); `api` reaches its routes;
    `on_problems` sees the codes of the problems the MCP layer renders itself (the API's own are recorded
    where it renders them: the error-coverage recorder)."""
    caller = Caller(api_key)

    async def call(method: str, path: str, body: Any, ctx: Context | None) -> ApiAnswer:
        key, address = caller.of(ctx)
        return await api.call(method, path, body=body, api_key=key, client_address=address)

    async def answer_of(method: str, path: str, body: Any, ctx: Context | None) -> CallToolResult:
        answer = await call(method, path, body, ctx)
        return success(answer.json()) if answer.ok else tool_error(problem_of(answer))

    def body_of(operation_id: str) -> Any:
        return WithJsonSchema(request_schema(document, operation_id))

    async def validate_transaction(
        request: Annotated[dict[str, Any], WithJsonSchema(validate_input_schema(document))], ctx: Context
    ) -> CallToolResult:
        return await answer_of("POST", "/v1/validate", request, ctx)

    async def relay_batch(
        requests: Annotated[list[Any], WithJsonSchema(batch_input_schema(document))], ctx: Context
    ) -> CallToolResult:
        if not 1 <= len(requests) <= MAX_BATCH:
            raise ApiError(
                "MALFORMED_REQUEST",
                detail=f"a batch holds 1 to {MAX_BATCH} transactions, not {len(requests)}; nothing was "
                "relayed",
                details={"field": "requests", "limit": MAX_BATCH, "actual": len(requests)},
            )
        api.check_available()  # an API known to be away refuses the whole batch, not each item
        results = []
        for index, item in enumerate(requests):
            outcome: dict[str, Any] = {"index": index}
            try:
                answer = await call("POST", "/v1/relay", item, ctx)
                outcome["status"] = answer.status
                if answer.ok:
                    outcome["relay"] = answer.json()
                else:
                    outcome["problem"] = problem_of(answer)
            except ApiError as error:
                # No answer for this item (stdio): the same bytes may be relayed again, a duplicate is
                # answered from its intent and never relayed twice.
                if on_problems is not None:
                    on_problems([error.code])
                outcome["status"] = error.status
                outcome["problem"] = problem_document(error, docs_url=docs_url, request_id=request_id_of(ctx))
            results.append(outcome)
        relayed = sum(1 for r in results if "relay" in r)
        return success({"results": results, "relayed": relayed, "refused": len(results) - relayed})

    async def assign_relayer(
        request: Annotated[dict[str, Any], body_of("assignRelayer")], ctx: Context
    ) -> CallToolResult:
        return await answer_of("POST", "/v1/relay/assign", request, ctx)

    async def quote(
        request: Annotated[dict[str, Any], body_of("quoteRelay")], ctx: Context
    ) -> CallToolResult:
        return await answer_of("POST", "/v1/quote", request, ctx)

    async def get_intent(
        id: Annotated[str, WithJsonSchema(parameter_schema(document, "getRelayStatus", "id"))], ctx: Context
    ) -> CallToolResult:
        return await answer_of("GET", f"/v1/relay/{quote_path(id)}", None, ctx)

    async def get_network(ctx: Context) -> CallToolResult:
        return await answer_of("GET", "/v1/network", None, ctx)

    tools = (
        (
            validate_transaction,
            "What POST /v1/relay would answer for a signed transaction, without signing, storing or sending "
            "anything: `ok`, and every problem it would return (the same checks as POST /v1/validate).",
            response_schema(document, "validateTransaction"),
        ),
        (
            relay_batch,
            f"Relay 1 to {MAX_BATCH} signed transactions, each exactly as POST /v1/relay relays it and each "
            "with its own outcome: `relay` (the RelayResponse: its intent) or `problem` (the RFC 9457 problem, "
            f"nothing sent for it). None, or {MAX_BATCH + 1} or more, are refused whole.",
            batch_output_schema(document),
        ),
        (
            assign_relayer,
            "A relayer of the sender's shard and a lease, just before the user signs (POST /v1/relay/assign): "
            "needs a presence proof signed by the sender's key.",
            response_schema(document, "assignRelayer"),
        ),
        (
            quote,
            "The RU weight and price of a signed or unsigned transaction (POST /v1/quote); no reservation, no "
            "signature.",
            response_schema(document, "quoteRelay"),
        ),
        (
            get_intent,
            "A relayed transaction's status: `id` is an IntentId (`<sender>:<nonce>`) or a transaction hash "
            "(GET /v1/relay/{id}).",
            response_schema(document, "getRelayStatus"),
        ),
        (
            get_network,
            "The network the service relays on (GET /v1/network): chain id, round duration, gas price, and a "
            "recent shard-1 block for native-auth.",
            response_schema(document, "getNetwork"),
        ),
    )
    registered = []
    for function, description, output_schema in tools:
        tool = Tool.from_function(function, description=description)
        # Published as written (the route's success schema); the SDK validates no structured content
        # against a schema given without a model, and the route already answered to this one.
        tool.fn_metadata.output_schema = output_schema
        registered.append(tool)

    server = GaslessMCPServer(
        "gasless",
        version=__version__,
        instructions=INSTRUCTIONS,
        website_url=docs_url,
        tools=registered,
        docs_url=docs_url,
        on_problems=on_problems,
    )

    @server.resource(
        "relay://pricing",
        mime_type="application/json",
        description="The pricing document: the same bytes as GET /v1/pricing",
    )
    async def pricing() -> str:
        try:
            answer = await api.call("GET", "/v1/pricing")
            if answer.ok:
                return answer.body.decode()
            problem = problem_of(answer)
        except ApiError as error:
            problem = problem_document(error, docs_url=docs_url, request_id=new_request_id())
        # A resource has no error result: a JSON-RPC error, the problem document as its data.
        raise MCPError(JSONRPC_INTERNAL_ERROR, f"{problem['code']}: {problem['detail']}", problem)

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
