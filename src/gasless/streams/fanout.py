"""Cross-host fan-out of account-stream changes through Redis pub/sub.

Changes are sent in order by one sender task (a burst goes out as one pipelined batch) on the channel
`<prefix>:<env>:<chainId>:stream`; every host listens on it and delivers the other hosts' changes to its
own hub (its own come back too and are skipped by origin).

Only changes of streamed accounts are built and sent. Which accounts some host streams is a registry in
Redis: the sorted set `<prefix>:<env>:<chainId>:stream:interest` (member the account, score the time its
entry lapses). A host adds an account when a stream for it opens, before the stream's first frame, and also
says so on the channel, so the other hosts know at once; every `INTEREST_REFRESH_MS` it renews the entries
of the accounts it streams (open, or ended within the replay window), drops lapsed ones and reads the set
again (an announcement missed while its subscription was down is found there). A host that has not read the
set, or could not for longer than an entry lives, treats every account as streamed: it sends everything,
as it would without the registry. Pub/sub is at-most-once: a change sent while a
host's subscription is down does not reach that host's streams; a client that reconnects meanwhile gets
the events this host did see, and the read routes stay the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gasless.streams.hub import StreamHub

log = structlog.get_logger("gasless.streams")
_BATCH = 256
_QUEUE = 10_000
INTEREST_TTL_MS = 15_000  # a registry entry lapses this long after its host last renewed it
INTEREST_REFRESH_MS = 5_000  # how often a host renews its entries and reads the registry


class RedisFanout:
    def __init__(
        self,
        publisher: Redis,
        listener: Redis,
        namespace: str,
        origin: str,
        hub: StreamHub,
        *,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.publisher = publisher
        self.listener = listener  # its own connection: a subscribed connection blocks on reads
        self.channel = f"{namespace}:stream"
        self.interest_key = f"{namespace}:stream:interest"
        self.origin = origin  # `<instanceId>.<bootEpochMs>`: this process
        self.hub = hub
        self.clock = clock
        self._outbox: asyncio.Queue[str] = asyncio.Queue(_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.subscribed = asyncio.Event()
        self._streamed: dict[str, int] = {}  # account -> until (ms): streamed by some host, as last read
        self._streamed_read_at: int | None = None  # when the registry was last read (None: never)

    def interested(self, account: str) -> bool:
        now = self.clock()
        if self._streamed_read_at is None or now - self._streamed_read_at > INTEREST_TTL_MS:
            return True  # the registry is not known (not read yet, or Redis unreachable): send everything
        return self._streamed.get(account, 0) > now

    async def announce(self, account: str) -> None:
        """A stream for `account` opens on this host: the registry, and every host listening, know it before
        this returns (the stream's first frame goes out after it). Never raises: without Redis the other
        hosts' changes cannot reach this stream anyway."""
        until = self.clock() + INTEREST_TTL_MS
        self._streamed[account] = max(self._streamed.get(account, 0), until)
        message = json.dumps({"o": self.origin, "w": account, "until": until}, separators=(",", ":"))
        try:
            async with self.publisher.pipeline(transaction=False) as pipe:
                pipe.zadd(self.interest_key, {account: until})
                pipe.publish(self.channel, message)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("stream fan-out: could not register a streamed account", error=type(exc).__name__)

    async def refresh_interest(self) -> None:
        """Renew this host's registry entries, drop lapsed ones, and read the registry."""
        now = self.clock()
        until = now + INTEREST_TTL_MS
        mine = self.hub.streamed_accounts()
        async with self.publisher.pipeline(transaction=False) as pipe:
            if mine:
                pipe.zadd(self.interest_key, dict.fromkeys(mine, until))
            pipe.zremrangebyscore(self.interest_key, "-inf", now)
            pipe.zrangebyscore(self.interest_key, now, "+inf", withscores=True)
            results = await pipe.execute()
        streamed = {
            (member.decode() if isinstance(member, bytes) else str(member)): int(score)
            for member, score in results[-1]
        }
        # Announcements heard since the read began stay (each was added to the set before it was sent).
        for account, heard_until in self._streamed.items():
            if heard_until > streamed.get(account, 0) and heard_until > now:
                streamed[account] = heard_until
        self._streamed = streamed
        self._streamed_read_at = now

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
            asyncio.create_task(self._refresh_interest_forever(), name="stream-fanout-interest"),
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

    async def _refresh_interest_forever(self) -> None:
        failing = False
        while True:
            try:
                await self.refresh_interest()
                failing = False
            except (RedisError, OSError) as exc:
                if not failing:
                    log.warning(
                        "stream fan-out: registry unreachable; sending every change", error=type(exc).__name__
                    )
                    failing = True
            await asyncio.sleep(INTEREST_REFRESH_MS / 1000)

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
            if "w" in doc:  # another host's stream for an account opened
                account, until = str(doc["w"]), int(doc["until"])
                self._streamed[account] = max(self._streamed.get(account, 0), until)
                return
            self.hub.deliver(str(doc["a"]), str(doc["t"]), str(doc["k"]), doc["d"], int(doc["at"]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("stream fan-out: unreadable message", error=type(exc).__name__)
