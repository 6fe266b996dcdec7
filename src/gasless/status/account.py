"""An account's view of the service: the relayers that served it, and the public incidents that overlapped
its traffic with its own impact numbers (relays, failures, added latency from the rollups)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.core.errors import ApiError
from gasless.http.pages import CursorCodec, PageParams, TimeWindow
from gasless.incidents.repository import IncidentRepository
from gasless.incidents.service import to_incident
from gasless.status.repository import DAY_MS, account_relayers, account_traffic
from gasless.status.schemas import (
    AccountOutage,
    AccountOutagesPage,
    AccountRelayer,
    AccountRelayers,
    OutageImpact,
)
from gasless.usage.rollups import RollupRepository, merged, percentile

LISTING = "account-outages"
SCAN_LIMIT = 200  # incidents examined per page (those without the account's traffic are skipped)


class AccountStatusService:
    def __init__(
        self,
        engine: AsyncEngine,
        incidents: IncidentRepository,
        rollups: RollupRepository,
        cursors: CursorCodec,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.incidents = incidents
        self.rollups = rollups
        self.cursors = cursors
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def relayers(self, account: str, window: TimeWindow) -> AccountRelayers:
        now = self.now_ms()
        from_ms, to_ms = window.bounded(now, 30 * DAY_MS)
        rows = await account_relayers(self.engine, account, from_ms, to_ms)
        return AccountRelayers(
            account=account,
            fromMs=from_ms,
            toMs=to_ms,
            items=[
                AccountRelayer(
                    address=row[0],
                    shard=int(row[1]),
                    state=row[2],
                    relays=int(row[3]),
                    succeeded=int(row[4] or 0),
                    failed=int(row[5] or 0),
                    dead=int(row[6] or 0),
                    lastRelayAtMs=int(row[7]) if row[7] is not None else None,
                )
                for row in rows
            ],
        )

    async def outages(self, account: str, window: TimeWindow, page: PageParams) -> AccountOutagesPage:
        now = self.now_ms()
        filters = {"account": account, "from": window.from_ms, "to": window.to_ms}
        after: tuple[int, str] | None = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, LISTING, filters)
            if not (isinstance(position, list) and len(position) == 2 and isinstance(position[1], str)):
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            after = (int(position[0]), position[1])
        rows = await self.incidents.page(
            shard=None,
            status=None,
            from_ms=window.from_ms,
            to_ms=window.to_ms,
            now_ms=now,
            after=after,
            limit=SCAN_LIMIT,
        )
        items: list[AccountOutage] = []
        last: Any = None
        for row in rows:
            last = row
            end = row.resolved_at_ms if row.resolved_at_ms is not None else now
            relays, failures = await account_traffic(self.engine, account, row.created_at_ms, end)
            if relays == 0:
                continue
            added = merged(
                r.histogram
                for r in await self.rollups.read(
                    "acct_shard",
                    granularity="m",
                    from_ms=row.created_at_ms,
                    to_ms=end + 1,
                    key_prefix=f"{account}|",
                    metrics=("added",),
                )
            )
            items.append(
                AccountOutage(
                    incident=to_incident(row),
                    impact=OutageImpact(
                        relays=relays,
                        failures=failures,
                        addedP50Ms=percentile(added, 50),
                        addedP99Ms=percentile(added, 99),
                    ),
                )
            )
            if len(items) == page.limit:
                break
        stopped_early = bool(rows) and len(items) == page.limit and last is not rows[-1]
        more = stopped_early or len(rows) == SCAN_LIMIT
        cursor = self.cursors.mint(LISTING, filters, [last.created_at_ms, last.id]) if more and last else None
        return AccountOutagesPage(items=items, nextCursor=cursor)
