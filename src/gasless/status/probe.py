"""The synthetic probe (singleton role `probe`): every `probe_interval_ms` it relays a small transfer per
shard from that shard's probe account through the relay core (assignment, signature, co-signature,
broadcast, tracking), as a user would, and records the outcome in the shared database for the status
components. Its intents carry the route `probe`: the rollups, the registry statistics and the availability
figures leave them out, so no public figure counts synthetic traffic. Off unless `probe_enabled` (on in
`gasless up`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import structlog
from multiversx_sdk import Transaction
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.addresses import parse_address
from gasless.chain.codec import tx_to_wire
from gasless.core.errors import ApiError
from gasless.core.workers import cancel_and_wait
from gasless.db.engine import begin_write, dialect_insert
from gasless.db.tables import service_meta
from gasless.relay.service import RelayMode

log = structlog.get_logger("gasless.probe")

PROBE = RelayMode(route="probe")
PROBE_ROLE = "probe"
PROBE_GAS_LIMIT = 100_000  # the movement gas of a relayed (v3) transfer without data
KEY_PREFIX = "probe:shard:"


@dataclass
class Pending:
    tx_hash: str
    sent_at_ms: int


async def save_result(engine: AsyncEngine, shard: int, result: dict[str, Any]) -> None:
    now = int(time.time() * 1000)
    async with begin_write(engine) as conn:
        insert = dialect_insert(conn)
        await conn.execute(
            insert(service_meta)
            .values(key=f"{KEY_PREFIX}{shard}", value=result, updated_at_ms=now)
            .on_conflict_do_update(index_elements=["key"], set_={"value": result, "updated_at_ms": now})
        )


async def load_results(engine: AsyncEngine) -> dict[int, dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(service_meta).where(service_meta.c.key.startswith(KEY_PREFIX)))
        ).all()
    return {int(row.key[len(KEY_PREFIX) :]): dict(row.value) for row in rows}


class Prober:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        relay: Any,  # RelayService
        assign: Any,  # AssignService
        gateway: Any,  # GatewayClient
        intents: Any,  # IntentRepository
        keys: list[Any],  # UserKey, one per shard
        chain_id: str,
        min_gas_price: Any,  # callable
        interval_ms: int = 60_000,
    ) -> None:
        self.engine = engine
        self.relay = relay
        self.assign = assign
        self.gateway = gateway
        self.intents = intents
        self.keys = keys
        self.chain_id = chain_id
        self.min_gas_price = min_gas_price
        self.interval_ms = interval_ms
        self.pending: dict[int, Pending] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="probe")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            for key in self.keys:
                try:
                    await self.probe(key)
                except Exception as exc:  # one shard's failure never stops the others
                    log.warning("probe failed", shard=key.shard, error=type(exc).__name__)
            await asyncio.sleep(max(0.05, self.interval_ms / 1000 - (time.monotonic() - started)))

    async def settle(self, shard: int) -> bool:
        """Record the previous probe of `shard` once final; False while it is still in flight."""
        pending = self.pending.get(shard)
        if pending is None:
            return True
        row = await self.intents.by_hash(pending.tx_hash)
        if row is None or row.state not in ("EXECUTED", "FINALIZED", "DEAD"):
            if int(time.time() * 1000) - pending.sent_at_ms < 3 * self.interval_ms:
                return False
            outcome, inclusion = "timeout", None
        else:
            outcome = "dead" if row.state == "DEAD" else str(row.outcome)
            executed, received = row.executed_block_ts_ms, row.received_at_ms
            inclusion = int(executed - received) if executed and received else None
        await save_result(
            self.engine,
            shard,
            {
                "atMs": pending.sent_at_ms,
                "outcome": outcome,
                "inclusionMs": inclusion,
                "txHash": pending.tx_hash,
            },
        )
        del self.pending[shard]
        return True

    async def probe(self, key: Any) -> None:
        shard = key.shard
        if not await self.settle(shard):
            return
        now = int(time.time() * 1000)
        try:
            nonce = int((await self.gateway.account(key.address)).get("nonce", 0))
            assignment = self.assign.issue(key.address, "std", pin_nonce=nonce)
            tx = Transaction(
                sender=parse_address(key.address),
                receiver=parse_address(key.address),
                gas_limit=PROBE_GAS_LIMIT,
                chain_id=self.chain_id,
                nonce=nonce,
                gas_price=int(self.min_gas_price()),
                version=2,
                relayer=parse_address(assignment.relayer),
            )
            key.sign_transaction(tx)
            raw = json.dumps({"tx": tx_to_wire(tx), "lease": assignment.lease}).encode()
            _, response = await self.relay.relay(
                raw,
                idempotency_key=None,
                sponsor=None,
                request_id=f"req_probe{now:x}",
                received_ms=now,
                mode=PROBE,
            )
        except ApiError as refusal:
            await save_result(self.engine, shard, {"atMs": now, "outcome": "refused", "code": refusal.code})
            return
        self.pending[shard] = Pending(response.txHash, now)
