"""How the MCP tools reach the service: through its own HTTP API, so every tool runs the very route it
stands for (the same checks, limits, billing and problem documents; no second implementation).

Mounted at `/mcp` on an API host the calls go to the host's app in process (ASGI, no socket); `gasless mcp`
over stdio calls a remote API over HTTP. Both are an `httpx2.AsyncClient`.

A remote API may not answer (not started yet, restarting, a wrong `--api`): a call then raises
`UPSTREAM_UNAVAILABLE`, and `UpstreamWatch` probes the API in the background until it answers again;
meanwhile every call is refused at once with the reason and when the next probe is due.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2

from gasless.client import endpoints
from gasless.client.endpoints import Answer, Unanswered
from gasless.core.errors import ApiError

API_KEY_HEADER = "X-Api-Key"
CONNECT_TIMEOUT_S = 3.0
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ApiAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class UpstreamWatch:
    """Whether the remote API answers. A failed call marks it down; `run` then probes `GET /healthz` in
    the background (0.25 s, doubling up to 2 s) until it answers as a gasless API, and while it is down
    `unavailable()` is the refusal every call answers at once."""

    FIRST_RETRY_S = 0.25
    MAX_RETRY_S = 2.0

    def __init__(self, base_url: str, *, notify: Callable[[str], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.notify = notify or (lambda line: None)
        self.reason: str | None = None  # None: the API answered last time
        self.next_probe_at = 0.0
        self._wake: anyio.Event | None = None  # set by `run`, in its event loop

    def down(self, reason: str) -> None:
        if self.reason is None:
            self.notify(f"--api {self.base_url} {reason}; tools answer UPSTREAM_UNAVAILABLE until it answers")
            self.next_probe_at = time.monotonic() + self.FIRST_RETRY_S
        self.reason = reason
        if self._wake is not None:
            self._wake.set()

    def unavailable(self) -> ApiError | None:
        if self.reason is None:
            return None
        retry_ms = max(1, math.ceil((self.next_probe_at - time.monotonic()) * 1000))
        return ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail=f"the gasless API at {self.base_url} {self.reason}; it is probed again in the "
            f"background: retry after {retry_ms} ms",
            details={"retryAfterMs": retry_ms},
        )

    async def probe(self, client: httpx2.AsyncClient) -> str | None:
        """Why the API is not usable now (None: it answered `GET /healthz` as a gasless API). A URL that
        answers as something else is named for what it is, as the CLI's `--api` check names it."""

        async def get(path: str) -> Answer:
            try:
                answer = await client.get(f"{self.base_url}{path}", headers={"Accept": "application/json"})
            except httpx2.HTTPError as exc:
                raise Unanswered(does_not_answer(exc)) from None
            media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
            return Answer(path, answer.status_code, media_type, answer.text)

        try:
            answer = await get("/healthz")
        except Unanswered as exc:
            return str(exc)
        if endpoints.health(answer) is not None:
            return None
        return f"does not answer as a gasless API: {await endpoints.what_it_is(get, answer)}"

    async def run(self, client: httpx2.AsyncClient) -> None:
        """Probe while the API is down, until cancelled (the server's task group ends it)."""
        delay = self.FIRST_RETRY_S
        self._wake = anyio.Event()
        while True:
            if self.reason is None:
                await self._wake.wait()
                self._wake = anyio.Event()
                delay = self.FIRST_RETRY_S
                continue
            self.next_probe_at = time.monotonic() + delay
            await anyio.sleep(delay)
            reason = await self.probe(client)
            if reason is None:
                self.reason = None
                self.notify(f"--api {self.base_url} answers")
            else:
                self.reason = reason
                delay = min(delay * 2, self.MAX_RETRY_S)
                self.next_probe_at = time.monotonic() + delay


def does_not_answer(exc: BaseException) -> str:
    return f"does not answer ({type(exc).__name__})"


class ApiCaller:
    """Calls the API for the MCP tools. In process, each call is made as the MCP request's own client (its
    address is what the per-IP limits key on); remotely, the API sees this process."""

    def __init__(
        self,
        *,
        app: Any = None,
        base_url: str | None = None,
        watch: UpstreamWatch | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if (app is None) == (base_url is None):
            raise ValueError("an ApiCaller calls an app in process or a remote base URL")
        self.app = app
        self.watch = watch
        self.remote = (
            httpx2.AsyncClient(
                base_url=base_url.rstrip("/"),
                timeout=httpx2.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            )
            if base_url is not None
            else None
        )

    def _client(self, client_address: tuple[str, int] | None) -> httpx2.AsyncClient:
        if self.remote is not None:
            return self.remote
        transport = httpx2.ASGITransport(app=self.app, client=client_address or ("127.0.0.1", 0))
        return httpx2.AsyncClient(transport=transport, base_url="http://api.internal")

    def check_available(self) -> None:
        """UPSTREAM_UNAVAILABLE (ApiError) now when the remote API is known not to answer."""
        if self.watch is not None and (refusal := self.watch.unavailable()) is not None:
            raise refusal

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        api_key: str | None = None,
        client_address: tuple[str, int] | None = None,
    ) -> ApiAnswer:
        """The route's answer; `UPSTREAM_UNAVAILABLE` (ApiError) when a remote API does not answer."""
        self.check_available()
        headers = {"Accept": "application/json"}
        if api_key:
            headers[API_KEY_HEADER] = api_key
        content = None
        if body is not None:
            content = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        client = self._client(client_address)
        try:
            answer = await client.request(method, path, content=content, headers=headers)
        except httpx2.HTTPError as exc:
            if self.remote is None:
                raise
            if self.watch is not None:
                self.watch.down(does_not_answer(exc))
                refusal = self.watch.unavailable()
                assert refusal is not None
                raise refusal from None
            raise ApiError("UPSTREAM_UNAVAILABLE", detail=f"the gasless API {does_not_answer(exc)}") from None
        finally:
            if client is not self.remote:
                await client.aclose()
        return ApiAnswer(answer.status_code, dict(answer.headers), answer.content)

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()
