"""MCP tests: a real API host (uvicorn on a free port, against a real localnet) whose `/mcp` the SDK's own
client reaches over streamable HTTP, and `gasless mcp` subprocesses the SDK's client reaches over stdio."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters
from relay_kit import (  # type: ignore[import-not-found]
    ServedApi,
    load_conftest,
    reserved_port,
    unthrottled_limits,
)

from gasless.hosting.app import create_app

relay_env = load_conftest("relay")
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem


@pytest.fixture
def api(unpaused_localnet: Any, tmp_path: Path) -> Iterator[tuple[ServedApi, Any]]:
    """The served API and the relay suite's chain helpers (owner calls, senders, signing)."""
    kit = sys.modules["gasless_tests_relay_conftest"]
    settings = kit.relay_settings(tmp_path, unpaused_localnet)
    contract = unpaused_localnet.net.info["contract"]
    with ServedApi(create_app(settings, route_limits=unthrottled_limits())) as served:
        yield served, kit.RelayEnv(None, unpaused_localnet, settings, contract)


@pytest.fixture
def late_api(
    unpaused_localnet: Any, tmp_path: Path
) -> Iterator[tuple[str, Callable[[], ServedApi], StdioServerParameters]]:
    """The URL of an API not started yet (its port reserved: a connection is refused), the function that
    starts it there, and `gasless mcp --api URL`."""
    kit = sys.modules["gasless_tests_relay_conftest"]
    settings = kit.relay_settings(tmp_path, unpaused_localnet)
    sock = reserved_port()
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)

        def serve() -> ServedApi:
            return stack.enter_context(
                ServedApi(create_app(settings, route_limits=unthrottled_limits()), sock)
            )

        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield url, serve, stdio_server(url)


def stdio_server(api_url: str) -> StdioServerParameters:
    """`gasless mcp --api api_url`, as an MCP host starts it."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "gasless.cli", "mcp", "--api", api_url],
        env=dict(os.environ),  # the error-coverage recorder's file among them
    )


@pytest.fixture(params=["http", "stdio"])
def transport(request: pytest.FixtureRequest, api: tuple[ServedApi, Any]) -> Any:
    """What the SDK's `Client` connects to: the host's `/mcp`, or a `gasless mcp` subprocess."""
    served, _ = api
    if request.param == "http":
        return f"{served.url}/mcp"
    return stdio_server(served.url)
