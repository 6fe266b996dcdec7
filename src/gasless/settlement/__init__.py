"""Usage settlement: batches of ledger rows committed on chain as SHA-256 Merkle roots, and their proofs."""

from gasless.settlement.proofs import ProofInvalid, UsageProof, usage_settled_events, verify_proof

__all__ = ["ProofInvalid", "UsageProof", "usage_settled_events", "verify_proof"]
