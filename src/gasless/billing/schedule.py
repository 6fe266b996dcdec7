"""The RU schedule: Relay Units charged per transaction, by gas limit (schedule v1, docs/purchases.md)."""

from __future__ import annotations

RU_SCHEDULE_VERSION = "ru-v1"

# (gas limit ceiling, RU); a transaction pays the RU of the first ceiling its gas limit fits under.
RU_SCHEDULE_V1: tuple[tuple[int, int], ...] = (
    (100_000, 1),
    (1_000_000, 2),
    (5_000_000, 3),
    (10_000_000, 4),
    (20_000_000, 6),
    (50_000_000, 10),
    (100_000_000, 15),
    (200_000_000, 18),
    (400_000_000, 22),
    (600_000_000, 25),
)


def ru_for_gas_limit(gas_limit: int) -> int:
    for ceiling, ru in RU_SCHEDULE_V1:
        if gas_limit <= ceiling:
            return ru
    raise ValueError(f"gas limit {gas_limit} is above the schedule's last step")
