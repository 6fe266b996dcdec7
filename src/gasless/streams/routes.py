"""Account stream routes: `POST /v1/stream/tickets` and `GET /v1/stream` (thin adapters to the hub)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request, Response
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from gasless.auth.deps import (
    AccountAccess,
    ApiKeyHeader,
    AuthorizationHeader,
    hold_origin,
    read_access_to,
    refuse_url_credentials,
    verify_read_credential,
)
from gasless.core.errors import ApiError
from gasless.http.formats import Address, CommaList
from gasless.http.json_body import api_router
from gasless.limits.route_classes import Caller, account_rate, account_streams
from gasless.streams.schemas import (
    RESET,
    TOPICS,
    StreamEvent,
    StreamTicket,
    StreamTicketCreate,
    canonical_address,
)
from gasless.streams.service import StreamService
from gasless.streams.tickets import TicketClaims

router = api_router(tags=["streams"])
NO_STORE = "no-store"


def _host(request: Request) -> Any:
    return request.app.state.host


def _streams(request: Request) -> StreamService:
    service: StreamService | None = _host(request).streams
    if service is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is starting", details={"retryAfterMs": 1_000}
        )
    return service


# Tickets ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TicketRequest:
    access: AccountAccess
    body: StreamTicketCreate


async def ticket_request(
    request: Request, body: StreamTicketCreate, authorization: AuthorizationHeader, api_key: ApiKeyHeader
) -> TicketRequest:
    return TicketRequest(await read_access_to(request, body.account, authorization, api_key), body)


async def _ticket_caller(request: Request, asked: TicketRequest = Depends(ticket_request)) -> Caller:  # noqa: B008
    account = asked.access.account
    return Caller(account=account, rate_class=await _streams(request).rate_class(account))


@router.post(
    "/v1/stream/tickets",
    operation_id="createStreamTicket",
    response_model=StreamTicket,
    status_code=201,
    dependencies=[account_rate("private_read_class", caller=_ticket_caller)],
    summary="A single-use ticket (30 000 ms) for opening the account stream from a browser EventSource",
)
async def create_stream_ticket(
    request: Request, response: Response, asked: Annotated[TicketRequest, Depends(ticket_request)]
) -> StreamTicket:
    access, body = asked.access, asked.body
    topics = tuple(t for t in TOPICS if body.topics is None or t in body.topics)
    if access.role == "key":
        assert access.key is not None
        caller, role = access.key.key_id, "key"
    else:
        assert access.caller is not None
        caller, role = access.caller.address, access.role
    ticket, claims = _streams(request).tickets.issue(access.account, topics, caller, role)  # type: ignore[arg-type]
    response.headers["Cache-Control"] = NO_STORE
    return StreamTicket(
        ticket=ticket,
        account=claims.account,
        topics=list(claims.topics),
        expiresAtMs=claims.expires_ms,  # type: ignore[arg-type]
    )


# The stream ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamAccess:
    account: str
    topics: frozenset[str]
    ends_ms: int | None  # a native-auth stream ends when its token expires


TOPIC_LIST = CommaList("topics", TOPICS)


def _topics(text: str | None) -> frozenset[str] | None:
    names = TOPIC_LIST.parse(text)
    return frozenset(names) if names is not None else None


def _account(text: str) -> str:
    try:
        return canonical_address(text)
    except ValueError:
        raise ApiError(
            "MALFORMED_REQUEST", detail="account is not a valid erd1 address", details={"field": "account"}
        ) from None


async def _ticket_access(request: Request, claims: TicketClaims) -> None:
    """The ticket's caller still has the role it had when the ticket was issued."""
    host = _host(request)
    if claims.role == "key":
        row = await host.api_keys.repo.get(claims.caller)
        if row is None or not row.active or row.account != claims.account:
            raise ApiError(
                "FORBIDDEN",
                detail="the API key that asked for this ticket was revoked",
                details={"role": None},
            )
        return
    if await host.roles.role_of(claims.caller, claims.account) is None:
        raise ApiError(
            "FORBIDDEN",
            detail="the ticket's caller no longer has a role on this account",
            details={"role": None},
        )


