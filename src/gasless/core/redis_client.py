"""A host's Redis client: redis-py's asyncio client over a pool that closes the connections nobody took
for a minute.

redis-py's pool opens a connection whenever every pooled one is busy and keeps all it ever opened: each
slow spell left a host with more connections for good (the soak's descriptors rose in steps, about 20
connections a host at 50 relays/s). Like the database pool (`gasless.db.engine.IdleClosingQueuePool`),
this one hands out the connection returned last, so what a burst opened is left idle at the bottom and
closed a minute later.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection

CLOSE_IDLE_AFTER_S = 60.0


class IdleClosingConnectionPool(ConnectionPool):
    """redis-py's asyncio pool, disconnecting the connections idle for `close_idle_after_s` seconds. The
    check runs at a connection's return, at most four times a window; the idle ones leave the pool under
    its lock before they are closed, so no command is handed one that is closing."""

    def __init__(self, *args: Any, close_idle_after_s: float = CLOSE_IDLE_AFTER_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_idle_after_s = close_idle_after_s
        self._idle_since: weakref.WeakKeyDictionary[AbstractConnection, float] = weakref.WeakKeyDictionary()
        self._checked_idle_at = time.monotonic()

    async def release(self, connection: AbstractConnection) -> None:
        self._idle_since[connection] = time.monotonic()
        await super().release(connection)
        now = time.monotonic()
        if now - self._checked_idle_at >= self.close_idle_after_s / 4:
            self._checked_idle_at = now
            await self._close_idle(now - self.close_idle_after_s)

    async def _close_idle(self, idle_since: float) -> None:
        async with self._lock:
            idle = [
                c for c in self._available_connections if self._idle_since.get(c, idle_since) < idle_since
            ]
            for connection in idle:
                self._available_connections.remove(connection)
        for connection in idle:
            with contextlib.suppress(Exception):  # a connection already broken is gone either way
                await connection.disconnect()


def connect_redis(url: str, *, close_idle_after_s: float = CLOSE_IDLE_AFTER_S, **kwargs: Any) -> Redis:
    """A client of `url` whose pool closes idle connections; `aclose()` closes the pool with it."""
    pool = IdleClosingConnectionPool.from_url(url, close_idle_after_s=close_idle_after_s, **kwargs)
    return Redis.from_pool(pool)
