"""POST /v1/relay/assign: presence, a relayer of the sender's shard, and a lease for it.

Presence is a raw Ed25519 signature by the sender over `relay/assign/v1|<chainId>|<sender>|<serverTimeMs>`
(within +/- 30 000 ms of our clock), or a native-auth bearer token of the same address. The sponsor key
is never read here. A host whose clock is not synchronised with the chain mints no leases.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

from gasless.auth.native_auth import BlockUnavailable, NativeAuthError, NativeAuthVerifier
from gasless.chain.addresses import InvalidAddress, parse_address, shard_of_pubkey
from gasless.chain.codec import signing_bytes, tx_hash, verify_ed25519
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkView
from gasless.core.errors import ApiError
from gasless.limits.buckets import Decision, RouteLimiter, local_route_limiter
from gasless.relay.checks import parse_transaction, presence_message
from gasless.relay.leases import LeaseCodec, LeaseKind
from gasless.relay.relayers import RelayerInfo, RelayerPool
from gasless.relay.repository import IntentRepository
from gasless.relay.schemas import Assignment, AssignRequest
from gasless.signer import Signer, SignerError

PROOF_TOLERANCE_MS = 30_000
MAX_CLOCK_OFFSET_MS = 5_000


async def next_free_nonce(
    gateway: GatewayClient, repo: IntentRepository, sender: str, now_ms: int, *, unavailable: str
) -> int:
    """The sender's next free nonce: past its account nonce, the pool and this service's own in-flight
    intents. UPSTREAM_UNAVAILABLE (`unavailable` as its detail) when no gateway answers."""
    try:
        account, pool = await asyncio.gather(
            gateway.account(sender), gateway.pool_for_sender(sender, fields="nonce")
        )
    except (GatewayUnavailable, GatewayRejected) as exc:
        raise ApiError("UPSTREAM_UNAVAILABLE", detail=unavailable, details={"retryAfterMs": 1_000}) from exc
    nonce = int(account.get("nonce", 0))
    pooled = [int(entry["nonce"]) for entry in pool if "nonce" in entry]
    view = await repo.sender_view(sender, nonce, None, now_ms)
    ours = view.highest_in_flight_nonce
    return max([nonce, *(n + 1 for n in pooled), *([ours + 1] if ours is not None else [])])


class AssignService:
    def __init__(
        self,
        *,
        chain_id: str,
        network: NetworkView,
        leases: LeaseCodec,
        relayers: RelayerPool,
        signer: Signer,
        repo: IntentRepository,
        native_auth: NativeAuthVerifier | None,
        max_clock_offset_ms: int = MAX_CLOCK_OFFSET_MS,
        clock: Callable[[], float] = time.time,
        limits: RouteLimiter | None = None,
        gateway: GatewayClient | None = None,
    ) -> None:
        self.chain_id = chain_id
        self.gateway = gateway  # reads the sender's nonce when a request asks for it (withNextNonce)
        self.network = network
        self.leases = leases
        self.relayers = relayers
        self.signer = signer
        self.repo = repo
        self.native_auth = native_auth
        self.max_clock_offset_ms = max_clock_offset_ms
        self.clock = clock
        # The per-IP limit is the route's; the per-sender one needs the proven sender, so it is applied here.
        self.limits = limits if limits is not None else local_route_limiter()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def clock_synchronised(self) -> bool:
        offset = self.network.clock_offset_ms()
        return offset is not None and abs(offset) <= self.max_clock_offset_ms

    async def assign(
        self,
        request: AssignRequest,
        *,
        bearer: str | None,
        report: Callable[[Decision], None] | None = None,
    ) -> Assignment:
        """`report` receives the per-sender limit's decision (for the response's RateLimit-* headers)."""
        now = self.now_ms()
        try:
            sender_address = parse_address(request.sender)
        except InvalidAddress:
            raise ApiError(
                "MALFORMED_REQUEST", detail="sender is not a valid erd1 address", details={"field": "sender"}
            ) from None
        sender = sender_address.to_bech32()
        # Before the proof: a host whose clock is off cannot judge a proof's freshness, and a client with a
        # good clock must hear "retry, elsewhere" (503), not that its proof is invalid (found by
        # bench/chaos.py: a host 30 s ahead answered 401 ASSIGN_PROOF_INVALID to every fresh proof).
        self._require_synchronised_clock()
        await self._prove_presence(request, sender, bearer, now)
        decision = await self.limits.check("assign_sender", sender, "sender")
        if report is not None:
            report(decision)
        self._ready_to_mint()
        pubkey = sender_address.get_public_key()
        shard = shard_of_pubkey(pubkey)
        kind: LeaseKind = (
            "sponsor" if request.proof is not None and request.proof.kind == "sponsor" else "std"
        )
        if request.renewFor is not None:
            assignment = await self._renew(request.renewFor, sender, pubkey, shard, kind, now)
        elif request.cancel is not None:
            assignment = await self._cancel(sender, pubkey, shard, request.cancel, now)
        else:
            assignment = self._assignment(sender, self._choose(pubkey, shard), kind, now)
        if request.withNextNonce:
            assignment.nextNonce = await self.next_nonce(sender)
        return assignment

    async def next_nonce(self, sender: str) -> int:
        if self.gateway is None:
            raise ApiError(
                "UPSTREAM_UNAVAILABLE",
                detail="this host reads no nonces (no gateway is configured for it)",
                details={"retryAfterMs": 1_000},
            )
        return await next_free_nonce(
            self.gateway,
            self.repo,
            sender,
            self.now_ms(),
            unavailable="no gateway answered: the sender's nonce could not be read",
        )

    def issue(self, sender: str, kind: LeaseKind, *, pin_nonce: int | None = None) -> Assignment:
        """An assignment for a transaction this service built (the purchase builders): no presence proof,
        since the lease authorises nothing by itself; the user still signs the transaction."""
        now = self.now_ms()
        self._ready_to_mint()
        pubkey = parse_address(sender).get_public_key()
        relayer = self._choose(pubkey, shard_of_pubkey(pubkey))
        return self._assignment(sender, relayer, kind, now, pin_nonce=pin_nonce)

    def _require_synchronised_clock(self) -> None:
        if not self.clock_synchronised():
            raise ApiError(
                "UPSTREAM_UNAVAILABLE",
                detail="this host's clock is not synchronised with the chain; no leases are minted",
                details={"retryAfterMs": 5_000},
            )

    def _ready_to_mint(self) -> None:
        self._require_synchronised_clock()
        try:
            self.signer.check()
        except SignerError as exc:
            raise ApiError(exc.code, detail=str(exc), details={"retryAfterMs": 5_000}) from None

    # Presence -----------------------------------------------------------------------------------------
    async def _prove_presence(
        self, request: AssignRequest, sender: str, bearer: str | None, now: int
    ) -> None:
        if bearer is not None and self.native_auth is not None:
            try:
                identity = await self.native_auth.verify_async(bearer)
            except NativeAuthError as exc:
                raise ApiError(exc.code, detail=exc.message) from None
            except BlockUnavailable:
                raise ApiError(
                    "UPSTREAM_UNAVAILABLE",
                    detail="the token's block could not be looked up on the chain",
                    details={"retryAfterMs": 1_000},
                ) from None
            if identity.address != sender:
                raise ApiError(
                    "ASSIGN_PROOF_INVALID",
                    detail="the native-auth token belongs to another address",
                    details={"serverTimeMs": now},
                )
            return
        proof = request.proof
        if proof is None or (proof.signature is None and proof.serverTimeMs is None):
            raise ApiError(
                "ASSIGN_PROOF_REQUIRED",
                detail="sign relay/assign/v1|<chainId>|<sender>|<serverTimeMs> with the sender key",
                details={"serverTimeMs": now},
            )
        if proof.serverTimeMs is None or proof.signature is None:
            raise self._invalid("the proof needs both serverTimeMs and signature", now)
        if abs(proof.serverTimeMs - now) > PROOF_TOLERANCE_MS:
            raise self._invalid(
                f"serverTimeMs is more than {PROOF_TOLERANCE_MS} ms from the server clock", now
            )
        try:
            signature = bytes.fromhex(proof.signature)
        except ValueError:
            raise self._invalid("signature is not hex", now) from None
        message = presence_message(self.chain_id, sender, proof.serverTimeMs)
        if not verify_ed25519(parse_address(sender).get_public_key(), message, signature):
            raise self._invalid(
                "the signature does not verify (raw Ed25519 over the message, no prefix)", now
            )

    @staticmethod
    def _invalid(detail: str, now: int) -> ApiError:
        return ApiError("ASSIGN_PROOF_INVALID", detail=detail, details={"serverTimeMs": now})

    # Leases -----------------------------------------------------------------------------------------
    def _choose(self, pubkey: bytes, shard: int) -> RelayerInfo:
        relayer = self.relayers.choose(pubkey, shard)
        if relayer is None:
            raise ApiError(
                "NO_RELAYER_AVAILABLE",
                detail=f"no funded, active relayer in shard {shard}",
                details={"retryAfterMs": 10_000},
            )
        return relayer

    def _assignment(
        self,
        sender: str,
        relayer: RelayerInfo,
        kind: LeaseKind,
        now: int,
        *,
        pin_nonce: int | None = None,
        tx_hash_: str | None = None,
    ) -> Assignment:
        token, lease = self.leases.mint(
            sender=sender,
            relayer=relayer.address,
            kind=kind,
            now_ms=now,
            pin_nonce=pin_nonce,
            tx_hash=tx_hash_,
        )
        return Assignment(
            relayer=relayer.address,
            shard=relayer.shard,
            lease=token,
            kind=kind,
            pinNonce=pin_nonce,
            issuedAtMs=lease.issuedAtMs,
            expiresAtMs=lease.expiresAtMs,
            renewable=relayer.assignable,
            serverTimeMs=now,
        )

    async def _renew(
        self, wire: dict[str, Any], sender: str, pubkey: bytes, shard: int, kind: LeaseKind, now: int
    ) -> Assignment:
        tx = parse_transaction(wire, "renewFor")
        if tx.sender.to_bech32() != sender:
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="renewFor is signed by another sender",
                details={"field": "renewFor.sender"},
            )
        relayer_address = (
            tx.relayer.to_bech32() if tx.relayer is not None and not tx.relayer.is_empty() else ""
        )
        info = self.relayers.get(relayer_address)
        if info is None:
            raise ApiError("RELAYER_UNKNOWN", detail=f"{relayer_address or 'no relayer'} is not one of ours")
        if not info.assignable:
            raise self.resign_required(sender, pubkey, shard, tx.nonce)
        signed_hash = tx_hash(tx)
        occupier = await self.repo.by_slot(sender, tx.nonce)
        same_bytes = (
            occupier is not None and occupier.bytes_sha256 == hashlib.sha256(signing_bytes(tx)).hexdigest()
        )
        if occupier is not None and occupier.state in ("COSIGNED", "BROADCAST") and not same_bytes:
            # The renewed transaction replaces an in-flight intent: it keeps its cancel lease's meaning.
            kind = "cancel"
        return self._assignment(sender, info, kind, now, pin_nonce=tx.nonce, tx_hash_=signed_hash)

    async def _cancel(self, sender: str, pubkey: bytes, shard: int, nonce: int, now: int) -> Assignment:
        occupier = await self.repo.by_slot(sender, nonce)
        live = occupier is not None and occupier.state in ("COSIGNED", "BROADCAST")
        if not live:
            raise ApiError("NOTHING_TO_CANCEL", detail=f"no in-flight intent holds nonce {nonce}")
        assert occupier is not None
        info = self.relayers.get(occupier.relayer)
        relayer = info if info is not None and info.assignable else self._choose(pubkey, shard)
        return self._assignment(sender, relayer, "cancel", now, pin_nonce=nonce)

    # Answers the relay route embeds --------------------------------------------------------------------
    def resign_required(self, sender: str, pubkey: bytes, shard: int, nonce: int) -> ApiError:
        relayer = self.relayers.choose(pubkey, shard)
        if relayer is None:
            # No lease flow can continue: there is nobody to re-sign for.
            return ApiError(
                "RELAYER_RETIRED", detail="the relayer is retired and no other relayer is available"
            )
        assignment = self._assignment(sender, relayer, "std", self.now_ms(), pin_nonce=nonce)
        return ApiError(
            "RESIGN_REQUIRED",
            detail="the assigned relayer can no longer be used; sign the same nonce for the new relayer",
            details={"assignment": assignment.model_dump()},
        )

    def resign_same_nonce(
        self, sender: str, pubkey: bytes, shard: int, nonce: int, min_gas_price: int
    ) -> ApiError:
        relayer = self._choose(pubkey, shard)
        assignment = self._assignment(sender, relayer, "cancel", self.now_ms(), pin_nonce=nonce)
        return ApiError(
            "RESIGN_SAME_NONCE",
            detail=f"nonce {nonce} is taken in the pool; re-sign it with a gas price of at least {min_gas_price}",
            details={"assignment": assignment.model_dump(), "minGasPrice": min_gas_price},
        )
