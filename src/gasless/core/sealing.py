"""Sealed storage of secrets at rest: AES-256-GCM under an HKDF purpose key (bound to env + chainId).

A sealed value is `v1.<base64url(nonce || ciphertext+tag)>`; the associated data binds it to its row (a
webhook id, an idempotency record), so a sealed value copied into another row does not open.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode

_VERSION = "v1."
_NONCE_BYTES = 12


class SealBroken(Exception):
    """A sealed value that does not open (other environment, other row, tampered or corrupt)."""


def seal(keys: PurposeKeys, purpose: str, plaintext: bytes, associated: bytes) -> str:
    nonce = os.urandom(_NONCE_BYTES)
    return _VERSION + b64url(nonce + AESGCM(keys.key(purpose)).encrypt(nonce, plaintext, associated))


def unseal(keys: PurposeKeys, purpose: str, sealed: str, associated: bytes) -> bytes:
    if not sealed.startswith(_VERSION):
        raise SealBroken("unknown seal version")
    try:
        raw = b64url_decode(sealed[len(_VERSION) :])
        return AESGCM(keys.key(purpose)).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], associated)
    except (ValueError, InvalidTag):
        raise SealBroken("sealed value does not open") from None
