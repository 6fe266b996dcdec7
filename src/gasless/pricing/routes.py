"""Pricing routes: public cached reads (route class "public cached reads": 20 req/s, burst 60 per IP)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request, Response

from gasless.core.errors import ApiError
from gasless.http.caching import cached_json
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery
from gasless.limits.route_classes import PUBLIC_READ
from gasless.pricing.schemas import Audience, PricingDocument, TariffHistoryPage

router = api_router(tags=["pricing"])

# The document is rebuilt from the contract at most every 3 000 ms; with max-age=3 a client's copy is never
# more than 6 000 ms old (docs/api-conventions.md, "Caching": pricing at most 6 000 ms).
PRICING_CACHE = "public, max-age=3"
TARIFF_HISTORY_CACHE = "public, max-age=5"


def pricing_service(request: Request) -> Any:
    service = request.app.state.host.pricing
    if service is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is still starting", details={"retryAfterMs": 1_000}
        )
    return service


@router.get(
    "/v1/pricing",
    operation_id="getPricing",
    response_model=PricingDocument,
    dependencies=[PUBLIC_READ],
    summary="Tiers, rate classes, the RU schedule, deposit bounds and the free operations (pricing-v1)",
)
async def get_pricing(
    request: Request,
    audience: Annotated[Audience | None, Query(description="only the tiers of this audience")] = None,
) -> Response:
    document = await pricing_service(request).document(audience)
    return cached_json(request, document, cache_control=PRICING_CACHE)


@router.get(
    "/v1/pricing/tariff-history",
    operation_id="getTariffHistory",
    response_model=TariffHistoryPage,
    dependencies=[PUBLIC_READ],
    summary="The tariff's changes, newest first (append-only; the contract's getTariffHistory is the authority)",
)
async def get_tariff_history(request: Request, page: PageQuery) -> Response:
    history = await pricing_service(request).tariff_history(page)
    return cached_json(request, history, cache_control=TARIFF_HISTORY_CACHE)
