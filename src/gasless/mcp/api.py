"""How the MCP tools reach the service: through its own HTTP API, so every tool runs the very route it
stands for (the same checks, limits, billing and problem documents; no second implementation).

Mounted at `/mcp` on an API host the calls go to the host's app in process (ASGI, no socket); `gasless mcp`
over stdio calls a remote API over HTTP. Both are an `httpx2.AsyncClient`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

API_KEY_HEADER = "X-Api-Key"


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


class ApiCaller:
    """Calls the API for the MCP tools. In process, each call is made as the MCP request's own client (its
    address is what the per-IP limits key on); remotely, the API sees this process."""

    def __init__(self, *, app: Any = None, base_url: str | None = None, timeout_s: float = 30.0) -> None:
        if (app is None) == (base_url is None):
            raise ValueError("an ApiCaller calls an app in process or a remote base URL")
        self.app = app
        self.remote = (
            httpx2.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s)
            if base_url is not None
            else None
        )

    def _client(self, client_address: tuple[str, int] | None) -> httpx2.AsyncClient:
        if self.remote is not None:
            return self.remote
        transport = httpx2.ASGITransport(app=self.app, client=client_address or ("127.0.0.1", 0))
        return httpx2.AsyncClient(transport=transport, base_url="http://api.internal")

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        api_key: str | None = None,
        client_address: tuple[str, int] | None = None,
    ) -> ApiAnswer:
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
        finally:
            if client is not self.remote:
                await client.aclose()
        return ApiAnswer(answer.status_code, dict(answer.headers), answer.content)

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.aclose()
