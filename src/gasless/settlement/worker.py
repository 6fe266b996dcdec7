"""The settlement singleton (role `settlement`): batches of billed ledger rows, submitted as `settleUsage`.

Every `interval_ms` at the latest (3 600 000 ms by default, also when there is nothing to settle: a
root-only batch), the worker builds the next batch from the billed, unsettled `usage_ledger` rows and has
the owner key sign `settleUsage(batch_id, usage_root, row_count, total_ru, charges)`, broadcast through the
gateways. The batch is `submitted` then; the contract mirror marks it `committed` when the `usageSettled`
event is final. A batch left `built` or `submitted` by a crash or a failed transaction is submitted again
(with the same root, rows and charges) unless the contract already holds it.

On a restored database the worker neither builds nor submits until its first host has reconciled the
settlement batches with the contract (gasless.settlement.restored); the rows that reconciliation holds are
left out of every batch (gasless.settlement.repository.held).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from gasless.chain.abi import decode_outputs, encode_args, load_billing_abi
from gasless.chain.gateway import GatewayClient
from gasless.core.workers import cancel_and_wait, wait_event
from gasless.settlement.owner_tx import OWNER_GAS, OwnerCallError, OwnerTransactor
from gasless.settlement.repository import BuiltBatch, SettlementRepository

log = structlog.get_logger("gasless.settlement")

SETTLEMENT_ROLE = "settlement"
RESUBMIT_AFTER_MS = 30_000  # a submitted batch whose transaction is still unknown this long is sent again
GAS_PER_CHARGE = 1_000_000


def _now_ms() -> int:
    return int(time.time() * 1000)


class SettlementWorker:
    def __init__(
        self,
        repo: SettlementRepository,
        gateway: GatewayClient,
        owner: OwnerTransactor,
        *,
        interval_ms: int = 3_600_000,
        max_rows: int = 50_000,
        tick_ms: int = 1_000,
    ) -> None:
        self.repo = repo
        self.gateway = gateway
        self.owner = owner
        self.interval_ms = interval_ms
        self.max_rows = max_rows
        self.tick_ms = tick_ms
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._started_ms = _now_ms()
        self._lock = asyncio.Lock()
        self._restore_cleared = False  # the database is no restore waiting for its reconciliation
        # Called with the kind of each failure (metrics): `send` (settleUsage not sent), `execution`
        # (sent, did not execute: resubmitted), `root_conflict`, `tick` (anything else).
        self.on_failure: Callable[[str], None] | None = None

    def _failed(self, kind: str) -> None:
        if self.on_failure is not None:
            self.on_failure(kind)

    async def start(self) -> None:
        if self._task is None:
            self._started_ms = _now_ms()
            self._task = asyncio.create_task(self._run(), name="settlement")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def settle_now(self) -> None:
        """Build and submit the next batch at once (operator command)."""
        self._wake.set()

    async def next_due_ms(self) -> int:
        """When the next batch will be built at the latest (Unix ms)."""
        last = await self.repo.last()
        since = int(last["created_at_ms"]) if last is not None else self._started_ms
        return since + self.interval_ms

    async def _run(self) -> None:
        while True:
            forced = self._wake.is_set()
            self._wake.clear()
            try:
                await self.tick(force=forced)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried next tick
                log.warning("settlement.tick_failed", error=str(exc), error_type=type(exc).__name__)
                self._failed("tick")
            await wait_event(self._wake, self.tick_ms / 1000)

    async def tick(self, *, force: bool = False) -> int | None:
        """Finish unfinished batches; build a new one when due (or forced). Returns a new batch's id."""
        async with self._lock:
            if not await self._cleared():
                return None
            for batch in await self.repo.unfinished():
                await self._finish(batch)
            if not force and _now_ms() < await self.next_due_ms():
                return None
            built = await self.repo.build(self.max_rows)
            log.info(
                "settlement.built", batch_id=built.batch_id, rows=built.row_count, total_ru=built.total_ru
            )
            await self._submit(built)
            return built.batch_id

    async def _cleared(self) -> bool:
        """False while the database is a restore not reconciled with the contract yet (read until it is)."""
        if not self._restore_cleared:
            if await self.repo.restore_pending():
                log.info("settlement.waiting_for_restore_reconciliation")
                return False
            self._restore_cleared = True
        return True

    async def _finish(self, batch: dict[str, Any]) -> None:
        batch_id = int(batch["batch_id"])
        on_chain = await self._settlement_on_chain(batch_id)
        if on_chain is not None:
            if on_chain.hex() != batch["usage_root"]:
                log.error("settlement.root_conflict", batch_id=batch_id)
                self._failed("root_conflict")
                await self.repo.mark(batch_id, "failed")
            return  # the mirror commits it once the event is final
        if batch["state"] == "submitted" and batch["tx_hash"]:
            state, reason = await self.owner.outcome(batch["tx_hash"], timeout_s=0.01)
            age = _now_ms() - int(batch["submitted_at_ms"] or 0)
            if state == "success" or (state == "pending" and age < RESUBMIT_AFTER_MS):
                return
            log.warning("settlement.resubmit", batch_id=batch_id, state=state, reason=reason)
            self._failed("execution")
        await self._submit(await self.repo.rebuild(batch_id))

    async def _submit(self, built: BuiltBatch) -> None:
        args = [built.batch_id, list(built.usage_root), built.row_count, built.total_ru, built.charges]
        gas = OWNER_GAS + GAS_PER_CHARGE * len(built.charges)
        try:
            tx_hash = await self.owner.send("settleUsage", args, gas_limit=gas)
        except OwnerCallError as exc:
            log.warning("settlement.send_failed", batch_id=built.batch_id, error=str(exc))
            self._failed("send")
            return
        await self.repo.mark(built.batch_id, "submitted", tx_hash=tx_hash)
        log.info("settlement.submitted", batch_id=built.batch_id, tx_hash=tx_hash)

    async def _settlement_on_chain(self, batch_id: int) -> bytes | None:
        abi = load_billing_abi()
        args = encode_args(abi, "getSettlement", [batch_id])
        parts = await self.gateway.vm_query(self.owner.contract, "getSettlement", args)
        value = decode_outputs(abi, "getSettlement", parts)[0]
        return None if value is None else bytes(value.usage_root)
