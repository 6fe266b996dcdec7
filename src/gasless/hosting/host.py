"""What one API host holds while it runs (`HostState`), its health shape, and its purpose keys."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import aiohttp
import structlog
from pydantic import BaseModel, Field
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.accounts.mirror_reads import AccountReads
from gasless.accounts.senders import SenderListing
from gasless.auth.actions import ActionSignatures
from gasless.auth.native_auth import NativeAuthVerifier
from gasless.auth.origins import OriginPolicy
from gasless.auth.roles import AccountRoles
from gasless.chain.gateway import GatewayClient
from gasless.chain.identity import ChainGuard
from gasless.chain.network import NetworkView
from gasless.compat.service import CompatService
from gasless.core.crypto import PurposeKeys
from gasless.core.errors import ApiError
from gasless.core.metrics import HostMetrics
from gasless.core.settings import MAX_WORKERS, Settings
from gasless.core.workers import cancel_and_wait
from gasless.db import ping
from gasless.db.leader import SingletonRunner
from gasless.http.idempotency import IdempotencyStore
from gasless.http.pages import CursorCodec
from gasless.incidents.jobs import IncidentWatch
from gasless.incidents.service import IncidentService
from gasless.keys.service import ApiKeyService
from gasless.limits.buckets import RouteLimiter
from gasless.mirror.follower import MirrorFollower
from gasless.mirror.repository import MirrorRepository
from gasless.mirror.views import ContractMirror
from gasless.notices.jobs import NoticeParts
from gasless.notices.service import NoticeService
from gasless.notifications.service import NotificationService
from gasless.pricing.service import PricingService
from gasless.purchases.service import PurchaseService
from gasless.relay.assign import AssignService
from gasless.relay.events import IntentBus
from gasless.relay.jobs import Broadcaster, Retention, Tracker
from gasless.relay.quote import QuoteService
from gasless.relay.relayers import RelayerPool
from gasless.relay.repository import IntentRepository
from gasless.relay.service import RelayService
from gasless.settlement.service import ProofService
from gasless.settlement.worker import SettlementWorker
from gasless.signer import FencedSigner
from gasless.signer.owner import OwnerSigner
from gasless.streams.service import StreamService
from gasless.webhooks.delivery import Dispatcher, IntentRecorder
from gasless.webhooks.service import WebhookService
from gasless.x402.service import X402Service

if TYPE_CHECKING:
    from gasless.mcp.mount import LazyMcp

log = structlog.get_logger("gasless.hosting.host")

T = TypeVar("T")


class RelayerFunds(BaseModel):
    """One relayer's funds as this host's relayer pool sees them (readiness only; never makes a host
    unready: the relayers are shared by every host)."""

    address: str
    shard: int
    state: Literal["active", "draining", "retired"]
    assignable: bool = Field(description="active and funded: new senders are assigned to it")
    balanceAtto: str = Field(description="the balance on chain, as last read (decimal atto)")
    inFlightAtto: str = Field(
        description="the most its co-signed, not yet executed intents can cost, counted against the floor"
    )
    floorAtto: str = Field(description="under this (balance less in-flight fees) it is not assigned")
    spendAttoPerHour: str | None = Field(
        description="fees paid per hour over the last hour, from this host's balance readings; null until "
        "it read the balance twice"
    )
    secondsToFloor: int | None = Field(
        description="time left until the floor at that rate; 0 when under it; null when nothing is being "
        "spent or the rate is not known yet"
    )


class Health(BaseModel):
    """Liveness or readiness of one API host."""

    status: Literal["ok", "starting", "unavailable"]
    hostId: str
    version: str
    network: str
    chainId: str
    bootEpochMs: int
    checks: dict[str, str] = {}
    # Singleton roles and whether this host runs them now (readiness only): "leader" or "standby".
    singletons: dict[str, str] = {}
    # The relayer pool's funds (readiness only; docs/keys.md "Relayer funds and rotation").
    relayers: list[RelayerFunds] = []


def relayer_funds(info: Any) -> RelayerFunds:
    """A pool entry (`gasless.relay.relayers.RelayerInfo`) as readiness shows it."""
    left = info.seconds_to_floor
    return RelayerFunds(
        address=info.address,
        shard=info.shard,
        state=info.state,
        assignable=info.assignable,
        balanceAtto=str(info.balance_atto),
        inFlightAtto=str(info.in_flight_atto),
        floorAtto=str(info.floor_atto),
        spendAttoPerHour=None if info.spend_atto_per_hour is None else str(info.spend_atto_per_hour),
        secondsToFloor=None if left is None or left == float("inf") else int(left),
    )


def boot_epoch_ms(worker: int | None, clock: Callable[[], float] = time.time) -> int:
    """The process's start time in Unix ms, the `bootEpoch` of its stream event ids. Worker k of a
    multi-process host (`gasless serve --workers`) rounds it up to the next ms congruent to k modulo
    MAX_WORKERS: its sibling workers share its host id, and two of them starting in the same ms must still
    issue distinct ids (a restarted worker gets a later epoch than its previous life's)."""
    now_ms = int(clock() * 1000)
    return now_ms if worker is None else now_ms + (worker - now_ms) % MAX_WORKERS


@dataclass
class HostState:
    """What one API host holds while it runs."""

    settings: Settings
    boot_epoch_ms: int
    keys: PurposeKeys
    limits: RouteLimiter
    cursors: CursorCodec
    metrics: HostMetrics = field(default_factory=HostMetrics)
    engine: AsyncEngine | None = None
    http: aiohttp.ClientSession | None = None
    redis: Redis | None = None
    restored: bool = False
    checks: dict[str, str] = field(default_factory=dict)
    # The relay core, wired in the lifespan once the network is reachable.
    gateway: GatewayClient | None = None
    network: NetworkView | None = None
    signer: FencedSigner | None = None
    relayers: RelayerPool | None = None
    repo: IntentRepository | None = None
    bus: IntentBus | None = None
    tracker: Tracker | None = None
    broadcaster: Broadcaster | None = None
    retention: Retention | None = None
    singletons: SingletonRunner | None = None
    relay_service: RelayService | None = None
    assign_service: AssignService | None = None
    quote_service: QuoteService | None = None
    pricing: PricingService | None = None
    mcp: LazyMcp | None = None  # /mcp (gasless.mcp.mount)
    purchases: PurchaseService | None = None
    x402: X402Service | None = None
    compat: CompatService | None = (
        None  # the starter-kit facade (on the relay core)  # the x402 flow (needs the relay core and the billing contract)
    )
    mirror: ContractMirror | None = None
    native_auth: NativeAuthVerifier | None = None
    sender_listing: SenderListing | None = None
    # Authentication: browser origins, roles on accounts, sponsor API keys.
    origin_policy: OriginPolicy | None = None
    account_roles: AccountRoles | None = None
    action_signatures: ActionSignatures | None = None
    api_key_service: ApiKeyService | None = None
    # Account streams and their tickets (needs only Redis or this process: usable before the relay core).
    streams: StreamService | None = None
    # Webhooks and the generic Idempotency-Key store (database only: usable before the relay core).
    webhooks: WebhookService | None = None
    webhook_dispatcher: Dispatcher | None = None
    webhook_recorder: IntentRecorder | None = None
    idempotency: IdempotencyStore | None = None
    # Incidents (database only: usable before the relay core) and the watcher raising automatic ones.
    incident_service: IncidentService | None = None
    incident_watch: IncidentWatch | None = None
    startup_error: str | None = None
    # The chain: its identity checked against the database's at start (gasless.chain.identity). A refusal
    # (another chain) keeps the host unready for good; `refused` lets a server process exit on it.
    chain_guard: ChainGuard | None = None
    refusal: str | None = None
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the server begins to stop (`begin_stop`): open streams end then, since uvicorn waits for
    # every open response before it stops, and a stream never ends on its own.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Billing contract mirror, account reads, settlement (the workers run on the role's leader only).
    mirror_repo: MirrorRepository | None = None
    mirror_follower: MirrorFollower | None = None
    account_reads: AccountReads | None = None
    settlement_worker: SettlementWorker | None = None
    # The contract owner's key the settlement worker signs with (a token's sessions: closed on stop).
    owner_signer: OwnerSigner | None = None
    proof_service: ProofService | None = None
    notices: NoticeService | None = None
    notifications: NotificationService | None = None
    notice_parts: NoticeParts | None = None
    # The dependencies and the webhook backlog as the metrics read them (started in the lifespan).
    probe: OpsProbe | None = None

    # Account-stream event ids (docs/streams.md, Events): `<hostId>.<bootEpochMs>.<seq>`. Only ids this
    # very process issued resume; another host's, or one from before a restart, starts with `reset`.
    def stream_event_id(self, seq: int) -> str:
        return f"{self.settings.host_id}.{self.boot_epoch_ms}.{seq}"

    def resumable_seq(self, last_event_id: str | None) -> int | None:
        """The `seq` of a Last-Event-ID issued by this process, else None (the stream sends `reset`)."""
        host, _, rest = (last_event_id or "").partition(".")
        boot, _, seq = rest.partition(".")
        if host != self.settings.host_id or boot != str(self.boot_epoch_ms) or not seq.isdigit():
            return None
        return int(seq)

    def begin_stop(self) -> None:
        """The server stops: every open stream ends now (a client resumes it elsewhere or after restart)."""
        self.stopping.set()

    async def unless_stopping(self, awaitable: Awaitable[T], timeout: float | None) -> T | None:
        """`awaitable`'s result; None when `timeout` (seconds) passes or the host begins to stop first
        (`stopping` tells which). A stream's every wait goes through here."""
        waited = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((waited, stop), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not waited.done():
                waited.cancel()
        return waited.result() if waited.done() and not waited.cancelled() else None

    def refuse(self, reason: str) -> None:
        """Never become ready: the database belongs to another chain than the gateways serve."""
        self.refusal = reason
        self.startup_error = f"chain mismatch: {reason}"
        self.refused.set()

    def unavailable(self) -> ApiError:
        """The 503 of a route that needs the relay core: the host is still starting, or refuses its chain."""
        if self.refusal is not None:
            return ApiError(
                "UPSTREAM_UNAVAILABLE",
                detail=f"this host refuses to serve: {self.refusal}",
                details={"retryAfterMs": 60_000},
            )
        return ApiError(
            "UPSTREAM_UNAVAILABLE",
            detail="this host is still starting (restoring state, reaching the network); retry shortly",
            details={"retryAfterMs": 1_000},
        )

    def _require(self, value: Any) -> Any:
        if value is None or not self.restored:
            raise self.unavailable()
        return value

    @property
    def relay(self) -> RelayService:
        return self._require(self.relay_service)  # type: ignore[no-any-return]

    @property
    def assign(self) -> AssignService:
        return self._require(self.assign_service)  # type: ignore[no-any-return]

    @property
    def quotes(self) -> QuoteService:
        return self._require(self.quote_service)  # type: ignore[no-any-return]

    @property
    def senders(self) -> SenderListing:
        return self._require(self.sender_listing)  # type: ignore[no-any-return]

    @property
    def account_reads_service(self) -> AccountReads:
        return self._require(self.account_reads)  # type: ignore[no-any-return]

    @property
    def token_verifier(self) -> NativeAuthVerifier:
        return self._require(self.native_auth)  # type: ignore[no-any-return]

    @property
    def actions(self) -> ActionSignatures:
        return self._require(self.action_signatures)  # type: ignore[no-any-return]

    @property
    def roles(self) -> AccountRoles:
        return self._require(self.account_roles)  # type: ignore[no-any-return]

    @property
    def api_keys(self) -> ApiKeyService:
        # Needs only the database: usable before the relay core is restored.
        if self.api_key_service is None:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE", detail="this host is starting", details={"retryAfterMs": 1_000}
            )
        return self.api_key_service

    @property
    def incidents(self) -> IncidentService:
        # Needs only the database: usable before the relay core is restored.
        if self.incident_service is None:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE", detail="this host is starting", details={"retryAfterMs": 1_000}
            )
        return self.incident_service

    def note_platform_bind(self) -> None:
        """The limiter's hook when the platform admission budget refuses (relay hot path: no I/O)."""
        if self.incident_watch is not None:
            self.incident_watch.note()


