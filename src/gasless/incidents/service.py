"""Incidents: the public listing and reads, operator declarations and updates, and automatic incidents.

Status moves (docs/incidents.md): an open incident (`investigating`, `identified`, `monitoring`) takes an
update to any open status (its own included: "still investigating") or to `resolved`; `resolved` is final,
and a new occurrence of the same problem opens a new incident. Any other move is `400 MALFORMED_REQUEST`
with `details.field = "status"`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from gasless.core.errors import ApiError
from gasless.http.pages import CursorCodec, PageParams, TimeWindow
from gasless.incidents.repository import IncidentRepository, IncidentRow, NotOpen, Raised
from gasless.incidents.schemas import (
    INCIDENT_IMPACTS,
    INCIDENT_STATUSES,
    OPEN_STATUSES,
    Incident,
    IncidentsPage,
    IncidentUpdate,
)

LISTING = "incidents"
ID_PATTERN = re.compile(r"inc_[0-9a-f]{20}")
MAX_TITLE = 200
MAX_BODY = 10_000


@dataclass(frozen=True)
class AutomaticKind:
    """An incident the service raises itself: its title and impact, and the texts of its updates."""

    kind: str
    title: str
    impact: str
    raised: Callable[[int], str]  # refusals counted when it was raised -> first update
    resolved: Callable[[int, int], str]  # (total occurrences, quiet period ms) -> resolving update


PLATFORM_ADMISSION = AutomaticKind(
    kind="platform_admission",
    title="Relay admission limited: the platform admission budget is reached",
    impact="minor",
    raised=lambda refused: (
        "The platform-wide admission budget binds: "
        f"{refused} relay request{'s' if refused != 1 else ''} answered 429 RATE_LIMITED (scope platform) "
        "so far. Refused requests can be retried after Retry-After; nothing was sent for them."
    ),
    resolved=lambda total, quiet_ms: (
        f"The platform admission budget has not bound for {quiet_ms / 1000:g} s: resolved automatically. "
        f"{total} relay request{'s' if total != 1 else ''} were refused while it was open."
    ),
)
AUTOMATIC_KINDS = {PLATFORM_ADMISSION.kind: PLATFORM_ADMISSION}


def to_incident(row: IncidentRow) -> Incident:
    return Incident(
        id=row.id,
        title=row.title,
        status=row.status,  # type: ignore[arg-type]
        impact=row.impact,  # type: ignore[arg-type]
        shard=row.shard,
        source=row.source,  # type: ignore[arg-type]
        kind=row.kind,
        createdAtMs=row.created_at_ms,
        updatedAtMs=row.updated_at_ms,
        resolvedAtMs=row.resolved_at_ms,
        updates=[
            IncidentUpdate(seq=u.seq, status=u.status, body=u.body, atMs=u.at_ms)  # type: ignore[arg-type]
            for u in row.updates
        ],
    )


def _invalid(field: str, detail: str) -> ApiError:
    return ApiError("MALFORMED_REQUEST", detail=detail, details={"field": field})


def _text(field: str, value: str, limit: int) -> str:
    value = value.strip()
    if not value:
        raise _invalid(field, f"{field} must not be blank")
    if len(value) > limit:
        raise _invalid(field, f"{field} is longer than {limit} characters")
    if any(not ch.isprintable() and ch not in "\n\t" for ch in value):
        raise _invalid(field, f"{field} must not contain control characters")
    return value


def not_found(incident_id: str) -> ApiError:
    return ApiError("NOT_FOUND", detail=f"no incident {incident_id[:40]!r}")


class IncidentService:
    def __init__(
        self,
        repo: IncidentRepository,
        cursors: CursorCodec | None = None,  # listings only (the operator's commands need none)
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.repo = repo
        self.cursors = cursors
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # Public reads -------------------------------------------------------------------------------------
    async def page(
        self, *, shard: int | None, status: str | None, window: TimeWindow, page: PageParams
    ) -> IncidentsPage:
        assert self.cursors is not None, "listing needs a cursor codec"
        filters = {"shard": shard, "status": status, "from": window.from_ms, "to": window.to_ms}
        after: tuple[int, str] | None = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, LISTING, filters)
            if (
                not isinstance(position, list)
                or len(position) != 2
                or not isinstance(position[0], int)
                or isinstance(position[0], bool)
                or not isinstance(position[1], str)
            ):
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            after = (position[0], position[1])
        rows = await self.repo.page(
            shard=shard,
            status=status,
            from_ms=window.from_ms,
            to_ms=window.to_ms,
            now_ms=self.now_ms(),
            after=after,
            limit=page.limit + 1,
        )
        more = len(rows) > page.limit
        rows = rows[: page.limit]
        cursor = self.cursors.mint(LISTING, filters, [rows[-1].created_at_ms, rows[-1].id]) if more else None
        return IncidentsPage(items=[to_incident(row) for row in rows], nextCursor=cursor)

    async def get(self, incident_id: str) -> Incident:
        row = await self.repo.get(incident_id) if ID_PATTERN.fullmatch(incident_id) else None
        if row is None:
            raise not_found(incident_id)
        return to_incident(row)

    # Operator declarations ----------------------------------------------------------------------------
    async def declare(
        self,
        *,
        title: str,
        body: str,
        impact: str = "minor",
        shard: int | None = None,
        status: str = "investigating",
    ) -> Incident:
        """A new operator incident in an open status, with its first update."""
        if impact not in INCIDENT_IMPACTS:
            raise _invalid("impact", f"impact is one of {', '.join(INCIDENT_IMPACTS)}")
        if shard is not None and shard not in (0, 1, 2):
            raise _invalid("shard", "shard is 0, 1 or 2")
        if status not in OPEN_STATUSES:
            raise _invalid("status", f"a new incident starts in one of {', '.join(OPEN_STATUSES)}")
        incident_id = await self.repo.create(
            title=_text("title", title, MAX_TITLE),
            impact=impact,
            shard=shard,
            source="operator",
            kind=None,
            status=status,
            body=_text("body", body, MAX_BODY),
            now_ms=self.now_ms(),
        )
        return await self.get(incident_id)

    async def post_update(self, incident_id: str, *, status: str, body: str) -> Incident:
        """Append an update; `resolved` closes the incident for good."""
        if status not in INCIDENT_STATUSES:
            raise _invalid("status", f"status is one of {', '.join(INCIDENT_STATUSES)}")
        text = _text("body", body, MAX_BODY)
        if not ID_PATTERN.fullmatch(incident_id):
            raise not_found(incident_id)
        try:
            await self.repo.add_update(incident_id, status=status, body=text, now_ms=self.now_ms())
        except KeyError:
            raise not_found(incident_id) from None
        except NotOpen:
            raise _invalid(
                "status",
                f"incident {incident_id} is resolved, and resolved is final: a new occurrence is a new "
                "incident",
            ) from None
        return await self.get(incident_id)

    # Automatic incidents ------------------------------------------------------------------------------
    async def raise_automatic(self, kind: AutomaticKind, *, occurrences: int, seen_at_ms: int) -> Raised:
        """Open the kind's incident, or count into the one already open (on any host)."""
        return await self.repo.raise_or_touch(
            kind.kind,
            title=kind.title,
            impact=kind.impact,
            body=kind.raised(occurrences),
            occurrences=occurrences,
            seen_at_ms=seen_at_ms,
            now_ms=self.now_ms(),
        )

    async def resolve_if_quiet(self, kind: AutomaticKind, *, quiet_ms: int) -> IncidentRow | None:
        """Resolve the kind's open incident when no host saw it for `quiet_ms`; the incident when this call
        resolved it (one caller wins across hosts), else None."""
        open_row = await self.repo.open_automatic(kind.kind)  # a read first: the usual answer is "none"
        now = self.now_ms()
        if open_row is None or (open_row.last_seen_at_ms or 0) >= now - quiet_ms:
            return None
        return await self.repo.resolve_quiet(
            kind.kind,
            quiet_before_ms=now - quiet_ms,
            now_ms=now,
            body=lambda row: kind.resolved(row.occurrences, quiet_ms),
        )
