"""The per-transaction admission policy: the self-serve data ceiling and the per-account allow-lists."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_DATA_BYTES_SELF_SERVE = 4_096  # spec: Limits, per-transaction ceilings (more only by allow-list)


@dataclass(frozen=True)
class AdmissionPolicy:
    """Operator settings of the admission policy (allow-lists are per account)."""

    deploy_allowlist: frozenset[str] = frozenset()
    data_allowlist: frozenset[str] = frozenset()

    @classmethod
    def of(cls, deploy: Iterable[str] = (), data: Iterable[str] = ()) -> AdmissionPolicy:
        return cls(frozenset(deploy), frozenset(data))
