"""Property tests of the usage Merkle tree: every leaf's proof verifies; any changed leaf, sibling, side or
root fails; the leaf encoding is fixed-width and binds batch and index."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gasless.settlement.merkle import (
    EMPTY_ROOT,
    LEAF_DATA_BYTES,
    LeafRow,
    ProofStep,
    leaf_hash,
    merkle_path,
    merkle_root,
    node_hash,
    root_from_path,
)
from gasless.settlement.proofs import ProofInvalid, UsageProof, verify_proof

leaves = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=70)


@settings(max_examples=200, deadline=None)
@given(leaves)
def test_every_leaf_proof_verifies(values: list[bytes]) -> None:
    root = merkle_root(values)
    for index, leaf in enumerate(values):
        assert root_from_path(leaf, merkle_path(values, index)) == root


@settings(max_examples=200, deadline=None)
@given(leaves, st.data())
def test_a_changed_leaf_or_path_fails(values: list[bytes], data: st.DataObject) -> None:
    root = merkle_root(values)
    index = data.draw(st.integers(0, len(values) - 1))
    path = merkle_path(values, index)
    flip = data.draw(st.integers(0, 255))
    changed = bytes([values[index][0] ^ (flip or 1)]) + values[index][1:]
    assert root_from_path(changed, path) != root
    if path:
        step = data.draw(st.integers(0, len(path) - 1))
        bad = list(path)
        sibling = bad[step].sibling
        bad[step] = ProofStep(bytes([sibling[0] ^ 1]) + sibling[1:], bad[step].side)
        assert root_from_path(values[index], bad) != root
        swapped = list(path)
        other = "left" if path[step].side == "right" else "right"
        swapped[step] = ProofStep(path[step].sibling, other)
        if path[step].sibling != root_from_path(values[index], path[:step]):  # not a symmetric pair
            assert root_from_path(values[index], swapped) != root
        assert root_from_path(values[index], path[:-1]) != root or len(values) == 1


@settings(max_examples=100, deadline=None)
@given(leaves)
def test_the_tree_shape(values: list[bytes]) -> None:
    # Two leaves: one node; an odd last node is promoted, never paired with itself.
    if len(values) == 2:
        assert merkle_root(values) == node_hash(values[0], values[1])
    if len(values) == 3:
        assert merkle_root(values) == node_hash(node_hash(values[0], values[1]), values[2])
    assert merkle_root(values) != merkle_root(values + [values[-1]])


def test_empty_batch_root_and_node_prefix() -> None:
    assert merkle_root([]) == EMPTY_ROOT
    leaf = bytes(32)
    assert leaf_hash(leaf) == hashlib.sha256(b"\x00" + leaf).digest()
    assert node_hash(leaf, leaf) == hashlib.sha256(b"\x01" + leaf + leaf).digest()


rows = st.builds(
    LeafRow,
    batch_id=st.integers(1, 2**63),
    leaf_index=st.integers(0, 2**32 - 1),
    tx_hash=st.binary(min_size=32, max_size=32),
    account=st.binary(min_size=32, max_size=32),
    sender=st.binary(min_size=32, max_size=32),
    nonce=st.integers(0, 2**64 - 1),
    receiver=st.binary(min_size=32, max_size=32),
    status=st.sampled_from(["success", "failed"]),
    billing_class=st.sampled_from(["plan", "payg", "sponsor", "free"]),
    ru=st.integers(0, 2**32 - 1),
    payg_micro=st.integers(0, 2**63),
    period_id=st.integers(0, 2**63),
    executed_block_ts_ms=st.integers(0, 2**63),
    gas_limit=st.integers(0, 2**63),
    gas_price=st.integers(0, 2**63),
    api_key_id=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", max_size=16),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(rows, min_size=1, max_size=20), st.data())
def test_verify_proof_on_encoded_rows(batch: list[LeafRow], data: st.DataObject) -> None:
    from dataclasses import replace

    batch = [replace(r, batch_id=batch[0].batch_id, leaf_index=i) for i, r in enumerate(batch)]
    encoded = [r.encode() for r in batch]
    assert all(len(e) == LEAF_DATA_BYTES for e in encoded)
    hashes = [leaf_hash(e) for e in encoded]
    root = merkle_root(hashes)
    index = data.draw(st.integers(0, len(batch) - 1))
    proof = UsageProof(
        txHash=batch[index].tx_hash.hex(),
        batchId=batch[index].batch_id,
        leafIndex=index,
        rowCount=len(batch),
        leafData=encoded[index].hex(),
        leaf=hashes[index].hex(),
        path=[{"hash": s.sibling.hex(), "side": s.side} for s in merkle_path(hashes, index)],
        usageRoot=root.hex(),
        settlement={"txHash": "00" * 32, "hyperblockNonce": 1, "blockTsMs": 1},
    )
    event = {"batch_id": batch[0].batch_id, "usage_root": root.hex()}
    assert verify_proof(proof, event)
    # Another ru in the leaf data (the leaf hash recomputed to match) no longer reaches the root.
    tampered = replace(batch[index], ru=(batch[index].ru + 1) % 2**32).encode()
    forged = proof.model_copy(update={"leafData": tampered.hex(), "leaf": leaf_hash(tampered).hex()})
    for bad, bad_event in (
        (forged, event),
        (proof, {"batch_id": batch[0].batch_id, "usage_root": "11" * 32}),
        (proof, {"batch_id": batch[0].batch_id + 1, "usage_root": root.hex()}),
        (proof.model_copy(update={"leafIndex": index + 1}), event),
    ):
        try:
            verify_proof(bad, bad_event)
        except ProofInvalid:
            continue
        raise AssertionError("a tampered proof verified")
