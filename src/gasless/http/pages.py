"""Listings: the shared page object, the page and time-window query parameters, and opaque signed cursors.

Wire names, chosen once for every listing: `limit` (page size 1..200, default 50), `cursor` (the previous
page's `nextCursor`), `from` and `to` (Unix ms, inclusive). A page is `{"items": [...], "nextCursor": ...}`
with `nextCursor` null on the last page.

A cursor is `base64url(payload).base64url(HMAC-SHA256)` under the environment's `cursor` purpose key (HKDF,
bound to env and chainId). The payload names the listing, a digest of the listing's filters, the position
after which the next page starts, and an expiry. A cursor that is malformed, tampered with, minted for
another listing or other filters, another environment or chain, or past its expiry is `400 CURSOR_INVALID`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import rfc8785
from fastapi import Depends, Query
from pydantic import BaseModel, Field

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode
from gasless.core.errors import ApiError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
CURSOR_TTL_MS = 3_600_000
# Expiries are rounded up to the minute so that the same page minted twice within a minute is the same
# bytes (and the same ETag).
CURSOR_EXPIRY_STEP_MS = 60_000
MAX_CURSOR_CHARS = 1_024
CURSOR_PATTERN = "^[A-Za-z0-9_-]+[.][A-Za-z0-9_-]+$"  # base64url(payload).base64url(mac), unpadded
_CURSOR_VERSION = 1

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a listing."""

    items: list[T]
    nextCursor: str | None = Field(
        description="pass as `cursor` to get the next page; null on the last page (opaque, expires)"
    )


@dataclass(frozen=True)
class PageParams:
    limit: int
    cursor: str | None


def page_params(
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE_SIZE, description="page size, 1 to 200 (default 50)")
    ] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[
        str | None,
        Query(
            description="the previous page's `nextCursor`, as it was given (opaque; a cursor that is "
            "malformed, forged, of another listing or expired is 400 CURSOR_INVALID)",
            # Documented here, judged by CursorCodec.open: the interface contract answers CURSOR_INVALID, not a schema error.
            json_schema_extra={"pattern": CURSOR_PATTERN, "maxLength": MAX_CURSOR_CHARS},
        ),
    ] = None,
) -> PageParams:
    return PageParams(limit=limit, cursor=cursor)


PageQuery = Annotated[PageParams, Depends(page_params)]


@dataclass(frozen=True)
class TimeWindow:
    from_ms: int | None
    to_ms: int | None

    def bounded(self, now_ms: int, span_ms: int) -> tuple[int, int]:
        """(from, to) with the route's defaults: `to` now, `from` `span_ms` before `to`, never before the
        epoch (a window ending at `to=0` starts there too)."""
        to_ms = self.to_ms if self.to_ms is not None else now_ms
        from_ms = self.from_ms if self.from_ms is not None else max(0, to_ms - span_ms)
        return from_ms, to_ms


def time_window(
    from_ms: Annotated[
        int | None,
        Query(alias="from", ge=0, le=2**53 - 1, description="start, Unix ms, inclusive; at most `to`"),
    ] = None,
    to_ms: Annotated[
        int | None, Query(alias="to", ge=0, le=2**53 - 1, description="end, Unix ms, inclusive")
    ] = None,
) -> TimeWindow:
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise ApiError("MALFORMED_REQUEST", detail="`from` is after `to`", details={"field": "from"})
    return TimeWindow(from_ms=from_ms, to_ms=to_ms)


WindowQuery = Annotated[TimeWindow, Depends(time_window)]


def _invalid(detail: str) -> ApiError:
    return ApiError("CURSOR_INVALID", detail=detail)


class CursorCodec:
    def __init__(
        self, keys: PurposeKeys, *, ttl_ms: int = CURSOR_TTL_MS, clock: Callable[[], float] = time.time
    ) -> None:
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.clock = clock

    @staticmethod
    def _binding(listing: str, filters: Mapping[str, Any]) -> str:
        canonical = rfc8785.dumps({"listing": listing, "filters": dict(filters)})
        return b64url(hashlib.sha256(canonical).digest()[:12])

    def mint(self, listing: str, filters: Mapping[str, Any], position: Any) -> str:
        """A cursor for the page after `position` of `listing` with `filters`."""
        now_ms = int(self.clock() * 1000)
        step = CURSOR_EXPIRY_STEP_MS
        expires_ms = -(-now_ms // step) * step + self.ttl_ms
        payload = {
            "v": _CURSOR_VERSION,
            "l": listing,
            "f": self._binding(listing, filters),
            "p": position,
            "x": expires_ms,
        }
        raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return f"{b64url(raw)}.{b64url(self.keys.mac('cursor', raw))}"

    def open(self, cursor: str, listing: str, filters: Mapping[str, Any]) -> Any:
        """The position a cursor of this listing and these filters carries, or CURSOR_INVALID."""
        if len(cursor) > MAX_CURSOR_CHARS or cursor.count(".") != 1:
            raise _invalid("the cursor is malformed; use a page's nextCursor as it was given")
        body, tag = cursor.split(".")
        try:
            raw, mac = b64url_decode(body), b64url_decode(tag)
        except ValueError:
            raise _invalid("the cursor is malformed; use a page's nextCursor as it was given") from None
        # Only the canonical spelling: a second encoding of the same bytes is not the cursor we issued.
        if b64url(raw) != body or b64url(mac) != tag or not self.keys.verify("cursor", raw, mac):
            raise _invalid("the cursor was not issued by this service for this environment")
        try:
            payload = json.loads(raw)
        except ValueError:
            raise _invalid("the cursor is malformed") from None
        if not isinstance(payload, dict) or payload.get("v") != _CURSOR_VERSION:
            raise _invalid("the cursor is from an unsupported version; start again from the first page")
        if payload.get("l") != listing or payload.get("f") != self._binding(listing, filters):
            raise _invalid("the cursor belongs to another listing or other filters")
        expires_ms = payload.get("x")
        if not isinstance(expires_ms, int) or int(self.clock() * 1000) >= expires_ms:
            raise _invalid("the cursor has expired; start again from the first page")
        return payload.get("p")
