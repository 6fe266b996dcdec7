"""Relay routes: thin adapters from HTTP to the relay services."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Request, Response
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from gasless.auth.deps import OptionalBearer, RelaySponsorKey, relay_sponsor
from gasless.auth.native_auth import BlockUnavailable, NativeAuthError
from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.chain.gateway import GatewayRejected, GatewayUnavailable
from gasless.core.errors import ApiError
from gasless.http.caching import NETWORK_CACHE, cached_json, intent_cache_control
from gasless.http.formats import INT64_MAX, VISIBLE_ASCII_KEY_PATTERN, Address, IntentIdOrTxHash, TxHash
from gasless.http.json_body import api_router
from gasless.limits.route_classes import ASSIGN_IP, PUBLIC_READ, RELAY_EVENTS, client_key, enforce, record
from gasless.relay.checks import MAX_BODY_BYTES
from gasless.relay.intents import TERMINAL, intent_from_row, rejected_intent
from gasless.relay.replay import replay_while_starting
from gasless.relay.schemas import (
    Assignment,
    AssignRequest,
    Intent,
    Network,
    QuoteRelayRequest,
    RelayQuote,
    RelayRequest,
    RelayResponse,
    ValidateRequest,
    ValidateResponse,
)
from gasless.relay.validate import validate_submission
from gasless.usage.latency import SHARD_WINDOW_MS, shard_figures

STREAM_LIFETIME_MS = 120_000
STREAM_POLL_S = 0.5  # re-read the row this often: changes made on the other host reach the stream too
_HASH = re.compile(r"[0-9a-fA-F]{64}")


async def _quote_account(request: Request) -> str | None:
    """The paying account behind a verified native-auth bearer, else None (the caller counts as anonymous:
    these routes are public, so a token that does not verify is ignored rather than refused)."""
    authorization = request.headers.get("authorization") or ""
    if not authorization.lower().startswith("bearer "):
        return None
    host = request.app.state.host
    if host.native_auth is None or host.mirror is None:
        return None
    try:
        identity = await host.native_auth.verify_async(authorization[7:].strip())
        paying = await host.mirror.paying_account(identity.address)
    except (NativeAuthError, BlockUnavailable, GatewayUnavailable, GatewayRejected):
        return None
    # Only an account on the contract (or one of its authorised senders) earns the account allowance:
    # anyone can mint native-auth tokens for fresh keys.
    return str(paying[0]) if paying is not None else None


async def limit_quote(request: Request) -> None:
    """`POST /v1/quote` and `/v1/validate`: 5 req/s per account with a verified token, else 2 req/s per IP."""
    account = await _quote_account(request)
    if account is not None:
        await enforce(request, "quote_account", account, "account")
    else:
        await enforce(request, "quote_ip", client_key(request), "ip")


QUOTE = Depends(limit_quote)

NATIVE_AUTH_MAX_TTL_MS = 86_400_000
NATIVE_AUTH_BLOCK_LAG = 3  # nonces below the newest recorded block: what every host has polled by then
STALLED_ROUNDS = 10  # a shard whose newest block is older than this many rounds is stalled

router = api_router(tags=["relay"])
IntentOrHashPath = Annotated[IntentIdOrTxHash, Path(description="an IntentId or a TxHash")]


def _host(request: Request) -> Any:
    return request.app.state.host


def _ready_host(request: Request) -> Any:
    """The host, once it has restored its state; before that its repository and network view are unset."""
    host = _host(request)
    if not host.restored or host.repo is None or host.network is None:
        raise host.unavailable()
    return host


def _is_decimal(text: str) -> bool:
    # str.isdigit() also accepts digits int() refuses (superscripts such as '²').
    return text.isascii() and text.isdigit()


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, refused with PAYLOAD_TOO_LARGE as soon as it passes `limit` (before parsing)."""
    declared = request.headers.get("content-length")
    if declared is not None and _is_decimal(declared) and int(declared) > limit:
        raise ApiError("PAYLOAD_TOO_LARGE", detail=f"body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError("PAYLOAD_TOO_LARGE", detail=f"body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/v1/relay/assign",
    operation_id="assignRelayer",
    response_model=Assignment,
    dependencies=[ASSIGN_IP],
    summary="A relayer of the sender's shard and a lease, just before the user signs",
)
async def assign(request: Request, body: AssignRequest, bearer: OptionalBearer) -> Assignment:
    host = _host(request)
    return await host.assign.assign(body, bearer=bearer, report=lambda decision: record(request, decision))


