"""The SHA-256 Merkle tree over a settlement batch's ledger rows (docs/settlement.md: the exact encoding).

- Leaf: `SHA-256(0x00 || leaf_data)`, leaf_data being `LeafRow.encode()`, 211 bytes.
- Node: `SHA-256(0x01 || left || right)`. The prefixes keep a leaf from ever passing for a node.
- Odd node: the last node of a level with an odd count is promoted unchanged to the next level (never
  paired with itself, so no two different row lists give the same root).
- Root of an empty batch (a root-only settlement): 32 zero bytes.

A proof is the list of siblings from the leaf up, each with its side; a promoted level adds no step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = bytes(32)
LEAF_VERSION = 1
STATUS_CODES = {"success": 0, "failed": 1}
CLASS_CODES = {"plan": 0, "payg": 1, "sponsor": 2, "free": 3}
LEAF_DATA_BYTES = 211


def leaf_hash(leaf_data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + leaf_data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _u(value: int, width: int) -> bytes:
    return int(value).to_bytes(width, "big", signed=False)


@dataclass(frozen=True)
class LeafRow:
    """The ledger row's members that a leaf commits to (addresses as 32-byte public keys)."""

    batch_id: int
    leaf_index: int
    tx_hash: bytes  # 32
    account: bytes  # 32: the paying account
    sender: bytes  # 32
    nonce: int
    receiver: bytes  # 32
    status: str  # success | failed
    billing_class: str  # plan | payg | sponsor | free
    ru: int
    payg_micro: int
    period_id: int  # 0 when the row has none
    executed_block_ts_ms: int  # 0 when unknown
    gas_limit: int
    gas_price: int
    api_key_id: str  # "" when none; ASCII, at most 16 characters

    def encode(self) -> bytes:
        """The fixed-width leaf data (all integers unsigned big-endian)."""
        key = self.api_key_id.encode("ascii")
        if len(key) > 16:
            raise ValueError("api_key_id longer than 16 characters")
        for name in ("tx_hash", "account", "sender", "receiver"):
            if len(getattr(self, name)) != 32:
                raise ValueError(f"{name} must be 32 bytes")
        data = b"".join(
            (
                _u(LEAF_VERSION, 1),
                _u(self.batch_id, 8),
                _u(self.leaf_index, 4),
                self.tx_hash,
                self.account,
                self.sender,
                _u(self.nonce, 8),
                self.receiver,
                _u(STATUS_CODES[self.status], 1),
                _u(CLASS_CODES[self.billing_class], 1),
                _u(self.ru, 4),
                _u(self.payg_micro, 8),
                _u(self.period_id, 8),
                _u(self.executed_block_ts_ms, 8),
                _u(self.gas_limit, 8),
                _u(self.gas_price, 8),
                key.ljust(16, b"\x00"),
            )
        )
        assert len(data) == LEAF_DATA_BYTES
        return data


@dataclass(frozen=True)
class ProofStep:
    sibling: bytes
    side: Literal["left", "right"]  # where the sibling sits


def levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first, root last."""
    if not leaves:
        return [[EMPTY_ROOT]]
    level = list(leaves)
    out = [level]
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])  # promoted unchanged
        level = nxt
        out.append(level)
    return out


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    return levels(leaves)[-1][0]


def merkle_path(leaves: Sequence[bytes], index: int) -> list[ProofStep]:
    if not 0 <= index < len(leaves):
        raise IndexError("leaf index outside the tree")
    path: list[ProofStep] = []
    for level in levels(leaves)[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(ProofStep(level[sibling], "left" if sibling < index else "right"))
        index //= 2
    return path


def root_from_path(leaf: bytes, path: Sequence[ProofStep]) -> bytes:
    node = leaf
    for step in path:
        node = node_hash(step.sibling, node) if step.side == "left" else node_hash(node, step.sibling)
    return node
