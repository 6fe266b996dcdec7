"""Is `--api` a gasless API and `--gateway` a MultiversX gateway? One probe each before the command works,
so a swapped pair (or a wrong port) is one line naming the option instead of a `404 HTTP_ERROR` later.

When the URL answers as something else, the line says what it is (`gasless.client.endpoints.what_it_is`, which
`gasless mcp` uses too): the other kind, the status site, a metrics listener, or else what it answered.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from gasless.client import endpoints
from gasless.client.endpoints import Answer, Get, Unanswered

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)


class EndpointError(Exception):
    """The URL of an option does not answer as what the option names (the message is the line to print)."""


def _getter(session: aiohttp.ClientSession, base: str) -> Get:
    async def get(path: str) -> Answer:
        try:
            async with session.get(base + path, timeout=PROBE_TIMEOUT, allow_redirects=False) as response:
                text = await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unanswered(f"{type(exc).__name__}: {exc}") from None
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return Answer(path, response.status, media_type, text)

    return get


async def check_api(session: aiohttp.ClientSession, url: str, option: str = "--api") -> dict[str, Any]:
    """The API's Health document; EndpointError when `url` is not a gasless API."""
    get = _getter(session, url.rstrip("/"))
    try:
        answer = await get("/healthz")
    except Unanswered as exc:
        raise EndpointError(f"{option} {url} does not answer ({exc})") from None
    health = endpoints.health(answer)
    if health is not None:
        return health
    what = await endpoints.what_it_is(get, answer)
    if what == endpoints.GATEWAY:
        what += " (--api and --gateway swapped?)"
    raise EndpointError(f"{option} {url} does not answer as a gasless API: {what}")


async def check_gateway(session: aiohttp.ClientSession, url: str, option: str = "--gateway") -> None:
    """EndpointError when `url` is not a MultiversX gateway."""
    get = _getter(session, url.rstrip("/"))
    try:
        answer = await get("/network/config")
    except Unanswered as exc:
        raise EndpointError(f"{option} {url} does not answer ({exc})") from None
    if endpoints.gateway_config(answer) is not None:
        return
    what = await endpoints.what_it_is(get, answer)
    if what == endpoints.API:
        what += " (--api and --gateway swapped?)"
    raise EndpointError(f"{option} {url} does not answer as a MultiversX gateway: {what}")
