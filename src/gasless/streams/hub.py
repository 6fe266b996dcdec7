"""StreamHub: one call, `publish(account, topic, key, data)`, reaches every account stream on every host.

On each host the hub coalesces (at most one event per (account, topic, key) per window, the latest state
wins: the first change goes out at once, later ones in the window are folded into one at its end), then
numbers the account's events (`seq`, per account on this host), keeps the last 300 000 ms / 1 000 of
them for `Last-Event-ID` resumption, and hands them to the account's open streams.

Across hosts, `publish` also sends the raw change through a `Fanout` (Redis pub/sub when configured); the
other host's hub receives it with `deliver` and numbers it in its own sequence, so ids stay host-specific
(docs/streams.md: not resumable across hosts or restarts).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

log = structlog.get_logger("gasless.streams")

REPLAY_MS = 300_000
REPLAY_EVENTS = 1_000
QUEUE_SIZE = 1_000  # a stream this far behind is closed (it resumes from the replay window, or resets)


@dataclass(frozen=True)
class Emitted:
    """One numbered event, ready to send (`doc` is the StreamEvent JSON)."""

    seq: int
    topic: str
    at_ms: int
    doc: str


class Fanout(Protocol):
    def send(self, account: str, topic: str, key: str, data: dict[str, Any], at_ms: int) -> None: ...

    def interested(self, account: str) -> bool:
        """Whether another host may have a stream for `account` (when unsure: yes)."""
        ...


@dataclass(eq=False)
class Subscription:
    account: str
    topics: frozenset[str]
    queue: asyncio.Queue[Emitted | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    lagging: bool = False


@dataclass
class _Account:
    seq: int = 0
    replay: deque[Emitted] = field(default_factory=deque)
    streams: set[Subscription] = field(default_factory=set)
    closed_at_ms: int | None = None  # when its last stream on this host ended


@dataclass
class _Window:
    handle: asyncio.TimerHandle
    pending: tuple[dict[str, Any], int] | None = None


class StreamHub:
    def __init__(
        self,
        *,
        coalesce_ms: int = 200,
        replay_ms: int = REPLAY_MS,
        replay_events: int = REPLAY_EVENTS,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.coalesce_ms = coalesce_ms
        self.replay_ms = replay_ms
        self.replay_events = replay_events
        self.clock = clock
        self.fanout: Fanout | None = None
        self._accounts: dict[str, _Account] = {}
        self._windows: dict[tuple[str, str, str], _Window] = {}

    # Publishing -----------------------------------------------------------------------------------------
    def wants(self, account: str) -> bool:
        """Whether a change for `account` can reach anyone: a stream of this host, open or ended (a client
        may resume it with Last-Event-ID), or another host's (the fan-out's shared registry of streamed
        accounts says). An account that no host streams has nothing to receive or resume, so its changes
        need not even be built: building and fanning out every account's changes was a tenth of a
        multi-host service's CPU per relay (docs/performance.md)."""
        return account in self._accounts or (self.fanout is not None and self.fanout.interested(account))

    def streamed_accounts(self) -> list[str]:
        """The accounts with a stream on this host, open or ended within the replay window (resumable)."""
        recent = self.clock() - self.replay_ms
        return [
            account
            for account, state in self._accounts.items()
            if state.streams or (state.closed_at_ms is not None and state.closed_at_ms >= recent)
        ]

    def publish(self, account: str, topic: str, key: str, data: dict[str, Any]) -> None:
        """A change of `key` (e.g. an intent id) under `topic` for `account`: to every host's streams."""
        at_ms = self.clock()
        if self.fanout is not None:
            try:
                self.fanout.send(account, topic, key, data, at_ms)
            except Exception as exc:  # the other host misses it; this host's streams still get it
                log.warning("stream fan-out failed", error=type(exc).__name__)
        self.deliver(account, topic, key, data, at_ms)

    def deliver(self, account: str, topic: str, key: str, data: dict[str, Any], at_ms: int) -> None:
        """A change for this host's streams (from this host's publish, or from another host). An account
        with no stream on this host, now or before, gets no event: no client holds an id to resume from,
        and a new stream starts from its first live event."""
        if account not in self._accounts:
            return
        window_key = (account, topic, key)
        window = self._windows.get(window_key)
        if window is not None:
            window.pending = (data, at_ms)  # the latest state wins
            return
        self._emit(account, topic, key, data, at_ms)
        self._open_window(window_key)

    def deliver_everywhere(self, topic: str, key: str, data: dict[str, Any]) -> None:
        """A change for every account with a stream on this host (global events such as incidents: each
        host finds them itself, so nothing goes through the fan-out). An account whose last stream ended
        within the replay window gets it too, so a stream resumed with Last-Event-ID does not miss it."""
        at_ms = self.clock()
        for account in self.streamed_accounts():
            self.deliver(account, topic, key, data, at_ms)

    def _open_window(self, window_key: tuple[str, str, str]) -> None:
        loop = asyncio.get_running_loop()
        handle = loop.call_later(self.coalesce_ms / 1000, self._close_window, window_key)
        self._windows[window_key] = _Window(handle)

    def _close_window(self, window_key: tuple[str, str, str]) -> None:
        window = self._windows.pop(window_key, None)
        if window is None or window.pending is None:
            return
        data, at_ms = window.pending
        account, topic, key = window_key
        self._emit(account, topic, key, data, at_ms)
        self._open_window(window_key)

    def _emit(self, account: str, topic: str, key: str, data: dict[str, Any], at_ms: int) -> None:
        state = self._accounts.setdefault(account, _Account())
        state.seq += 1
        doc = json.dumps(
            {"topic": topic, "account": account, "key": key, "atMs": at_ms, "data": data},
            separators=(",", ":"),
        )
        event = Emitted(state.seq, topic, at_ms, doc)
        state.replay.append(event)
        self._trim(state)
        for stream in state.streams:
            if topic not in stream.topics or stream.lagging:
                continue
            try:
                stream.queue.put_nowait(event)
            except asyncio.QueueFull:
                stream.lagging = True  # the stream ends; its client resumes with Last-Event-ID

    def _trim(self, state: _Account) -> None:
        oldest = self.clock() - self.replay_ms
        replay = state.replay
        while replay and (len(replay) > self.replay_events or replay[0].at_ms < oldest):
            replay.popleft()

    # Streams --------------------------------------------------------------------------------------------
    def head(self, account: str) -> int:
        """The account's latest seq on this host (0 before its first event)."""
        state = self._accounts.get(account)
        return state.seq if state is not None else 0

    def subscribe(
        self, account: str, topics: frozenset[str], after: int | None
    ) -> tuple[Subscription, list[Emitted] | None]:
        """A subscription, and the events after seq `after` still in the replay window (None when some are
        gone, or `after` is not a seq of this account: the stream then starts with `reset`). Atomic with
        respect to publishing: nothing falls between the replay and the live events."""
        state = self._accounts.setdefault(account, _Account())
        stream = Subscription(account, topics)
        state.streams.add(stream)
        if after is None:
            return stream, None
        self._trim(state)
        if after > state.seq:
            return stream, None
        if after < state.seq and (not state.replay or state.replay[0].seq > after + 1):
            return stream, None
        return stream, [e for e in state.replay if e.seq > after and e.topic in topics]

    def unsubscribe(self, stream: Subscription) -> None:
        state = self._accounts.get(stream.account)
        if state is None:
            return
        state.streams.discard(stream)
        if not state.streams:
            state.closed_at_ms = self.clock()
        # Keep the sequence (a later id must still compare right); drop the rest when nothing is left.
        self._trim(state)

    def sweep(self) -> None:
        """Drop replay events past the window for every account (run now and then)."""
        for state in self._accounts.values():
            self._trim(state)

    def close(self) -> None:
        for window in self._windows.values():
            window.handle.cancel()
        self._windows.clear()
        for state in self._accounts.values():
            for stream in state.streams:
                stream.lagging = True
                try:
                    stream.queue.put_nowait(None)
                except asyncio.QueueFull:
                    pass
