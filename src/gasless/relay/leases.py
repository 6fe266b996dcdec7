"""Leases: `base64url(json payload).base64url(HMAC-SHA256)` under the environment's lease key.

The payload names the environment, chain, sender and relayer, the kind (`std`, `sponsor`, `cancel`,
`free`), an optional pinned nonce, issue and expiry times, and for a `renewFor` lease the hash of the
already signed transaction. Any host holding the environment's master secret verifies any host's lease.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode

LEASE_VERSION = 1
LEASE_VALIDITY_MS = 600_000
MAX_LEASE_CHARS = 2_048

LeaseKind = Literal["std", "sponsor", "cancel", "free"]
LEASE_KINDS = ("std", "sponsor", "cancel", "free")


class LeaseInvalid(ValueError):
    """The lease did not verify (bad form, bad MAC, another environment)."""


@dataclass(frozen=True)
class Lease:
    v: int
    env: str
    chainId: str
    sender: str
    relayer: str
    kind: str
    pinNonce: int | None
    issuedAtMs: int
    expiresAtMs: int
    txHash: str | None = None

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.expiresAtMs


class LeaseCodec:
    def __init__(self, keys: PurposeKeys) -> None:
        self.keys = keys

    def mint(
        self,
        *,
        sender: str,
        relayer: str,
        kind: LeaseKind,
        now_ms: int,
        pin_nonce: int | None = None,
        tx_hash: str | None = None,
        validity_ms: int = LEASE_VALIDITY_MS,
    ) -> tuple[str, Lease]:
        lease = Lease(
            v=LEASE_VERSION,
            env=self.keys.env,
            chainId=self.keys.chain_id,
            sender=sender,
            relayer=relayer,
            kind=kind,
            pinNonce=pin_nonce,
            issuedAtMs=now_ms,
            expiresAtMs=now_ms + validity_ms,
            txHash=tx_hash,
        )
        payload = json.dumps(asdict(lease), separators=(",", ":"), sort_keys=True).encode()
        return f"{b64url(payload)}.{b64url(self.keys.mac('lease', payload))}", lease

    def verify(self, token: object) -> Lease:
        if not isinstance(token, str) or not token or len(token) > MAX_LEASE_CHARS or token.count(".") != 1:
            raise LeaseInvalid("lease is not of the form payload.mac")
        body, tag = token.split(".")
        try:
            payload, mac = b64url_decode(body), b64url_decode(tag)
        except ValueError:
            raise LeaseInvalid("lease is not base64url") from None
        if b64url(payload) != body or b64url(mac) != tag:
            # Only the canonical spelling is the lease: no second spelling of the same bytes verifies.
            raise LeaseInvalid("lease is not canonical base64url")
        if not self.keys.verify("lease", payload, mac):
            raise LeaseInvalid("lease MAC does not verify for this environment")
        try:
            fields = json.loads(payload)
            lease = Lease(**fields)
        except (ValueError, TypeError):
            raise LeaseInvalid("lease payload is malformed") from None
        # The key is bound to env + chain already; the explicit check documents it and catches key reuse.
        if lease.v != LEASE_VERSION or lease.env != self.keys.env or lease.chainId != self.keys.chain_id:
            raise LeaseInvalid("lease belongs to another environment")
        if lease.kind not in LEASE_KINDS:
            raise LeaseInvalid("lease kind unknown")
        return lease