@router.post(
    "/v1/relay",
    operation_id="relayTransaction",
    response_model=RelayResponse,
    status_code=200,
    summary="Co-sign and broadcast one user-signed Relayed-V3 transaction",
    responses={
        202: {"model": RelayResponse, "description": "co-signed; no gateway acknowledged within 800 ms"}
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RelayRequest"}}},
        }
    },
)
async def relay(
    request: Request,
    sponsor: RelaySponsorKey,  # a present key is verified first: API_KEY_INVALID before any other check
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="logical idempotency key, 16 to 128 visible ASCII characters (wins over intentKey)",
            json_schema_extra={"pattern": VISIBLE_ASCII_KEY_PATTERN},  # judged by relay/checks.py
        ),
    ] = None,
) -> Response:
    # Served by `relay_direct` (the app's DirectRoutes) before FastAPI's router: this declaration gives the
    # OpenAPI document its operation, and answers only if the direct route is not installed.
    return await _relay(request, sponsor, idempotency_key)


async def relay_direct(request: Request) -> Response:
    """`POST /v1/relay` without FastAPI's routing and dependency solving (about 7% of the API process's
    time at the maximum, py-spy --gil; docs/performance.md): the same steps as the declared route, in the
    same order, on the same Request."""
    sponsor = await relay_sponsor(request, request.headers.get("x-api-key"))
    return await _relay(request, sponsor, request.headers.get("idempotency-key"))


async def _relay(request: Request, sponsor: Any, idempotency_key: str | None) -> Response:
    received_ms = int(time.time() * 1000)
    host = _host(request)
    raw = await read_body(request)
    # A host that refuses its chain serves nothing from its (stale) database: host.relay answers 503.
    if host.refusal is None and (host.relay_service is None or not host.restored):
        round_ms = host.network.params.round_duration_ms if host.network is not None else 0
        status, response = await replay_while_starting(
            host.repo, raw, idempotency_key, round_ms=round_ms, now_ms=received_ms
        )
        return _json(response, status)
    status, response = await host.relay.relay(
        raw,
        idempotency_key=idempotency_key,
        sponsor=sponsor,
        request_id=request.state.request_id,
        received_ms=received_ms,
        report=lambda decision: record(request, decision),
    )
    return _json(response, status)


def _json(model: BaseModel, status: int) -> Response:
    # One pass in pydantic-core: building the dict, then json.dumps, was 2.3% of the API's time at the
    # maximum load (py-spy, docs/performance.md).
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


async def _intent_for(request: Request, ident: str) -> Intent:
    host = _ready_host(request)
    round_ms = host.network.params.round_duration_ms
    if _HASH.fullmatch(ident):
        tx_hash = ident.lower()
        row = await host.repo.by_hash(tx_hash)
        if row is not None:
            return intent_from_row(row, round_ms)
        rejected = await host.repo.rejection_by_hash(tx_hash)
        if rejected is not None:
            return rejected_intent(rejected, round_ms)
        raise ApiError("NOT_FOUND", detail=f"no intent with transaction hash {tx_hash}")
    sender, _, nonce_text = ident.rpartition(":")
    # At most 19 digits before int(): the nonce is an int64, and a long digit string is never converted.
    if not sender or not _is_decimal(nonce_text) or len(nonce_text) > 19 or int(nonce_text) > INT64_MAX:
        raise ApiError(
            "MALFORMED_REQUEST",
            detail="id is an IntentId (<sender>:<nonce>, the nonce an int64) or a 64-hex transaction hash",
            details={"field": "id"},
        )
    return await _intent_for_slot(request, sender, int(nonce_text))


