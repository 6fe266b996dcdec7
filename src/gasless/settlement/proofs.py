"""Usage proofs: the inclusion proof of one ledger row in its batch's on-chain `usage_root`, and the verifier.

`verify_proof(proof, usage_settled_event)` is the library check anybody can run: it recomputes the leaf
from the proof's leaf data, climbs the path, and compares the root and batch id with the `usageSettled`
event (as decoded from the chain: `batch_id`/`batchId` and `usage_root`/`usageRoot` in hex).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, Field

from gasless.chain.abi import decode_event, load_billing_abi
from gasless.core.errors import ApiError
from gasless.mirror.events import plain
from gasless.settlement.merkle import LEAF_DATA_BYTES, ProofStep, leaf_hash, root_from_path

# The interface contract names no code for "row not yet committed in a root" and the catalogue is exactly the interface contract's:
# the retryable 409 of the platform group is the closest; `details.reason` says which case it is
# (docs/usage.md, docs/settlement.md).
PROOF_PENDING_CODE = "IDEMPOTENCY_IN_PROGRESS"


class ProofPathStep(BaseModel):
    """One sibling on the way from the leaf to the root."""

    hash: str = Field(description="the sibling node, 64 hex characters")
    side: Literal["left", "right"] = Field(description="where the sibling sits: hash(left || right)")


class SettlementRef(BaseModel):
    """The on-chain transaction that committed the batch's root, as the mirror saw it final."""

    txHash: str
    hyperblockNonce: int
    blockTsMs: int


class UsageProof(BaseModel):
    """A Merkle inclusion proof of one ledger row against its batch's on-chain `usage_root` (SHA-256)."""

    txHash: str
    batchId: int
    leafIndex: int
    rowCount: int
    leafData: str = Field(description=f"the {LEAF_DATA_BYTES}-byte leaf encoding, hex (docs/settlement.md)")
    leaf: str = Field(description="SHA-256(0x00 || leafData), hex")
    path: list[ProofPathStep]
    usageRoot: str
    settlement: SettlementRef
    encoding: str = "gasless-usage-leaf-v1"


class ProofInvalid(ValueError):
    pass


def _field(event: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in event:
            return event[name]
    raise ProofInvalid(f"the event has no {names[0]}")


def verify_proof(proof: UsageProof | dict[str, Any], usage_settled_event: dict[str, Any]) -> bool:
    """True when the proof's row is in the root the `usageSettled` event carries; ProofInvalid otherwise."""
    p = proof if isinstance(proof, UsageProof) else UsageProof.model_validate(proof)
    data = bytes.fromhex(p.leafData)
    if len(data) != LEAF_DATA_BYTES:
        raise ProofInvalid("leaf data has the wrong length")
    if int.from_bytes(data[1:9], "big") != p.batchId or int.from_bytes(data[9:13], "big") != p.leafIndex:
        raise ProofInvalid("leaf data names another batch or index")
    if data[13:45].hex() != p.txHash.lower():
        raise ProofInvalid("leaf data names another transaction")
    leaf = leaf_hash(data)
    if leaf.hex() != p.leaf.lower():
        raise ProofInvalid("leaf hash does not match the leaf data")
    steps = [ProofStep(bytes.fromhex(s.hash), s.side) for s in p.path]
    root = root_from_path(leaf, steps)
    event_batch = int(_field(usage_settled_event, "batch_id", "batchId"))
    event_root = str(_field(usage_settled_event, "usage_root", "usageRoot")).lower()
    if event_batch != p.batchId:
        raise ProofInvalid(f"the event settles batch {event_batch}, the proof is for batch {p.batchId}")
    if root.hex() != event_root:
        raise ProofInvalid("the path does not lead to the event's usage_root")
    return True


def usage_settled_events(transaction: dict[str, Any], contract: str | None = None) -> list[dict[str, Any]]:
    """The `usageSettled` events of a gateway transaction (with results), decoded with the billing ABI."""
    abi = load_billing_abi()
    found = []
    for event in (transaction.get("logs") or {}).get("events") or []:
        if contract is not None and event.get("address") != contract:
            continue
        topics = [base64.b64decode(t) if t else b"" for t in event.get("topics") or []]
        if not topics or topics[0] != b"usageSettled":
            continue
        data = [base64.b64decode(d) if d else b"" for d in event.get("additionalData") or []]
        found.append(plain(decode_event(abi, "usageSettled", topics[1:], data)))
    return found


def not_committed(batch: dict[str, Any] | None, next_due_ms: int | None, now_ms: int) -> ApiError:
    if batch is None:
        detail = "the row is not in a settlement batch yet; the next batch is built at the latest at nextBatchDueMs"
    else:
        detail = f"batch {batch['batch_id']} is {batch['state']}; its root is not final on chain yet"
    retry_ms = 5_000 if batch is not None else max(1_000, min(60_000, (next_due_ms or now_ms) - now_ms))
    return ApiError(
        PROOF_PENDING_CODE,
        detail=detail,
        details={
            # Tells this 409 from the code's first meaning (a request with the same Idempotency-Key still
            # running): docs/usage.md.
            "reason": "PROOF_PENDING",
            "batchId": batch["batch_id"] if batch is not None else None,
            "batchState": batch["state"] if batch is not None else None,
            "nextBatchDueMs": next_due_ms,
            "retryAfterMs": retry_ms,
        },
        headers={"Retry-After": str(max(1, -(-retry_ms // 1000)))},
    )
