"""The localnet genesis configuration of the billing contract, applied as if the owner had sent the calls.

Rate classes follow the service's published figures (docs/api-conventions.md, docs/billing.md); tiers,
prices and the other figures are localnet's choice (on the real networks they are contract configuration). The contract stays paused: the embedded default unpauses
it with a real owner transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gasless.localnet.contracts.billing import BillingContract
from gasless.localnet.contracts.billing_state import (
    MONTH_MS,
    RateClass,
    RelayerInfo,
    Tier,
    append_tariff,
    rate_class_changes,
    tier_changes,
)

USDC = 1_000_000  # micro-USDC per USDC
M = 1_000_000

# class: ru/s, ru burst, gas/s per shard, gas burst per shard, max gas limit, ru/h
SEED_RATE_CLASSES: tuple[RateClass, ...] = (
    RateClass(1, 1, 15, 20 * M, 200 * M, 100 * M, 300),
    RateClass(2, 5, 25, 50 * M, 600 * M, 600 * M, 600),
    RateClass(3, 20, 60, 100 * M, 1_000 * M, 600 * M, 1_500),
    RateClass(4, 50, 150, 150 * M, 1_500 * M, 600 * M, 3_000),
    RateClass(5, 100, 300, 200 * M, 2_000 * M, 600 * M, 6_000),
    RateClass(6, 2, 15, 20 * M, 200 * M, 100 * M, 300),
)

# Enterprise carries a list price (it is granted, never bought) so that buying a cheaper tier while an
# Enterprise block runs queues behind it instead of replacing it as an "upgrade".
SEED_TIERS: tuple[Tier, ...] = (
    Tier(1, b"Starter", "Human", 1, 9 * USDC, 30_000, MONTH_MS, True, False),
    Tier(2, b"Builder", "Human", 2, 29 * USDC, 150_000, MONTH_MS, True, False),
    Tier(3, b"Growth", "Human", 3, 99 * USDC, 600_000, MONTH_MS, True, False),
    Tier(4, b"Scale", "Human", 4, 299 * USDC, 2_000_000, MONTH_MS, True, False),
    Tier(5, b"Enterprise", "Human", 5, 999 * USDC, 10_000_000, MONTH_MS, False, False),
    Tier(6, b"Agent Pro", "Agent", 3, 49 * USDC, 300_000, MONTH_MS, True, False),
    Tier(7, b"Agent Fleet", "Agent", 5, 249 * USDC, 2_000_000, MONTH_MS, True, False),
    Tier(8, b"Agent Metered", "Agent", 6, 0, 0, 0, True, True),
)

SEED_RU_PRICE_MICRO = 200
SEED_DEPOSIT_MIN_MICRO = 1 * USDC
SEED_DEPOSIT_MAX_MICRO = 10_000 * USDC
SEED_SENDER_FEE_RU = 50
SEED_FREE_OPERATIONS: tuple[str, ...] = (
    "deposit",
    "depositFor",
    "subscribe",
    "depositAndSubscribe",
    "setAutoRenew",
    "setPayg",
    "releaseEscrow",
    "renew",
    "removeSenders",
)
SEED_SWAP_SHARE_BPS = 1_000
SEED_SWAP_BUDGET_MICRO = 50_000 * USDC


def seed_config(contract: BillingContract, now_ms: int, relayers: Iterable[bytes] = ()) -> None:
    """Apply the genesis configuration (with its tariff history) and register `relayers` as active."""
    state = contract.state
    changes: list[tuple[str, int, int, int]] = []
    for rc in SEED_RATE_CLASSES:
        changes += rate_class_changes(state.rate_classes.get(rc.id), rc, now_ms)
        state.rate_classes[rc.id] = rc
    for tier in SEED_TIERS:
        changes += tier_changes(state.tiers.get(tier.id), tier, now_ms)
        state.tiers[tier.id] = tier
    changes += [
        ("DepositMin", 0, SEED_DEPOSIT_MIN_MICRO, now_ms),
        ("DepositMax", 0, SEED_DEPOSIT_MAX_MICRO, now_ms),
        ("SenderFeeRu", 0, SEED_SENDER_FEE_RU, now_ms),
        ("RuPrice", 0, SEED_RU_PRICE_MICRO, now_ms),
        ("FreeOperations", 0, len(SEED_FREE_OPERATIONS), now_ms),
    ]
    state.config = replace(
        state.config,
        deposit_min_micro=SEED_DEPOSIT_MIN_MICRO,
        deposit_max_micro=SEED_DEPOSIT_MAX_MICRO,
        sender_fee_ru=SEED_SENDER_FEE_RU,
        pending_sender_fee=None,
        ru_price_micro=SEED_RU_PRICE_MICRO,
        free_operations=SEED_FREE_OPERATIONS,
        swap_share_bps=SEED_SWAP_SHARE_BPS,
        swap_budget_micro=SEED_SWAP_BUDGET_MICRO,
        swap_window_start_ms=now_ms,
        swap_window_spent_micro=0,
    )
    append_tariff(state, now_ms, changes)
    for relayer in relayers:
        state.relayers[relayer] = RelayerInfo(relayer, "Active", now_ms)
