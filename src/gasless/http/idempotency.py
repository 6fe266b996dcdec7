"""Generic `Idempotency-Key` handling for POST writes, shared by every host through the database.

A route adopts it with one line, handing over the work as a callable:

    return await idempotent(request, scope=access.account, operation="createWebhook", status_code=201,
                            run=lambda: service.create(access.account, body))

 - no header: the work just runs;
 - key not 16..128 visible ASCII characters: 400 MALFORMED_REQUEST (`details.field = "Idempotency-Key"`);
 - records are per (scope, operation, SHA-256 of the key), kept 86 400 000 ms;
 - the request fingerprint is SHA-256 over method, path and the canonical (RFC 8785) JSON body;
 - same key, same fingerprint, finished: the stored answer is replayed (status and body, or the same
   problem), with `Idempotent-Replayed: true`;
 - same key, other fingerprint: 422 IDEMPOTENCY_KEY_REUSED;
 - same key while the first request still runs: 409 IDEMPOTENCY_IN_PROGRESS with Retry-After;
 - a 5xx or retryable error (429, 503...) frees the key, so the client's retry really runs again; a first
   request whose host died leaves a record whose lock (`LOCK_MS`) expires, after which the key runs again;
 - stored answers are sealed (AES-256-GCM, purpose key `idempotency-seal`, the record's identity as
   associated data): a response carrying a secret (a webhook's signing secret) is never stored in clear.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import rfc8785
from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from sqlalchemy import and_, delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.core.crypto import PurposeKeys
from gasless.core.errors import ApiError
from gasless.core.sealing import SealBroken, seal, unseal
from gasless.db import begin_write, dialect_insert
from gasless.db.tables import idempotency_keys

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
TTL_MS = 86_400_000
LOCK_MS = 60_000  # longer than any write takes; a crashed first request frees its key after this
MIN_CHARS, MAX_CHARS = 16, 128
SEAL_PURPOSE = "idempotency-seal"
_t = idempotency_keys.c


@dataclass(frozen=True)
class Stored:
    """A finished first request: a success (status + JSON body) or a refusal (an ApiError's parts)."""

    status_code: int
    body: Any = None
    error: dict[str, Any] | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def check_key(key: str) -> str:
    if not MIN_CHARS <= len(key) <= MAX_CHARS or any(not 0x21 <= ord(ch) <= 0x7E for ch in key):
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="Idempotency-Key must be 16 to 128 visible ASCII characters (no spaces)",
            details={"field": HEADER},
        )
    return key


def request_digest(method: str, path: str, body: bytes) -> str:
    try:
        canonical = rfc8785.dumps(json.loads(body)) if body.strip() else b""
    except ValueError:  # not JSON (the route will have refused it anyway): fingerprint the raw bytes
        canonical = body
    return hashlib.sha256(method.encode() + b"\n" + path.encode() + b"\n" + canonical).hexdigest()


