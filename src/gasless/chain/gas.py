"""The node's gas and fee rules (mx-chain-go economicsData), shared by the relay checks and localnet."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from multiversx_sdk import Transaction

OPTION_HASH_SIGN = 1
OPTION_GUARDED = 2


@dataclass(frozen=True)
class GasRules:
    min_gas_price: int = 1_000_000_000
    min_gas_limit: int = 50_000
    gas_per_data_byte: int = 1_500
    gas_price_modifier: Decimal = Decimal("0.01")
    extra_gas_guarded: int = 50_000
    extra_gas_relayed: int = 50_000
    max_gas_per_tx: int = 600_000_000

    def movement_gas(self, *, data_len: int, guarded: bool, relayed: bool) -> int:
        """ComputeGasLimitInEpoch: the gas a transaction needs before any processing."""
        return (
            self.min_gas_limit
            + data_len * self.gas_per_data_byte
            + (self.extra_gas_guarded if guarded else 0)
            + (self.extra_gas_relayed if relayed else 0)
        )

    def movement_gas_of(self, tx: Transaction) -> int:
        return self.movement_gas(data_len=len(tx.data), guarded=is_guarded(tx), relayed=is_relayed_v3(tx))

    def processing_gas_price(self, gas_price: int) -> int:
        # The node converts through float64: uint64(float64(gasPrice) * modifier).
        return int(float(gas_price) * float(self.gas_price_modifier))

    def fee(self, *, gas_price: int, movement_gas: int, gas_used: int) -> int:
        """fee = movement*price + (used - movement)*price*modifier (the relayer pays it on Relayed-V3)."""
        processing = max(0, gas_used - movement_gas)
        return movement_gas * gas_price + processing * self.processing_gas_price(gas_price)


def is_relayed_v3(tx: Transaction) -> bool:
    return bool(tx.relayer and not tx.relayer.is_empty()) or bool(tx.relayer_signature)


def is_guarded(tx: Transaction) -> bool:
    return tx.version > 1 and bool(tx.options & OPTION_GUARDED)


def is_hash_signed(tx: Transaction) -> bool:
    return tx.version > 1 and bool(tx.options & OPTION_HASH_SIGN)
