"""Stateless quotes (design: Quote): an HMAC over the quote's RFC 8785 canonical JSON, including its TTL bucket
`floor(nowMs / 10 000)`, under the environment's `quote` purpose key; the quote id is derived from the MAC.

The same inputs in one bucket give the same MAC and id on host `a` and host `b` (they share the master
secret) and nothing is stored: a quote is verified by recomputing its MAC, never by lookup. A quote of a
bucket is valid 120 000 ms from the bucket's start: never longer than 120 000 ms from its issue, and a client
always holds more than 110 000 ms of validity (`expiresAtMs`, and x402's `maxTimeoutSeconds`, say its real
end).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode

QUOTE_VALIDITY_MS = 120_000  # the interface contract's purchase quote validity
QUOTE_BUCKET_MS = 10_000  # same inputs, same quote within this; a client keeps > 110 000 ms of validity
QUOTE_VERSION = 1


def bucket_of(now_ms: int) -> int:
    return now_ms // QUOTE_BUCKET_MS


def expiry_of(bucket: int) -> int:
    """A quote of `bucket` is valid for QUOTE_VALIDITY_MS from the bucket's start."""
    return bucket * QUOTE_BUCKET_MS + QUOTE_VALIDITY_MS


@dataclass(frozen=True)
class SignedQuote:
    terms: dict[str, Any]  # what was quoted (canonicalised with the bucket)
    bucket: int
    mac: str  # base64url HMAC-SHA256
    quote_id: str  # 64 hex characters: 32 bytes, the contract `ref`
    expires_at_ms: int

    @property
    def ref(self) -> bytes:
        return bytes.fromhex(self.quote_id)


class QuoteSigner:
    def __init__(self, keys: PurposeKeys, *, clock: Callable[[], float] = time.time) -> None:
        self.keys = keys
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _canonical(self, terms: Mapping[str, Any], bucket: int) -> bytes:
        return rfc8785.dumps(
            {
                "v": QUOTE_VERSION,
                "env": self.keys.env,
                "chainId": self.keys.chain_id,
                "bucket": bucket,
                "terms": dict(terms),
            }
        )

    def sign(self, terms: Mapping[str, Any], *, now_ms: int | None = None) -> SignedQuote:
        """The quote of `terms` (JSON values: strings for amounts) in the current bucket."""
        bucket = bucket_of(self.now_ms() if now_ms is None else now_ms)
        mac = self.keys.mac("quote", self._canonical(terms, bucket))
        return SignedQuote(
            terms=dict(terms),
            bucket=bucket,
            mac=b64url(mac),
            quote_id=hashlib.sha256(b"gasless/quote-id/v1|" + mac).hexdigest(),
            expires_at_ms=expiry_of(bucket),
        )

    def verify(self, terms: Mapping[str, Any], bucket: int, mac: str) -> bool:
        """Whether `mac` is this environment's MAC of `terms` in `bucket` (constant time; any other
        environment's or chain's quote fails). Expiry is the caller's check (`expired`)."""
        try:
            tag = b64url_decode(mac)
        except ValueError:
            return False
        if b64url(tag) != mac or isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
            return False
        expected = self.keys.mac("quote", self._canonical(terms, bucket))
        return hmac.compare_digest(expected, tag)

    def expired(self, bucket: int, *, now_ms: int | None = None) -> bool:
        return (self.now_ms() if now_ms is None else now_ms) >= expiry_of(bucket)

    @staticmethod
    def quote_id_of(mac: str) -> str:
        return hashlib.sha256(b"gasless/quote-id/v1|" + b64url_decode(mac)).hexdigest()
