"""State of the billing contract model.

Every record is a frozen dataclass replaced on change, held in a few dicts and lists of `BillingState`.
Deep-copying the state (the chain does it before every call) therefore copies only those containers and
shares the records, which is correct because nothing mutates a record in place.
Enum-valued fields hold the ABI variant name (`"Human"`, `"Active"`, `"TierPrice"`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

MONTH_MS = 2_592_000_000  # one plan period (30 days)
DAY_MS = 86_400_000
SENDER_FEE_NOTICE_MS = 172_800_000  # an increase of sender_fee_ru takes effect this much later
RENEW_WINDOW_MS = DAY_MS  # renew() applies once the running block ends within this window
SWAP_WINDOW_MS = DAY_MS  # the swap budget is per window of this length
MAX_MONTHS = 12
BPS = 10_000
ZERO_REF = bytes(32)

AUDIENCES = ("Human", "Agent")
RELAYER_STATES = ("Active", "Draining", "Retired")


class _Record:
    """An immutable record: a deep copy may share it."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> _Record:
        return self


@dataclass(frozen=True, slots=True)
class PendingFee(_Record):
    fee_ru: int
    effective_ms: int


@dataclass(frozen=True, slots=True)
class BillingConfig(_Record):
    owner: bytes
    payment_token: str
    wegld_token: str
    pair: bytes
    wrapper: bytes
    gas_tank: bytes
    deposit_min_micro: int = 0
    deposit_max_micro: int = 0  # 0 = unlimited
    sender_fee_ru: int = 0
    pending_sender_fee: PendingFee | None = None
    ru_price_micro: int = 0
    free_operations: tuple[str, ...] = ()
    swap_share_bps: int = 0
    swap_budget_micro: int = 0  # per window; 0 = unlimited
    swap_window_start_ms: int = 0
    swap_window_spent_micro: int = 0
    policy_version: int = 0


@dataclass(slots=True)
class PauseState:
    """Mutable (the localnet admin API flips the flags outside transactions); copied with the state."""

    paused: bool = True  # deployed paused
    deposits_paused: bool = False


@dataclass(frozen=True, slots=True)
class Tier(_Record):
    id: int
    name: bytes
    audience: str
    rate_class: int
    price_micro: int  # per month
    included_ru: int  # per period
    period_ms: int  # 0 = no period (pay-as-you-go)
    purchasable: bool
    payg: bool


@dataclass(frozen=True, slots=True)
class RateClass(_Record):
    id: int
    ru_per_sec: int
    ru_burst: int
    gas_per_sec_per_shard: int
    gas_burst_per_shard: int
    max_gas_limit: int
    ru_per_hour: int


@dataclass(frozen=True, slots=True)
class TariffEntry(_Record):
    seq: int
    timestamp_ms: int
    effective_ms: int
    kind: str
    subject_id: int
    value: int
    policy_version: int


@dataclass(frozen=True, slots=True)
class RelayerInfo(_Record):
    relayer: bytes
    state: str
    since_ms: int


@dataclass(frozen=True, slots=True)
class PlanBlock(_Record):
    tier_id: int
    start_ms: int
    end_ms: int  # 0 = open-ended (a tier without period)
    included_ru: int  # per period
    months: int
    price_paid_micro: int
    ref: bytes

    @property
    def has_period(self) -> bool:
        return self.end_ms != 0

    def ended(self, now_ms: int) -> bool:
        return self.has_period and self.end_ms <= now_ms


@dataclass(frozen=True, slots=True)
class PaygSettings(_Record):
    enabled: bool = False
    budget_micro: int = 0
    auto_topup: bool = False
    max_payg_price_micro: int = 0  # per RU; 0 = no cap


@dataclass(frozen=True, slots=True)
class AccountState(_Record):
    created_ms: int
    credits_micro: int = 0
    escrow_micro: int = 0
    running: PlanBlock | None = None
    queued: PlanBlock | None = None
    auto_renew: bool = False
    payg: PaygSettings = PaygSettings()
    suspended: bool = False

    def rolled(self, now_ms: int) -> AccountState:
        """The account with its queued block promoted once the running block has ended."""
        if self.queued is not None and (self.running is None or self.running.ended(now_ms)):
            if self.queued.start_ms <= now_ms:
                return replace(self, running=self.queued, queued=None)
        return self


@dataclass(frozen=True, slots=True)
class Settlement(_Record):
    batch_id: int
    usage_root: bytes
    row_count: int
    total_ru: int
    settled_ms: int


