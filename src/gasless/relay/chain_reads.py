"""The tracker's reads of the chain (`relay/jobs.Tracker`): the hyperblocks it follows, its look at one
intent, an executed contract call's outcome, and an intent the chain does not know: taken, dropped (and
why) or not decided yet.

What the chain says is read as the real network says it (docs/chain.md): the node's `success` is not an
outcome for a contract call (process-status decides it), and a transaction the sender-shard lookup cannot
find is confirmed missing by a second source before it is dead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gasless.chain.addresses import METACHAIN
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.chain.outcomes import contract_failure, is_move_balance, process_reason
from gasless.relay.repository import Rec

MAX_HYPERBLOCKS_PER_TICK = 10  # a tracker that fell behind (a slow gateway) catches up this many a tick
MAX_HYPERBLOCKS_BEHIND = 200  # further behind than this, it jumps to the newest and the looks cover the gap
# A transaction the node dropped as not executable (a guarded relayer, a fee the relayer cannot cover, a
# guardian mismatch) leaves the pool without a block. Unknown to the chain, absent from the pool and its
# nonce unused for this many rounds, with a re-send in between that did not bring it back: it is dead.
DROPPED_AFTER_ROUNDS = 8

UNREACHABLE = object()  # no gateway answered this round's look at an intent

# A row with its wire transaction (updates return rows without it), or None when the row is gone.
WithWire = Callable[[Rec], Awaitable[Rec | None]]


class ChainReads:
    """What the tracker asks the gateways, and what it remembers between two asks: the next hyperblock to
    read (`hyper_cursor`), whether the last read succeeded (`following`), and the intents the chain does not
    know and the pool does not hold (`absent`: pk -> first seen so, sends by then)."""

    def __init__(self, gateway: GatewayClient, network: NetworkView) -> None:
        self.gateway = gateway
        self.network = network
        self._limit = asyncio.Semaphore(32)
        self.hyper_cursor: int | None = None  # the next hyperblock to read
        self.following = False  # the last hyperblock read succeeded
        self.absent: dict[int, tuple[int, int]] = {}

    async def hyperblocks(self, tracked: dict[int, Rec]) -> dict[int, dict[str, Any]]:
        """The `tracked` intents the hyperblocks read since the last tick show as settled (pk -> the
        transaction as the hyperblock lists it, with its coordinates). One read a block whatever the number of
        intents, instead of one look per intent per round. A failed read leaves the cursor: it is read again
        next tick, and meanwhile the per-intent looks (which never stop) see what it would have shown."""
        meta = self.network.status(METACHAIN)
        if meta is None:
            return {}
        newest = meta.nonce
        if self.hyper_cursor is None or newest - self.hyper_cursor >= MAX_HYPERBLOCKS_BEHIND:
            # Start (or a long gap) at the newest block: what executed before is found by the looks.
            self.hyper_cursor = newest
        by_hash = {row.tx_hash: pk for pk, row in tracked.items()} if tracked else {}
        seen: dict[int, dict[str, Any]] = {}
        last = min(newest, self.hyper_cursor + MAX_HYPERBLOCKS_PER_TICK - 1)
        while self.hyper_cursor <= last:
            try:
                data = await self.gateway.get(f"/hyperblock/by-nonce/{self.hyper_cursor}")
            except (GatewayUnavailable, GatewayRejected):
                self.following = False
                break
            self.following = True
            hyper = data.get("hyperblock") or {}
            for chain_tx in hyper.get("transactions") or []:
                pk = by_hash.get(chain_tx.get("hash"))
                if pk is None or chain_tx.get("status") not in ("success", "fail", "invalid"):
                    continue  # not ours, or a cross-shard transaction only notarized at its source
                chain_tx = dict(chain_tx)
                chain_tx["hyperblockNonce"] = chain_tx.get("hyperblockNonce") or self.hyper_cursor
                chain_tx["blockNonce"] = chain_tx.get("blockNonce") or chain_tx["hyperblockNonce"]
                if not chain_tx.get("timestampMs") and not chain_tx.get("timestamp"):
                    chain_tx["timestampMs"] = (
                        hyper.get("timestampMs") or int(hyper.get("timestamp") or 0) * 1000
                    )
                seen[pk] = chain_tx
            self.hyper_cursor += 1
        return seen

    async def look(self, row: Rec) -> dict[str, Any] | None | object:
        async with self._limit:
            try:
                return await self.gateway.transaction(row.tx_hash, sender=row.sender)
            except (GatewayUnavailable, GatewayRejected):
                return UNREACHABLE

    async def outcomes(self, settled: list[tuple[Rec, dict[str, Any]]]) -> None:
        """Each executed contract call's outcome, as the proxy's process-status works it out from the logs
        and results (the node's `success` does not say it: a reverted call, or one still inside an async
        call, reads `success`). Sets `_outcome` on the transaction (`success`, `fail`, or None: not decided
        yet, ask again next round) and `_failure` on a failure. A transfer (no data) needs no question."""

        async def one(row: Rec, chain_tx: dict[str, Any]) -> None:
            async with self._limit:
                try:
                    status, reason = await self.gateway.process_status(row.tx_hash)
                except (GatewayUnavailable, GatewayRejected):
                    chain_tx["_outcome"] = None
                    return
                if status == "fail":
                    failure = contract_failure(chain_tx)
                    if failure is None and not chain_tx.get("logs"):  # a hyperblock's listing has no logs
                        try:
                            full = await self.gateway.transaction(row.tx_hash)
                        except (GatewayUnavailable, GatewayRejected):
                            full = None
                        failure = contract_failure(full) if full else None
                    chain_tx["_failure"] = failure or process_reason(reason) or "failed on chain"
            chain_tx["_outcome"] = status if status in ("success", "fail") else None

        wanted = [
            (row, chain_tx)
            for row, chain_tx in settled
            if chain_tx.get("status") == "success" and not is_move_balance(chain_tx)
        ]
        if wanted:
            await asyncio.gather(*(one(row, chain_tx) for row, chain_tx in wanted))

    async def missing(self, row: Rec, now: int, with_wire: WithWire) -> dict[str, Any] | str | None:
        """The sender-shard lookup does not know the transaction. Returns the transaction when a second
        source knows it after all, the reason it is dead, or None (not decided: keep sending).

        - The sender's nonce moved past ours: taken by another transaction, unless the lookup without
          `sender` finds ours (on the `sender` path the proxy answers any failure of the sender shard's
          history nodes as 404 "transaction not found").
        - The nonce did not move and the pool does not hold it, for DROPPED_AFTER_ROUNDS rounds and a
          re-send: the node dropped it as not executable."""
        try:
            account = await self.gateway.account(row.sender)
        except (GatewayUnavailable, GatewayRejected):
            return None
        if int(account.get("nonce", 0)) > int(row.nonce):
            self.absent.pop(int(row.pk), None)
            try:
                again = await self.gateway.transaction(row.tx_hash)  # without `sender`: every shard's nodes
            except (GatewayUnavailable, GatewayRejected):
                return None
            return again if again is not None else "nonce used by another transaction of the sender"
        if row.state != "BROADCAST":
            return None  # never acknowledged: a gateway may simply not have it yet
        try:
            pool = await self.gateway.pool_for_sender(row.sender, fields="hash")
        except (GatewayUnavailable, GatewayRejected):
            return None
        pk = int(row.pk)
        if any(entry.get("hash") == row.tx_hash for entry in pool):
            self.absent.pop(pk, None)
            return None
        first_ms, sends = self.absent.setdefault(pk, (now, int(row.send_attempts)))
        rounds = (now - first_ms) / max(1, self.network.params.round_duration_ms)
        if rounds < DROPPED_AFTER_ROUNDS or int(row.send_attempts) <= sends:
            return None
        return "dropped by the network without execution: " + await self.why_dropped(row, with_wire)

    async def why_dropped(self, row: Rec, with_wire: WithWire) -> str:
        """Which of the node's "not executable" rules it met, as far as the accounts tell now."""
        full = await with_wire(row)
        wire: dict[str, Any] = dict(full.tx) if full is not None else {}
        relayer = wire.get("relayer")
        try:
            if relayer:
                guardian = await self.gateway.guardian_data(relayer)
                if guardian.get("guarded"):
                    return "the relayer is a guarded account"
                account = await self.gateway.account(relayer)
                fee = int(wire.get("gasLimit") or 0) * int(wire.get("gasPrice") or 0)
                if int(account.get("balance") or 0) < fee:
                    return "the relayer cannot cover the fee"
            sender_guardian = await self.gateway.guardian_data(row.sender)
            active = (sender_guardian.get("activeGuardian") or {}).get("address")
            if sender_guardian.get("guarded") and active != wire.get("guardian"):
                return "the transaction's guardian is not the account's"
        except (GatewayUnavailable, GatewayRejected, ValueError, TypeError):
            pass
        return "not executable (it left the pool without a block)"
