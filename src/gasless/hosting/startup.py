"""Starting one API host's parts: the relay core (network, chain identity, signer, billing, the singleton
workers, the read services) once the process serves, and the webhook workers; stopping them. `create_app`
(gasless.hosting.app) calls these from its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from gasless.accounts.mirror_reads import AccountReads
from gasless.accounts.senders import SenderListing
from gasless.auth.native_auth import BlockUnavailable, NativeAuthVerifier
from gasless.auth.roles import AccountRoles
from gasless.billing.decision import Entitlement
from gasless.billing.entitlement import BillingEntitlement
from gasless.billing.gate import BillingGate, FreeFlowLimits
from gasless.billing.policy import MAX_DATA_BYTES_SELF_SERVE, AdmissionPolicy
from gasless.billing.unbilled import UnbilledEntitlement
from gasless.chain.gateway import GatewayClient, GatewayUnavailable
from gasless.chain.identity import ChainGuard, ChainIdentityRepository, ChainMismatch
from gasless.chain.network import NetworkView
from gasless.client.keys import UserKey
from gasless.compat.service import CompatService
from gasless.core.metrics import HostMetrics
from gasless.core.settings import Settings
from gasless.db.engine import autovacuum_off
from gasless.db.leader import SingletonRunner
from gasless.hosting.host import HostState
from gasless.http.idempotency import IdempotencyStore
from gasless.incidents.repository import IncidentRepository
from gasless.limits.accounts import AccountLimiter, PlatformBudget
from gasless.limits.buckets import Rate
from gasless.mirror.follower import MIRROR_ROLE, MirrorFollower
from gasless.mirror.repository import MirrorRepository
from gasless.mirror.views import ContractMirror
from gasless.pricing.service import PricingService
from gasless.purchases.builder import CallBuilder
from gasless.purchases.quotes import QuoteSigner
from gasless.purchases.service import PurchaseService
from gasless.registry.repository import RegistryRepository
from gasless.registry.service import RegistryService
from gasless.relay.assign import AssignService
from gasless.relay.checks import MAX_BODY_BYTES
from gasless.relay.events import IntentBus
from gasless.relay.jobs import Broadcaster, Retention, Tracker
from gasless.relay.leases import LeaseCodec
from gasless.relay.ownership import RECOVERY_ROLE, HostIntents, OrphanAdopter
from gasless.relay.quote import QuoteService
from gasless.relay.relayers import RelayerPool
from gasless.relay.repository import IntentRepository
from gasless.relay.restored import QUIET_ROUNDS, RestoreReconciler
from gasless.relay.service import RelayConfig, RelayService
from gasless.settlement.owner_tx import OwnerTransactor
from gasless.settlement.repository import SettlementRepository
from gasless.settlement.restored import SettlementReconciler
from gasless.settlement.service import ProofService
from gasless.settlement.worker import SETTLEMENT_ROLE, SettlementWorker
from gasless.signer import FencedSigner, OwnerKeyRefused, Signer, open_owner_signer, open_signer
from gasless.status.account import AccountStatusService
from gasless.status.jobs import FEED_ROLE, FeedPublisher
from gasless.status.probe import PROBE_ROLE, Prober
from gasless.status.repository import StatusRepository
from gasless.status.service import StatusService
from gasless.usage.latency import LatencyService
from gasless.usage.rollups import ROLLUP_ROLE, LatencyRollup, RollupRepository
from gasless.webhooks.delivery import DeliveryRetention, Dispatcher, IntentRecorder
from gasless.webhooks.repository import WebhookRepository
from gasless.webhooks.service import WebhookService
from gasless.webhooks.ssrf import AddressPolicy
from gasless.x402.challenges import X402Challenges
from gasless.x402.repository import PaymentRepository
from gasless.x402.service import X402Service

log = structlog.get_logger("gasless.hosting.app")


class MeteredIntentBus(IntentBus):
    """The intent bus, also observing stage timings: every state change a host makes is published once,
    by the host whose guarded update won, so each figure is observed once across hosts."""

    def __init__(self, metrics: HostMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def publish(self, row: Any) -> None:
        super().publish(row)
        try:
            self.metrics.observe_intent(row)
        except Exception as exc:  # a metric must never break the publisher
            log.warning("stage metrics failed", error=type(exc).__name__)


async def start_relay_core(
    state: HostState,
    settings: Settings,
    signer_wrapper: Callable[[Signer], Signer] | None,
    entitlement_factory: Callable[[ContractMirror], Entitlement] | None,
) -> None:
    """Reach the network, check it is the database's chain, claim the signer, restore in-flight intents;
    then the host is ready. On another chain the host refuses and stops here: nothing acts on the database."""
    assert state.engine is not None and state.http is not None
    gateway = GatewayClient(
        state.http, settings.effective_gateway_urls, timeout_ms=settings.gateway_timeout_ms
    )
    gateway.on_failure = state.metrics.gateway_failed
    network = NetworkView(gateway)
    while True:
        try:
            await network.start()
            break
        except Exception as exc:  # gateways down at boot: keep trying, stay not-ready meanwhile
            state.startup_error = f"network: {type(exc).__name__}"
            log.warning("network unreachable at start-up; retrying", error=type(exc).__name__)
            await asyncio.sleep(1.0)
    try:
        verified = await verify_chain(state, gateway, network)
    except BaseException:
        await network.stop()
        raise
    if not verified:
        await network.stop()  # nothing reads the chain on this host from here
        return
    state.gateway, state.network = gateway, network
    opened = await open_signer(settings, lambda why: setattr(state, "startup_error", why))
    if opened is None:
        return  # the signer refused its configuration: never ready, /readyz says why (docs/keys.md)
    inner: Signer = opened if signer_wrapper is None else signer_wrapper(opened)
    await reconcile_restored(state, settings, gateway, network, inner)
    signer = FencedSigner(
        inner,
        state.engine,
        signer_id=f"{settings.key_env}:{settings.instance_id}",
        ttl_ms=settings.signer_fence_ttl_ms,
    )
    state.signer = signer  # from here the host's stop closes it (a token's sessions)
    await signer.start()
    if settings.network.contract_address is not None:
        try:  # the settlement worker's key, held as the relayer keys are (docs/keys.md)
            state.owner_signer = await open_owner_signer(
                settings, lambda why: setattr(state, "startup_error", why)
            )
        except OwnerKeyRefused:
            return  # never ready, /readyz says why
    mirror = ContractMirror(gateway, settings.network.contract_address, pair=settings.network.pair_address)
    relayers = RelayerPool(
        state.engine,
        gateway,
        signer.relayers(),
        min_balance_atto=settings.relayer_min_balance_atto,
        refresh_ms=settings.relayer_refresh_ms,
        # The contract's getRelayerState is the authority for relayer states (the database row follows it).
        chain_states=mirror.relayer_states if settings.network.contract_address is not None else None,
    )
    await relayers.start()
    state.relayers = relayers
    state.registry = RegistryService(RegistryRepository(state.engine), relayers)
    leases = LeaseCodec(state.keys)
    repo = state.repo or IntentRepository(state.engine)
    bus: IntentBus = MeteredIntentBus(state.metrics)
    if state.webhook_recorder is not None:
        bus.listen(state.webhook_recorder.observe)
    broadcaster = Broadcaster(gateway, repo, bus)
    broadcaster.on_unacknowledged = state.metrics.unacknowledged_sends.inc
    # The tracker follows this host's intents (and adopted ones while it leads recovery).
    tracked = HostIntents(state.engine, settings.instance_id)
    tracker = Tracker(gateway, network, tracked, bus, broadcaster)
    contract = settings.network.contract_address
    challenges = (
        None
        if contract is None
        else X402Challenges(
            QuoteSigner(state.keys),
            chain_id=settings.network.chain_id,
            contract=contract,
            payment_token=settings.network.payment_token,
            base_url=settings.network.api_base_url,
        )
    )
    billing_entitlement = BillingEntitlement(
        mirror,
        challenges=challenges,
        policy=AdmissionPolicy.of(
            deploy=settings.billing_deploy_allowlist, data=settings.billing_data_allowlist
        ),
    )
    entitlement: Entitlement = (
        entitlement_factory(mirror) if entitlement_factory is not None else billing_entitlement
    )
    billing = BillingGate(
        state.engine,
        billing_entitlement,
        AccountLimiter(
            state.limits.rates,
            platform=PlatformBudget(
                settings.billing_platform_ru_per_second, settings.billing_platform_ru_burst
            ),
            on_platform_bind=state.note_platform_bind,  # raises the platform_admission incident
        ),
        free_flow=FreeFlowLimits(
            per_day=settings.billing_free_flow_per_day,
            per_30_days=settings.billing_free_flow_per_30_days,
            platform_per_day=settings.billing_free_flow_platform_per_day,
            platform_rate=Rate(
                settings.billing_free_flow_platform_per_second, settings.billing_free_flow_platform_burst
            ),
        ),
    )
    gate: BillingGate | None = billing
    if settings.bench_unbilled:  # bench/relay.py --unbilled only: the relay path without billing
        entitlement, gate = UnbilledEntitlement(), None
        log.warning("billing disabled (bench_unbilled): every relay is free and unaccounted")

    async def resolve_block(block_hash: str) -> int | None:
        try:
            return await network.block_timestamp_ms(block_hash)
        except GatewayUnavailable as exc:
            raise BlockUnavailable(str(exc)) from exc

    native_auth = NativeAuthVerifier(
        network.blocks,
        accepted_origins=settings.effective_native_auth_origins,
        resolve_block=resolve_block,
    )
    assign = AssignService(
        chain_id=settings.network.chain_id,
        network=network,
        leases=leases,
        relayers=relayers,
        signer=signer,
        repo=repo,
        native_auth=native_auth,
        max_clock_offset_ms=settings.max_clock_offset_ms,
        limits=state.limits,
        gateway=gateway,
    )
    relay = RelayService(
        RelayConfig(
            chain_id=settings.network.chain_id,
            host_id=settings.instance_id,
            docs_url=settings.docs_url,
            signer_deadline_ms=settings.signer_deadline_ms,
            simulate=settings.simulate,
            contract=settings.network.contract_address,
            data_limit=MAX_BODY_BYTES if settings.billing_data_allowlist else MAX_DATA_BYTES_SELF_SERVE,
        ),
        network=network,
        gateway=gateway,
        leases=leases,
        relayers=relayers,
        signer=signer,
        repo=repo,
        entitlement=entitlement,
        broadcaster=broadcaster,
        tracker=tracker,
        assign=assign,
        billing=gate,
    )
    state.repo, state.bus, state.broadcaster, state.tracker = repo, bus, broadcaster, tracker
    recovered = await tracker.recover()
    await tracker.start()
    singletons = SingletonRunner(
        settings.effective_database_url,
        host_id=settings.instance_id,
        scope=f"{settings.key_env}:{settings.network.chain_id}",
    )
    retention = Retention(repo)
    singletons.add("retention", retention)
    if state.webhooks is not None and state.idempotency is not None:
        singletons.add("webhook-retention", DeliveryRetention(state.webhooks.repo, state.idempotency))
    singletons.add(RECOVERY_ROLE, OrphanAdopter(tracked, singletons))
    rollups = RollupRepository(state.engine)
    round_ms = lambda: network.params.round_duration_ms  # noqa: E731
    if settings.latency_rollup_enabled:
        singletons.add(
            ROLLUP_ROLE,
            LatencyRollup(
                rollups,
                round_ms,
                every_ms=settings.latency_rollup_ms,
                offload_rows=settings.latency_rollup_offload_rows,
            ),
        )
    state.latency, state.rollups = LatencyService(state.engine, rollups, round_ms), rollups
    probe_keys = [UserKey.from_pem(path) for path in settings.probe_key_files]
    probe_senders = tuple(key.address for key in probe_keys)
    state.status = StatusService(
        StatusRepository(state.engine),
        rollups,
        IncidentRepository(state.engine),
        host=state,
        min_balance_atto=settings.relayer_min_balance_atto,
        excluded_senders=lambda: probe_senders,
    )
    if state.registry is not None:
        state.registry.excluded_senders = probe_senders
    if settings.probe_enabled and probe_keys:
        singletons.add(
            PROBE_ROLE,
            Prober(
                engine=state.engine,
                relay=relay,
                assign=assign,
                gateway=gateway,
                intents=repo,
                keys=probe_keys,
                chain_id=settings.network.chain_id,
                min_gas_price=lambda: network.params.min_gas_price,
                interval_ms=settings.probe_interval_ms,
            ),
        )
    state.account_status = AccountStatusService(
        state.engine, IncidentRepository(state.engine), rollups, state.cursors
    )
    if state.incident_service is not None:
        singletons.add(
            FEED_ROLE,
            FeedPublisher(
                state.status,
                state.incident_service,
                settings.effective_status_feed_dir,
                every_ms=settings.status_feed_ms,
            ),
        )
    add_billing_workers(state, settings, gateway, network, mirror, singletons)
    state.pricing = PricingService(
        mirror,
        state.mirror_repo,
        state.cursors,
        chain_id=settings.network.chain_id,
        payment_token=settings.network.payment_token,
    )
    if state.notice_parts is not None and state.account_reads is not None:
        state.notice_parts.attach(
            state.engine,
            singletons,
            account_reads=state.account_reads,
            tariff_entries=state.pricing.tariff_entries if contract is not None and state.pricing else None,
            webhooks=state.webhooks,
            streams=state.streams,
            bus=bus,
            follower=state.mirror_follower,
            poll_ms=settings.notices_poll_ms,
        )
    await singletons.start()
    state.retention, state.singletons = retention, singletons
    state.relay_service, state.assign_service = relay, assign
    state.compat = CompatService(
        relay, relayers, leases, state.limits, min_gas_price=lambda: network.params.min_gas_price
    )
    state.quote_service = QuoteService(network, mirror)
    if settings.network.contract_address is not None:
        state.purchases = PurchaseService(
            mirror,
            CallBuilder(
                chain_id=settings.network.chain_id,
                contract=settings.network.contract_address,
                payment_token=settings.network.payment_token,
                gateway=gateway,
                network=network,
                assign=assign,
                repo=repo,
            ),
            QuoteSigner(state.keys),
            challenges=challenges,
            flag_calls=gate.flag_calls if gate is not None else None,
            billable=gate.billable if gate is not None else None,
            flag_limits=(settings.billing_free_flow_per_day, settings.billing_free_flow_per_30_days),
        )
        assert challenges is not None and state.mirror_repo is not None
        state.x402 = X402Service(
            challenges,
            state.purchases,
            PaymentRepository(state.engine),
            relay=relay,
            intents=repo,
            mirror_repo=state.mirror_repo,
            host_id=settings.instance_id,
        )
    state.mirror, state.native_auth = mirror, native_auth
    state.account_roles = AccountRoles(mirror)
    assert state.mirror_repo is not None
    state.sender_listing = SenderListing(state.mirror_repo, state.cursors)
    if state.streams is not None:
        state.streams.attach_intents(bus, network.params.round_duration_ms, mirror)
    state.startup_error = None
    state.restored = True
    if await autovacuum_off(state.engine):
        # Intents are updated three or four times each and latency rollups every round: unvacuumed, their
        # dead rows slow every read (docs/deploy.md). The operator's server, so a warning, not a refusal.
        log.warning(
            "PostgreSQL autovacuum is off: dead rows will slow the relays down; turn it on (docs/deploy.md)"
        )
    log.info("host ready", host_id=settings.instance_id, network=settings.profile, recovered=recovered)


async def verify_chain(state: HostState, gateway: GatewayClient, network: NetworkView) -> bool:
    """The chain identity check (gasless.chain.identity); False when the host refuses to start."""
    assert state.engine is not None
    guard = ChainGuard(ChainIdentityRepository(state.engine), gateway, network)

    def waiting(why: str) -> None:
        state.startup_error = why

    while True:
        try:
            await guard.verify(waiting)
            break
        except ChainMismatch as exc:
            state.refuse(exc.reason)
            log.error("refusing to start: the database belongs to another chain", reason=exc.reason)
            return False
        except Exception as exc:  # the gateways or the database failed: retry, not ready meanwhile
            state.startup_error = f"chain: {type(exc).__name__}"
            log.warning("chain identity check failed; retrying", error=repr(exc))
            await asyncio.sleep(1.0)
    network.on_poll(guard.on_poll)
    state.chain_guard = guard
    return True


async def reconcile_restored(
    state: HostState, settings: Settings, gateway: GatewayClient, network: NetworkView, signer: Signer
) -> None:
    """A restored database's first start: reconciled with the chain (its relays and its settlement batches)
    before this host may sign or settle (gasless.relay.restored); one read on any other database."""
    assert state.engine is not None
    quiet_ms = max(settings.signer_fence_ttl_ms, QUIET_ROUNDS * network.params.round_duration_ms)

    def report(why: str) -> None:
        state.startup_error = why

    contract = settings.network.contract_address
    reconciler = RestoreReconciler(
        state.engine,
        gateway,
        network,
        [key.bech32 for key in signer.relayers()],
        host_id=settings.instance_id,
        quiet_ms=quiet_ms,
        report=report,
        settlement=SettlementReconciler(state.engine, gateway, contract) if contract else None,
    )
    while True:
        try:
            await reconciler.run()
            return
        except Exception as exc:  # the gateways or the database failed: start over, not ready meanwhile
            state.startup_error = f"restore: {type(exc).__name__}"
            log.warning("restored database: reconciliation failed; retrying", error=repr(exc)[:300])
            await asyncio.sleep(1.0)


def add_billing_workers(
    state: HostState,
    settings: Settings,
    gateway: GatewayClient,
    network: NetworkView,
    mirror: ContractMirror,
    singletons: SingletonRunner,
) -> None:
    """The contract mirror and settlement singletons, and the reads over the mirror tables."""
    assert state.engine is not None
    contract = settings.network.contract_address
    repo = MirrorRepository(state.engine)
    state.mirror_repo = repo
    state.account_reads = AccountReads(state.engine, repo, state.cursors, lambda: chain_now_ms(network))
    if contract is None:
        return
    follower = MirrorFollower(
        repo,
        gateway,
        contract,
        poll_ms=settings.mirror_poll_ms,
        start_hyperblock=settings.mirror_start_hyperblock,
    )
    invalidate = getattr(mirror, "invalidate", None)  # the relay core's cached views of a changed account
    if invalidate is not None:
        follower.on_account_changed(invalidate)
    singletons.add(MIRROR_ROLE, follower)
    state.mirror_follower = follower
    settlements = SettlementRepository(state.engine)
    worker: SettlementWorker | None = None
    if state.owner_signer is not None:
        owner = OwnerTransactor(gateway, state.owner_signer, contract, settings.network.chain_id)
        worker = SettlementWorker(
            settlements,
            gateway,
            owner,
            interval_ms=settings.settlement_interval_ms,
            max_rows=settings.settlement_max_rows,
        )
        worker.on_failure = lambda kind: state.metrics.settlement_failures.labels(kind).inc()
        singletons.add(SETTLEMENT_ROLE, worker)
    state.settlement_worker = worker

    async def next_due_ms() -> int | None:
        if worker is not None:
            return await worker.next_due_ms()
        last = await settlements.last()
        return int(last["created_at_ms"]) + settings.settlement_interval_ms if last is not None else None

    state.proof_service = ProofService(settlements, repo, next_due_ms)


def chain_now_ms(network: NetworkView) -> int:
    """Shard-1 chain time now: its newest block's timestamp plus the time since we read it."""
    now = int(time.time() * 1000)
    status = network.status(1)
    if status is None:
        offset = network.clock_offset_ms() or 0
        return now - offset
    return status.block_ts_ms + max(0, now - status.observed_at_ms)


