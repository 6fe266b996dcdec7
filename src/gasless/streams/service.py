"""The account streams of one host: the hub, the tickets, the sources publishing into the hub, and the
account's rate class (which sets its concurrent-stream allowance)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from gasless.chain.abi import decode_outputs
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.relay.intents import intent_from_row
from gasless.streams.fanout import RedisFanout
from gasless.streams.hub import StreamHub
from gasless.streams.tickets import StreamTickets

log = structlog.get_logger("gasless.streams")

DEFAULT_RATE_CLASS = 1  # an account without a running plan streams as a Starter
_TIERS_TTL_S = 60.0


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


class AccountRateClass:
    """The rate class (1..6) of an account's running plan, read from the billing contract."""

    def __init__(self, mirror: Any) -> None:
        self.mirror = mirror
        self._tiers: dict[int, int] = {}
        self._tiers_at = 0.0

    async def of(self, account: str) -> int:
        try:
            view = await self.mirror.account(account)
            running = getattr(view, "running", None) if view is not None else None
            if running is None:
                return DEFAULT_RATE_CLASS
            tiers = await self._tier_classes()
            rate_class = tiers.get(int(running.tier_id), DEFAULT_RATE_CLASS)
            return rate_class if 1 <= rate_class <= 6 else DEFAULT_RATE_CLASS
        except (GatewayUnavailable, GatewayRejected, AttributeError, ValueError, TypeError):
            return DEFAULT_RATE_CLASS

    async def _tier_classes(self) -> dict[int, int]:
        if self._tiers and time.monotonic() - self._tiers_at < _TIERS_TTL_S:
            return self._tiers
        parts = await self.mirror.gateway.vm_query(self.mirror.contract, "getTiers", [])
        decoded = decode_outputs(self.mirror.abi, "getTiers", parts)
        tiers = decoded[0] if len(decoded) == 1 and isinstance(decoded[0], list) else decoded
        self._tiers = {int(t.id): int(t.rate_class) for t in tiers}
        self._tiers_at = time.monotonic()
        return self._tiers


@dataclass
class StreamService:
    hub: StreamHub
    tickets: StreamTickets
    keepalive_ms: int
    fanout: RedisFanout | None = None
    rate_classes: AccountRateClass | None = None
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
        self.rate_classes = AccountRateClass(mirror)

    async def rate_class(self, account: str) -> int:
        return DEFAULT_RATE_CLASS if self.rate_classes is None else await self.rate_classes.of(account)

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
