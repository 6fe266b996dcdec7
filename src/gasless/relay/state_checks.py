"""Checks against the sender's chain state and our own records: guardian, nonce and slot, gap, balance,
and in-flight count (docs/relay.md, the order of checks). Used by relay and validate alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gasless.chain.codec import verify_ed25519
from gasless.chain.gas import is_guarded
from gasless.core.errors import ApiError
from gasless.relay.assign import AssignService
from gasless.relay.checks import ChainState, ParsedRelay, gas_price_of
from gasless.relay.intents import intent_from_row
from gasless.relay.leases import Lease
from gasless.relay.repository import SenderView

MAX_IN_FLIGHT = 64  # non-terminal intents per sender (docs/relay.md: TOO_MANY_IN_FLIGHT)


def state_checks(
    parsed: ParsedRelay,
    lease: Lease,
    view: SenderView,
    state: ChainState,
    *,
    round_ms: int,
    assign: AssignService,
) -> list[Callable[[], Any]]:
    """The checks against the sender's chain state and our own records, in the interface contract's order; the last
    callable returns the slot sequence the commit uses."""
    tx = parsed.tx
    nonce = tx.nonce
    ours_at_nonce = [r for r in view.at_nonce if r.state in ("COSIGNED", "BROADCAST")]
    executed_at_nonce = [r for r in view.at_nonce if r.state in ("EXECUTED", "FINALIZED")]
    replacing = lease.kind == "cancel" and lease.pinNonce == nonce
    result: dict[str, int] = {"slot_seq": max((int(r.slot_seq) for r in view.at_nonce), default=-1) + 1}

    def guardian() -> ApiError | None:
        guarded_tx = is_guarded(tx)
        if state.guarded and not guarded_tx:
            return ApiError(
                "GUARDIAN_REQUIRED", detail="the sender is guarded; the transaction must be co-signed"
            )
        if guarded_tx:
            named = (
                tx.guardian.to_bech32() if tx.guardian is not None and not tx.guardian.is_empty() else None
            )
            if not state.guarded or named != state.active_guardian:
                return ApiError(
                    "GUARDIAN_MISMATCH", detail="the guardian is not the sender's active guardian"
                )
            assert tx.guardian is not None
            if not verify_ed25519(tx.guardian.get_public_key(), parsed.signing_bytes, tx.guardian_signature):
                return ApiError("GUARDIAN_SIGNATURE_INVALID", detail="the guardian signature does not verify")
        return None

    def executed() -> ApiError | None:
        if executed_at_nonce:
            intent = intent_from_row(executed_at_nonce[0], round_ms)
            return ApiError(
                "INTENT_ALREADY_EXECUTED",
                detail=f"nonce {nonce} already executed",
                details={"intent": {"txHash": intent.txHash, "id": intent.id, "state": intent.state}},
            )
        if nonce < state.nonce:
            return ApiError(
                "NONCE_TOO_LOW",
                detail=f"nonce {nonce} is below the account nonce {state.nonce}",
                details={
                    "onchainNonce": state.nonce,
                    "poolLastNonce": state.pool_last_nonce,
                    "expectedNonce": expected_nonce(state, view),
                },
            )
        return None

    def slot() -> ApiError | None:
        pooled = state.pooled_at(nonce)
        our_hashes = {r.tx_hash for r in view.at_nonce}
        if ours_at_nonce:
            occupier = max(ours_at_nonce, key=lambda r: int(r.gas_price))
            if not replacing:
                return ApiError(
                    "NONCE_IN_FLIGHT",
                    detail=f"intent {occupier.tx_hash} holds nonce {nonce}; assign with cancel to replace it",
                    details={
                        "occupiedBy": {"id": f"{occupier.sender}:{nonce}", "txHash": occupier.tx_hash},
                        "pinnedNonce": nonce,
                    },
                )
            if tx.gas_price <= int(occupier.gas_price):
                return underpriced(int(occupier.gas_price))
            return None
        if pooled is not None and pooled.get("hash") not in our_hashes:
            pooled_price = gas_price_of(pooled)
            if not replacing:
                return assign.resign_same_nonce(
                    parsed.sender, parsed.sender_pubkey, parsed.sender_shard, nonce, pooled_price + 1
                )
            if tx.gas_price <= pooled_price:
                return underpriced(pooled_price)
        return None

    def gap() -> ApiError | None:
        expected = expected_nonce(state, view)
        if nonce > expected:
            return ApiError(
                "NONCE_GAP",
                detail=f"nonce {nonce} skips ahead; the next usable nonce is {expected}",
                details={"expectedNonce": expected, "onchainNonce": state.nonce},
            )
        return None

    def balance() -> ApiError | None:
        if tx.value > state.balance:
            return ApiError("INSUFFICIENT_SENDER_BALANCE", detail="the sender cannot cover the value moved")
        return None

    def in_flight() -> ApiError | None:
        if not replacing and view.in_flight_count >= MAX_IN_FLIGHT:
            return ApiError(
                "TOO_MANY_IN_FLIGHT",
                detail=f"the sender has {MAX_IN_FLIGHT} unsettled intents",
                details={"retryAfterMs": round_ms},
            )
        return None

    def done() -> int:
        return result["slot_seq"]

    return [guardian, executed, slot, gap, balance, in_flight, done]


def underpriced(current: int) -> ApiError:
    return ApiError(
        "REPLACEMENT_UNDERPRICED",
        detail=f"a replacement must pay more than the pooled gas price {current}",
        details={"minGasPrice": current + 1},
    )


def expected_nonce(state: ChainState, view: SenderView) -> int:
    candidates = [state.nonce]
    if state.pool_last_nonce is not None:
        candidates.append(state.pool_last_nonce + 1)
    if view.highest_in_flight_nonce is not None:
        candidates.append(view.highest_in_flight_nonce + 1)
    return max(candidates)
