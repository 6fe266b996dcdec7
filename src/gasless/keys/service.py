"""Sponsor API keys: creation (secret shown once), listing, policy changes, revocation, and lookups.

Only `HMAC-SHA256(purpose key "api-key", whole key string)` is stored; the purpose key is derived from the
environment's master secret with env + chainId in its info, so a key cannot verify on another network.

Lookups keep a small per-host cache keyed by key id (row snapshot, or "no such key") that lives
`cache_ttl_ms` (1 000 ms): with hosts sharing the database, a revocation made on one host is seen by every
other host within that time, well inside the interface contract's 2 000 ms; the revoking host drops its entry at once.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gasless.core.crypto import PurposeKeys
from gasless.core.errors import ApiError
from gasless.keys.key_format import (
    KEY_ID_PATTERN,
    KeyFormatError,
    display_prefix,
    make_key,
    new_key_id,
    parse_key,
)
from gasless.keys.repository import ApiKeyRepository, ApiKeyRow, SlotsFull
from gasless.keys.schemas import ApiKey, ApiKeyCreated, ApiKeyPolicy

MAX_ACTIVE_KEYS = 10
CACHE_TTL_MS = 1_000  # < the interface contract's 2 000 ms revocation bound, with room for a slow read
CACHE_SIZE = 10_000
_NO_SUCH_KEY = object()


@dataclass(frozen=True)
class SponsorKey:
    """A verified key: the account it bills and its policy (what routes and billing need)."""

    key_id: str
    account: str
    env: str
    policy: ApiKeyPolicy

    def allows(self, scope: str) -> bool:
        return scope in self.policy.scopes


def invalid_key(reason: str, detail: str) -> ApiError:
    return ApiError("API_KEY_INVALID", detail=detail, details={"reason": reason})


def to_api_key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        keyId=row.key_id,
        label=row.label,
        env=row.env,  # type: ignore[arg-type]
        prefix=display_prefix(row.env, row.key_id),
        policy=ApiKeyPolicy.model_validate(row.policy),
        createdMs=row.created_at_ms,
        updatedMs=row.updated_at_ms,
    )


class ApiKeyService:
    def __init__(
        self,
        repo: ApiKeyRepository,
        keys: PurposeKeys,
        *,
        max_active: int = MAX_ACTIVE_KEYS,
        cache_ttl_ms: int = CACHE_TTL_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repo = repo
        self.keys = keys
        self.env = keys.env
        self.max_active = max_active
        self.cache_ttl_ms = cache_ttl_ms
        self.clock = clock  # seconds, monotonic: drives the lookup cache only
        self._cache: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def _hmac(self, key: str) -> str:
        return self.keys.mac("api-key", key.encode("ascii")).hex()

    # Management (the owner, through native-auth routes) ----------------------------------------------
    async def create(self, account: str, label: str, policy: ApiKeyPolicy) -> ApiKeyCreated:
        key_id = new_key_id()
        secret = make_key(self.env, key_id)
        try:
            row = await self.repo.insert(
                key_id=key_id,
                account=account,
                env=self.env,
                label=label,
                policy=policy.model_dump(mode="json"),
                secret_hmac=self._hmac(secret),
                now_ms=_now_ms(),
                max_active=self.max_active,
            )
        except SlotsFull:
            raise ApiError(
                "LIMIT_REACHED",
                detail=f"the account already has {self.max_active} active API keys; revoke one first",
                details={"limit": self.max_active, "resource": "apiKeys"},
            ) from None
        return ApiKeyCreated(**to_api_key(row).model_dump(), secret=secret)

    async def list(self, account: str) -> list[ApiKey]:
        return [to_api_key(row) for row in await self.repo.active_for(account, self.env)]

    async def update(
        self, account: str, key_id: str, *, label: str | None, policy: ApiKeyPolicy | None
    ) -> ApiKey:
        row = None
        if KEY_ID_PATTERN.fullmatch(key_id):
            row = await self.repo.update(
                key_id,
                account=account,
                env=self.env,
                label=label,
                policy=policy.model_dump(mode="json") if policy is not None else None,
                now_ms=_now_ms(),
            )
        if row is None:
            raise _no_such_key(account, key_id)
        self._forget(key_id)  # this host sees the new policy at once; the others within the cache TTL
        return to_api_key(row)

    async def revoke(self, account: str, key_id: str) -> None:
        revoked = KEY_ID_PATTERN.fullmatch(key_id) is not None and await self.repo.revoke(
            key_id, account=account, env=self.env, now_ms=_now_ms()
        )
        if not revoked:
            raise _no_such_key(account, key_id)
        self._forget(key_id)

    # Lookup (every request carrying X-Api-Key) --------------------------------------------------------
    async def resolve(self, key: str) -> SponsorKey:
        """The verified key, or API_KEY_INVALID (malformed, checksum, environment, unknown, revoked)."""
        try:
            parsed = parse_key(key)
        except KeyFormatError as exc:
            raise invalid_key(exc.reason, exc.message) from None
        if parsed.env != self.env:
            raise invalid_key(
                "environment",
                f"this is a {parsed.env} key; this host serves the {self.env} environment "
                f"(keys start with gls_{self.env}_ here)",
            )
        row = await self._row(parsed.key_id)
        # Constant-time: the comparison must not reveal how much of a guessed secret was right.
        if row is None or not hmac.compare_digest(row.secret_hmac, self._hmac(key)):
            raise invalid_key("unknown", "unknown API key")
        if not row.active:
            raise invalid_key("revoked", "this API key was revoked")
        return SponsorKey(
            key_id=row.key_id,
            account=row.account,
            env=row.env,
            policy=ApiKeyPolicy.model_validate(row.policy),
        )

    async def _row(self, key_id: str) -> ApiKeyRow | None:
        now = self.clock()
        hit = self._cache.get(key_id)
        if hit is not None and hit[0] > now:
            return None if hit[1] is _NO_SUCH_KEY else hit[1]  # type: ignore[no-any-return]
        row = await self.repo.get(key_id)
        self._cache[key_id] = (now + self.cache_ttl_ms / 1000, _NO_SUCH_KEY if row is None else row)
        self._cache.move_to_end(key_id)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return row

    def _forget(self, key_id: str) -> None:
        self._cache.pop(key_id, None)


def _no_such_key(account: str, key_id: str) -> ApiError:
    return ApiError("NOT_FOUND", detail=f"account {account} has no active API key {key_id[:32]!r}")


def _now_ms() -> int:
    return int(time.time() * 1000)
