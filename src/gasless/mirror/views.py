"""Cached reads of the billing contract's views (`ContractMirror`), shared by the relay core, billing and
account reads. The event mirror (`gasless.mirror.follower`) forgets an entry as soon as a final event names it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from gasless.chain.abi import decode_outputs, load_billing_abi, load_pair_abi
from gasless.chain.addresses import address_of, parse_address
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.limits.buckets import DEFAULT_RATE_CLASS

log = structlog.get_logger("gasless.entitlement")


class _Cached:
    """Per-key values with a time to live; concurrent misses of one key share a single load.

    A value loaded with `refresh_ahead` true for it is served for one more time to live after it expires
    while a background load replaces it (stale-while-revalidate): a found paying account is re-read every
    few seconds, and that read (a contract view through the gateway, ~2 ms of ABI decoding plus the
    gateway's latency) no longer sits in front of a relay. Exactness does not rest on the TTL: the event
    mirror forgets an entry as soon as a final event names it, and a forgotten entry is loaded in line.
    """

    def __init__(self, ttl_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_ms = ttl_ms
        self.clock = clock  # seconds, monotonic
        # key -> (expires at, value, served stale until or 0)
        self._values: dict[Any, tuple[float, Any, float]] = {}
        self._loading: dict[Any, asyncio.Future[Any]] = {}
        self._refreshing: set[asyncio.Task[Any]] = set()

    async def get(
        self,
        key: Any,
        load: Callable[[], Awaitable[Any]],
        ttl_ms: int | Callable[[Any], int] | None = None,
        refresh_ahead: Callable[[Any], bool] | None = None,
    ) -> Any:
        now = self.clock() * 1000
        hit = self._values.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        if hit is not None and hit[2] > now:
            if key not in self._loading:
                future = self._claim(key)
                task = asyncio.create_task(self._load(key, future, load, ttl_ms, refresh_ahead))
                self._refreshing.add(task)
                task.add_done_callback(self._refreshed)
            return hit[1]
        pending = self._loading.get(key)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this caller was cancelled
                # the loader was cancelled (its request went away): load for ourselves
        if key in self._loading:
            return await self.get(key, load, ttl_ms, refresh_ahead)
        return await self._load(key, self._claim(key), load, ttl_ms, refresh_ahead)

    def _claim(self, key: Any) -> asyncio.Future[Any]:
        # Registered before any await, so callers arriving meanwhile share this load.
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        return future

    def _refreshed(self, task: asyncio.Task[Any]) -> None:
        self._refreshing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The stale value keeps serving until its grace ends; then a relay loads in line again.
            log.warning("background refresh of a contract view failed", error=type(task.exception()).__name__)

    async def _load(
        self,
        key: Any,
        future: asyncio.Future[Any],
        load: Callable[[], Awaitable[Any]],
        ttl_ms: int | Callable[[Any], int] | None,
        refresh_ahead: Callable[[Any], bool] | None,
    ) -> Any:
        try:
            value = await load()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: waiters re-raise it, nobody else must log it
            raise
        finally:
            self._loading.pop(key, None)
        future.set_result(value)
        now = self.clock() * 1000
        ttl = ttl_ms(value) if callable(ttl_ms) else (ttl_ms if ttl_ms is not None else self.ttl_ms)
        grace = now + 2 * ttl if refresh_ahead is not None and refresh_ahead(value) else 0.0
        self._values[key] = (now + ttl, value, grace)
        if len(self._values) > 65_536:  # bounded: drop the oldest half
            for stale in list(self._values)[: len(self._values) // 2]:
                self._values.pop(stale, None)
        return value

    def forget(self, subject: str | None) -> None:
        """Drop the entries naming `subject` (an address) in their key, or every entry."""
        if subject is None:
            self._values.clear()
            return
        for key in [k for k in self._values if isinstance(k, tuple) and subject in k]:
            self._values.pop(key, None)
        # A sender's lookup may name the account only in its value.
        for key, (_, value, _grace) in list(self._values.items()):
            if key[0] == "account" and isinstance(value, tuple) and value and value[0] == subject:
                self._values.pop(key, None)


class ContractMirror:
    """Cached reads of the billing contract's views (a convenience; purchases read the views directly)."""

    def __init__(
        self, gateway: GatewayClient, contract: str | None, *, pair: str | None = None, ttl_ms: int = 3_000
    ) -> None:
        self.gateway = gateway
        self.contract = contract
        self.pair = pair  # the exchange venue deposits swap through (its pause blocks purchases)
        self.abi = load_billing_abi()
        self._pair_abi = load_pair_abi()
        self._cache = _Cached(ttl_ms)

    async def _view(self, function: str, args: list[bytes] | None = None) -> list[Any]:
        assert self.contract is not None
        parts = await self.gateway.vm_query(self.contract, function, args or [])
        return decode_outputs(self.abi, function, parts)

    async def fresh(self, function: str, args: list[bytes] | None = None) -> list[Any]:
        """A view read now, past the caches (for documents that promise their own freshness)."""
        return await self._view(function, args)

    async def config(self) -> Any:
        return await self._cache.get(("config",), lambda: self._view("getConfig"))

    async def pause_state(self) -> Any:
        return await self._cache.get(("pause",), lambda: self._view("getPauseState"), ttl_ms=1_000)

    async def venue_open(self, *, fresh: bool = False) -> bool:
        """Whether the exchange venue trades (`getState` is `Active`); no venue configured: open. `fresh`
        reads the venue now (a payment about to be co-signed), else a view at most 1 000 ms old."""
        if self.pair is None:
            return True

        async def load() -> bool:
            assert self.pair is not None
            parts = await self.gateway.vm_query(self.pair, "getState", [])
            (state,) = decode_outputs(self._pair_abi, "getState", parts)
            return str(getattr(state, "__name__", state)) == "Active"

        if fresh:
            return await load()
        return bool(await self._cache.get(("venue",), load, ttl_ms=1_000))

    async def relayer_states(self, addresses: Sequence[str]) -> dict[str, tuple[str, int]]:
        """The contract's state of each relayer, from `getRelayerState` (the authority the interface contract names): address
        -> (state `active`|`draining`|`retired`, since ms); a relayer the contract does not know is left out.
        Read now (the relayer pool asks on its own refresh period)."""

        async def one(address: str) -> tuple[str, tuple[str, int] | None]:
            (info,) = await self._view("getRelayerState", [parse_address(address).get_public_key()])
            if info is None:
                return address, None
            name = str(getattr(info.state, "__name__", info.state)).lower()
            return address, (name, int(info.since_ms))

        answers = await asyncio.gather(*(one(address) for address in addresses))
        return {address: state for address, state in answers if state is not None}

    async def rate_classes(self) -> dict[int, Any]:
        views = await self._cache.get(("rateClasses",), lambda: self._view("getRateClasses"), ttl_ms=10_000)
        return {int(rc.id): rc for rc in views[0]}

    async def tiers(self) -> dict[int, Any]:
        views = await self._cache.get(("tiers",), lambda: self._view("getTiers"), ttl_ms=10_000)
        return {int(tier.id): tier for tier in views[0]}

    async def rate_class_of(self, account: str) -> int:
        """The rate class (1..6) of the account's running plan; an address without one (or when the contract
        cannot be read) counts as class 1, the Starter's, for the request limits that go by class."""
        try:
            view = await self.account(account)
            running = getattr(view, "running", None) if view is not None else None
            if running is None:
                return DEFAULT_RATE_CLASS
            tier = (await self.tiers()).get(int(running.tier_id))
            rate_class = int(tier.rate_class) if tier is not None else DEFAULT_RATE_CLASS
        except (GatewayUnavailable, GatewayRejected, AttributeError, ValueError, TypeError):
            return DEFAULT_RATE_CLASS
        return rate_class if 1 <= rate_class <= 6 else DEFAULT_RATE_CLASS

    def invalidate(self, account: str | None = None) -> None:
        """Forget cached views (the event mirror calls this when an event says they changed): one
        account's (and its sender lookups), or everything when `account` is None."""
        self._cache.forget(account)

    async def owner(self) -> str | None:
        # The contract's owner (from the account record): owner calls are never blocked by the pause.
        async def load() -> str | None:
            assert self.contract is not None
            account = await self.gateway.account(self.contract)
            return account.get("ownerAddress") or None

        return await self._cache.get(("owner",), load, ttl_ms=60_000)

    async def account(self, address: str) -> Any | None:
        """The contract's account view of `address`, or None when it has no account."""
        pubkey = parse_address(address).get_public_key()
        # A found account is kept 5 s, "no account" 1 s; the event mirror forgets an account as soon as a
        # final event names it (purchases, flags, suspension), so the TTL only bounds a missed event.
        views = await self._cache.get(
            ("getAccount", address),
            lambda: self._view("getAccount", [pubkey]),
            ttl_ms=lambda found: 1_000 if found[0] is None else 5_000,
            refresh_ahead=lambda found: found[0] is not None,
        )
        return views[0]

    async def has_account(self, address: str) -> bool:
        """Whether `address` has an account, a cached "no" confirmed by a read now before it is believed
        (an account created a moment ago, whose event the mirror has not applied yet, is found)."""
        if await self.account(address) is not None:
            return True
        found = (await self._view("getAccount", [parse_address(address).get_public_key()]))[0]
        if found is not None:
            self.invalidate(address)
        return found is not None

    async def account_of_sender(self, sender: str) -> str | None:
        """The account that names `sender` as an authorised sender, or None."""
        pubkey = parse_address(sender).get_public_key()
        views = await self._cache.get(
            ("getAccountOfSender", sender), lambda: self._view("getAccountOfSender", [pubkey]), ttl_ms=1_000
        )
        return None if views[0] is None else _bech32(views[0])

    async def senders(self, address: str) -> list[str]:
        """The account's authorised senders, oldest authorisation first (the contract's order)."""
        pubkey = parse_address(address).get_public_key()
        views = await self._cache.get(
            ("getSenders", address), lambda: self._view("getSenders", [pubkey]), ttl_ms=1_000
        )
        return [_bech32(value) for value in views[0]]

    async def paying_account(self, sender: str) -> tuple[str, str] | None:
        """(account, relation) where relation is `own` or `authorised`; None when neither exists."""
        pubkey = parse_address(sender).get_public_key()

        async def load() -> tuple[str, str] | None:
            own = await self.account(sender)  # shares the account view the decision reads next
            if own is not None:
                return sender, "own"
            account = (await self._view("getAccountOfSender", [pubkey]))[0]
            if account is not None:
                raw = account if isinstance(account, bytes) else account.get_public_key()
                return address_of(bytes(raw)).to_bech32(), "authorised"
            return None

        # "No account" is kept 1 s (a sender who just bought a plan must not wait long to be recognised);
        # a found account 10 s (it changes only by a purchase, a removal or an expiry; the billing
        # issue's event mirror refreshes it sooner).
        return await self._cache.get(
            ("account", sender),
            load,
            ttl_ms=lambda found: 1_000 if found is None else 10_000,
            refresh_ahead=lambda found: found is not None,
        )


def _bech32(value: Any) -> str:
    raw = value if isinstance(value, bytes) else value.get_public_key()
    return address_of(bytes(raw)).to_bech32()
