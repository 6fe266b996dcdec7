"""The account's merged notice log (its own notices and the global ones) and its acknowledgement."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gasless.core.errors import ApiError
from gasless.http.pages import CursorCodec, PageParams
from gasless.notices.repository import NewNotice, NoticeRepository, NoticeRow
from gasless.notices.schemas import Notice, NoticePage

LISTING = "notices"


def to_notice(row: NoticeRow, acked_seq: int) -> Notice:
    return Notice(
        seq=row.seq,
        kind=row.kind,  # type: ignore[arg-type]
        scope="global" if row.account is None else "account",
        account=row.account,
        severity=row.severity,  # type: ignore[arg-type]
        title=row.title,
        message=row.body,
        data=row.data,
        createdAtMs=row.created_at_ms,
        acknowledged=row.seq <= acked_seq,
    )


class NoticeService:
    def __init__(
        self,
        repo: NoticeRepository,
        cursors: CursorCodec,
        *,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.repo = repo
        self.cursors = cursors
        self.clock = clock
        self.on_appended: Callable[[], None] | None = None  # wakes this host's dispatcher when it leads

    async def append(self, new: Sequence[NewNotice]) -> list[NoticeRow]:
        stored = await self.repo.append(new, self.clock())
        if stored and self.on_appended is not None:
            self.on_appended()
        return stored

    async def page(
        self, account: str, *, since_seq: int, unacknowledged: bool, page: PageParams
    ) -> NoticePage:
        filters = {"account": account, "sinceSeq": since_seq, "unacknowledged": unacknowledged}
        before = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, LISTING, filters)
            if not isinstance(position, int) or isinstance(position, bool) or position < 1:
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            before = position
        acked = await self.repo.acked(account)
        rows = await self.repo.page(
            account,
            since_seq=since_seq,
            after_acked=acked if unacknowledged else None,
            before_seq=before,
            limit=page.limit + 1,
        )
        more = len(rows) > page.limit
        rows = rows[: page.limit]
        cursor = self.cursors.mint(LISTING, filters, rows[-1].seq) if more else None
        return NoticePage(items=[to_notice(r, acked) for r in rows], nextCursor=cursor, acknowledgedSeq=acked)

    async def ack(self, account: str, up_to_seq: int) -> int:
        return await self.repo.ack(account, up_to_seq, self.clock())
