"""What a URL is, from what it answers: a gasless API, a MultiversX gateway, the status site, a metrics
listener, or else what it answered (not a gasless endpoint).

Shared by the CLI's `--api`/`--gateway` checks (`gasless.cli.endpoints`, over aiohttp) and `gasless mcp`'s
probe of its `--api` (`gasless.mcp.api`, over httpx2), so both name a wrong URL the same way. The HTTP
client stays the caller's: it passes a `Get` that fetches one path of the URL.

A gasless API answers `GET /healthz` with its Health document (`status`, `hostId`, `chainId`, `version`);
a gateway answers `GET /network/config` with `{"data": {"config": {"erd_chain_id": ...}}, "code":
"successful"}`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any


class Unanswered(Exception):
    """The URL gave no HTTP answer (connection refused, timeout, ...); the message says which."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, media type (without parameters) and body text."""

    path: str
    status: int
    media_type: str
    text: str

    @cached_property
    def body(self) -> Any:
        try:
            return json.loads(self.text)
        except ValueError:
            return None

    def line(self) -> str:
        """`GET /healthz answered HTTP 404 (text/html)`."""
        return f"GET {self.path} answered HTTP {self.status} ({self.media_type or 'no content type'})"


# GET one path (`/healthz`) of the URL being probed; raises Unanswered when nothing answers.
Get = Callable[[str], Awaitable[Answer]]


def health(answer: Answer) -> dict[str, Any] | None:
    """The Health document of a gasless API's `GET /healthz`, or None."""
    body = answer.body
    keys = ("status", "hostId", "chainId", "version")
    if (
        answer.status == 200
        and isinstance(body, dict)
        and all(isinstance(body.get(key), str) for key in keys)
    ):
        return body
    return None


def gateway_config(answer: Answer) -> dict[str, Any] | None:
    """The network config of a MultiversX gateway's `GET /network/config`, or None."""
    data = answer.body.get("data") if isinstance(answer.body, dict) else None
    config = data.get("config") if isinstance(data, dict) else None
    if answer.status == 200 and isinstance(config, dict) and "erd_chain_id" in config:
        return config
    return None


def _status_site(answer: Answer) -> bool:
    """The status site's `/healthz` (`service: status-site`) or one of its feeds."""
    body = answer.body
    if not isinstance(body, dict):
        return False
    if body.get("service") == "status-site":
        return True
    feed = isinstance(body.get("overall"), str) and isinstance(body.get("components"), list)
    missing = answer.status == 404 and str(body.get("error", "")).startswith("no feed ")
    return feed or missing


def _metrics(answer: Answer) -> bool:
    """A Prometheus exposition (the service's admin listener, or any exporter)."""
    return answer.status == 200 and ("# HELP " in answer.text or "# TYPE " in answer.text)


async def _answers(get: Get, path: str, shape: Callable[[Answer], Any]) -> bool:
    try:
        return bool(shape(await get(path)))
    except Unanswered:
        return False


GATEWAY = "it is a MultiversX gateway"
API = "it is a gasless API"


async def what_it_is(get: Get, answered: Answer) -> str:
    """What the URL is, given that `answered` was not what was expected of it: the other kind of endpoint
    (`GATEWAY`, `API`), the status site, a metrics listener, or else what it answered."""
    if await _answers(get, "/network/config", gateway_config):
        return GATEWAY
    if await _answers(get, "/healthz", health):
        return API
    if await _answers(get, "/healthz", _status_site) or await _answers(
        get, "/feed/status.json", _status_site
    ):
        return "it is the gasless status site (the API has its own port; `gasless up` prints both)"
    if await _answers(get, "/metrics", _metrics):
        return "it is a metrics listener (Prometheus /metrics), not the API (`gasless up` prints its URL)"
    return f"{answered.line()}: it is not a gasless endpoint"
