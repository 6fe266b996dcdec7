"""In-process fan-out of intent changes to the per-intent event streams of this host.

A change made on another host reaches this host's streams through their periodic re-read of the row;
this bus only makes same-host changes immediate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("gasless.relay.events")


class IntentBus:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        # Called with every published row (the account streams listen here); a listener must not raise.
        self._listeners: list[Callable[[Any], None]] = []

    def listen(self, listener: Callable[[Any], None]) -> None:
        self._listeners.append(listener)

    def subscribe(self, *keys: str) -> asyncio.Event:
        event = asyncio.Event()
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)
        return event

    def unsubscribe(self, event: asyncio.Event, *keys: str) -> None:
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def publish(self, row: Any) -> None:
        for key in (row.tx_hash, f"{row.sender}:{row.nonce}"):
            for event in self._waiters.get(key, ()):
                event.set()
        for listener in self._listeners:
            try:
                listener(row)
            except Exception as exc:  # a listener (streams, webhooks) must never break the relay path
                log.warning(
                    "intent listener failed",
                    listener=getattr(listener, "__qualname__", "?"),
                    error=type(exc).__name__,
                )