async def stop_relay_core(state: HostState) -> None:
    if state.chain_guard is not None:
        with contextlib.suppress(Exception):
            await state.chain_guard.record()  # the newest final hyperblock this host saw
    for part in (state.singletons, state.tracker, state.relayers, state.signer, state.network):
        if part is not None:
            with contextlib.suppress(Exception):
                await part.stop()
    if state.owner_signer is not None:  # after the settlement worker (a singleton) stopped
        with contextlib.suppress(Exception):
            await state.owner_signer.aclose()
    if state.broadcaster is not None:
        await state.broadcaster.drain(2.0)
    if state.gateway is not None:
        await state.gateway.aclose()  # sends still under way end as failures: the next start re-sends them


async def start_webhooks(state: HostState, settings: Settings) -> None:
    """Webhook management, the event recorder and this host's delivery worker (database only)."""
    assert state.engine is not None
    repo = WebhookRepository(state.engine)
    service = WebhookService(
        repo,
        state.keys,
        AddressPolicy.from_cidrs(settings.webhook_local_receiver_cidrs),
        state.cursors,
        max_attempts=len(settings.webhook_retry_backoff_ms) + 1,
    )
    dispatcher = Dispatcher(
        service,
        repo,
        worker_id=f"{settings.instance_id}.{state.boot_epoch_ms}",
        timeout_ms=settings.webhook_timeout_ms,
        backoff_ms=settings.webhook_retry_backoff_ms,
        poll_ms=settings.webhook_poll_ms,
    )
    recorder = IntentRecorder(service)
    state.idempotency = IdempotencyStore(state.engine, state.keys)
    state.webhooks, state.webhook_dispatcher, state.webhook_recorder = service, dispatcher, recorder
    await recorder.start()
    await dispatcher.start()
