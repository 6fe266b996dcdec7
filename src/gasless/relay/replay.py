"""Replays answered by a host that cannot relay yet (still starting: restoring state, reaching the network).

The delivery guarantee says no error follows a relayer signature. Another host may have co-signed these very
bytes and died; a client retries them here. Such a host needs only the shared database to answer the stored
response (`duplicate: true`); bytes it does not hold get `503 UPSTREAM_UNAVAILABLE`, and nothing is sent.
"""

from __future__ import annotations

import structlog

from gasless.core.errors import ApiError
from gasless.relay.checks import parse_json_body, parse_relay_body
from gasless.relay.repository import IntentRepository
from gasless.relay.schemas import RelayResponse
from gasless.relay.service import stored_response

log = structlog.get_logger("gasless.relay")

STARTING = "this host is still starting (restoring state, reaching the network); retry shortly"


async def replay_while_starting(
    repo: IntentRepository | None,
    raw: bytes,
    idempotency_key: str | None,
    *,
    round_ms: int,
    now_ms: int,
) -> tuple[int, RelayResponse]:
    """The stored answer for bytes some host already co-signed, else UPSTREAM_UNAVAILABLE."""
    # A body that cannot be a relay request is refused as on a ready host (nothing is sent either way).
    parsed = parse_relay_body(parse_json_body(raw), idempotency_key)
    if repo is not None:
        try:
            view = await repo.sender_view(parsed.sender, parsed.tx.nonce, None, now_ms)
        except Exception as exc:
            log.warning("database unavailable while starting", error=type(exc).__name__)
            view = None
        if view is not None:
            for row in view.at_nonce:
                if row.bytes_sha256 == parsed.bytes_sha256:
                    return stored_response(row, round_ms, duplicate=True)
    raise ApiError("UPSTREAM_UNAVAILABLE", detail=STARTING, details={"retryAfterMs": 1_000})
