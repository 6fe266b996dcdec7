"""Usage routes: thin adapters to UsageService (native-auth owner/sender, or a sponsor key with `read`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import Depends, Path, Query, Request, Response

from gasless.auth.deps import AccountAccess, ApiKeyHeader, AuthorizationHeader, read_access_to
from gasless.chain.addresses import is_address
from gasless.core.errors import ApiError
from gasless.http.formats import SHARD, Address, AddressDoc, CommaList, TxHash, comma_list
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery
from gasless.limits.route_classes import limit_private_read, private_read
from gasless.usage.latency import LatencyService
from gasless.usage.repository import UsageFilters, UsageRepository
from gasless.usage.schemas import (
    BILLING_CLASSES,
    ROW_STATES,
    USAGE_STATUSES,
    UsageLatency,
    UsageRow,
    UsageRowsPage,
    UsageSummary,
)
from gasless.usage.service import UsageService

router = api_router(tags=["usage"])
NO_STORE = "private, no-store"


def _host(request: Request) -> Any:
    return request.app.state.host


def usage_service(request: Request) -> UsageService:
    """One service per app, built on first use (the relay core wires the engine and network at start)."""
    host = _host(request)
    if host.engine is None or host.network is None:
        raise host.unavailable()
    service: UsageService | None = getattr(request.app.state, "usage_service", None)
    if service is None:
        network = host.network
        service = UsageService(
            UsageRepository(host.engine),
            host.cursors,
            host.mirror,
            lambda: int(network.params.round_duration_ms),
            rollups=host.rollups,
        )
        request.app.state.usage_service = service
    return service


def _address(value: str | None, field: str) -> str | None:
    """An Address filter whose checksum verifies (its shape is the parameter's pattern)."""
    if value is not None and not is_address(value):
        raise ApiError(
            "MALFORMED_REQUEST", detail=f"{field} is not a valid erd1 address", details={"field": field}
        )
    return value


STATUS_LIST = CommaList("status", USAGE_STATUSES)
STATE_LIST = CommaList("state", ROW_STATES)
SHARD_LIST_PATTERN = comma_list(SHARD)  # shard numbers 0 to 4294967295 (the metachain), no leading zeros
_SHARD_LIST = re.compile(SHARD_LIST_PATTERN.removeprefix("^").removesuffix("$"))


def _shards(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not _SHARD_LIST.fullmatch(value):
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="shard is a comma-separated list of shard numbers, no spaces (metachain: 4294967295)",
            details={"field": "shard"},
        )
    return tuple(sorted({int(part) for part in value.split(",")}))


# Documented as an Address; judged after the credential, as `{erd}` is (auth/deps.py).
AccountQuery = Annotated[AddressDoc, Query(max_length=100, description="the account (bech32), required")]


async def usage_access(
    request: Request, account: AccountQuery, authorization: AuthorizationHeader, api_key: ApiKeyHeader
) -> AccountAccess:
    """DashboardRead for the `account` query parameter."""
    return await read_access_to(request, account, authorization, api_key)


# "Private reads": per account, by the account's rate class.
PRIVATE_READ = private_read(usage_access)


@router.get(
    "/v1/usage",
    operation_id="listUsage",
    response_model=UsageRowsPage,
    dependencies=[PRIVATE_READ],
    summary="The account's usage rows, newest first (in-flight and REJECTED ones with includeInFlight)",
)
async def list_usage(
    request: Request,
    response: Response,
    access: Annotated[AccountAccess, Depends(usage_access)],
    page: PageQuery,
    sender: Annotated[Address | None, Query()] = None,
    relayer: Annotated[Address | None, Query()] = None,
    status: Annotated[
        str | None,
        Query(description="UsageStatus list, comma-separated", json_schema_extra=STATUS_LIST.schema()),
    ] = None,
    state: Annotated[
        str | None,
        Query(
            description="IntentState list, comma-separated; only with includeInFlight=true",
            json_schema_extra=STATE_LIST.schema(),
        ),
    ] = None,
    shard: Annotated[
        str | None,
        Query(
            description="sender shards, comma-separated (metachain: 4294967295)",
            json_schema_extra={"pattern": SHARD_LIST_PATTERN},
        ),
    ] = None,
    min_inclusion_ms: Annotated[int | None, Query(alias="minInclusionMs", ge=0, le=2**53 - 1)] = None,
    q: Annotated[
        str | None,
        Query(min_length=3, max_length=64, description="prefix of txHash, sender, receiver or function"),
    ] = None,
    billing_class: Annotated[
        Literal["plan", "payg", "sponsor", "free"] | None, Query(alias="billingClass")
    ] = None,
    period_id: Annotated[int | None, Query(alias="periodId", ge=0, le=2**53 - 1)] = None,
    api_key_id: Annotated[
        str | None,
        Query(alias="apiKeyId", max_length=16, description="a key's keyId (any text; no match, no rows)"),
    ] = None,
    include_in_flight: Annotated[bool, Query(alias="includeInFlight")] = False,
) -> UsageRowsPage:
    states = STATE_LIST.parse(state)
    if states is not None and not include_in_flight:
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="state filters in-flight and REJECTED rows: it needs includeInFlight=true (use status "
            "for terminal rows)",
            details={"field": "state"},
        )
    assert billing_class is None or billing_class in BILLING_CLASSES
    filters = UsageFilters(
        account=access.account,
        sender=_address(sender, "sender"),
        relayer=_address(relayer, "relayer"),
        statuses=STATUS_LIST.parse(status),
        states=states,
        shards=_shards(shard),
        min_inclusion_ms=min_inclusion_ms,
        q=q,
        billing_class=billing_class,
        period_id=period_id,
        api_key_id=api_key_id,
        include_in_flight=include_in_flight,
    )
    response.headers["Cache-Control"] = NO_STORE
    return await usage_service(request).page(filters, page)