async def _intent_for_slot(request: Request, sender: str, nonce: int) -> Intent:
    host = _ready_host(request)
    try:
        sender = parse_address(sender).to_bech32()
    except InvalidAddress:
        raise ApiError(
            "MALFORMED_REQUEST", detail="sender is not a valid erd1 address", details={"field": "sender"}
        ) from None
    if nonce > INT64_MAX:
        raise ApiError("MALFORMED_REQUEST", detail="nonce is an int64", details={"field": "nonce"})
    round_ms = host.relay.network.params.round_duration_ms  # 503 while starting
    row = await host.repo.by_slot(sender, nonce)
    if row is not None:
        return intent_from_row(row, round_ms)
    rejected = await host.repo.rejection_by_slot(sender, nonce)
    if rejected is not None:
        return rejected_intent(rejected, round_ms)
    raise ApiError("NOT_FOUND", detail=f"no intent {sender}:{nonce}")


def _cached_intent(request: Request, intent: Intent) -> Response:
    return cached_json(request, intent, cache_control=intent_cache_control(intent.state))


@router.get(
    "/v1/relay/{id}", operation_id="getRelayStatus", response_model=Intent, dependencies=[PUBLIC_READ]
)
async def get_relay(request: Request, id: IntentOrHashPath) -> Response:
    return _cached_intent(request, await _intent_for(request, id))


@router.get(
    "/v1/intents/{sender}/{nonce}",
    operation_id="getIntent",
    response_model=Intent,
    dependencies=[PUBLIC_READ],
)
async def get_intent(
    request: Request,
    sender: Annotated[Address, Path()],
    nonce: Annotated[int, Path(ge=0, le=INT64_MAX, description="int64")],
) -> Response:
    return _cached_intent(request, await _intent_for_slot(request, sender, nonce))


@router.get(
    "/v1/tx/{hash}", operation_id="getIntentByTxHash", response_model=Intent, dependencies=[PUBLIC_READ]
)
async def get_tx(request: Request, hash: Annotated[TxHash, Path()]) -> Response:
    return _cached_intent(request, await _intent_for(request, hash))


@router.get(
    "/v1/relay/{id}/events",
    operation_id="streamRelayEvents",
    response_class=EventSourceResponse,
    dependencies=[RELAY_EVENTS],
    responses={200: {"content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/Intent"}}}}},
)
async def relay_events(
    request: Request,
    id: IntentOrHashPath,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    first = await _intent_for(request, id)  # 404 before the stream opens
    host = _host(request)
    keys = (first.id, first.txHash) if first.txHash else (first.id,)
    last_seq = int(last_event_id) if last_event_id and _is_decimal(last_event_id) else None

    async def events() -> AsyncIterator[ServerSentEvent]:
        wake = host.bus.subscribe(*keys)
        deadline = time.monotonic() + STREAM_LIFETIME_MS / 1000
        sent_seq = last_seq
        current = first
        try:
            while True:
                seq = await _seq_of(host, current)
                if sent_seq is None or seq > sent_seq:
                    sent_seq = seq
                    yield ServerSentEvent(
                        data=json.dumps(current.model_dump(mode="json"), separators=(",", ":")),
                        event="intent",
                        id=str(seq),
                    )
                if current.state in TERMINAL:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                await host.unless_stopping(wake.wait(), min(STREAM_POLL_S, remaining))
                if host.stopping.is_set():
                    return  # the client reconnects (another host, or this one restarted) and resumes
                wake.clear()
                current = await _intent_for(request, id)
        finally:
            host.bus.unsubscribe(wake, *keys)

    return EventSourceResponse(events(), ping=15)


async def _seq_of(host: Any, intent: Intent) -> int:
    # The per-intent sequence is the row's change counter; a REJECTED submission is one event.
    if intent.state == "REJECTED" or intent.txHash is None:
        return 1
    row = await host.repo.by_hash(intent.txHash)
    return int(row.seq) if row is not None else 1


@router.post("/v1/quote", operation_id="quoteRelay", response_model=RelayQuote, dependencies=[QUOTE])
async def quote(request: Request, body: QuoteRelayRequest) -> RelayQuote:
    return await _host(request).quotes.quote(body.tx)


@router.post(
    "/v1/validate",
    operation_id="validateTransaction",
    response_model=ValidateResponse,
    dependencies=[QUOTE],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidateRequest"}}},
        }
    },
)
async def validate(request: Request) -> ValidateResponse:
    raw = await read_body(request)
    answer = await validate_submission(_host(request).relay, raw)
    return answer


