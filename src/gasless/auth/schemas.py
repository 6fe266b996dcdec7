"""Response shapes of the identity route, named as the interface contract names them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class MeAccount(BaseModel):
    """An account the caller may see, and how."""

    address: str = Field(description="the account's address")
    role: Literal["owner", "sender"] = Field(
        description="`owner`: the caller is the account (full dashboard); `sender`: read-only"
    )
    suspended: bool


class Me(BaseModel):
    """The native-auth caller and the accounts it owns or is an authorised sender of."""

    address: str = Field(description="the token's address")
    tokenExpiresMs: int = Field(description="when the token stops being accepted (chain time)")
    accounts: list[MeAccount]
