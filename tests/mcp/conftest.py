"""MCP tests: a real API host (uvicorn on a free port, against a real localnet) whose `/mcp` the SDK's own
client reaches over streamable HTTP, and `gasless mcp` subprocesses the SDK's client reaches over stdio."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import uvicorn
from mcp import StdioServerParameters
from relay_kit import load_conftest, unthrottled_limits  # type: ignore[import-not-found]

from gasless.app import create_app

relay_env = load_conftest("relay")
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem


def reserved_port() -> socket.socket:
    """A free port, bound and not listening: until a server listens on it, a connection is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


class Served:
    """An API host served by uvicorn from a thread, on a free port (or on `sock`), until the test ends."""

    def __init__(self, app: Any, sock: socket.socket | None = None) -> None:
        self.sock = sock or reserved_port()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.05)
        self.__exit__()
        raise AssertionError("API not ready")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


@pytest.fixture
def api(unpaused_localnet: Any, tmp_path: Path) -> Iterator[tuple[Served, Any]]:
    """The served API and the relay suite's chain helpers (owner calls, senders, signing)."""
    kit = sys.modules["gasless_tests_relay_conftest"]
    settings = kit.relay_settings(tmp_path, unpaused_localnet)
    contract = unpaused_localnet.net.info["contract"]
    with Served(create_app(settings, route_limits=unthrottled_limits())) as served:
        yield served, kit.RelayEnv(None, unpaused_localnet, settings, contract)


@pytest.fixture
def late_api(
    unpaused_localnet: Any, tmp_path: Path
) -> Iterator[tuple[str, Callable[[], Served], StdioServerParameters]]:
    """The URL of an API not started yet (its port reserved: a connection is refused), the function that
    starts it there, and `gasless mcp --api URL`."""
    kit = sys.modules["gasless_tests_relay_conftest"]
    settings = kit.relay_settings(tmp_path, unpaused_localnet)
    sock = reserved_port()
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)

        def serve() -> Served:
            return stack.enter_context(Served(create_app(settings, route_limits=unthrottled_limits()), sock))

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
def transport(request: pytest.FixtureRequest, api: tuple[Served, Any]) -> Any:
    """What the SDK's `Client` connects to: the host's `/mcp`, or a `gasless mcp` subprocess."""
    served, _ = api
    if request.param == "http":
        return f"{served.url}/mcp"
    return stdio_server(served.url)
