"""Stream tests: the relay suite's app on a real localnet (`env`, `make_env`, `problem`), the auth suite's
kit (real native-auth tokens, accounts, keys), a real uvicorn server for open streams, and an SSE reader."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from relay_kit import ServedApi, load_conftest

from gasless.hosting.app import create_app

_tests = Path(__file__).resolve().parents[1]
relay_env = load_conftest("relay")
auth_env = load_conftest("auth")
env = relay_env.env
make_env = relay_env.make_env
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem
auth = auth_env.auth
platform_problem = auth_env.platform_problem
AuthKit = auth_env.AuthKit


def check_ticket_invalid(response: Any, reason: str) -> dict[str, Any]:
    """The interface contract's platform problem STREAM_TICKET_INVALID (401, not retryable), with `details.reason`."""
    assert response.status_code == 401, f"{response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["code"] == "STREAM_TICKET_INVALID" and body["status"] == 401, body
    assert body["type"] == relay_env.DOCS_ERRORS_URL + "stream-ticket-invalid"
    assert body["retryable"] is False and "resign" not in body and body["detail"], body
    assert body["instance"] == response.headers["Relay-Request-Id"], body
    assert body["details"] == {"reason": reason}, body
    return body  # type: ignore[no-any-return]


@pytest.fixture
def ticket_invalid() -> Callable[[Any, str], dict[str, Any]]:
    """`ticket_invalid(response, reason)`: see `check_ticket_invalid`."""
    return check_ticket_invalid


class Served(ServedApi):
    """`create_app(settings)` served by uvicorn from a thread on a free loopback port, with an HTTP client."""

    def __init__(self, settings: Any, **app_kwargs: Any) -> None:
        super().__init__(create_app(settings, **app_kwargs))
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def stop(self) -> None:
        self.client.close()
        super().stop()

    @property
    def host(self) -> Any:
        return self.app.state.host

    def on_loop(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the server's event loop (the hub belongs to it) and wait for it."""
        import asyncio

        async def run() -> None:
            fn()

        loop = self.server_loop()
        asyncio.run_coroutine_threadsafe(run(), loop).result(10)

    def server_loop(self) -> Any:
        # uvicorn runs the app on the loop of its thread; the hub's windows were opened there.
        streams = self.host.streams
        assert streams is not None and streams._sweeper is not None
        return streams._sweeper.get_loop()


class Sse:
    """An open `GET /v1/stream`, read frame by frame (a frame: its `event`, `id`, `data`, in order)."""

    def __init__(self, client: httpx.Client, params: dict[str, str], headers: dict[str, str] | None = None):
        self._cm = client.stream("GET", "/v1/stream", params=params, headers=headers or {})
        self.response = self._cm.__enter__()
        self._lines = self.response.iter_lines()
        self.comments = 0

    def frame(self, timeout: float = 20.0) -> dict[str, Any]:
        """The next frame with a field (comment-only frames, the keep-alives, are counted, not returned)."""
        import json

        deadline = time.monotonic() + timeout
        current: dict[str, Any] = {}
        for line in self._lines:
            if line.startswith(":"):
                self.comments += 1
            elif line.startswith("event:"):
                current["event"] = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                current["id"] = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line.split(":", 1)[1])
            elif line == "" and current:
                return current
            if time.monotonic() > deadline:
                break
        raise AssertionError("no frame in time")

    def keepalives(self, count: int, timeout: float = 20.0) -> None:
        """Read until `count` keep-alive comments have arrived in all (failing on any other frame)."""
        deadline = time.monotonic() + timeout
        for line in self._lines:
            if line.startswith(":"):
                self.comments += 1
                if self.comments >= count:
                    return
            elif line:
                raise AssertionError(f"unexpected line while waiting for keep-alives: {line!r}")
            if time.monotonic() > deadline:
                break
        raise AssertionError("keep-alives did not arrive")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


@pytest.fixture
def sse() -> type[Sse]:
    """`sse(client, params, headers)`: an open account stream read frame by frame."""
    return Sse


@pytest.fixture
def served(unpaused_localnet: Any, tmp_path: Path) -> Iterator[Callable[..., tuple[Served, Any, Any]]]:
    """`served(**settings)`: a real server, a RelayEnv whose client talks to it, and an AuthKit."""
    opened: list[Served] = []

    def start(**overrides: Any) -> tuple[Served, Any, Any]:
        name = overrides.pop("name", "api")
        overrides_limits = overrides.pop("route_limits", None)
        overrides.setdefault("database_url", f"sqlite+aiosqlite:///{(tmp_path / f'{name}.db').as_posix()}")
        settings = relay_env.relay_settings(tmp_path, unpaused_localnet, **overrides)
        limits = overrides_limits or relay_env.unthrottled_limits()
        server = Served(settings, route_limits=limits).start()
        opened.append(server)
        contract = unpaused_localnet.net.info["contract"]
        env = relay_env.RelayEnv(server.client, unpaused_localnet, settings, contract)
        return server, env, AuthKit(env)

    yield start
    for server in opened:
        server.stop()