@router.get(
    "/v1/usage/summary",
    operation_id="getUsageSummary",
    response_model=UsageSummary,
    dependencies=[PRIVATE_READ],
    summary="Period totals (billed rows), a bucketed series and the top senders and receivers",
)
async def get_usage_summary(
    request: Request,
    response: Response,
    access: Annotated[AccountAccess, Depends(usage_access)],
    period_id: Annotated[
        int | None,
        Query(alias="periodId", ge=0, le=2**53 - 1, description="the period's start (ms); default current"),
    ] = None,
    bucket: Annotated[Literal["hour", "day"], Query()] = "day",
) -> UsageSummary:
    response.headers["Cache-Control"] = NO_STORE
    return await usage_service(request).summary(access.account, period_id, bucket)


def latency_service(request: Request) -> LatencyService:
    host = _host(request)
    if host.latency is None:
        raise host.unavailable()
    service: LatencyService = host.latency
    return service


# Declared before `/v1/usage/{txHash}`: a path segment `latency` is this route, not a hash.
@router.get(
    "/v1/usage/latency",
    operation_id="getUsageLatency",
    response_model=UsageLatency,
    dependencies=[PRIVATE_READ],
    summary="The account's added and inclusion latency by shard, relayer, sender or gateway (from rollups)",
)
async def get_usage_latency(
    request: Request,
    response: Response,
    access: Annotated[AccountAccess, Depends(usage_access)],
    window: Annotated[Literal["1h", "24h", "7d", "30d"], Query()] = "24h",
    group_by: Annotated[Literal["shard", "relayer", "sender", "gateway"], Query(alias="groupBy")] = "shard",
) -> UsageLatency:
    response.headers["Cache-Control"] = NO_STORE
    return await latency_service(request).latency(access.account, window, group_by)


@router.get(
    "/v1/usage/{txHash}",
    operation_id="getUsageRow",
    response_model=UsageRow,
    summary="One usage row with its settlement batch and the gateway acknowledgements",
)
async def get_usage_row(
    request: Request,
    response: Response,
    tx_hash: Annotated[TxHash, Path(alias="txHash", description="64-hex transaction hash")],
    authorization: AuthorizationHeader,
    api_key: ApiKeyHeader,
) -> UsageRow:
    if authorization is None and api_key is None:
        raise ApiError(
            "UNAUTHENTICATED",
            detail="this route needs a native-auth token in 'Authorization: Bearer <token>', or a sponsor "
            "API key with the 'read' scope in X-Api-Key",
            headers={"WWW-Authenticate": 'Bearer realm="gasless"'},
        )
    found = await usage_service(request).row(tx_hash.lower())
    if found is None:
        raise ApiError("NOT_FOUND", detail="no usage row or in-flight intent has this transaction hash")
    account, detail = found
    access = await read_access_to(request, account, authorization, api_key)
    await limit_private_read(request, access.account)
    response.headers["Cache-Control"] = NO_STORE
    return detail