async def readiness(state: HostState) -> dict[str, str]:
    """The readiness checks of a host, each "ok" or what is wrong: state restored, database and at least
    one gateway reachable, Redis when configured, and once restored the clock and the signer (its claim, and
    whether its keys can sign).
    `GET /readyz` answers them; the kit's `GET /health` says ok only when all are."""
    checks = {
        "restore": "ok" if state.restored else (state.startup_error or "running"),
        "database": "ok" if state.engine is not None and await ping(state.engine) else "unreachable",
        "gateway": "ok" if state.http is not None and await gateway_answers(state) else "unreachable",
    }
    if state.redis is not None:
        checks["redis"] = "ok" if await redis_answers(state.redis) else "unreachable"
    if state.restored and state.network is not None and state.signer is not None:
        offset = state.network.clock_offset_ms()
        checks["clock"] = (
            "ok"
            if offset is not None and abs(offset) <= state.settings.max_clock_offset_ms
            else f"offset {offset} ms"
        )
        checks["signer"] = state.signer.readiness()  # ok, fenced, or unavailable (docs/keys.md)
    return checks


PROBE_INTERVAL_S = 5.0


class OpsProbe:
    """Every PROBE_INTERVAL_S: the dependencies as readiness checks them (database, Redis, gateways) and the
    webhook backlog, kept for the metrics (a scrape reads them, it never waits for a dependency)."""

    def __init__(self, state: HostState, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.state = state
        self.interval_s = interval_s
        self.dependencies: dict[str, bool] = {}
        self.webhook_backlog: int | None = None
        self.webhook_oldest_due_ms: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="ops-probe")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def probe(self) -> None:
        state = self.state
        found = {
            "database": state.engine is not None and await ping(state.engine),
            "gateway": state.http is not None and await gateway_answers(state),
        }
        if state.redis is not None:
            found["redis"] = await redis_answers(state.redis)
        self.dependencies = found
        if state.webhooks is not None and found["database"]:
            now = int(time.time() * 1000)
            try:
                count, oldest = await state.webhooks.repo.backlog(now)
            except Exception as exc:  # the database went away in between: the next probe says so
                log.warning("webhook backlog unreadable", error=type(exc).__name__)
            else:
                self.webhook_backlog, self.webhook_oldest_due_ms = count, oldest

    async def _loop(self) -> None:
        while True:
            try:
                await self.probe()
            except Exception as exc:  # a probe must never stop probing
                log.warning("ops probe failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval_s)


async def gateway_answers(state: HostState) -> bool:
    assert state.http is not None
    for url in state.settings.effective_gateway_urls:
        try:
            async with state.http.get(
                f"{url}/network/config", timeout=aiohttp.ClientTimeout(total=1.5)
            ) as resp:
                if resp.status == 200:
                    return True
        except (TimeoutError, aiohttp.ClientError):
            continue
    return False


async def redis_answers(redis: Redis) -> bool:
    try:
        return bool(await redis.ping())
    except Exception:  # any connection or protocol error means "not ready"
        return False


def purpose_keys(settings: Settings) -> PurposeKeys:
    secret = settings.master_secret.get_secret_value() if settings.master_secret is not None else None
    if secret is None:
        # localnet without a configured secret: leases live as long as the process.
        if not settings.effective_database_url.startswith("sqlite"):
            log.warning(
                "no master secret: another host will refuse this host's leases", host_id=settings.host_id
            )
        secret = secrets.token_urlsafe(48)
    return PurposeKeys(secret.encode(), settings.key_env, settings.network.chain_id)
