"""Incident shapes (members chosen in docs/incidents.md)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

from gasless.http.pages import Page

# The Statuspage vocabulary (docs/incidents.md).
IncidentStatus = Literal["investigating", "identified", "monitoring", "resolved"]
INCIDENT_STATUSES: tuple[str, ...] = get_args(IncidentStatus)
OPEN_STATUSES: tuple[str, ...] = tuple(s for s in INCIDENT_STATUSES if s != "resolved")
IncidentImpact = Literal["none", "minor", "major", "critical"]
INCIDENT_IMPACTS: tuple[str, ...] = get_args(IncidentImpact)
IncidentSource = Literal["automatic", "operator"]


class IncidentUpdate(BaseModel):
    """One entry of an incident's history: appended, never changed."""

    seq: int = Field(description="1 for the update that opened the incident, then 2, 3, ...")
    status: IncidentStatus = Field(description="the incident's status from this update on")
    body: str = Field(description="what the update says (plain text)")
    atMs: int = Field(description="when it was posted, Unix ms")


class Incident(BaseModel):
    """A public incident and its whole history, oldest update first."""

    id: str = Field(description="`inc_` followed by 20 hex characters")
    title: str
    status: IncidentStatus = Field(description="the status of the latest update; `resolved` is final")
    impact: IncidentImpact = Field(description="Statuspage impact: none, minor, major or critical")
    shard: int | None = Field(description="the shard concerned (0, 1 or 2); null when not shard-specific")
    source: IncidentSource = Field(
        description="`automatic`: raised by the service itself; `operator`: declared by an operator"
    )
    kind: str | None = Field(
        description="what raised an automatic incident (e.g. `platform_admission`); null for operator ones"
    )
    createdAtMs: int
    updatedAtMs: int = Field(description="the time of the latest update")
    resolvedAtMs: int | None = Field(description="when it was resolved; null while open")
    updates: list[IncidentUpdate] = Field(description="the history, oldest first (seq 1, 2, ...)")


class IncidentsPage(Page[Incident]):
    """Incidents newest first (by creation), each with its whole history."""
