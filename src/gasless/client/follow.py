"""Following one intent: the SSE stream `GET /v1/relay/{id}/events`, then polling `GET /v1/relay/{id}`.

- Each `intent` event's data is an Intent; `id:` is the intent's change counter.
- A dropped connection (or a stream that ends early without a final event) is resumed with
  `Last-Event-ID`, so nothing is seen twice; after `max_reconnects` failures in a row the client polls.
- The server closes the stream after its lifetime (120 000 ms); then the client polls, as the interface contract says.
- A stream refused with `RATE_LIMITED` (too many streams from this IP) is not retried: the client polls,
  and a poll refused with `RATE_LIMITED` waits as asked and reads again.
- Iteration stops after the first intent with `final: true` (`FINALIZED`, `DEAD`, `REJECTED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from gasless.client.problems import RelayProblem
from gasless.client.sse import SSEParser


class IntentReads(Protocol):
    """The parts of `RelayClient` that following an intent uses (the client passes itself)."""

    @property
    def session(self) -> aiohttp.ClientSession: ...

    def url(self, path: str) -> str: ...

    async def intent(self, ident: str) -> dict[str, Any]: ...


FINAL_STATES = ("FINALIZED", "DEAD", "REJECTED")
KEEPALIVE_READ_S = 45.0  # the server sends a comment every 15 s; three missed ones mean a dead connection
LIFETIME_SLACK = 0.9


def is_final(intent: dict[str, Any]) -> bool:
    return intent.get("final") is True or intent.get("state") in FINAL_STATES


def _newer(event_id: str, last_id: str | None) -> bool:
    if last_id is None:
        return True
    if event_id.isdigit() and last_id.isdigit():
        return int(event_id) > int(last_id)
    return event_id != last_id


class _Stream:
    """One connection to the event stream; remembers the last event id and the server's retry hint."""

    def __init__(self, client: IntentReads, ident: str, last_id: str | None, read_timeout_s: float) -> None:
        self.client = client
        self.ident = ident
        self.last_id = last_id
        self.read_timeout_s = read_timeout_s
        self.retry_ms: int | None = None

    async def events(self) -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.read_timeout_s)
        url = self.client.url(f"/v1/relay/{quote(self.ident, safe=':')}/events")
        async with self.client.session.get(url, headers=headers, timeout=timeout) as response:
            if response.status != 200:
                text = await response.text()
                try:
                    body: Any = json.loads(text)
                except ValueError:
                    body = text
                raise RelayProblem.from_response(response.status, body, response.headers)
            parser = SSEParser()
            async for chunk in response.content.iter_any():
                for event in parser.feed(chunk):
                    self.retry_ms = parser.retry_ms
                    if event.event != "intent":
                        continue
                    try:
                        intent = json.loads(event.data)
                    except ValueError:
                        continue
                    if isinstance(intent, dict):
                        yield event.id, intent


async def follow_intent(
    client: IntentReads,
    ident: str,
    *,
    poll_interval_s: float = 1.0,
    stream_lifetime_s: float = 120.0,
    timeout_s: float | None = None,
    max_reconnects: int = 5,
) -> AsyncIterator[dict[str, Any]]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last_id: str | None = None
    last_seen: dict[str, Any] | None = None
    failures = 0

    def remaining() -> float:
        if deadline is None:
            return KEEPALIVE_READ_S
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"intent {ident} was not final within {timeout_s} s")
        return left

    # 1. The event stream, resumed after drops.
    while failures <= max_reconnects:
        stream = _Stream(client, ident, last_id, min(KEEPALIVE_READ_S, remaining()))
        opened = time.monotonic()
        try:
            async with contextlib.aclosing(stream.events()) as events:
                async for event_id, intent in events:
                    if event_id is not None:
                        if not _newer(event_id, last_id):
                            continue
                        last_id = event_id
                    failures = 0
                    if intent != last_seen:
                        last_seen = intent
                        yield intent
                    if is_final(intent):
                        return
        except RelayProblem as problem:
            if problem.code == "RATE_LIMITED":
                break  # too many streams from this IP: polling is limited separately
            if problem.status < 500 and problem.code != "HTTP_ERROR":
                raise  # NOT_FOUND, MALFORMED_REQUEST: polling would not help either
            failures += 1
        except (aiohttp.ClientError, TimeoutError):
            failures += 1
        else:
            if time.monotonic() - opened >= stream_lifetime_s * LIFETIME_SLACK:
                break  # the server's lifetime is over: poll from now on
            failures += 1  # ended early without a final event: resume
        remaining()
        if failures <= max_reconnects:
            delay = stream.retry_ms / 1000 if stream.retry_ms is not None else min(0.2 * 2**failures, 5.0)
            await asyncio.sleep(min(delay, remaining()))

    # 2. Polling.
    while True:
        remaining()
        try:
            intent = await client.intent(ident)
        except RelayProblem as problem:
            if problem.code == "RATE_LIMITED":  # wait as asked, then read again
                await asyncio.sleep(min(max(problem.retry_after_s or 1.0, poll_interval_s), remaining()))
                continue
            if problem.status < 500 and problem.code != "HTTP_ERROR":
                raise
            intent = None
        except (aiohttp.ClientError, TimeoutError):
            intent = None
        if intent is not None:
            if intent != last_seen:
                last_seen = intent
                yield intent
            if is_final(intent):
                return
        await asyncio.sleep(min(poll_interval_s, remaining()))
