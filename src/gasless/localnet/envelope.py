"""localnet's gateway envelope, as mx-chain-proxy-go answers: every answer is
`{"data": ..., "error": "", "code": "successful"}`; errors carry the node's text in `error` with `code`
`bad_request` (HTTP 400) or `internal_issue` (HTTP 500). And what every route reads from a request: the
chain, an address in the path, a JSON body.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

from aiohttp import web

from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.localnet.chain import LocalChain

CHAIN_KEY: web.AppKey[LocalChain] = web.AppKey("chain", LocalChain)
# Requests this gateway received, by method and route ("GET /address/{address}"), and VM queries by function
# ("POST /vm-values/query getRelayerState"): what a client costs it, and what it asks.
REQUESTS_KEY: web.AppKey[Counter[str]] = web.AppKey("requests", Counter)


def ok(data: Any) -> web.Response:
    return web.json_response({"data": data, "error": "", "code": "successful"}, dumps=dumps)


def fail(message: str, status: int = 400) -> web.Response:
    code = "bad_request" if status == 400 else "internal_issue"
    return web.json_response({"data": None, "error": message, "code": code}, status=status, dumps=dumps)


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def chain_of(request: web.Request) -> LocalChain:
    return request.app[CHAIN_KEY]


def bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 to raise, in the envelope (`fail`'s body)."""
    return web.HTTPBadRequest(
        text=dumps({"data": None, "error": message, "code": "bad_request"}), content_type="application/json"
    )


def address_param(request: web.Request) -> bytes:
    try:
        return parse_address(request.match_info["address"]).get_public_key()
    except InvalidAddress:
        raise bad_request("cannot decode address") from None


async def json_body(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("invalid JSON body") from None
