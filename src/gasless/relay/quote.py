"""POST /v1/quote: the RU weight and price of a transaction; no reservation, no signer call."""

from __future__ import annotations

from typing import Any

from gasless.billing.schedule import RU_SCHEDULE_VERSION, ru_for_gas_limit
from gasless.chain.calls import function_of
from gasless.chain.gas import is_guarded
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.core.errors import ApiError
from gasless.mirror.views import ContractMirror
from gasless.relay.checks import gas_limit_problem, parse_transaction
from gasless.relay.schemas import RelayQuote


class QuoteService:
    def __init__(self, network: NetworkView, mirror: ContractMirror) -> None:
        self.network = network
        self.mirror = mirror

    async def quote(self, wire: dict[str, Any]) -> RelayQuote:
        tx = parse_transaction(wire)
        params = self.network.params
        if tx.chain_id != params.chain_id:
            raise ApiError("CHAIN_ID_MISMATCH", detail=f"this host serves chain {params.chain_id!r}")
        rules = params.gas_rules()
        movement = rules.movement_gas(data_len=len(tx.data), guarded=is_guarded(tx), relayed=True)
        problem = gas_limit_problem(tx, params)
        if problem is not None:
            raise problem
        ru = ru_for_gas_limit(tx.gas_limit)
        free = False
        price_per_ru = 0
        if self.mirror.contract is not None:
            try:
                config = (await self.mirror.config())[0]
            except (GatewayUnavailable, GatewayRejected) as exc:
                raise ApiError("UPSTREAM_UNAVAILABLE", detail="could not read the contract's tariff") from exc
            price_per_ru = int(config.ru_price_micro)
            free_ops = {bytes(name).decode() for name in config.free_operations}
            free = tx.receiver.to_bech32() == self.mirror.contract and function_of(tx) in free_ops
        gas_price = tx.gas_price or params.min_gas_price
        max_fee = rules.fee(gas_price=gas_price, movement_gas=movement, gas_used=tx.gas_limit)
        return RelayQuote(
            ru=str(ru),
            priceMicroUsdc=str(0 if free else ru * price_per_ru),
            ruScheduleVersion=RU_SCHEDULE_VERSION,
            gasLimit=str(tx.gas_limit),
            movementGas=str(movement),
            maxFeeAtto=str(max_fee),
            billingClass="free" if free else None,
            free=free,
        )