# Schemas referenced only through openapi_extra must still be registered as components.
EXTRA_SCHEMAS = (RelayRequest, ValidateRequest)


@router.get(
    "/v1/network",
    operation_id="getNetwork",
    tags=["meta"],
    response_model=Network,
    dependencies=[PUBLIC_READ],
)
async def network(request: Request) -> Response:
    """The network this host serves, with a recent shard-1 block for building native-auth tokens."""
    host = _host(request)
    view = host.network
    if view is None or not view.ready:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail="the network view is still loading",
            details={"retryAfterMs": 1_000},
        )
    params = view.params
    # Not the newest block: each host records blocks from its own poll (twice a round), so a token
    # made on the newest block one host knows can reach another host before that one has polled it.
    auth_block = view.blocks.settled(NATIVE_AUTH_BLOCK_LAG)
    settings = host.settings
    document = {
        "chainId": params.chain_id,
        "env": settings.key_env,
        "network": settings.profile,
        "numShards": params.num_shards,
        "roundDurationMs": params.round_duration_ms,
        "epoch": view.epoch,
        "minGasPrice": params.min_gas_price,
        "minGasLimit": params.min_gas_limit,
        "gasPerDataByte": params.gas_per_data_byte,
        "maxGasPerTx": params.max_gas_per_tx,
        "nativeAuth": {
            "shard": 1,
            "blockHash": auth_block[0] if auth_block else None,
            "blockNonce": auth_block[1] if auth_block else None,
            "blockTimestampMs": auth_block[2] if auth_block else None,
            "origins": settings.effective_native_auth_origins,
            "maxTtlMs": NATIVE_AUTH_MAX_TTL_MS,
        },
        **await _network_state(host),
        "shards": await _shards(host, view, params),
    }
    return cached_json(request, document, cache_control=NETWORK_CACHE)


async def _network_state(host: Any) -> dict[str, Any]:
    """The contract's pause state and the exchange venue's, as read (null where not configured)."""
    mirror = host.mirror
    if mirror is None or mirror.contract is None:
        return {"contractPause": None, "swapVenue": None}
    try:
        pause = (await mirror.pause_state())[0]
        venue = await mirror.venue_open() if mirror.pair is not None else None
    except (GatewayUnavailable, GatewayRejected) as exc:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="the contract could not be read", details={"retryAfterMs": 1_000}
        ) from exc
    return {
        "contractPause": {"paused": bool(pause.paused), "depositsPaused": bool(pause.deposits_paused)},
        "swapVenue": None if venue is None else {"state": "active" if venue else "paused"},
    }


async def _shards(host: Any, view: Any, params: Any) -> list[dict[str, Any]]:
    now = int(time.time() * 1000)
    measured = await shard_figures(host.rollups, now) if host.rollups is not None else {}
    chain_now = now + (view.clock_offset_ms() or 0)
    shards = []
    for shard in range(params.num_shards):
        status = view.status(shard)
        last = status.block_ts_ms if status is not None else None
        figures = measured.get(str(shard), {})
        shards.append(
            {
                "shard": shard,
                "addedP50Ms": figures.get("addedP50Ms"),
                "addedP99Ms": figures.get("addedP99Ms"),
                "inclusionP50Ms": figures.get("inclusionP50Ms"),
                "inclusionP95Ms": figures.get("inclusionP95Ms"),
                "inclusionP99Ms": figures.get("inclusionP99Ms"),
                "samples": figures.get("samples", 0),
                "windowMs": SHARD_WINDOW_MS,
                "lastBlockTsMs": last,
                "stalled": last is None or chain_now - last > STALLED_ROUNDS * params.round_duration_ms,
                "relays24h": figures.get("relays24h", 0),
            }
        )
    return shards
