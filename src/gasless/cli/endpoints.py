"""Is `--api` a gasless API and `--gateway` a MultiversX gateway? One probe each before the command works,
so a swapped pair (or a wrong port) is one line naming the option instead of a `404 HTTP_ERROR` later.

A gasless API answers `GET /healthz` with its Health document (`status`, `hostId`, `chainId`, `version`);
a gateway answers `GET /network/config` with `{"data": {"config": {"erd_chain_id": ...}}, "code":
"successful"}`. When the URL answers as something else, the line says what it is, probed from its answers:
the other kind, the status site, a metrics listener, or else what it answered (not a gasless endpoint).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)


class EndpointError(Exception):
    """The URL of an option does not answer as what the option names (the message is the line to print)."""


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url, timeout=PROBE_TIMEOUT, allow_redirects=False) as response:
        text = await response.text(errors="replace")
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, None


def _health(status: int, body: Any) -> dict[str, Any] | None:
    keys = ("status", "hostId", "chainId", "version")
    if status == 200 and isinstance(body, dict) and all(isinstance(body.get(key), str) for key in keys):
        return body
    return None


def _gateway_config(status: int, body: Any) -> dict[str, Any] | None:
    data = body.get("data") if isinstance(body, dict) else None
    config = data.get("config") if isinstance(data, dict) else None
    if status == 200 and isinstance(config, dict) and "erd_chain_id" in config:
        return config
    return None


async def _answers(session: aiohttp.ClientSession, url: str, path: str, shape: Any) -> bool:
    try:
        return bool(shape(*await _get(session, url + path)))
    except (aiohttp.ClientError, TimeoutError):
        return False


def _status_site(status: int, body: Any) -> bool:
    """The status site's `/healthz` (`service: status-site`) or one of its feeds."""
    if not isinstance(body, dict):
        return False
    if body.get("service") == "status-site":
        return True
    feed = isinstance(body.get("overall"), str) and isinstance(body.get("components"), list)
    missing = status == 404 and str(body.get("error", "")).startswith("no feed ")
    return feed or missing


async def _metrics_listener(session: aiohttp.ClientSession, url: str) -> bool:
    """A Prometheus exposition at `/metrics` (the service's admin listener, or any exporter)."""
    try:
        async with session.get(f"{url}/metrics", timeout=PROBE_TIMEOUT, allow_redirects=False) as response:
            text = await response.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError):
        return False
    return response.status == 200 and ("# HELP " in text or "# TYPE " in text)


async def _what_it_is(session: aiohttp.ClientSession, base: str, answered: str) -> str:
    """What the URL is, from what it answers: the other kind of endpoint, the status site, a metrics
    listener, or else what it answered (it is not a gasless endpoint)."""
    if await _answers(session, base, "/network/config", _gateway_config):
        return "it is a MultiversX gateway"
    if await _answers(session, base, "/healthz", _health):
        return "it is a gasless API"
    if await _answers(session, base, "/healthz", _status_site) or await _answers(
        session, base, "/feed/status.json", _status_site
    ):
        return "it is the gasless status site (the API has its own port; `gasless up` prints both)"
    if await _metrics_listener(session, base):
        return "it is a metrics listener (Prometheus /metrics), not the API (`gasless up` prints its URL)"
    return f"{answered}: it is not a gasless endpoint"


async def _answer_line(session: aiohttp.ClientSession, url: str) -> str:
    """`GET /healthz answered HTTP 404 (text/html)`."""
    try:
        async with session.get(url, timeout=PROBE_TIMEOUT, allow_redirects=False) as response:
            kind = response.headers.get("Content-Type", "no content type").split(";")[0]
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"GET {url} failed ({type(exc).__name__})"
    path = url.split("//", 1)[-1].partition("/")[2]
    return f"GET /{path} answered HTTP {status} ({kind})"


async def check_api(session: aiohttp.ClientSession, url: str, option: str = "--api") -> dict[str, Any]:
    """The API's Health document; EndpointError when `url` is not a gasless API."""
    base = url.rstrip("/")
    try:
        status, body = await _get(session, f"{base}/healthz")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EndpointError(f"{option} {url} does not answer ({type(exc).__name__}: {exc})") from None
    health = _health(status, body)
    if health is not None:
        return health
    what = await _what_it_is(session, base, await _answer_line(session, f"{base}/healthz"))
    if what.startswith("it is a MultiversX gateway"):
        what += " (--api and --gateway swapped?)"
    raise EndpointError(f"{option} {url} does not answer as a gasless API: {what}")


async def check_gateway(session: aiohttp.ClientSession, url: str, option: str = "--gateway") -> None:
    """EndpointError when `url` is not a MultiversX gateway."""
    base = url.rstrip("/")
    try:
        status, body = await _get(session, f"{base}/network/config")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EndpointError(f"{option} {url} does not answer ({type(exc).__name__}: {exc})") from None
    if _gateway_config(status, body) is not None:
        return
    what = await _what_it_is(session, base, await _answer_line(session, f"{base}/network/config"))
    if what.startswith("it is a gasless API"):
        what += " (--api and --gateway swapped?)"
    raise EndpointError(f"{option} {url} does not answer as a MultiversX gateway: {what}")
