"""`/mcp` on an API host: the MCP server's streamable HTTP endpoint, its tools calling this host's routes in
process. The parent app's lifespan runs the MCP session manager (a mounted app's own lifespan never runs)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from gasless.mcp.api import ApiCaller
from gasless.mcp.server import build_mcp_server

MCP_PATH = "/mcp"


def mount_mcp(app: FastAPI, *, docs_url: str, on_problems: Callable[[list[str]], None] | None) -> MCPServer:
    document = app.openapi()
    app.openapi_schema = None  # built again when first served: routes added after this one are in it too
    server = build_mcp_server(document, ApiCaller(app=app), docs_url=docs_url, on_problems=on_problems)
    endpoint = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,  # any host answers any request: no session pinned to one process
        json_response=True,
        # Agents are not browsers, and the API's own origin policy applies to every route (auth/origins.py);
        # the SDK's Host allow-list would refuse the API's public host name.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    # Exactly `/mcp` (the SDK's one route), not a catch-all mount that would answer every unknown path.
    app.router.routes.extend(route for route in endpoint.routes if getattr(route, "path", None) == MCP_PATH)
    return server
