"""Problem documents (RFC 9457) as the client sees them, with the catalogue's retry semantics.

`retryable` and `resign` come from the document; when a document lacks them (an older host, a proxy's
error page) they come from the catalogue, and an answer that is not a problem document at all is
`HTTP_ERROR`, retryable with the same bytes only for 502/503/504.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from gasless.core.errors import CATALOGUE

RESIGN_VALUES = ("NONE", "SAME_BYTES", "NEW_SIGNATURE_SAME_NONCE")
_GATEWAY_STATUSES = (502, 503, 504)


class RelayProblem(Exception):
    """An error answer of the service (nothing was sent when it comes from `POST /v1/relay`)."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        detail: str = "",
        retryable: bool = False,
        resign: str = "NONE",
        details: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        retry_after_header: str | None = None,
        document: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail}" if detail else f"{status} {code}")
        self.status = status
        self.code = code
        self.detail = detail
        self.retryable = retryable
        self.resign = resign
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.retry_after_header = retry_after_header
        self.document: dict[str, Any] = dict(document or {})

    @property
    def retry_after_s(self) -> float | None:
        """How long the service asked to wait: `details.retryAfterMs`, else the `Retry-After` header."""
        ms = self.details.get("retryAfterMs")
        if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
            return ms / 1000
        return parse_retry_after(self.retry_after_header)

    @classmethod
    def from_response(cls, status: int, body: Any, headers: Mapping[str, str] | None = None) -> RelayProblem:
        headers = headers or {}
        request_id = headers.get("Relay-Request-Id")
        retry_after = headers.get("Retry-After")
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            retryable = status in _GATEWAY_STATUSES
            text = body if isinstance(body, str) else ""
            return cls(
                status=status,
                code="HTTP_ERROR",
                detail=text[:300] or f"HTTP {status} without a problem document",
                retryable=retryable,
                resign="SAME_BYTES" if retryable else "NONE",
                request_id=request_id,
                retry_after_header=retry_after,
            )
        code = body["code"]
        spec = CATALOGUE.get(code)
        retryable = body.get("retryable")
        if not isinstance(retryable, bool):
            retryable = spec.retryable if spec is not None else False
        resign = body.get("resign")
        if resign not in RESIGN_VALUES:
            resign = (spec.resign if spec is not None else None) or "NONE"
        details = body.get("details")
        return cls(
            status=status,
            code=code,
            detail=str(body.get("detail") or ""),
            retryable=retryable,
            resign=resign,
            details=details if isinstance(details, dict) else {},
            request_id=str(body.get("instance") or request_id or "") or None,
            retry_after_header=retry_after,
            document=body,
        )


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
