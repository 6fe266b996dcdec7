"""HTTP caching of public reads: `Cache-Control`, a strong `ETag` (a hash of the body) and `304`.

    return cached_json(request, document, cache_control=NETWORK_CACHE)

The body is serialised exactly as FastAPI would (compact UTF-8 JSON), hashed, and compared with the
request's `If-None-Match` (weak comparison, RFC 9110 section 13.1.2, so `W/"x"` matches `"x"`; `*` matches
any current representation). A match answers `304 Not Modified` with no body and the same `ETag` and
`Cache-Control`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from gasless.core.crypto import b64url

# Per-route policies (docs/api-conventions.md, "Caching").
NETWORK_CACHE = "public, max-age=1"  # the recent block for native-auth moves every round
INTENT_IN_FLIGHT_CACHE = "public, no-cache"  # changes every round; revalidate (304 is cheap)
INTENT_FINALIZED_CACHE = "public, max-age=86400, immutable"
ACCOUNT_MIRROR_CACHE = "public, max-age=2"  # the contract mirror itself is a few seconds old


def intent_cache_control(state: str) -> str:
    """FINALIZED never changes again. DEAD and REJECTED are final for their attempt, but the same nonce or
    the same signed bytes may be relayed again later, so what the URL answers can still change."""
    return INTENT_FINALIZED_CACHE if state == "FINALIZED" else INTENT_IN_FLIGHT_CACHE


def render_json(content: Any) -> bytes:
    if isinstance(content, BaseModel):
        content = content.model_dump(mode="json")
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def strong_etag(body: bytes) -> str:
    return '"' + b64url(hashlib.sha256(body).digest()[:18]) + '"'


def _matches(if_none_match: str, etag: str) -> bool:
    tags = [tag.strip() for tag in if_none_match.split(",")]
    opaque = etag.removeprefix("W/")
    return any(tag == "*" or tag.removeprefix("W/") == opaque for tag in tags if tag)


def cached_json(request: Request, content: Any, *, cache_control: str, status_code: int = 200) -> Response:
    """`content` as JSON with its validators; `304` when the client already holds this representation."""
    body = render_json(content)
    etag = strong_etag(body)
    headers = {"Cache-Control": cache_control, "ETag": etag}
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)