@dataclass
class BillingState:
    """The whole contract storage."""

    config: BillingConfig
    pause: PauseState = field(default_factory=PauseState)
    tiers: dict[int, Tier] = field(default_factory=dict)
    rate_classes: dict[int, RateClass] = field(default_factory=dict)
    tariff_history: list[TariffEntry] = field(default_factory=list)
    relayers: dict[bytes, RelayerInfo] = field(default_factory=dict)
    accounts: dict[bytes, AccountState] = field(default_factory=dict)
    senders: dict[bytes, tuple[bytes, ...]] = field(default_factory=dict)  # account -> senders, oldest first
    sender_account: dict[bytes, bytes] = field(default_factory=dict)  # sender -> account
    settlements: dict[int, Settlement] = field(default_factory=dict)

    def __deepcopy__(self, memo: dict[int, Any]) -> BillingState:
        return BillingState(
            config=self.config,
            pause=PauseState(self.pause.paused, self.pause.deposits_paused),
            tiers=dict(self.tiers),
            rate_classes=dict(self.rate_classes),
            tariff_history=list(self.tariff_history),
            relayers=dict(self.relayers),
            accounts=dict(self.accounts),
            senders=dict(self.senders),
            sender_account=dict(self.sender_account),
            settlements=dict(self.settlements),
        )


def effective_sender_fee_ru(config: BillingConfig, now_ms: int) -> int:
    """The per-sender fee in RU in force at `now_ms`."""
    pending = config.pending_sender_fee
    if pending is not None and pending.effective_ms <= now_ms:
        return pending.fee_ru
    return config.sender_fee_ru


def settle_pending_fee(config: BillingConfig, now_ms: int) -> BillingConfig:
    """The config with a pending fee increase folded in once it is in force."""
    pending = config.pending_sender_fee
    if pending is not None and pending.effective_ms <= now_ms:
        return replace(config, sender_fee_ru=pending.fee_ru, pending_sender_fee=None)
    return config


def swap_window(config: BillingConfig, now_ms: int) -> tuple[int, int]:
    """(window start, spent) of the swap budget window containing `now_ms`."""
    if now_ms >= config.swap_window_start_ms + SWAP_WINDOW_MS:
        return now_ms, 0
    return config.swap_window_start_ms, config.swap_window_spent_micro


def append_tariff(
    state: BillingState, now_ms: int, changes: list[tuple[str, int, int, int]]
) -> list[TariffEntry]:
    """Append (kind, subject_id, value, effective_ms) entries under one new policy version."""
    if not changes:
        return []
    version = state.config.policy_version + 1
    state.config = replace(state.config, policy_version=version)
    entries = []
    for kind, subject_id, value, effective_ms in changes:
        entry = TariffEntry(
            seq=len(state.tariff_history) + 1,
            timestamp_ms=now_ms,
            effective_ms=effective_ms,
            kind=kind,
            subject_id=subject_id,
            value=value,
            policy_version=version,
        )
        state.tariff_history.append(entry)
        entries.append(entry)
    return entries


def tier_changes(old: Tier | None, new: Tier, now_ms: int) -> list[tuple[str, int, int, int]]:
    """Tariff entries for the tariff-relevant fields of a tier that changed (all of them for a new tier)."""
    pairs = (
        ("TierPrice", "price_micro"),
        ("TierIncludedRu", "included_ru"),
        ("TierPeriod", "period_ms"),
        ("TierRateClass", "rate_class"),
        ("TierPurchasable", "purchasable"),
        ("TierPayg", "payg"),
    )
    return [
        (kind, new.id, int(getattr(new, attr)), now_ms)
        for kind, attr in pairs
        if old is None or getattr(old, attr) != getattr(new, attr)
    ]


def rate_class_changes(old: RateClass | None, new: RateClass, now_ms: int) -> list[tuple[str, int, int, int]]:
    """Tariff entries for the fields of a rate class that changed (all of them for a new class)."""
    pairs = (
        ("RateClassRuPerSec", "ru_per_sec"),
        ("RateClassRuBurst", "ru_burst"),
        ("RateClassGasPerSec", "gas_per_sec_per_shard"),
        ("RateClassGasBurst", "gas_burst_per_shard"),
        ("RateClassMaxGasLimit", "max_gas_limit"),
        ("RateClassRuPerHour", "ru_per_hour"),
    )
    return [
        (kind, new.id, int(getattr(new, attr)), now_ms)
        for kind, attr in pairs
        if old is None or getattr(old, attr) != getattr(new, attr)
    ]


def valid_rate_class(rc: RateClass) -> bool:
    """Bursts hold at least one second of sustained rate, and the gas burst admits the largest transaction."""
    return (
        rc.id != 0
        and rc.ru_per_sec > 0
        and rc.ru_burst >= rc.ru_per_sec
        and rc.gas_burst_per_shard >= rc.gas_per_sec_per_shard
        and rc.gas_burst_per_shard >= rc.max_gas_limit
    )
