"""What the API answers the client: `RelayResult` (an accepted `POST /v1/relay`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RelayResult:
    """A 200 (`BROADCAST` or later) or 202 (`COSIGNED`) answer of `POST /v1/relay`."""

    status: int
    body: dict[str, Any]
    request_id: str | None = None

    @property
    def id(self) -> str:
        return str(self.body["id"])

    @property
    def tx_hash(self) -> str:
        return str(self.body["txHash"])

    @property
    def state(self) -> str:
        return str(self.body["state"])

    @property
    def duplicate(self) -> bool:
        return bool(self.body.get("duplicate"))

    @property
    def relayer(self) -> str | None:
        return self.body.get("relayer")

    @property
    def intent(self) -> dict[str, Any]:
        return dict(self.body.get("intent") or {})
