"""Simulation before co-signing: contract calls (by default) run through the gateway's simulate first.

The real gateway's simulate answers the node's `SimulationResults` (`status`, `failReason`, `scResults`,
`receipts`, `hash`: no gas used, no logs), and for a cross-shard transaction one result per shard,
`{"senderShard": ..., "receiverShard": ...}` (docs/chain.md). Every result must say `success` for a pass; a
`fail` is refused (`SIMULATION_FAILED`, with the contract's message where an SCR carries it); a result that
gives no verdict (a shape we cannot read, no status) is "could not judge", refused as the upstream not
answering (`UPSTREAM_UNAVAILABLE`, nothing sent), never taken as a pass.

The gas the call needs comes from `POST /transaction/cost` (`txGasUnits`), asked at the same time: a gas
limit far above it is refused (`GAS_OVERPROVISIONED`: up to 1.9 times the measured processing gas above
movement gas is fine). When the cost cannot be had (the gateway fails or the estimate itself fails) the
overprovisioning check is skipped; the verdict above still decides.
"""

from __future__ import annotations

import asyncio
from typing import Any

from multiversx_sdk import Transaction

from gasless.chain.gas import is_guarded
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.core.errors import ApiError
from gasless.relay.checks import ParsedRelay

OVERPROVISION_FACTOR = 1.9


def wants_simulation(tx: Transaction, mode: str) -> bool:
    if mode == "never":
        return False
    if mode == "always":
        return True
    return bool(tx.data) and tx.receiver.get_public_key()[:8] == b"\0" * 8


def shard_results(result: Any) -> list[dict[str, Any]] | None:
    """The per-shard results of a simulate answer's `result`, or None when it is no shape we know."""
    if not isinstance(result, dict):
        return None
    if "senderShard" in result or "receiverShard" in result:
        shards = [result.get("senderShard"), result.get("receiverShard")]
        return shards if all(isinstance(r, dict) for r in shards) else None  # type: ignore[return-value]
    return [result]


def _message(result: dict[str, Any]) -> str:
    """The contract's own message where an SCR carries it, else the VM's return code text."""
    scrs = result.get("scResults")
    for scr in scrs.values() if isinstance(scrs, dict) else scrs if isinstance(scrs, list) else []:
        message = scr.get("returnMessage") if isinstance(scr, dict) else None
        if message and message != "gas refund for relayer":
            return str(message)
    return str(result.get("failReason") or result.get("status"))


async def _needed_gas(gateway: GatewayClient, wire: dict[str, Any]) -> int | None:
    try:
        cost = await gateway.cost(wire)
    except (GatewayUnavailable, GatewayRejected):
        return None
    units = cost.get("txGasUnits") if isinstance(cost, dict) else None
    if cost.get("returnMessage") or not isinstance(units, int) or units <= 0:
        return None
    return units


async def simulate_or_refuse(gateway: GatewayClient, parsed: ParsedRelay, params: Any, mode: str) -> None:
    tx = parsed.tx
    if not wants_simulation(tx, mode):
        return
    # The relayer has not signed yet: simulate without signature checks, with a placeholder relayer
    # signature so the node sees a complete Relayed-V3 transaction (the sender's was verified already).
    wire = {**parsed.wire, "relayerSignature": "00" * 64}
    simulated, needed = await asyncio.gather(
        gateway.simulate(wire, check_signature=False), _needed_gas(gateway, wire), return_exceptions=True
    )
    if isinstance(simulated, GatewayRejected):
        raise ApiError(
            "SIMULATION_FAILED",
            detail=f"simulation refused: {simulated}",
            details={"returnMessage": str(simulated)},
        ) from None
    if isinstance(simulated, GatewayUnavailable):
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="simulation unavailable; nothing was sent"
        ) from simulated
    if isinstance(simulated, BaseException):
        raise simulated
    results = shard_results(simulated)
    if results is None or any(r.get("status") is None for r in results):
        raise ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail="the gateway's simulation gave no verdict; nothing was sent",
        )
    for result in results:
        if result.get("status") != "success":
            message = _message(result)
            raise ApiError(
                "SIMULATION_FAILED",
                detail=f"it would fail on chain: {message}",
                details={"returnMessage": message},
            )
    if not isinstance(needed, int):
        return
    movement = params.gas_rules().movement_gas(data_len=len(tx.data), guarded=is_guarded(tx), relayed=True)
    processing = max(0, needed - movement)
    if processing > 0:
        ceiling = movement + int(OVERPROVISION_FACTOR * processing)
        if tx.gas_limit > ceiling:
            raise ApiError(
                "GAS_OVERPROVISIONED",
                detail=f"gas limit far above the measured need; at most {ceiling}",
                details={"limit": ceiling, "actual": tx.gas_limit},
            )
