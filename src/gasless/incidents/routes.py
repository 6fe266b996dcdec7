"""Incident routes: public cached reads (route class "public cached reads": 20 req/s, burst 60 per IP)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query, Request, Response

from gasless.http.caching import cached_json
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery, WindowQuery
from gasless.incidents.schemas import Incident, IncidentsPage, IncidentStatus
from gasless.limits.route_classes import PUBLIC_READ

router = api_router(tags=["incidents"])

# A status page polls these: an incident raised or updated shows within a few seconds. A resolved incident
# never changes again (resolved is final).
INCIDENTS_CACHE = "public, max-age=5"
RESOLVED_INCIDENT_CACHE = "public, max-age=3600"


def _incidents(request: Request) -> Any:
    return request.app.state.host.incidents


@router.get(
    "/v1/incidents",
    operation_id="listIncidents",
    response_model=IncidentsPage,
    dependencies=[PUBLIC_READ],
    summary="Public incidents, newest first, each with its updates",
)
async def list_incidents(
    request: Request,
    page: PageQuery,
    window: WindowQuery,
    shard: Annotated[int | None, Query(ge=0, le=2, description="only incidents of this shard")] = None,
    status: Annotated[IncidentStatus | None, Query(description="only incidents in this status")] = None,
) -> Response:
    """`from`/`to` keep the incidents whose lifetime (created until resolved, or until now while open)
    overlaps the window."""
    result = await _incidents(request).page(shard=shard, status=status, window=window, page=page)
    return cached_json(request, result, cache_control=INCIDENTS_CACHE)


@router.get(
    "/v1/incidents/{incidentId}",
    operation_id="getIncident",
    response_model=Incident,
    dependencies=[PUBLIC_READ],
    summary="One incident with all its updates",
)
async def get_incident(
    request: Request, incidentId: Annotated[str, Path(description="`inc_...`; anything else is 404")]
) -> Response:
    incident: Incident = await _incidents(request).get(incidentId)
    cache = RESOLVED_INCIDENT_CACHE if incident.status == "resolved" else INCIDENTS_CACHE
    return cached_json(request, incident, cache_control=cache)
