"""The account streams of one host: the hub, the tickets, the sources publishing into the hub, and the
account's rate class (which sets its concurrent-stream allowance)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import structlog

from gasless.mirror.views import DEFAULT_RATE_CLASS, ContractMirror
from gasless.relay.intents import intent_from_row
from gasless.streams.fanout import RedisFanout
from gasless.streams.hub import StreamHub
from gasless.streams.tickets import StreamTickets

log = structlog.get_logger("gasless.streams")


class IntentSource:
    """Publishes every intent change a host makes to the `intents` topic of the account billed for it."""

    def __init__(self, hub: StreamHub, round_ms: int) -> None:
        self.hub = hub
        self.round_ms = round_ms

    def __call__(self, row: Any) -> None:
        try:
            billing = row.billing if isinstance(row.billing, dict) else {}
            account = billing.get("account")
            if not account or not self.hub.wants(str(account)):
                return
            intent = intent_from_row(row, self.round_ms)
            self.hub.publish(str(account), "intents", intent.id, intent.model_dump(mode="json"))
        except Exception as exc:  # a stream must never break the relay core's publisher
            log.warning("intent stream event failed", error=type(exc).__name__)


@dataclass
class StreamService:
    hub: StreamHub
    tickets: StreamTickets
    keepalive_ms: int
    fanout: RedisFanout | None = None
    mirror: ContractMirror | None = None
    _sweeper: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        if self.fanout is not None:
            await self.fanout.start()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="stream-replay-sweeper")

    async def stop(self) -> None:
        self.hub.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper
        if self.fanout is not None:
            await self.fanout.stop()

    def attach_intents(self, bus: Any, round_ms: int, mirror: Any) -> None:
        """Once the relay core runs: intent changes flow into the hub; rate classes come from the contract."""
        bus.listen(IntentSource(self.hub, round_ms))
        self.mirror = mirror

    async def rate_class(self, account: str) -> int:
        return DEFAULT_RATE_CLASS if self.mirror is None else await self.mirror.rate_class_of(account)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(30.0)
            self.hub.sweep()


def build_stream_service(settings: Any, keys: Any, redis: Any, boot_epoch_ms: int) -> StreamService:
    """The host's streams: tickets and fan-out through Redis when configured, else within this process."""
    from redis.asyncio import Redis

    from gasless.limits.redis_backend import redis_namespace
    from gasless.streams.tickets import LocalUsedTickets, RedisUsedTickets, UsedTickets

    hub = StreamHub(coalesce_ms=settings.stream_coalesce_ms)
    used: UsedTickets
    fanout: RedisFanout | None = None
    if redis is not None and settings.redis_url:
        namespace = redis_namespace(settings.redis_prefix, settings.key_env, settings.network.chain_id)
        used = RedisUsedTickets(redis, namespace)
        listener = Redis.from_url(settings.redis_url, socket_connect_timeout=2)
        fanout = RedisFanout(redis, listener, namespace, f"{settings.host_id}.{boot_epoch_ms}", hub)
        hub.fanout = fanout
    else:
        used = LocalUsedTickets()
        if not settings.effective_database_url.startswith("sqlite"):
            log.warning(
                "no redis: stream tickets are single use and stream events reach streams on this host only; "
                "configure redis for more than one host"
            )
    return StreamService(hub, StreamTickets(keys, used), settings.stream_keepalive_ms, fanout)
