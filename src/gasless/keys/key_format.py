"""Sponsor API key strings: `gls_<env>_<keyId><secret><checksum>`.

 env       `live` or `test` (the host's `Settings.key_env`); a key only ever works in its own environment
 keyId     16 base62 characters, public (listed, shown in usage rows as `apiKeyId`)
 secret    32 base62 characters from the OS CSPRNG (about 190 bits)
 checksum  6 base62 characters: CRC-32 of everything before it, so a typo or a truncated paste is caught
           before any lookup, and secret scanners can tell a real key from a look-alike offline

The checksum is not a security measure (anyone can compute it); the service stores only an HMAC of the
whole string under a purpose key bound to env + chainId and compares HMACs in constant time.
"""

from __future__ import annotations

import re
import secrets
import zlib
from dataclasses import dataclass

PREFIX = "gls_"
ENVIRONMENTS = ("live", "test")
KEY_ID_CHARS = 16
SECRET_CHARS = 32
CHECKSUM_CHARS = 6
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

_KEY = re.compile(
    rf"gls_(?P<env>[a-z]+)_(?P<key_id>[0-9A-Za-z]{{{KEY_ID_CHARS}}})"
    rf"(?P<secret>[0-9A-Za-z]{{{SECRET_CHARS}}})(?P<checksum>[0-9A-Za-z]{{{CHECKSUM_CHARS}}})"
)
KEY_ID_PATTERN = re.compile(rf"[0-9A-Za-z]{{{KEY_ID_CHARS}}}")


class KeyFormatError(ValueError):
    """Not a well-formed key; `reason` is `malformed` or `checksum`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ParsedKey:
    env: str
    key_id: str


def _base62(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, digit = divmod(value, 62)
        digits.append(BASE62[digit])
    return "".join(reversed(digits))


def _random_base62(length: int) -> str:
    return "".join(secrets.choice(BASE62) for _ in range(length))


def checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode("ascii")), CHECKSUM_CHARS)


def new_key_id() -> str:
    return _random_base62(KEY_ID_CHARS)


def make_key(env: str, key_id: str) -> str:
    """A new key string for `key_id` in `env`, with a fresh secret."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"unknown key environment {env!r}")
    if not KEY_ID_PATTERN.fullmatch(key_id):
        raise ValueError("key id must be 16 base62 characters")
    body = f"{PREFIX}{env}_{key_id}{_random_base62(SECRET_CHARS)}"
    return body + checksum(body)


def display_prefix(env: str, key_id: str) -> str:
    """What a dashboard shows to identify a key without its secret: `gls_<env>_<keyId>`."""
    return f"{PREFIX}{env}_{key_id}"


def looks_like_key(value: str) -> bool:
    """True for anything shaped like one of our keys (used to spot a key sent in the wrong header)."""
    return value.startswith(PREFIX)


def parse_key(value: str) -> ParsedKey:
    """The environment and id of a well-formed key; KeyFormatError otherwise (nothing is looked up)."""
    match = _KEY.fullmatch(value)
    if match is None or match["env"] not in ENVIRONMENTS:
        raise KeyFormatError(
            "malformed",
            "the key is not a well-formed gasless key (gls_live_... or gls_test_..., 63 characters)",
        )
    expected = checksum(value[:-CHECKSUM_CHARS])
    if not secrets.compare_digest(expected, match["checksum"]):
        raise KeyFormatError("checksum", "the key's checksum does not match (mistyped or truncated key?)")
    return ParsedKey(env=match["env"], key_id=match["key_id"])
