"""`gasless mcp`: the MCP server over stdio for an agent, its tools calling a gasless API over HTTP.

Nothing but the MCP protocol is written on stdout (the agent reads it); errors go to stderr as one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from gasless.cli.common import fail
from gasless.cli.relay import DEFAULT_API, Api

DEFAULT_DOCS_URL = "https://docs.gasless.example"


def _openapi(api_url: str) -> dict[str, Any]:
    """The API's own document: the tools' input schemas are its request schemas."""
    import httpx2

    try:
        answer = httpx2.get(f"{api_url.rstrip('/')}/openapi.json", timeout=10)
    except httpx2.HTTPError as exc:
        fail(f"--api {api_url} does not answer ({type(exc).__name__}); is the gasless API running?")
    if answer.status_code != 200 or "paths" not in (answer.json() if answer.content else {}):
        fail(f"--api {api_url} does not serve the gasless OpenAPI document (status {answer.status_code})")
    document: dict[str, Any] = answer.json()
    return document


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
    from gasless.http.problems import ProblemRecorder
    from gasless.mcp.api import ApiCaller
    from gasless.mcp.server import build_mcp_server

    document = _openapi(api)
    record = os.environ.get("GASLESS_PROBLEM_RECORD_FILE")  # the test suite's error-coverage recorder
    recorder = ProblemRecorder(Path(record)) if record else None
    server = build_mcp_server(
        document,
        ApiCaller(base_url=api),
        docs_url=docs_url,
        api_key=api_key,
        on_problems=recorder.record if recorder is not None else None,
    )
    server.run("stdio")


def register(app: typer.Typer) -> None:
    app.command(name="mcp")(mcp)
