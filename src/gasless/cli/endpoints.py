"""Is `--api` a gasless API and `--gateway` a MultiversX gateway? One probe each before the command works,
so a swapped pair (or a wrong port) is one line naming the option instead of a `404 HTTP_ERROR` later.

A gasless API answers `GET /healthz` with its Health document (`status`, `hostId`, `chainId`, `version`);
a gateway answers `GET /network/config` with `{"data": {"config": {"erd_chain_id": ...}}, "code":
"successful"}`. When the URL answers as the other kind, the line says so.
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
        return shape(*await _get(session, url + path)) is not None
    except (aiohttp.ClientError, TimeoutError):
        return False


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
    if await _answers(session, base, "/network/config", _gateway_config):
        raise EndpointError(
            f"{option} {url} does not answer as a gasless API: it is a MultiversX gateway "
            "(--api and --gateway swapped?)"
        )
    raise EndpointError(
        f"{option} {url} does not answer as a gasless API (GET /healthz: HTTP {status}; is it the gateway?)"
    )


async def check_gateway(session: aiohttp.ClientSession, url: str, option: str = "--gateway") -> None:
    """EndpointError when `url` is not a MultiversX gateway."""
    base = url.rstrip("/")
    try:
        status, body = await _get(session, f"{base}/network/config")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EndpointError(f"{option} {url} does not answer ({type(exc).__name__}: {exc})") from None
    if _gateway_config(status, body) is not None:
        return
    if await _answers(session, base, "/healthz", _health):
        raise EndpointError(
            f"{option} {url} does not answer as a MultiversX gateway: it is the gasless API "
            "(--api and --gateway swapped?)"
        )
    raise EndpointError(
        f"{option} {url} does not answer as a MultiversX gateway "
        f"(GET /network/config: HTTP {status}; is it the gasless API?)"
    )