async def stream_access(
    request: Request,
    authorization: AuthorizationHeader,
    api_key: ApiKeyHeader,
    account: Annotated[
        Address | None, Query(description="the account (required with header credentials)")
    ] = None,
    topics: Annotated[
        str | None,
        Query(
            description="comma-separated StreamTopic values (default all)",
            json_schema_extra=TOPIC_LIST.schema(),
        ),
    ] = None,
    ticket: Annotated[
        str | None, Query(max_length=1_024, description="a ticket from POST /v1/stream/tickets (single use)")
    ] = None,
) -> StreamAccess:
    wanted = _topics(topics)
    named = _account(account) if account is not None else None
    if ticket is None:
        if named is None:
            await verify_read_credential(request, authorization, api_key)  # credentials first
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="account is required (or open the stream with a ticket)",
                details={"field": "account"},
            )
        access = await read_access_to(request, named, authorization, api_key)
        expires = access.caller.expires_ms if access.caller is not None else None
        return StreamAccess(access.account, wanted or frozenset(TOPICS), expires)
    hold_origin(request)
    refuse_url_credentials(request, tokens=True)
    if authorization is not None or api_key is not None:
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="send either a ticket or a header credential, not both",
            details={"field": "ticket"},
        )
    tickets = _streams(request).tickets
    claims = tickets.verify(ticket)  # a request refused below does not use the ticket up
    if named is not None and named != claims.account:
        raise ApiError(
            "FORBIDDEN", detail="the ticket was issued for another account", details={"role": None}
        )
    granted = frozenset(claims.topics)
    if wanted is not None and not wanted <= granted:
        raise ApiError(
            "MALFORMED_REQUEST",
            detail=f"the ticket covers only these topics: {', '.join(sorted(granted))}",
            details={"field": "topics"},
        )
    await _ticket_access(request, claims)
    await tickets.use(claims)
    return StreamAccess(claims.account, wanted or granted, None)


async def _stream_caller(request: Request, access: StreamAccess = Depends(stream_access)) -> Caller:  # noqa: B008
    return Caller(account=access.account, rate_class=await _streams(request).rate_class(access.account))


@router.get(
    "/v1/stream",
    operation_id="streamAccountEvents",
    response_class=EventSourceResponse,
    dependencies=[account_streams(_stream_caller)],
    summary="The account's events (intents, quota, account, notices, incidents, pricing) as Server-Sent Events",
    responses={
        200: {"content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/StreamEvent"}}}}
    },
)
async def stream_account_events(
    request: Request,
    access: Annotated[StreamAccess, Depends(stream_access)],
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=100)] = None,
) -> EventSourceResponse:
    host = _host(request)
    service = _streams(request)
    hub = service.hub
    after = host.resumable_seq(last_event_id) if last_event_id else None

    async def events() -> AsyncIterator[ServerSentEvent]:
        if service.fanout is not None:
            # Before the first frame: a change on another host after it reaches this stream.
            await service.fanout.announce(access.account)
        stream, replay = hub.subscribe(access.account, access.topics, after)
        try:
            head = hub.head(access.account)
            if last_event_id and replay is None:
                reason = "unknown_id" if after is None else "window"
                doc = {
                    "topic": RESET,
                    "account": access.account,
                    "key": None,
                    "atMs": _now_ms(),
                    "data": None,
                }
                yield ServerSentEvent(
                    data=json.dumps({**doc, "reason": reason}, separators=(",", ":")),
                    event=RESET,
                    id=host.stream_event_id(head),
                )
            elif not last_event_id:
                # An id-only frame: the client's Last-Event-ID is set at once, so a reconnect before the
                # first event resumes instead of resetting. EventSource dispatches no event for it.
                yield ServerSentEvent(id=host.stream_event_id(head))
            last = after if replay is not None and after is not None else head
            for event in replay or ():
                last = event.seq
                yield ServerSentEvent(data=event.doc, event=event.topic, id=host.stream_event_id(event.seq))
            while not stream.lagging:
                timeout = None if access.ends_ms is None else (access.ends_ms - _now_ms()) / 1000
                if timeout is not None and timeout <= 0:
                    return
                event = await host.unless_stopping(stream.queue.get(), timeout)
                if event is None:
                    # The token expired, the stream lags or the host stops: the client reconnects (with a
                    # fresh token, or to another host or this one restarted) and resumes.
                    return
                if event.seq <= last:
                    continue
                last = event.seq
                yield ServerSentEvent(data=event.doc, event=event.topic, id=host.stream_event_id(event.seq))
        finally:
            hub.unsubscribe(stream)

    return EventSourceResponse(
        events(), ping=service.keepalive_ms / 1000, headers={"Cache-Control": NO_STORE}
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


# Referenced only from the event-stream response's schema: registered as a component explicitly.
EXTRA_SCHEMAS = (StreamEvent,)
