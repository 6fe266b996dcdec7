"""The usage-proof read: a committed row's inclusion proof, or why there is none yet."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from gasless.core.errors import ApiError
from gasless.mirror.repository import MirrorRepository
from gasless.settlement.merkle import leaf_hash
from gasless.settlement.proofs import ProofPathStep, SettlementRef, UsageProof, not_committed
from gasless.settlement.repository import SettlementRepository, leaf_row


class ProofService:
    def __init__(
        self,
        repo: SettlementRepository,
        mirror: MirrorRepository,
        next_due_ms: Callable[[], Awaitable[int | None]],
    ) -> None:
        self.repo = repo
        self.mirror = mirror
        self.next_due_ms = next_due_ms

    async def account_of(self, tx_hash: str) -> str | None:
        """The paying account of the ledger row (None: no such row); read before the caller is checked."""
        row = await self.repo.ledger_row(tx_hash)
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"no usage row {tx_hash}")
        return row.account

    async def proof(self, tx_hash: str) -> UsageProof:
        row = await self.repo.ledger_row(tx_hash)
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"no usage row {tx_hash}")
        if not row.billed:
            raise ApiError(
                "NOT_FOUND",
                detail="the row is not billed (dead or not executed): it is never settled and has no proof",
            )
        now = int(time.time() * 1000)
        batch = await self.repo.batch(int(row.batch_id)) if row.batch_id is not None else None
        settled = await self.mirror.settlement(int(row.batch_id)) if row.batch_id is not None else None
        if batch is None or batch["state"] != "committed" or settled is None:
            raise not_committed(batch, await self.next_due_ms(), now)
        path, stored = await self.repo.proof_parts(int(row.batch_id), int(row.leaf_index))
        data = leaf_row(stored, int(row.batch_id), int(row.leaf_index)).encode()
        return UsageProof(
            txHash=tx_hash,
            batchId=int(row.batch_id),
            leafIndex=int(row.leaf_index),
            rowCount=int(settled["row_count"]),
            leafData=data.hex(),
            leaf=leaf_hash(data).hex(),
            path=[ProofPathStep(hash=s.sibling.hex(), side=s.side) for s in path],
            usageRoot=settled["usage_root"],
            settlement=SettlementRef(
                txHash=settled["tx_hash"],
                hyperblockNonce=int(settled["hyperblock_nonce"]),
                blockTsMs=int(settled["block_ts_ms"]),
            ),
        )
