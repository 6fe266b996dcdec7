"""The account streams of one host: the hub, the tickets, the sources publishing into the hub, and the
account's rate class (which sets its concurrent-stream allowance)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gasless.limits.buckets import DEFAULT_RATE_CLASS
from gasless.mirror.views import ContractMirror
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


TERMINAL = frozenset({"EXECUTED", "DEAD"})


class QuotaSource:
    """Publishes the account's Quota to the `quota` topic after its intents settle (executed: billed; dead:
    released) and after a purchase. Quotas are read at most once per `every_ms` per account (the latest
    wins), so a burst of settlements costs one read."""

    def __init__(
        self,
        hub: StreamHub,
        quotas: Callable[[list[str]], Awaitable[Mapping[str, Any]]],
        every_ms: int,
    ) -> None:
        self.hub = hub
        self.quotas = quotas  # the Quota of several accounts in one read
        self.every_ms = every_ms
        self._dirty: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def __call__(self, row: Any) -> None:
        """The intent bus listener (synchronous, on the tracker's path: it only notes the account)."""
        if row.state not in TERMINAL:
            return
        billing = row.billing if isinstance(row.billing, dict) else {}
        account = billing.get("account")
        if account and self.hub.wants(str(account)):
            self.mark(str(account))

    def mark(self, account: str) -> None:
        self._dirty.add(account)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush(), name="stream-quota")

    async def _flush(self) -> None:
        while self._dirty:
            accounts, self._dirty = self._dirty, set()
            try:
                quotas = await self.quotas(sorted(accounts))
                for account, quota in quotas.items():
                    self.hub.publish(account, "quota", "quota", quota.model_dump(mode="json"))
            except Exception as exc:  # a stream must never break the tracker
                log.warning("quota stream event failed", accounts=len(accounts), error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class AccountSource:
    """The mirror follower's callback (on the host that follows the contract): every mirrored contract
    event naming an account publishes its Account to the `account` topic, and its Quota (a purchase,
    a deposit or a flag change moves it)."""

    def __init__(self, hub: StreamHub, account: Callable[[str], Awaitable[Any]], quota: QuotaSource) -> None:
        self.hub = hub
        self.account = account
        self.quota = quota

    async def __call__(self, address: str) -> None:
        if not self.hub.wants(address):
            return
        try:
            document = await self.account(address)
        except Exception:  # not an account (an authorised sender's address): nothing to publish
            return
        self.hub.publish(address, "account", "account", document.model_dump(mode="json"))
        self.quota.mark(address)


@dataclass
class StreamService:
    hub: StreamHub
    tickets: StreamTickets
    keepalive_ms: int
    fanout: RedisFanout | None = None
    coalesce_ms: int = 200
    mirror: ContractMirror | None = None
    quota_source: QuotaSource | None = None
    _sweeper: asyncio.Task[None] | None = field(default=None, repr=False)

    async def start(self) -> None:
        if self.fanout is not None:
            await self.fanout.start()
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="stream-replay-sweeper")

    async def stop(self) -> None:
        if self.quota_source is not None:
            await self.quota_source.stop()
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

    def attach_accounts(
        self,
        bus: Any,
        quotas: Callable[[list[str]], Awaitable[Mapping[str, Any]]],
        account: Callable[[str], Awaitable[Any]],
        follower: Any | None,
    ) -> None:
        """The `quota` topic after settlements (this host's tracker) and purchases, the `account` topic on
        contract events (the follower's callback, on whichever host follows the contract)."""
        self.quota_source = QuotaSource(self.hub, quotas, self.coalesce_ms)
        bus.listen(self.quota_source)
        if follower is not None:
            follower.on_account_changed(AccountSource(self.hub, account, self.quota_source))

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
        fanout = RedisFanout(redis, listener, namespace, f"{settings.instance_id}.{boot_epoch_ms}", hub)
        hub.fanout = fanout
    else:
        used = LocalUsedTickets()
        if not settings.effective_database_url.startswith("sqlite"):
            log.warning(
                "no redis: stream tickets are single use and stream events reach streams on this host only; "
                "configure redis for more than one host"
            )
    return StreamService(
        hub,
        StreamTickets(keys, used),
        settings.stream_keepalive_ms,
        fanout,
        coalesce_ms=settings.stream_coalesce_ms,
    )
