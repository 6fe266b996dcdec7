"""Cross-host fan-out of account-stream changes through Redis pub/sub.

Changes are sent in order by one sender task (a burst goes out as one pipelined batch) on the channel
`<prefix>:<env>:<chainId>:stream`; every host listens on it and delivers the other hosts' changes to its
own hub (its own come back too and are skipped by origin). Pub/sub is at-most-once: a change sent while a
host's subscription is down does not reach that host's streams; a client that reconnects meanwhile gets
the events this host did see, and the read routes stay the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gasless.streams.hub import StreamHub

log = structlog.get_logger("gasless.streams")
_BATCH = 256
_QUEUE = 10_000


class RedisFanout:
    def __init__(
        self, publisher: Redis, listener: Redis, namespace: str, origin: str, hub: StreamHub
    ) -> None:
        self.publisher = publisher
        self.listener = listener  # its own connection: a subscribed connection blocks on reads
        self.channel = f"{namespace}:stream"
        self.origin = origin  # `<hostId>.<bootEpochMs>`: this process
        self.hub = hub
        self._outbox: asyncio.Queue[str] = asyncio.Queue(_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.subscribed = asyncio.Event()

    def send(self, account: str, topic: str, key: str, data: dict[str, Any], at_ms: int) -> None:
        message = json.dumps(
            {"o": self.origin, "a": account, "t": topic, "k": key, "d": data, "at": at_ms},
            separators=(",", ":"),
        )
        try:
            self._outbox.put_nowait(message)
        except asyncio.QueueFull:
            log.warning("stream fan-out queue full; change not sent to the other host", topic=topic)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._send_forever(), name="stream-fanout-send"),
            asyncio.create_task(self._listen_forever(), name="stream-fanout-listen"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        await self.listener.aclose()

    async def _send_forever(self) -> None:
        while True:
            batch = [await self._outbox.get()]
            while len(batch) < _BATCH and not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            try:
                async with self.publisher.pipeline(transaction=False) as pipe:
                    for message in batch:
                        pipe.publish(self.channel, message)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                log.warning("stream fan-out: redis unreachable", dropped=len(batch), error=type(exc).__name__)

    async def _listen_forever(self) -> None:
        failing = False
        while True:
            try:
                async with self.listener.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    self.subscribed.set()
                    if failing:
                        log.info("stream fan-out: subscribed again")
                        failing = False
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                        if message is not None and message.get("type") == "message":
                            self._receive(message["data"])
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                if not failing:
                    log.warning("stream fan-out: subscription lost; retrying", error=type(exc).__name__)
                    failing = True
                await asyncio.sleep(1.0)

    def _receive(self, raw: bytes | str) -> None:
        try:
            doc = json.loads(raw)
            if doc["o"] == self.origin:
                return
            self.hub.deliver(str(doc["a"]), str(doc["t"]), str(doc["k"]), doc["d"], int(doc["at"]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("stream fan-out: unreadable message", error=type(exc).__name__)
