"""Purpose keys derived from the environment's master secret, and the MAC helpers built on them.

One master secret per environment (`live`, `test`); every purpose gets its own key by HKDF-SHA256 with the
purpose, the environment and the chain id in `info`, so a lease minted for devnet never verifies on
mainnet and a lease key never doubles as a quote key. Hosts `a` and `b` share the master secret and so
accept each other's leases and quotes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from functools import lru_cache

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PURPOSES = (
    "lease",
    "quote",
    "flags",
    "ticket",
    "api-key",
    "webhook-seal",
    "idempotency-seal",
    "cursor",
    "fence",
    "action",
    "email-verify",
)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class PurposeKeys:
    """The derived keys of one environment (`env` is `live` or `test`) on one chain."""

    master_secret: bytes = field(repr=False)
    env: str
    chain_id: str

    def key(self, purpose: str) -> bytes:
        if purpose not in PURPOSES:
            raise ValueError(f"unknown key purpose {purpose!r}")
        return _derive(self.master_secret, f"gasless/{purpose}/v1|{self.env}|{self.chain_id}".encode())

    def mac(self, purpose: str, message: bytes) -> bytes:
        return hmac.new(self.key(purpose), message, hashlib.sha256).digest()

    def verify(self, purpose: str, message: bytes, tag: bytes) -> bool:
        # Constant-time: a timing side channel must not reveal how many MAC bytes matched.
        return hmac.compare_digest(self.mac(purpose, message), tag)


@lru_cache(maxsize=64)
def _derive(master: bytes, info: bytes) -> bytes:
    # HKDF is deterministic; memoising keeps it off the hot path (a handful of purposes per environment).
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master)
