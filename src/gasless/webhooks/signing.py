"""Webhook signatures, Stripe-style.

Header `Gasless-Signature: t=<unix ms>,v1=<hex>[,v1=<hex>]` where each `v1` is
`HMAC-SHA256(secret, "{t}.{body}")` in lowercase hex, over the exact body bytes sent. During the
86 400 000 ms after a rotation a delivery carries two `v1` values (new secret first, then the previous
one), so a receiver holding either secret verifies it. `verify_signature` is the receiver's side.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SIGNATURE_HEADER = "Gasless-Signature"
SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_MS = 300_000


def new_secret() -> str:
    """A fresh signing secret: `whsec_` + 32 random bytes in base64url (about 256 bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _mac(secret: str, timestamp_ms: int, body: bytes) -> str:
    message = str(timestamp_ms).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secrets_in_use: list[str], timestamp_ms: int, body: bytes) -> str:
    """The header value for `body` signed at `timestamp_ms` with every secret in use (newest first)."""
    parts = [f"t={timestamp_ms}"] + [f"v1={_mac(secret, timestamp_ms, body)}" for secret in secrets_in_use]
    return ",".join(parts)


def verify_signature(
    secret: str,
    header: str,
    body: bytes,
    tolerance_ms: int = DEFAULT_TOLERANCE_MS,
    *,
    now_ms: int | None = None,
) -> bool:
    """True when `header` carries a `v1` of `body` under `secret` and its `t` is within `tolerance_ms` of
    now (replays of an old delivery are refused). Constant-time comparison; never raises on bad input."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit() and len(value) <= 16:
            timestamp = int(value)
        elif name == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if abs(now - timestamp) > tolerance_ms:
        return False
    expected = _mac(secret, timestamp, body)
    matched = False
    for candidate in candidates:  # compare all, so timing does not reveal which one matched
        matched |= hmac.compare_digest(expected, candidate.lower())
    return matched
