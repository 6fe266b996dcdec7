"""Fencing: a signer signs only while it holds the database lease for its identity.

Two processes configured with the same signer identity (a host restarted while the old one hangs, a copied
config) must never both sign. Each process claims the identity's row with a fresh holder id; it renews the
claim every third of its TTL and refuses to sign once it cannot prove the claim is still its own (another
holder took it, or the database has been unreachable for longer than the claim lasts). A process that stops
cleanly stops signing, then gives its claim back, so its successor (a restart, a deploy) takes the identity
at once; one that died takes its claim with it, and its successor takes over just after the claim expired.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.core.workers import cancel_and_wait
from gasless.db import begin_write, signer_fences
from gasless.signer.base import RelayerKey, Signer, SignerFenced

log = structlog.get_logger("gasless.signer")

# Stop signing this long before the claim's end: a signature must never outlive the proof behind it.
SAFETY_MARGIN_MS = 500
# A process waiting for another holder's claim tries again this long after the claim's end.
RETAKE_AFTER_MS = 20


class FencedSigner:
    """Wraps a Signer; `sign` and `check` raise SignerFenced unless the identity's claim is held."""

    def __init__(
        self,
        inner: Signer,
        engine: AsyncEngine,
        *,
        signer_id: str,
        ttl_ms: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.engine = engine
        self.signer_id = signer_id
        self.ttl_ms = ttl_ms
        self.holder = uuid.uuid4().hex
        self.token: int | None = None
        self._clock = clock
        self._valid_until_ms = 0
        self._lost = False
        self._held_by_other_until_ms = 0  # another holder's claim, while this one has none yet
        self._task: asyncio.Task[None] | None = None

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def start(self) -> None:
        await self._claim()
        self._task = asyncio.create_task(self._keep(), name=f"fence:{self.signer_id}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._release()
        close = getattr(self.inner, "aclose", None)  # a signer holding resources (a PKCS#11 token's)
        if close is not None:
            await close()

    async def _claim(self) -> bool:
        """Take or renew the claim; False when another live holder has it."""
        try:
            async with begin_write(self.engine) as conn:
                # Time is read once the write lock is ours: a wait for the lock must not eat the validity.
                now = self._now_ms()
                row = (
                    await conn.execute(
                        select(signer_fences).where(signer_fences.c.signer_id == self.signer_id)
                    )
                ).first()
                if row is None:
                    token = 1
                    await conn.execute(
                        signer_fences.insert().values(
                            signer_id=self.signer_id,
                            holder=self.holder,
                            token=token,
                            expires_at_ms=now + self.ttl_ms,
                            updated_at_ms=now,
                        )
                    )
                elif row.holder == self.holder or row.expires_at_ms < now:
                    if row.holder != self.holder and self.token is not None:
                        # Our claim lapsed and someone may have held it since: never silently resume.
                        self._lost = True
                        return False
                    token = row.token if row.holder == self.holder else row.token + 1
                    await conn.execute(
                        update(signer_fences)
                        .where(signer_fences.c.signer_id == self.signer_id)
                        .values(
                            holder=self.holder,
                            token=token,
                            expires_at_ms=now + self.ttl_ms,
                            updated_at_ms=now,
                        )
                    )
                else:
                    if self.token is not None:
                        self._lost = True
                        log.error("signer fenced: another holder took the identity", signer_id=self.signer_id)
                    self._held_by_other_until_ms = row.expires_at_ms
                    return False
        except Exception as exc:  # database unreachable: keep the old proof until it runs out
            log.warning("signer fence renewal failed", signer_id=self.signer_id, error=type(exc).__name__)
            self._held_by_other_until_ms = 0
            return False
        self.token = token
        self._valid_until_ms = now + self.ttl_ms - SAFETY_MARGIN_MS
        self._held_by_other_until_ms = 0
        return True

    async def _keep(self) -> None:
        while not self._lost:
            delay_ms = self.ttl_ms / 3
            if self.token is None and self._held_by_other_until_ms:
                # Not claimed yet: try again just after the other holder's claim ends, not a renewal later.
                delay_ms = min(
                    delay_ms, max(0, self._held_by_other_until_ms - self._now_ms()) + RETAKE_AFTER_MS
                )
            await asyncio.sleep(delay_ms / 1000)
            await self._claim()

    async def _release(self) -> None:
        """Give the claim back: signing stops first, then the claim (still this holder's, or nobody's to
        release) is marked expired, so the identity's next holder need not wait out the TTL."""
        held = self.token is not None and not self._lost
        self._lost = True  # from here `sign` and `check` refuse
        if not held:
            return
        try:
            async with begin_write(self.engine) as conn:
                await conn.execute(
                    update(signer_fences)
                    .where(signer_fences.c.signer_id == self.signer_id, signer_fences.c.holder == self.holder)
                    .values(expires_at_ms=0, updated_at_ms=self._now_ms())
                )
        except Exception as exc:  # the claim then lapses on its own, within the TTL
            log.warning("signer fence release failed", signer_id=self.signer_id, error=type(exc).__name__)

    @property
    def holds(self) -> bool:
        return not self._lost and self.token is not None and self._now_ms() < self._valid_until_ms

    def check(self) -> None:
        if not self.holds:
            raise SignerFenced("signer cannot prove it is the only holder of its identity")
        self.inner.check()

    def readiness(self) -> str:
        """`/readyz`'s signer check: ok, fenced (the claim is not proven), or unavailable (a signer that
        follows its keys' store says it cannot sign now: a PKCS#11 token gone, docs/keys.md)."""
        if not self.holds:
            return "fenced"
        unavailable = getattr(self.inner, "unavailable", None)
        return "unavailable" if unavailable is not None and unavailable() is not None else "ok"

    def relayers(self) -> list[RelayerKey]:
        return self.inner.relayers()

    async def sign(self, relayer: str, message: bytes) -> bytes:
        if not self.holds and not self._lost:
            # The proof ran out (e.g. a database blip outlasted it): try to renew it once before refusing.
            await self._claim()
        self.check()
        return await self.inner.sign(relayer, message)
