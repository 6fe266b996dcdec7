"""Who a native-auth caller is to an account, read from the billing contract (through ContractMirror).

 owner   the caller's address is the account (it has an account in the contract): full dashboard
 sender  the account names the caller as an authorised sender: read-only

The mirror caches these views for about a second, so a sender removed on chain loses access within that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.core.errors import ApiError

Role = Literal["owner", "sender"]


class AccountViews(Protocol):
    async def account(self, address: str) -> Any | None: ...

    async def account_of_sender(self, sender: str) -> str | None: ...


@dataclass(frozen=True)
class AccountRole:
    account: str
    role: Role
    suspended: bool


class AccountRoles:
    def __init__(self, views: AccountViews) -> None:
        self.views = views

    async def role_of(self, caller: str, account: str) -> AccountRole | None:
        """The caller's role on `account`, or None when it has none (or `account` has no account)."""
        try:
            if caller == account:
                view = await self.views.account(account)
                return None if view is None else AccountRole(account, "owner", bool(view.suspended))
            if await self.views.account_of_sender(caller) != account:
                return None
            view = await self.views.account(account)
            return None if view is None else AccountRole(account, "sender", bool(view.suspended))
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise _unavailable(exc) from None

    async def accounts_of(self, caller: str) -> list[AccountRole]:
        """Every account the caller may see: its own first, then the one it is a sender of."""
        roles: list[AccountRole] = []
        try:
            own = await self.views.account(caller)
            if own is not None:
                roles.append(AccountRole(caller, "owner", bool(own.suspended)))
            holder = await self.views.account_of_sender(caller)
            if holder is not None and holder != caller:
                view = await self.views.account(holder)
                if view is not None:
                    roles.append(AccountRole(holder, "sender", bool(view.suspended)))
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise _unavailable(exc) from None
        return roles


def _unavailable(exc: Exception) -> ApiError:
    return ApiError(
        "UPSTREAM_UNAVAILABLE",
        detail=f"the billing contract could not be read ({type(exc).__name__}); retry shortly",
        details={"retryAfterMs": 1_000},
    )
