"""Simulation before co-signing: contract calls (by default) run through the gateway's simulate first.

A call the chain would fail is refused (`SIMULATION_FAILED`) and a gas limit far above the measured need is
refused (`GAS_OVERPROVISIONED`: up to 1.9 times the simulated processing gas above movement gas is fine).
"""

from __future__ import annotations

from typing import Any

from multiversx_sdk import Transaction

from gasless.chain.gas import is_guarded
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.errors import ApiError
from gasless.relay.checks import ParsedRelay

OVERPROVISION_FACTOR = 1.9


def wants_simulation(tx: Transaction, mode: str) -> bool:
    if mode == "never":
        return False
    if mode == "always":
        return True
    return bool(tx.data) and tx.receiver.get_public_key()[:8] == b"\0" * 8


async def simulate_or_refuse(gateway: GatewayClient, parsed: ParsedRelay, params: Any, mode: str) -> None:
    tx = parsed.tx
    if not wants_simulation(tx, mode):
        return
    # The relayer has not signed yet: simulate without signature checks, with a placeholder relayer
    # signature so the node sees a complete Relayed-V3 transaction (the sender's was verified already).
    wire = {**parsed.wire, "relayerSignature": "00" * 64}
    try:
        data = await gateway.simulate(wire, check_signature=False)
    except GatewayRejected as exc:
        raise ApiError(
            "SIMULATION_FAILED", detail=f"simulation refused: {exc}", details={"returnMessage": str(exc)}
        ) from None
    except GatewayUnavailable as exc:
        raise ApiError("UPSTREAM_UNAVAILABLE", detail="simulation unavailable; nothing was sent") from exc
    result = data.get("result", data) if isinstance(data, dict) else {}
    status = result.get("status")
    if status not in (None, "success"):
        message = result.get("failReason") or status
        raise ApiError(
            "SIMULATION_FAILED",
            detail=f"it would fail on chain: {message}",
            details={"returnMessage": message},
        )
    used = result.get("gasUsed")
    if used is None:
        return
    movement = params.gas_rules().movement_gas(data_len=len(tx.data), guarded=is_guarded(tx), relayed=True)
    processing = max(0, int(used) - movement)
    if processing > 0:
        ceiling = movement + int(OVERPROVISION_FACTOR * processing)
        if tx.gas_limit > ceiling:
            raise ApiError(
                "GAS_OVERPROVISIONED",
                detail=f"gas limit far above the simulated need; at most {ceiling}",
                details={"limit": ceiling, "actual": tx.gas_limit},
            )
