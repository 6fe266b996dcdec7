"""POST /v1/relay, /v1/validate and /v1/quote: the checks in their order (docs/relay.md), the commit point,
broadcast.

Before the commit point every failure is an ApiError and nothing was sent (the submission is recorded as
REJECTED). The commit point is one database transaction storing the co-signed intent, its idempotency
key and (later) its reservation. After it the answer is 200 or 202 whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from multiversx_sdk import Transaction

from gasless.billing.decision import Entitlement, EntitlementDecision
from gasless.billing.gate import BillingGate
from gasless.billing.policy import MAX_DATA_BYTES_SELF_SERVE
from gasless.chain.addresses import shard_of_pubkey
from gasless.chain.codec import tx_hash, tx_to_wire, verify_ed25519
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.core.errors import ApiError
from gasless.limits.buckets import Decision
from gasless.relay.assign import AssignService
from gasless.relay.checks import (
    ChainState,
    ParsedRelay,
    contract_in_other_shard,
    first_failure,
    first_or_raise,
    identify,
    parse_json_body,
    parse_relay_body,
    static_checks,
)
from gasless.relay.intents import intent_from_row
from gasless.relay.jobs import Broadcaster, Tracker
from gasless.relay.leases import Lease, LeaseCodec, LeaseInvalid
from gasless.relay.relayers import RelayerPool
from gasless.relay.repository import CommitConflict, IntentRepository, Rec, SenderView
from gasless.relay.schemas import BillingInfo, RelayResponse
from gasless.relay.simulation import simulate_or_refuse
from gasless.relay.state_checks import state_checks
from gasless.signer import Signer, SignerError, sign_with_deadline

log = structlog.get_logger("gasless.relay")

ACK_WAIT_MS = 800
KEY_TTL_MS = 86_400_000


@dataclass(frozen=True)
class RelayConfig:
    chain_id: str
    host_id: str
    docs_url: str
    signer_deadline_ms: int = 250
    simulate: str = "contract_calls"
    contract: str | None = None
    # The static data-size ceiling: 4 096 bytes, or the body limit's when some account is allow-listed for
    # more (the entitlement stage then applies the 4 096 bytes to every other account).
    data_limit: int = MAX_DATA_BYTES_SELF_SERVE


def stored_response(row: Rec, round_ms: int, *, duplicate: bool) -> tuple[int, RelayResponse]:
    """The answer stored for an intent: 202 while `COSIGNED`, else 200."""
    intent = intent_from_row(row, round_ms)
    billing = (
        BillingInfo(**row.billing) if isinstance(row.billing, dict) else BillingInfo(authMode="signed_tx")
    )
    response = RelayResponse(
        id=intent.id,
        txHash=row.tx_hash,
        state=intent.state,
        duplicate=duplicate,
        relayer=row.relayer,
        intent=intent,
        billing=billing,
    )
    return (202 if intent.state == "COSIGNED" else 200), response


@dataclass(frozen=True)
class RelayMode:
    """A route's own rules on the one relay core: the compat facade simulates always and accepts a draining
    same-shard relayer; `route` is recorded with the intent's billing (and its usage row). `admit` is the
    route's own limit, taken with the billing admission (after every check that could refuse the relay for
    good), so that a relay refused for good, or an identical resubmission, takes nothing from it."""

    route: str = "native"
    simulate_always: bool = False
    accept_draining: bool = False
    admit: Callable[[ParsedRelay], Awaitable[None]] | None = None


NATIVE = RelayMode()


class RelayService:
    def __init__(
        self,
        config: RelayConfig,
        *,
        network: NetworkView,
        gateway: GatewayClient,
        leases: LeaseCodec,
        relayers: RelayerPool,
        signer: Signer,
        repo: IntentRepository,
        entitlement: Entitlement,
        broadcaster: Broadcaster,
        tracker: Tracker,
        assign: AssignService,
        billing: BillingGate | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.network = network
        self.gateway = gateway
        self.leases = leases
        self.relayers = relayers
        self.signer = signer
        self.repo = repo
        self.entitlement = entitlement
        self.broadcaster = broadcaster
        self.tracker = tracker
        self.assign = assign
        self.billing = billing
        self.clock = clock
        self._background: set[asyncio.Task[Any]] = set()
        # sender -> (expires at, monotonic ms; guardian data): read at most once per round per sender. A
        # guardian change becomes active on chain only after a waiting period, so a round-old answer is
        # as good as a fresh one.
        self._guardians: dict[str, tuple[float, dict[str, Any] | None]] = {}
        # sender -> (shard block nonce, account): the account a committed relay was checked against, and
        # the block its state is from (RelayService._account).
        self._accounts: dict[str, tuple[int, dict[str, Any]]] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------------------------------------
    async def relay(
        self,
        raw: bytes,
        *,
        idempotency_key: str | None,
        sponsor: Any | None,
        request_id: str,
        received_ms: int,
        report: Callable[[Decision], None] | None = None,
        mode: RelayMode = NATIVE,
    ) -> tuple[int, RelayResponse]:
        """`sponsor` is the verified sponsor key (SponsorKey) or None; `report` receives the rate-class
        decision of an admitted relay (its RateLimit-* headers); `mode` the route's own rules (compat)."""
        body = parse_json_body(raw)
        try:
            parsed = parse_relay_body(body, idempotency_key)
        except ApiError as error:
            who = identify(body)
            if who is not None:
                self._record_rejection(who[0], who[1], None, error, request_id, received_ms)
            raise
        try:
            return await self._relay(
                parsed,
                sponsor=sponsor,
                request_id=request_id,
                received_ms=received_ms,
                report=report,
                mode=mode,
            )
        except ApiError as error:
            self._record_rejection(
                parsed.sender, parsed.tx.nonce, tx_hash(parsed.tx), error, request_id, received_ms
            )
            raise
        except Exception:
            # Unexpected failure before the commit point: INTERNAL, nothing sent, still recorded.
            self._record_rejection(
                parsed.sender,
                parsed.tx.nonce,
                tx_hash(parsed.tx),
                ApiError("INTERNAL"),
                request_id,
                received_ms,
            )
            raise

    async def _relay(
        self,
        parsed: ParsedRelay,
        *,
        sponsor: Any | None,
        request_id: str,
        received_ms: int,
        report: Callable[[Decision], None] | None = None,
        mode: RelayMode = NATIVE,
    ) -> tuple[int, RelayResponse]:
        tx = parsed.tx
        params = self.network.params
        failure = first_failure(self._static(parsed))
        if failure is not None:
            raise failure
        # State reads start now and run while the local checks proceed.
        chain_read = asyncio.create_task(self._chain_state(parsed.sender, parsed.sender_shard))
        try:
            view = await self._sender_view(parsed, received_ms)
            duplicate = self._duplicate_of(parsed, view)
            if duplicate is not None:
                return self._stored_response(duplicate, duplicate=True)
            lease = first_or_raise(self._lease_checks(parsed, view, mode))
            first_or_raise([lambda: self._sender_signature(parsed)])
            state = await chain_read
            slot_seq = first_or_raise(self._state_checks(parsed, lease, view, state))
            decision = await self._entitle(tx, parsed.sender, sponsor, parsed.account)
            if self.billing is not None:
                decision = await self.billing.free_flow(
                    decision, tx, parsed.sender, sponsor, view.free_in_flight, account=parsed.account
                )
            await simulate_or_refuse(
                self.gateway, parsed, params, "always" if mode.simulate_always else self.config.simulate
            )
            if mode.admit is not None:
                await mode.admit(parsed)
            if self.billing is not None:
                admitted = await self.billing.admit(decision, tx, parsed.sender_shard, sponsor)
                if admitted is not None and report is not None:
                    report(admitted)
        finally:
            if not chain_read.done():
                chain_read.cancel()
                with contextlib.suppress(BaseException):
                    await chain_read
        committed = await self._cosign_and_commit(
            parsed, lease, slot_seq, decision, request_id, received_ms, route=mode.route
        )
        self._remember_account(parsed.sender, state)
        return committed

    # Stages -----------------------------------------------------------------------------------------
    def _static(self, parsed: ParsedRelay) -> list[Callable[[], ApiError | None]]:
        def relayer_shard(address: str) -> int | None:
            info = self.relayers.get(address)
            return None if info is None else info.shard

        return static_checks(
            parsed.tx,
            self.network.params,
            relayer_shard=relayer_shard,
            data_limit=self.config.data_limit,
            lease_present=parsed.lease_token not in (None, ""),
        )

    async def _sender_view(self, parsed: ParsedRelay, now_ms: int) -> SenderView:
        try:
            return await self.repo.sender_view(parsed.sender, parsed.tx.nonce, parsed.intent_key, now_ms)
        except Exception as exc:
            log.warning("database unavailable before commit", error=type(exc).__name__)
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="database unavailable; nothing was sent") from None

    def _duplicate_of(self, parsed: ParsedRelay, view: SenderView) -> Rec | None:
        for row in view.at_nonce:
            if row.bytes_sha256 == parsed.bytes_sha256:
                return row
        return None

    def _lease_checks(
        self, parsed: ParsedRelay, view: SenderView, mode: RelayMode
    ) -> list[Callable[[], Any]]:
        tx = parsed.tx
        holder: dict[str, Lease] = {}

        def key_reuse() -> ApiError | None:
            row = view.key_row
            if row is not None and row.state != "DEAD" and row.bytes_sha256 != parsed.bytes_sha256:
                return ApiError(
                    "INTENT_ALREADY_SUBMITTED",
                    detail="this idempotency key was used for another transaction",
                    details={
                        "intent": intent_from_row(row, self.network.params.round_duration_ms).model_dump()
                    },
                )
            return None

        def verify() -> ApiError | None:
            try:
                holder["lease"] = self.leases.verify(parsed.lease_token)
            except LeaseInvalid as exc:
                return ApiError("LEASE_INVALID", detail=str(exc))
            return None

        def matches() -> ApiError | None:
            lease = holder["lease"]
            relayer = tx.relayer.to_bech32() if tx.relayer is not None else ""
            if lease.sender != parsed.sender or lease.relayer != relayer:
                return ApiError("LEASE_MISMATCH", detail="the lease was issued for another sender or relayer")
            if lease.txHash is not None and lease.txHash != tx_hash(tx):
                return ApiError(
                    "LEASE_MISMATCH", detail="the lease was renewed for another signed transaction"
                )
            return None

        def pin() -> ApiError | None:
            lease = holder["lease"]
            if lease.pinNonce is not None and lease.pinNonce != tx.nonce:
                return ApiError(
                    "NONCE_PIN_MISMATCH",
                    detail=f"the assignment pinned nonce {lease.pinNonce}, the tx has {tx.nonce}",
                )
            return None

        def fresh() -> ApiError | None:
            lease = holder["lease"]
            if lease.expired(self.now_ms()):
                info = self.relayers.get(lease.relayer)
                return ApiError(
                    "LEASE_EXPIRED",
                    detail="the lease is past its validity; renew it (renewFor) and resend the same bytes",
                    details={"renewable": bool(info is not None and info.assignable)},
                )
            return None

        def relayer_usable() -> ApiError | None:
            info = self.relayers.get(holder["lease"].relayer)
            if info is not None and info.assignable:
                return None
            if info is not None and mode.accept_draining and info.state == "draining":
                return None  # the compat route still serves a draining relayer's (cached) users
            return self.assign.resign_required(
                parsed.sender, parsed.sender_pubkey, parsed.sender_shard, tx.nonce
            )

        def done() -> Lease:
            return holder["lease"]

        return [key_reuse, verify, matches, pin, fresh, relayer_usable, done]

    def _sender_signature(self, parsed: ParsedRelay) -> ApiError | None:
        if not verify_ed25519(parsed.sender_pubkey, parsed.signing_bytes, parsed.tx.signature):
            return ApiError("SENDER_SIGNATURE_INVALID", detail="the sender signature does not verify")
        return None

    async def _chain_state(self, sender: str, shard: int) -> ChainState:
        try:
            (account, account_block), guardian, pool = await asyncio.gather(
                self._account(sender, shard),
                self._guardian_data(sender),
                self.gateway.pool_for_sender(sender, fields="hash,nonce,gasprice"),
            )
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="no gateway answered; nothing was sent") from exc
        active = (guardian.get("activeGuardian") or {}).get("address") if guardian else None
        return ChainState(
            nonce=int(account.get("nonce", 0)),
            balance=int(account.get("balance", "0")),
            guarded=bool(guardian.get("guarded")) if guardian else False,
            active_guardian=active or None,
            pool=list(pool or []),
            account=account,
            account_block=account_block,
        )

    async def _account(self, sender: str, shard: int) -> tuple[dict[str, Any], int | None]:
        """The sender's account, read from a gateway unless a relay of this sender committed against the
        state of the block its shard is at now.

        An account's state changes only when its shard commits a block, so within one block the account
        read for the sender's previous relay is the one a new read would return; the pool, which
        transactions sent around the service change between two blocks, is always read fresh
        (tests/relay/test_account_snapshot.py). The block the shard is at comes from the network view's
        polls, made within a few milliseconds of each round's start: a block newer than that view is the
        race a fresh read has with a block landing before the broadcast (the gateway refuses the send
        and the intent ends DEAD). Kept only after a commit point, so a refused relay (a balance too
        low, say) reads again on its retry."""
        status = self.network.status(shard)
        hit = self._accounts.get(sender)
        if hit is not None and status is not None and hit[0] == status.nonce:
            return hit[1], hit[0]
        return await self.gateway.account_at_block(sender)

    def _remember_account(self, sender: str, state: ChainState) -> None:
        if state.account is None or state.account_block is None:
            return
        if len(self._accounts) > 65_536:
            self._accounts.clear()
        self._accounts[sender] = (state.account_block, state.account)

    async def _guardian_data(self, sender: str) -> dict[str, Any] | None:
        now = time.monotonic() * 1000
        hit = self._guardians.get(sender)
        if hit is not None and hit[0] > now:
            return hit[1]
        data = await self.gateway.guardian_data(sender)
        if len(self._guardians) > 65_536:
            self._guardians.clear()
        self._guardians[sender] = (now + self.network.params.round_duration_ms, data)
        return data

    def _state_checks(
        self, parsed: ParsedRelay, lease: Lease, view: SenderView, state: ChainState
    ) -> list[Callable[[], Any]]:
        return state_checks(
            parsed, lease, view, state, round_ms=self.network.params.round_duration_ms, assign=self.assign
        )

    async def _entitle(
        self, tx: Transaction, sender: str, sponsor: Any | None, account: str | None = None
    ) -> EntitlementDecision:
        try:
            return await self.entitlement.decide(tx, sender, sponsor, account=account)
        except (GatewayUnavailable, GatewayRejected) as exc:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE", detail="could not read the contract; nothing was sent"
            ) from exc

    async def _simulate(self, parsed: ParsedRelay, params: Any) -> None:
        await simulate_or_refuse(self.gateway, parsed, params, self.config.simulate)

    # The commit point ---------------------------------------------------------------------------------
    async def _cosign_and_commit(
        self,
        parsed: ParsedRelay,
        lease: Lease,
        slot_seq: int,
        decision: EntitlementDecision,
        request_id: str,
        received_ms: int,
        *,
        route: str = "native",
    ) -> tuple[int, RelayResponse]:
        tx = parsed.tx
        relayer = tx.relayer.to_bech32()
        try:
            signature = await sign_with_deadline(
                self.signer, relayer, parsed.signing_bytes, self.config.signer_deadline_ms
            )
        except SignerError as exc:
            raise ApiError(exc.code, detail=str(exc)) from None
        tx.relayer_signature = signature
        wire = tx_to_wire(tx)
        final_hash = tx_hash(tx)
        cosigned_ms = self.now_ms()
        receiver_pk = tx.receiver.get_public_key()
        values = {
            "sender": parsed.sender,
            "nonce": tx.nonce,
            "slot_seq": slot_seq,
            "tx_hash": final_hash,
            "bytes_sha256": parsed.bytes_sha256,
            "state": "COSIGNED",
            "seq": 1,
            "sender_shard": parsed.sender_shard,
            "receiver": tx.receiver.to_bech32(),
            "relayer": relayer,
            "cross_shard": shard_of_pubkey(receiver_pk) != parsed.sender_shard
            and receiver_pk[:8] != b"\0" * 8
            or contract_in_other_shard(receiver_pk, parsed.sender_shard),
            "gas_limit": tx.gas_limit,
            "gas_price": tx.gas_price,
            "value_atto": tx.value,
            "lease_kind": lease.kind,
            "billing": decision.as_json() if route == "native" else {**decision.as_json(), "route": route},
            "intent_key": parsed.intent_key,
            "tx": wire,
            "host_id": self.config.host_id,
            "request_id": request_id,
            "received_at_ms": received_ms,
            "cosigned_at_ms": cosigned_ms,
            "send_attempts": 0,
            "updated_at_ms": cosigned_ms,
        }
        try:
            pk = await self.repo.commit(values, parsed.intent_key, KEY_TTL_MS)
        except CommitConflict:
            return await self._lost_race(parsed)
        except ApiError:
            raise  # the reservation refused (QUOTA_EXHAUSTED): rolled back, the signature is discarded
        except Exception as exc:
            log.warning("commit failed; the signature is discarded", error=type(exc).__name__)
            raise ApiError("UPSTREAM_UNAVAILABLE", detail="database unavailable; nothing was sent") from None
        # From here on: 200 or 202, whatever happens.
        self.relayers.note_cosigned(relayer, tx.gas_limit * tx.gas_price)  # counts against its floor now
        row = Rec(
            pk=pk,
            **values,
            broadcast_at_ms=None,
            executed_block_ts_ms=None,
            finalized_at_ms=None,
            outcome=None,
            dead_reason=None,
            replaced_by=None,
            last_sent_at_ms=cosigned_ms,
        )
        try:
            sent = self.broadcaster.send(pk, wire, final_hash)
            self.tracker.watch(row)
            remaining = max(0.0, (received_ms + ACK_WAIT_MS - self.now_ms()) / 1000)
            async with asyncio.timeout(remaining):  # not wait_for: see gasless.core.workers.wait_event
                ack_ms = await asyncio.shield(sent.ack_ms)
        except (TimeoutError, Exception):  # noqa: BLE001 - after the commit point nothing may fail the answer
            ack_ms = None
        if ack_ms is not None:
            row = row._replace(state="BROADCAST", broadcast_at_ms=ack_ms, seq=2)
        return self._stored_response(row, duplicate=False)

    async def _lost_race(self, parsed: ParsedRelay) -> tuple[int, RelayResponse]:
        view = await self._sender_view(parsed, self.now_ms())
        duplicate = self._duplicate_of(parsed, view)
        if duplicate is not None:
            return self._stored_response(duplicate, duplicate=True)
        row = view.key_row
        if row is not None and row.state != "DEAD":
            raise ApiError(
                "INTENT_ALREADY_SUBMITTED",
                detail="this idempotency key was used for another transaction",
                details={"intent": intent_from_row(row, self.network.params.round_duration_ms).model_dump()},
            )
        occupier = next((r for r in view.at_nonce if r.state in ("COSIGNED", "BROADCAST")), None)
        raise ApiError(
            "NONCE_IN_FLIGHT",
            detail="another submission took this nonce first",
            details={
                "occupiedBy": {
                    "id": f"{parsed.sender}:{parsed.tx.nonce}",
                    "txHash": occupier.tx_hash if occupier else None,
                },
                "pinnedNonce": parsed.tx.nonce,
            },
        )

    def _stored_response(self, row: Rec, *, duplicate: bool) -> tuple[int, RelayResponse]:
        return stored_response(row, self.network.params.round_duration_ms, duplicate=duplicate)

    def _record_rejection(
        self,
        sender: str,
        nonce: int,
        hash_: str | None,
        error: ApiError,
        request_id: str,
        received_ms: int,
    ) -> None:
        values = {
            "sender": sender,
            "nonce": nonce,
            "tx_hash": hash_,
            "code": error.code,
            "status": error.status,
            "detail": error.detail[:500] if error.detail else None,
            "host_id": self.config.host_id,
            "request_id": request_id,
            "received_at_ms": received_ms,
        }

        async def write() -> None:
            try:
                await self.repo.record_rejection(values)
            except Exception as exc:  # best effort: the client already has its answer
                log.warning("could not record a rejection", error=type(exc).__name__)

        task = asyncio.create_task(write())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
