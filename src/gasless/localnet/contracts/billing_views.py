"""Readonly views of the billing contract model; values are evaluated at the query's block time."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gasless.localnet.contracts.billing_base import BillingBase
from gasless.localnet.contracts.billing_state import settle_pending_fee


class Views(BillingBase):
    """Each view returns its ABI outputs as native values (structs as dicts)."""

    def _view_get_config(self, now_ms: int) -> list[Any]:
        config = settle_pending_fee(self.state.config, now_ms)
        view = asdict(config)
        view["free_operations"] = [name.encode() for name in config.free_operations]
        view["sender_fee_micro"] = config.sender_fee_ru * config.ru_price_micro
        return [view]

    def _view_get_pause_state(self, now_ms: int) -> list[Any]:
        return [asdict(self.state.pause)]

    def _view_get_tiers(self, now_ms: int) -> list[Any]:
        return [[asdict(tier) for _, tier in sorted(self.state.tiers.items())]]

    def _view_get_rate_classes(self, now_ms: int) -> list[Any]:
        return [[asdict(rc) for _, rc in sorted(self.state.rate_classes.items())]]

    def _view_get_tariff_history(self, now_ms: int) -> list[Any]:
        return [[asdict(entry) for entry in self.state.tariff_history]]

    def _view_get_relayer_state(self, now_ms: int, relayer: bytes) -> list[Any]:
        info = self.state.relayers.get(relayer)
        return [asdict(info) if info is not None else None]

    def _view_get_relayers(self, now_ms: int) -> list[Any]:
        return [[asdict(info) for info in self.state.relayers.values()]]

    def _view_get_account(self, now_ms: int, address: bytes) -> list[Any]:
        account = self._account(address, now_ms)
        if account is None:
            return [None]
        return [
            {
                "address": address,
                "credits_micro": account.credits_micro,
                "escrow_micro": account.escrow_micro,
                "running": asdict(account.running) if account.running else None,
                "queued": asdict(account.queued) if account.queued else None,
                "auto_renew": account.auto_renew,
                "payg": asdict(account.payg),
                "suspended": account.suspended,
                "created_ms": account.created_ms,
                "sender_count": len(self.state.senders.get(address, ())),
            }
        ]

    def _view_get_senders(self, now_ms: int, address: bytes) -> list[Any]:
        return [list(self.state.senders.get(address, ()))]

    def _view_get_account_of_sender(self, now_ms: int, sender: bytes) -> list[Any]:
        return [self.state.sender_account.get(sender)]

    def _view_get_settlement(self, now_ms: int, batch_id: int) -> list[Any]:
        settlement = self.state.settlements.get(batch_id)
        return [asdict(settlement) if settlement is not None else None]
