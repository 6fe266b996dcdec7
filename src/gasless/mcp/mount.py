"""`/mcp` on an API host: the MCP server's streamable HTTP endpoint, its tools calling this host's routes in
process. The parent app's lifespan runs the MCP session manager (a mounted app's own lifespan never runs).

`POST /mcp` (and `DELETE`) go to the SDK's transport. `GET /mcp` is the server-to-client event stream of
the streamable HTTP transport, answered here and bounded like the service's other streams:

- it needs `Accept: text/event-stream` (named, not only through `*/*`): otherwise `400 MALFORMED_REQUEST`
  with `details.field: "Accept"`, and no stream;
- at most `MCP_STREAMS_PER_IP` (20, the per-intent stream's figure) are open at once per client IP (its
  /64 for IPv6), shared by the hosts through Redis when configured; one more is `429 RATE_LIMITED`
  (`details.scope: "ip"`, `Retry-After`);
- it ends after `STREAM_LIFETIME_S` (120 s; the client opens another) and when the host begins to stop.

The server is stateless (any host answers any request), so it never has a message to send on this stream:
it carries a keep-alive comment every 15 s and nothing else. It is served because MCP clients open it.

The MCP server itself is built on the first `POST`/`DELETE /mcp`, not with the app: its tools' schemas come
from the OpenAPI document, whose generation (0.5-0.9 s of CPU) and the SDK's import (0.4 s) a host that is
never asked for MCP does not pay at start-up. The first MCP request waits for them, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gasless.core.errors import ApiError
from gasless.http.problems import problem_response
from gasless.limits.buckets import refusal
from gasless.limits.route_classes import client_key, record

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

MCP_PATH = "/mcp"
MCP_STREAMS_PER_IP = 20
MCP_STREAM_BUCKET = "mcp_stream_ip"  # a concurrency bucket of its own (Redis keys carry the name)
STREAM_LIFETIME_S = 120.0
PING_S = 15


def accepts_event_stream(accept: str | None) -> bool:
    """`Accept` names `text/event-stream` (with a quality above 0)."""
    for part in (accept or "").split(","):
        media, *parameters = (piece.strip().lower() for piece in part.split(";"))
        if media != "text/event-stream":
            continue
        quality = next((p.partition("=")[2] for p in parameters if p.startswith("q=")), "1")
        try:
            if float(quality) > 0:
                return True
        except ValueError:
            return True
    return False


class LazyMcp:
    """The host's MCP server, built on first use; its session manager runs from then until `stop`."""

    def __init__(
        self, app: FastAPI, *, docs_url: str, on_problems: Callable[[list[str]], None] | None
    ) -> None:
        self.app, self.docs_url, self.on_problems = app, docs_url, on_problems
        self.server: MCPServer | None = None
        self._transport: ASGIApp | None = None
        self._building = asyncio.Lock()
        self._stop = asyncio.Event()
        self._sessions: asyncio.Task[None] | None = None

    async def transport(self) -> ASGIApp:
        """The SDK's streamable HTTP transport of `/mcp`, its server built and its sessions running."""
        if self._transport is not None:
            return self._transport
        async with self._building:
            if self._transport is None:
                if self._stop.is_set():
                    raise ApiError(
                        "UPSTREAM_UNAVAILABLE",
                        detail="this host is stopping; another host (or this one once restarted) answers",
                        details={"retryAfterMs": 1_000},
                    )
                server, transport = await asyncio.to_thread(self._build)
                started = asyncio.Event()
                self._sessions = asyncio.create_task(self._run_sessions(server, started), name="mcp-sessions")
                waiting = asyncio.create_task(started.wait())
                await asyncio.wait({waiting, self._sessions}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if self._sessions.done():
                    self._sessions.result()  # the session manager failed to start: raise it here
                self.server, self._transport = server, transport
        assert self._transport is not None
        return self._transport

    def _build(self) -> tuple[MCPServer, ASGIApp]:
        from mcp.server.transport_security import TransportSecuritySettings

        from gasless.mcp.api import ApiCaller
        from gasless.mcp.server import build_mcp_server

        document = self.app.openapi()
        server = build_mcp_server(
            document, ApiCaller(app=self.app), docs_url=self.docs_url, on_problems=self.on_problems
        )
        endpoint = server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,  # any host answers any request: no session pinned to one process
            json_response=True,
            # Agents are not browsers, and the API's own origin policy applies to every route
            # (auth/origins.py); the SDK's Host allow-list would refuse the API's public host name.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        # Exactly `/mcp` (the SDK's one route), not a catch-all mount that would answer every unknown path.
        for route in endpoint.routes:
            if isinstance(route, Route) and route.path == MCP_PATH:
                return server, route.endpoint
        raise RuntimeError(f"the MCP SDK's app has no {MCP_PATH} route")

    async def _run_sessions(self, server: MCPServer, started: asyncio.Event) -> None:
        # The session manager's task group is entered and left in this one task, as anyio requires.
        async with server.session_manager.run():
            started.set()
            await self._stop.wait()

    async def stop(self) -> None:
        self._stop.set()
        if self._sessions is not None:
            await self._sessions


class McpEndpoint:
    """The ASGI app of `/mcp`: the bounded event stream on GET, the SDK's transport for the rest."""

    def __init__(self, mcp: LazyMcp, *, docs_url: str) -> None:
        self.mcp = mcp
        self.docs_url = docs_url
        self.route: Route | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("route", self.route)  # the metrics' and access log's route label, as FastAPI's
        if scope["type"] == "http" and scope["method"] == "GET":
            await self.event_stream(Request(scope, receive), send)
            return
        try:
            transport = await self.mcp.transport()
        except ApiError as error:
            await problem_response(Request(scope, receive), error, self.docs_url)(scope, receive, send)
            return
        await transport(scope, receive, send)

    async def event_stream(self, request: Request, send: Send) -> None:
        scope, receive = request.scope, request.receive
        if not accepts_event_stream(request.headers.get("accept")):
            error = ApiError(
                "MALFORMED_REQUEST",
                detail="GET /mcp opens the MCP server's event stream and needs Accept: text/event-stream "
                "(MCP requests are POST /mcp)",
                details={"field": "Accept"},
            )
            await problem_response(request, error, self.docs_url)(scope, receive, send)
            return
        host = request.app.state.host
        decision, slot = await host.limits.streams.acquire(
            MCP_STREAM_BUCKET, client_key(request), MCP_STREAMS_PER_IP
        )
        if slot is None:
            error = refusal(
                decision, "ip", f"at most {MCP_STREAMS_PER_IP} MCP event streams are open at once per IP"
            )
            await problem_response(request, error, self.docs_url)(scope, receive, send)
            return
        record(request, decision)  # RateLimit-* on the stream's answer
        try:
            await EventSourceResponse(self.quiet(host), ping=PING_S)(scope, receive, send)
        finally:
            await slot.release()

    @staticmethod
    async def quiet(host: Any) -> AsyncIterator[ServerSentEvent]:
        """A comment (so the answer's headers leave now), then nothing until the lifetime ends or the host
        stops."""
        yield ServerSentEvent(comment="open")
        await host.unless_stopping(asyncio.Event().wait(), STREAM_LIFETIME_S)


def mount_mcp(app: FastAPI, *, docs_url: str, on_problems: Callable[[list[str]], None] | None) -> LazyMcp:
    """Route `/mcp` to a server built on first use (see the module); the host stops it with `stop()`."""
    mcp = LazyMcp(app, docs_url=docs_url, on_problems=on_problems)
    handler = McpEndpoint(mcp, docs_url=docs_url)
    handler.route = Route(MCP_PATH, handler)
    app.router.routes.append(handler.route)
    return mcp
