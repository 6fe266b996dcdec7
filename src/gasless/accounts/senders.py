"""`GET /v1/account/{erd}/senders`: an account's authorised senders, oldest first, read from the contract
mirror (`senderAdded` / `senderRemoved` events, in chain order).

Keyset pagination on the contract's list: a cursor carries the last sender a page returned and that
sender's position. The next page starts right after that sender wherever it now is, so senders removed
before it shift nothing and nothing is repeated. If that sender itself has been removed since, the page
starts at the position it held (exact unless earlier senders were removed as well).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gasless.core.errors import ApiError
from gasless.http.pages import CursorCodec, Page, PageParams
from gasless.mirror.repository import MirrorRepository

LISTING = "listAccountSenders"


class AccountSender(BaseModel):
    """One authorised sender of an account."""

    address: str


class AccountSendersPage(Page[AccountSender]):
    """A page of an account's authorised senders, oldest authorisation first."""


def _resume_at(senders: list[str], position: Any) -> int:
    if not (
        isinstance(position, dict)
        and isinstance(position.get("after"), str)
        and isinstance(position.get("index"), int)
        and position["index"] >= 0
    ):
        raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
    try:
        return senders.index(position["after"]) + 1
    except ValueError:
        return min(position["index"], len(senders))


class SenderListing:
    def __init__(self, mirror: MirrorRepository, cursors: CursorCodec) -> None:
        self.mirror = mirror
        self.cursors = cursors

    async def page(self, account: str, params: PageParams) -> AccountSendersPage:
        filters = {"account": account}
        # Open the cursor first: a bad cursor is the caller's mistake whatever the chain says.
        position = self.cursors.open(params.cursor, LISTING, filters) if params.cursor is not None else None
        found = await self.mirror.account(account) is not None
        senders = await self.mirror.senders(account) if found else []
        if not found:
            raise ApiError("NOT_FOUND", detail=f"no account {account}")
        start = _resume_at(senders, position) if position is not None else 0
        chunk = senders[start : start + params.limit]
        end = start + len(chunk)
        next_cursor = (
            self.cursors.mint(LISTING, filters, {"after": chunk[-1], "index": end - 1})
            if chunk and end < len(senders)
            else None
        )
        return AccountSendersPage(items=[AccountSender(address=a) for a in chunk], nextCursor=next_cursor)