class IdempotencyStore:
    def __init__(
        self,
        engine: AsyncEngine,
        keys: PurposeKeys,
        *,
        ttl_ms: int = TTL_MS,
        lock_ms: int = LOCK_MS,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.engine = engine
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.lock_ms = lock_ms
        self.clock = clock

    @staticmethod
    def _identity(scope: str, operation: str, key_digest: str) -> tuple[Any, ...]:
        return (_t.scope == scope, _t.operation == operation, _t.key_digest == key_digest)

    async def begin(self, scope: str, operation: str, key_digest: str, digest: str) -> Stored | None:
        """None: this request runs (the key is now held). A Stored: replay it. Raises the 409/422."""
        for _ in range(3):
            now = self.clock()
            async with begin_write(self.engine) as conn:
                inserted = await conn.execute(
                    dialect_insert(conn)(idempotency_keys)
                    .values(
                        scope=scope,
                        operation=operation,
                        key_digest=key_digest,
                        request_digest=digest,
                        state="running",
                        status_code=None,
                        response_sealed=None,
                        locked_until_ms=now + self.lock_ms,
                        created_at_ms=now,
                        expires_at_ms=now + self.ttl_ms,
                    )
                    .on_conflict_do_nothing()
                )
                if inserted.rowcount == 1:
                    return None
                row = (
                    await conn.execute(
                        select(idempotency_keys).where(*self._identity(scope, operation, key_digest))
                    )
                ).first()
                if row is None:
                    continue
                if row.expires_at_ms <= now:  # an old record: forget it and start over
                    await conn.execute(
                        delete(idempotency_keys).where(
                            *self._identity(scope, operation, key_digest),
                            _t.expires_at_ms == row.expires_at_ms,
                        )
                    )
                    continue
                if row.request_digest != digest:
                    raise ApiError(
                        "IDEMPOTENCY_KEY_REUSED",
                        detail="this Idempotency-Key was already used with a different request body; "
                        "use a new key for a new request",
                    )
                if row.state == "running":
                    if row.locked_until_ms > now:
                        raise ApiError(
                            "IDEMPOTENCY_IN_PROGRESS",
                            detail="the first request with this Idempotency-Key is still running; retry "
                            "shortly to get its answer",
                            details={"retryAfterMs": 1_000},
                            headers={"Retry-After": "1"},
                        )
                    # Its host died mid-request: take the key over.
                    taken = await conn.execute(
                        update(idempotency_keys)
                        .where(
                            *self._identity(scope, operation, key_digest),
                            _t.locked_until_ms == row.locked_until_ms,
                        )
                        .values(locked_until_ms=now + self.lock_ms)
                    )
                    if taken.rowcount == 1:
                        return None
                    continue
                return self._open(scope, operation, key_digest, row.response_sealed, row.status_code)
        raise ApiError(
            "IDEMPOTENCY_IN_PROGRESS", details={"retryAfterMs": 1_000}, headers={"Retry-After": "1"}
        )

    def _aad(self, scope: str, operation: str, key_digest: str) -> bytes:
        return f"{scope}|{operation}|{key_digest}".encode()

    def _open(self, scope: str, operation: str, key_digest: str, sealed: str, status_code: int) -> Stored:
        try:
            document = json.loads(
                unseal(self.keys, SEAL_PURPOSE, sealed, self._aad(scope, operation, key_digest))
            )
        except (SealBroken, ValueError):
            raise ApiError("INTERNAL", detail="a stored idempotent response could not be read") from None
        return Stored(status_code=status_code, body=document.get("body"), error=document.get("error"))

    async def complete(self, scope: str, operation: str, key_digest: str, stored: Stored) -> None:
        sealed = seal(
            self.keys,
            SEAL_PURPOSE,
            json.dumps({"body": stored.body, "error": stored.error}).encode(),
            self._aad(scope, operation, key_digest),
        )
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(idempotency_keys)
                .where(*self._identity(scope, operation, key_digest), _t.state == "running")
                .values(state="done", status_code=stored.status_code, response_sealed=sealed)
            )

    async def release(self, scope: str, operation: str, key_digest: str) -> None:
        async with begin_write(self.engine) as conn:
            await conn.execute(
                delete(idempotency_keys).where(
                    and_(*self._identity(scope, operation, key_digest), _t.state == "running")
                )
            )

    async def purge(self, now_ms: int) -> int:
        async with begin_write(self.engine) as conn:
            result = await conn.execute(delete(idempotency_keys).where(_t.expires_at_ms <= now_ms))
        return int(result.rowcount or 0)


def _store(request: Request) -> IdempotencyStore:
    store = request.app.state.host.idempotency
    if store is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is starting", details={"retryAfterMs": 1_000}
        )
    return store  # type: ignore[no-any-return]


def _reply(status_code: int, body: Any, *, replayed: bool) -> Response:
    headers = {"Cache-Control": "no-store"}
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    return JSONResponse(body, status_code=status_code, headers=headers)


async def idempotent(
    request: Request,
    *,
    scope: str,
    operation: str,
    run: Callable[[], Awaitable[Any]],
    status_code: int = 200,
) -> Response:
    """Run `run` (returning a pydantic model or JSON-able value, or raising ApiError) at most once per
    Idempotency-Key; see the module docstring."""
    key = request.headers.get(HEADER)
    if key is None:
        return _reply(status_code, jsonable_encoder(await run()), replayed=False)
    check_key(key)
    store = _store(request)
    key_digest = hashlib.sha256(key.encode("ascii")).hexdigest()
    digest = request_digest(request.method, request.url.path, await request.body())
    stored = await store.begin(scope, operation, key_digest, digest)
    if stored is not None:
        if stored.error is not None:
            raise ApiError(
                stored.error["code"],
                detail=stored.error.get("detail", ""),
                details=stored.error.get("details") or {},
                headers={**(stored.error.get("headers") or {}), REPLAYED_HEADER: "true"},
            )
        return _reply(stored.status_code, stored.body, replayed=True)
    try:
        body = jsonable_encoder(await run())
    except ApiError as error:
        if error.status >= 500 or error.spec.retryable:
            await store.release(scope, operation, key_digest)
        else:
            record = {
                "code": error.code,
                "detail": error.detail,
                "details": error.details,
                "headers": error.headers,
            }
            await store.complete(scope, operation, key_digest, Stored(status_code=error.status, error=record))
        raise
    except BaseException:
        await store.release(scope, operation, key_digest)
        raise
    await store.complete(scope, operation, key_digest, Stored(status_code=status_code, body=body))
    return _reply(status_code, body, replayed=False)
