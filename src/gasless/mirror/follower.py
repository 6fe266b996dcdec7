"""The contract mirror's singleton worker: follows the billing contract's finalised events.

Finality: a hyperblock (metachain block) is final once its nonce is at most the metachain's
`erd_highest_final_nonce`; a transaction is final with the hyperblock that notarises its execution
(`hyperblockNonce`). The follower reads hyperblocks in nonce order up to that bound, takes the successful
transactions sent to the contract, fetches each with its results, and applies the contract's events. One
step (up to `max_hyperblocks_per_step` hyperblocks) is written in one database transaction together with the
cursor (the last hyperblock nonce applied), so after a restart the follower resumes right after the cursor:
no event is applied twice and none is skipped.

Accounts and contract-wide views are read from the contract's views (the authority) when an event says they
changed, and at start-up; the timeline and the authorised-sender order come from the events themselves.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gasless.chain.abi import decode_outputs, load_billing_abi
from gasless.chain.addresses import METACHAIN, parse_address
from gasless.chain.gateway import GatewayClient
from gasless.core.workers import cancel_and_wait
from gasless.mirror.events import ContractEvent, decode_transaction_events, plain
from gasless.mirror.repository import MirrorRepository, MirrorStep

log = structlog.get_logger("gasless.mirror")

MIRROR_ROLE = "mirror"

# Contract-wide views the mirror keeps: name -> contract view function.
VIEWS = {
    "config": "getConfig",
    "pause": "getPauseState",
    "tiers": "getTiers",
    "rateClasses": "getRateClasses",
    "tariffHistory": "getTariffHistory",
    "relayers": "getRelayers",
}
# Events that change contract-wide views.
VIEW_EVENTS = {
    "pauseChanged": ("pause",),
    "tariffChanged": ("config", "tiers", "rateClasses", "tariffHistory"),
    "swapConfigChanged": ("config",),
    "relayerStateChanged": ("relayers",),
}

AccountCallback = Callable[[str], Awaitable[None] | None]


class MirrorFollower:
    """Singleton worker (role `mirror`): start() begins following, stop() ends it."""

    def __init__(
        self,
        repo: MirrorRepository,
        gateway: GatewayClient,
        contract: str,
        *,
        poll_ms: int = 300,
        start_hyperblock: int = 0,
        views_refresh_ms: int = 30_000,
        max_hyperblocks_per_step: int = 50,
    ) -> None:
        self.repo = repo
        self.gateway = gateway
        self.contract = contract
        self.poll_ms = poll_ms
        self.start_hyperblock = start_hyperblock
        self.views_refresh_ms = views_refresh_ms
        self.max_per_step = max_hyperblocks_per_step
        self.abi = load_billing_abi()
        self._callbacks: list[AccountCallback] = []
        self._committed_callbacks: list[Callable[[list[int]], Awaitable[None] | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._applied = asyncio.Condition()
        self.cursor: int | None = None
        self.final: int | None = None  # the newest final hyperblock the follower has seen (its lag: metrics)
        self._failing = False

    # Subscriptions ----------------------------------------------------------------------------------
    def on_account_changed(self, callback: AccountCallback) -> None:
        """Call `callback(address)` after a step changed an account (or made an address an authorised
        sender, or removed it): the relay core drops its cached views of it."""
        self._callbacks.append(callback)

    def on_batches_committed(self, callback: Callable[[list[int]], Awaitable[None] | None]) -> None:
        self._committed_callbacks.append(callback)

    # Life cycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mirror-follower")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def wait_for(self, hyperblock_nonce: int, timeout_s: float = 10.0) -> bool:
        """Wait until the mirror applied `hyperblock_nonce` (True) or the timeout passed (False)."""

        def done() -> bool:
            return self.cursor is not None and self.cursor >= hyperblock_nonce

        async with self._applied:
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for: see gasless.core.workers.wait_event
                    await self._applied.wait_for(done)
            except TimeoutError:
                return False
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        refreshed_at = -1e18
        while True:
            try:
                if (loop.time() - refreshed_at) * 1000 >= self.views_refresh_ms:
                    await self.repo.save_views(await self._read_views(tuple(VIEWS)))
                    refreshed_at = loop.time()
                while await self.step():
                    pass
                if self._failing:
                    log.info("mirror.recovered", cursor=self.cursor)
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the follower outlives gateway and database failures
                if not self._failing:
                    log.warning("mirror.step_failed", error=str(exc), error_type=type(exc).__name__)
                self._failing = True
            await asyncio.sleep(self.poll_ms / 1000)

    # One step ---------------------------------------------------------------------------------------
    async def step(self) -> bool:
        """Apply the next final hyperblocks (at most one step); True when more are waiting."""
        meta = await self.gateway.network_status(METACHAIN)
        final = int(meta["erd_highest_final_nonce"])
        self.final = final
        if self.cursor is not None and final <= self.cursor:
            # Nothing newer is final. The stored cursor is never behind this one (it only moves forward,
            # and this one is read from it or written to it), so it need not be read on every poll.
            return False
        stored = await self.repo.cursor()
        cursor = stored if stored is not None else self.start_hyperblock - 1
        await self._advanced(cursor)
        if final <= cursor:
            return False
        last = min(final, cursor + self.max_per_step)
        hyperblocks = await asyncio.gather(
            *(self.gateway.get(f"/hyperblock/by-nonce/{n}") for n in range(cursor + 1, last + 1))
        )
        step = MirrorStep(cursor=last)
        for data in hyperblocks:
            block = data["hyperblock"]
            step.cursor_hash = str(block.get("hash"))
            step.events.extend(await self._events_of(block))
        touched, views = self._changes(step.events)
        step.views = await self._read_views(views)
        for address in touched:
            step.accounts[address] = await self._read_account(address)
        committed = await self.repo.apply(step)
        await self._advanced(last)
        if step.events:
            log.info("mirror.applied", cursor=last, events=len(step.events), accounts=len(touched))
        changed = set(touched) | {
            e.fields["sender"] for e in step.events if e.name in ("senderAdded", "senderRemoved")
        }
        for address in sorted(changed):
            await self._notify(self._callbacks, address)
        if committed:
            await self._notify(self._committed_callbacks, committed)
        return last < final

    def lag_hyperblocks(self) -> int | None:
        """Final hyperblocks not applied yet (None before the first step)."""
        if self.cursor is None or self.final is None:
            return None
        return max(0, self.final - self.cursor)

    async def _advanced(self, cursor: int) -> None:
        async with self._applied:
            self.cursor = cursor
            self._applied.notify_all()

    async def _notify(self, callbacks: list[Any], value: Any) -> None:
        for callback in callbacks:
            try:
                outcome = callback(value)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception as exc:  # noqa: BLE001 - a subscriber must not stop the mirror
                log.warning("mirror.callback_failed", error=str(exc))

    async def _events_of(self, block: dict[str, Any]) -> list[ContractEvent]:
        nonce = int(block["nonce"])
        ts_ms = int(block.get("timestampMs") or int(block.get("timestamp", 0)) * 1000)
        events: list[ContractEvent] = []
        for position, tx in enumerate(block.get("transactions") or []):
            if tx.get("receiver") != self.contract or tx.get("status") != "success":
                continue
            full = await self.gateway.transaction(str(tx["hash"]))
            if full is None:
                raise RuntimeError(f"final transaction {tx['hash']} is unknown to the gateway")
            events.extend(
                decode_transaction_events(
                    full, self.contract, hyperblock_nonce=nonce, tx_position=position, block_ts_ms=ts_ms
                )
            )
        return events

    @staticmethod
    def _changes(events: list[ContractEvent]) -> tuple[list[str], tuple[str, ...]]:
        accounts: list[str] = []
        views: list[str] = []
        for event in events:
            if event.account is not None and event.account not in accounts:
                accounts.append(event.account)
            for name in VIEW_EVENTS.get(event.name, ()):
                if name not in views:
                    views.append(name)
        return accounts, tuple(views)

    # Views ------------------------------------------------------------------------------------------
    async def _query(self, function: str, args: list[bytes] | None = None) -> list[Any]:
        parts = await self.gateway.vm_query(self.contract, function, args or [])
        return decode_outputs(self.abi, function, parts)

    async def _read_views(self, names: tuple[str, ...]) -> dict[str, Any]:
        values = await asyncio.gather(*(self._query(VIEWS[name]) for name in names))
        return {name: plain(value[0], camel_case=True) for name, value in zip(names, values, strict=True)}

    async def _read_account(self, address: str) -> dict[str, Any] | None:
        view = (await self._query("getAccount", [parse_address(address).get_public_key()]))[0]
        return None if view is None else plain(view)
