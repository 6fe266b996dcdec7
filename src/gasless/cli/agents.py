"""`gasless mcp`: the MCP server over stdio for an agent, its tools calling a gasless API over HTTP.

Nothing but the MCP protocol is written on stdout (the agent reads it); notes go to stderr, one line each.

The server starts whether or not the API answers: an agent's host starts it with the host, often before
the API. The tools' schemas come from the API's OpenAPI document when it answers at start, else from this
package's own (`gasless.mcp.schemas.package_document`); while the API does not answer, every tool call is
answered `UPSTREAM_UNAVAILABLE` at once and the API is probed in the background until it does.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gasless.cli.relay import DEFAULT_API, Api

DEFAULT_DOCS_URL = "https://docs.gasless.example"
START_TIMEOUT_S = 3.0  # how long the start waits for the API's document before serving without it


def note(line: str) -> None:
    print(f"gasless mcp: {line}", file=sys.stderr, flush=True)


async def _api_document(client: Any, watch: Any) -> dict[str, Any] | None:
    """The API's own document, or None (and `watch` marked down) when the API does not serve it now."""
    import httpx2

    reason = await watch.probe(client)
    if reason is None:
        try:
            answer = await client.get(f"{watch.base_url}/openapi.json")
            document = answer.json() if answer.status_code == 200 else None
        except (httpx2.HTTPError, ValueError) as exc:
            document, reason = None, f"does not serve its OpenAPI document ({type(exc).__name__})"
        if isinstance(document, dict) and "paths" in document:
            return document
        reason = reason or "does not serve the gasless OpenAPI document at /openapi.json"
    watch.down(reason)
    return None


async def serve_stdio(api_url: str, api_key: str | None, docs_url: str) -> None:
    import anyio
    import httpx2

    from gasless.http.problems import ProblemRecorder
    from gasless.mcp.api import ApiCaller, UpstreamWatch
    from gasless.mcp.schemas import package_document
    from gasless.mcp.server import build_mcp_server

    watch = UpstreamWatch(api_url, notify=note)
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(START_TIMEOUT_S)) as probes:
        document = await _api_document(probes, watch)
        if document is None:
            note("serving the tools with this package's own schemas; the API is probed in the background")
            document = package_document()
        record = os.environ.get("GASLESS_PROBLEM_RECORD_FILE")  # the test suite's error-coverage recorder
        recorder = ProblemRecorder(Path(record)) if record else None
        api = ApiCaller(base_url=api_url, watch=watch)
        server = build_mcp_server(
            document,
            api,
            docs_url=docs_url,
            api_key=api_key,
            on_problems=recorder.record if recorder is not None else None,
        )
        # The SDK logs at INFO on stderr: not a line for every request to the API (nor every probe).
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch.run, probes)
                await server.run_stdio_async()
                tasks.cancel_scope.cancel()
        finally:
            await api.close()


def mcp(
    api: Api = DEFAULT_API,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="GASLESS_API_KEY",
            help="A sponsor API key sent as X-Api-Key on relays (prefer the environment variable).",
            show_default=False,
        ),
    ] = None,
    docs_url: Annotated[str, typer.Option("--docs-url", help="Base of the error reference pages.")] = (
        DEFAULT_DOCS_URL
    ),
) -> None:
    """Serve the MCP tools and resources over stdio (configure it as an MCP server of your agent)."""
    import anyio

    anyio.run(serve_stdio, api, api_key, docs_url)


def register(app: typer.Typer) -> None:
    app.command(name="mcp")(mcp)
