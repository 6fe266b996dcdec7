"""Stream tickets: `st1.<payload>.<mac>`, MAC'd with the `ticket` purpose key (bound to env and chain id).

The payload names the account, the topics, the caller who asked (an address or a key id, with its role)
and the expiry (30 000 ms after issue). Single use is enforced by remembering the ticket's nonce until it
expires: in Redis (`SET NX PX`, shared by every host of the environment) when Redis is configured, else in
this process (the single-host default). With Redis configured but not answering, tickets are refused with
503 rather than risk a second use on the other host.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode
from gasless.core.errors import ApiError
from gasless.streams.schemas import TOPICS

log = structlog.get_logger("gasless.streams")

TICKET_TTL_MS = 30_000
_PREFIX = "st1"
_DOMAIN = b"gasless/stream-ticket/v1|"
CallerKind = Literal["owner", "sender", "key"]


@dataclass(frozen=True)
class TicketClaims:
    account: str
    topics: tuple[str, ...]
    caller: str  # the native-auth address, or the sponsor key's keyId
    role: CallerKind
    expires_ms: int
    nonce: str


def ticket_invalid(reason: str, detail: str) -> ApiError:
    return ApiError("STREAM_TICKET_INVALID", detail=detail, details={"reason": reason})


class UsedTickets(Protocol):
    async def first_use(self, nonce: str, expires_ms: int, now_ms: int) -> bool:
        """True the first time `nonce` is presented (and remembers it until `expires_ms`)."""
        ...


class LocalUsedTickets:
    """Single use within this process: enough for one host (SQLite deployments run one)."""

    def __init__(self) -> None:
        self._used: dict[str, int] = {}

    async def first_use(self, nonce: str, expires_ms: int, now_ms: int) -> bool:
        if len(self._used) > 1024:
            self._used = {n: e for n, e in self._used.items() if e > now_ms}
        if nonce in self._used:
            return False
        self._used[nonce] = expires_ms
        return True


class RedisUsedTickets:
    """Single use across every host sharing this Redis namespace."""

    def __init__(self, redis: Redis, namespace: str) -> None:
        self.redis = redis
        self.namespace = namespace

    def key(self, nonce: str) -> str:
        return f"{self.namespace}:ticket:{nonce}"

    async def first_use(self, nonce: str, expires_ms: int, now_ms: int) -> bool:
        # Kept a second past expiry: a host whose clock runs slightly behind must still see the use.
        ttl_ms = max(1, expires_ms - now_ms) + 1_000
        try:
            return bool(await self.redis.set(self.key(nonce), b"1", nx=True, px=ttl_ms))
        except (RedisError, OSError) as exc:
            log.warning("redis unreachable; stream tickets refused", error=type(exc).__name__)
            raise ApiError(
                "UPSTREAM_UNAVAILABLE",
                detail="stream tickets cannot be checked for reuse right now; retry, or send the "
                "Authorization header instead of a ticket",
                details={"retryAfterMs": 1_000},
            ) from None


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamTickets:
    def __init__(
        self,
        keys: PurposeKeys,
        used: UsedTickets,
        *,
        ttl_ms: int = TICKET_TTL_MS,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.keys = keys
        self.used = used
        self.ttl_ms = ttl_ms
        self.clock = clock  # Unix ms; tests move it

    def issue(
        self, account: str, topics: tuple[str, ...], caller: str, role: CallerKind
    ) -> tuple[str, TicketClaims]:
        claims = TicketClaims(
            account=account,
            topics=topics,
            caller=caller,
            role=role,
            expires_ms=self.clock() + self.ttl_ms,
            nonce=secrets.token_hex(16),
        )
        payload = json.dumps(
            {
                "a": claims.account,
                "t": list(claims.topics),
                "c": claims.caller,
                "r": claims.role,
                "e": claims.expires_ms,
                "n": claims.nonce,
            },
            separators=(",", ":"),
        ).encode()
        tag = self.keys.mac("ticket", _DOMAIN + payload)
        return f"{_PREFIX}.{b64url(payload)}.{b64url(tag)}", claims

    def verify(self, ticket: str) -> TicketClaims:
        """The claims of a well-formed, authentic, unexpired ticket (not yet marked used)."""
        prefix, _, rest = ticket.partition(".")
        encoded, _, encoded_tag = rest.partition(".")
        try:
            if prefix != _PREFIX or not encoded or not encoded_tag:
                raise ValueError
            payload = b64url_decode(encoded)
            tag = b64url_decode(encoded_tag)
        except ValueError:
            raise ticket_invalid(
                "malformed", "not a stream ticket (POST /v1/stream/tickets issues them)"
            ) from None
        # Constant-time; a ticket of another environment or chain fails here (its key differs).
        if not self.keys.verify("ticket", _DOMAIN + payload, tag):
            raise ticket_invalid(
                "signature", "the ticket did not verify (altered, or issued for another environment)"
            )
        try:
            doc = json.loads(payload)
            claims = TicketClaims(
                account=str(doc["a"]),
                topics=tuple(str(t) for t in doc["t"] if t in TOPICS),
                caller=str(doc["c"]),
                role=doc["r"],
                expires_ms=int(doc["e"]),
                nonce=str(doc["n"]),
            )
        except (ValueError, KeyError, TypeError):
            raise ticket_invalid("malformed", "the ticket's contents are not readable") from None
        if self.clock() >= claims.expires_ms:
            raise ticket_invalid(
                "expired", f"the ticket expired (tickets live {self.ttl_ms} ms); ask for a new one"
            )
        return claims

    async def use(self, claims: TicketClaims) -> None:
        """Use up a verified ticket: STREAM_TICKET_INVALID when it was used before (on any host)."""
        if not await self.used.first_use(claims.nonce, claims.expires_ms, self.clock()):
            raise ticket_invalid("used", "the ticket was already used; a ticket opens one stream")

    async def redeem(self, ticket: str) -> TicketClaims:
        """Verify and use up the ticket: STREAM_TICKET_INVALID when bad, expired or already used."""
        claims = self.verify(ticket)
        await self.use(claims)
        return claims
