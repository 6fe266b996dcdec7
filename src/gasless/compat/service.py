"""The compat facade on the one relay core (docs/compat.md, "Compat relay rules").

- The relayer of a user is a rendezvous (highest-random-weight) choice over its shard's active relayers
  (the contract's states, never funding): a pure function of the user and that set, with no state and no
  lease, so the same on every host and after every restart. It moves only when its relayer leaves the
  active set, or for the few users a relayer joining the shard outscores; an answer once given stays
  accepted until its relayer is retired (the kit caches it forever). tests/compat pins literal answers.
- `POST /relay` applies the compat limits (gasPrice = the network minimum, gasLimit <= 60 000 000, 1 RU/s
  per sender with a burst of 5), accepts any active or draining relayer of the sender's shard, takes an
  internal lease of 5 000 ms and hands the transaction to the relay core with simulation always on and the
  route recorded on the intent's billing (and usage row). The sender's RU are taken with the billing
  admission (`RelayMode.admit`); a relay above the burst passes on a full bucket, which then refills from
  below zero (`limits.buckets.admits`). The answer is `{"txHash"}` once the commit point is passed;
  statuses are mapped to the kit's in `compat/rendering.py`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from gasless.billing.schedule import ru_for_gas_limit
from gasless.chain.addresses import InvalidAddress, parse_address, shard_of_pubkey
from gasless.chain.codec import WireError, tx_from_wire
from gasless.core.errors import ApiError
from gasless.limits.buckets import RouteLimiter
from gasless.relay.checks import ParsedRelay
from gasless.relay.leases import LeaseCodec
from gasless.relay.relayers import RelayerInfo, RelayerPool
from gasless.relay.service import RelayMode, RelayService

COMPAT_LEASE_MS = 5_000  # docs/compat.md: the internal lease
COMPAT_MAX_GAS_LIMIT = 60_000_000  # docs/compat.md: the gas limit ceiling


def rendezvous(user_pubkey: bytes, relayers: list[RelayerInfo]) -> RelayerInfo | None:
    """Highest random weight: each relayer scores sha256(relayer || user); the best wins. Removing a
    relayer moves only the users it won; adding one takes only the users it now wins."""
    best: tuple[bytes, RelayerInfo] | None = None
    for info in relayers:
        score = hashlib.sha256(parse_address(info.address).get_public_key() + user_pubkey).digest()
        if best is None or score > best[0]:
            best = (score, info)
    return best[1] if best is not None else None


class CompatService:
    def __init__(
        self,
        relay: RelayService,
        relayers: RelayerPool,
        leases: LeaseCodec,
        limits: RouteLimiter,
        *,
        min_gas_price: Callable[[], int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.relay = relay
        self.relayers = relayers
        self.leases = leases
        self.limits = limits
        self.min_gas_price = min_gas_price
        self.clock = clock
        # The sender's RU are taken with the billing admission: a relay refused for good (no plan, a failed
        # simulation) or an identical resubmission takes none, so a 429 is always one a wait clears.
        self.mode = RelayMode(
            route="compat", simulate_always=True, accept_draining=True, admit=self._take_sender_ru
        )

    async def _take_sender_ru(self, parsed: ParsedRelay) -> None:
        cost = ru_for_gas_limit(parsed.tx.gas_limit)
        await self.limits.check("compat_sender", parsed.sender, "sender", cost=cost)

    def relayer_for(self, user: str) -> str:
        try:
            pubkey = parse_address(user).get_public_key()
        except InvalidAddress:
            raise ApiError("NOT_FOUND", detail=f"invalid address: {user}") from None
        shard = shard_of_pubkey(pubkey)
        active = [r for r in self.relayers.all() if r.shard == shard and r.state == "active"]
        chosen = rendezvous(pubkey, active)
        if chosen is None:
            raise ApiError(
                "NO_RELAYER_AVAILABLE",
                detail=f"no active relayer in shard {shard}",
                details={"retryAfterMs": 10_000},
            )
        return chosen.address

    async def submit(self, body: dict[str, Any], *, request_id: str, received_ms: int) -> str:
        transaction = body.get("transaction")
        if not isinstance(transaction, dict):
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="the body needs a `transaction` object",
                details={"field": "transaction"},
            )
        if not transaction.get("signature"):
            raise ApiError(
                "MALFORMED_REQUEST",
                detail="the transaction is not signed: sign it with the sender's key first",
                details={"field": "transaction.signature"},
            )
        # The JS SDK's plain object spells absent members as "" (usernames, an empty relayer signature).
        transaction = {k: v for k, v in transaction.items() if v not in ("", None) or k == "value"}
        try:
            tx = tx_from_wire(transaction)
        except WireError as exc:
            raise ApiError(
                "MALFORMED_REQUEST", detail=f"transaction: {exc}", details={"field": "transaction"}
            ) from None
        minimum = self.min_gas_price()
        if tx.gas_price != minimum:
            # The catalogue's members: the bound crossed (`min` below it, `max` above it) and its limit; on
            # this route both bounds are the network minimum.
            raise ApiError(
                "GAS_PRICE_OUT_OF_RANGE",
                detail=f"gasPrice must be the network minimum {minimum} on this route",
                details={
                    "limit": minimum,
                    "actual": tx.gas_price,
                    "bound": "min" if tx.gas_price < minimum else "max",
                },
            )
        if tx.gas_limit > COMPAT_MAX_GAS_LIMIT:
            raise ApiError(
                "GAS_LIMIT_TOO_HIGH",
                detail=f"gasLimit is at most {COMPAT_MAX_GAS_LIMIT} on this route",
                details={"limit": COMPAT_MAX_GAS_LIMIT, "actual": tx.gas_limit},
            )
        sender = tx.sender.to_bech32()
        relayer = tx.relayer.to_bech32() if tx.relayer is not None and not tx.relayer.is_empty() else ""
        info = self.relayers.get(relayer)
        if info is None:
            raise ApiError(
                "RELAYER_UNKNOWN", detail=f"{relayer or 'no relayer'} is not a relayer of this service"
            )
        if info.state == "retired":
            raise ApiError(
                "RELAYER_RETIRED",
                detail=f"relayer {relayer} is retired: delete .relayer_cache.json and ask "
                f"GET /relayer/address/{sender} again",
            )
        sender_shard = shard_of_pubkey(tx.sender.get_public_key())
        if info.shard != sender_shard:
            raise ApiError(
                "RELAYER_SHARD_MISMATCH",
                detail=f"relayer {relayer} is in shard {info.shard}, the sender in shard {sender_shard}",
                details={"senderShard": sender_shard, "relayerShard": info.shard},
            )
        now = int(self.clock() * 1000)
        lease, _ = self.leases.mint(
            sender=sender,
            relayer=relayer,
            kind="std",
            now_ms=now,
            pin_nonce=tx.nonce,
            validity_ms=COMPAT_LEASE_MS,
        )
        raw = json.dumps({"tx": transaction, "lease": lease}, separators=(",", ":")).encode()
        _, response = await self.relay.relay(
            raw,
            idempotency_key=None,
            sponsor=None,
            request_id=request_id,
            received_ms=received_ms,
            mode=self.mode,
        )
        return response.txHash
