"""SQL of the sponsor API keys. An active key holds a slot 0..max-1 of its account; revoking frees it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import api_keys, begin_write

# The unique (account, env, slot) key is the guarantee; creations for one account queue on a transaction
# lock (PostgreSQL advisory lock; SQLite has one writer) so they do not race for the same free slot.
_INSERT_ATTEMPTS = 3


@dataclass(frozen=True)
class ApiKeyRow:
    key_id: str
    account: str
    env: str
    slot: int | None
    label: str
    policy: dict[str, Any]
    secret_hmac: str  # hex HMAC-SHA256 of the whole key string
    created_at_ms: int
    updated_at_ms: int
    revoked_at_ms: int | None

    @property
    def active(self) -> bool:
        return self.revoked_at_ms is None


def _account_lock(account: str, env: str) -> int:
    digest = hashlib.sha256(f"gasless.api_keys|{account}|{env}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _row(row: Row[Any] | None) -> ApiKeyRow | None:
    return None if row is None else ApiKeyRow(**row._mapping)


class SlotsFull(Exception):
    """Every slot of the account is held by an active key."""


class ApiKeyRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def insert(
        self,
        *,
        key_id: str,
        account: str,
        env: str,
        label: str,
        policy: dict[str, Any],
        secret_hmac: str,
        now_ms: int,
        max_active: int,
    ) -> ApiKeyRow:
        """Store a new active key in the lowest free slot; SlotsFull when the account has `max_active`."""
        for attempt in range(_INSERT_ATTEMPTS):
            try:
                async with begin_write(self.engine) as conn:
                    if conn.dialect.name == "postgresql":
                        await conn.execute(
                            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _account_lock(account, env)}
                        )
                    taken = set(
                        (
                            await conn.execute(
                                select(api_keys.c.slot).where(
                                    api_keys.c.account == account,
                                    api_keys.c.env == env,
                                    api_keys.c.slot.is_not(None),
                                )
                            )
                        ).scalars()
                    )
                    free = [slot for slot in range(max_active) if slot not in taken]
                    if not free:
                        raise SlotsFull
                    values = {
                        "key_id": key_id,
                        "account": account,
                        "env": env,
                        "slot": free[0],
                        "label": label,
                        "policy": policy,
                        "secret_hmac": secret_hmac,
                        "created_at_ms": now_ms,
                        "updated_at_ms": now_ms,
                        "revoked_at_ms": None,
                    }
                    await conn.execute(api_keys.insert().values(**values))
                    return ApiKeyRow(**values)
            except IntegrityError:
                if attempt == _INSERT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def get(self, key_id: str) -> ApiKeyRow | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.key_id == key_id))).first()
        return _row(row)

    async def active_for(self, account: str, env: str) -> list[ApiKeyRow]:
        """The account's active keys in `env`, oldest first."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(api_keys)
                    .where(
                        api_keys.c.account == account,
                        api_keys.c.env == env,
                        api_keys.c.revoked_at_ms.is_(None),
                    )
                    .order_by(api_keys.c.created_at_ms, api_keys.c.key_id)
                )
            ).all()
        return [row for row in map(_row, rows) if row is not None]

    async def update(
        self,
        key_id: str,
        *,
        account: str,
        env: str,
        label: str | None,
        policy: dict[str, Any] | None,
        now_ms: int,
    ) -> ApiKeyRow | None:
        """Change an active key's label and/or policy; None when the account has no such active key."""
        changes: dict[str, Any] = {"updated_at_ms": now_ms}
        if label is not None:
            changes["label"] = label
        if policy is not None:
            changes["policy"] = policy
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(api_keys).where(*self._active_key(key_id, account, env)).values(**changes)
            )
            if result.rowcount != 1:
                return None
            row = (await conn.execute(select(api_keys).where(api_keys.c.key_id == key_id))).first()
        return _row(row)

    async def revoke(self, key_id: str, *, account: str, env: str, now_ms: int) -> bool:
        """Revoke an active key of the account (its slot is freed); False when there is none."""
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(api_keys)
                .where(*self._active_key(key_id, account, env))
                .values(revoked_at_ms=now_ms, updated_at_ms=now_ms, slot=None)
            )
        return bool(result.rowcount == 1)

    @staticmethod
    def _active_key(key_id: str, account: str, env: str) -> tuple[Any, ...]:
        return (
            api_keys.c.key_id == key_id,
            api_keys.c.account == account,
            api_keys.c.env == env,
            api_keys.c.revoked_at_ms.is_(None),
        )
