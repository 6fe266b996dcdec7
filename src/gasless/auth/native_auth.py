"""MultiversX native-auth tokens, verified against the service's own record of recent blocks.

Same rules as the SDK's `NativeAuthServer` (multiversx_sdk.native_auth), without its HTTP lookups:

 token  = b64url(address) "." b64url(body) "." hex(signature)       (b64url: unpadded; padded accepted)
 body   = b64url(origin) "." blockHash "." ttlSeconds "." b64url(json extraInfo)
 signed = wallet signed message (MessageComputer prefix + keccak) over `address + body`,
          or the legacy `address + body + "{}"`

Checks, in NativeAuthServer's order: decoding, ttl <= max_ttl, origin accepted, block hash known to the record
(issued = its timestamp), not expired on the chain's clock (expires = issued + ttl; expired when expires <
the newest recorded block's timestamp), signature. Differences, all stricter: decoding is strict (canonical
base64url, ASCII decimal ttl, 64 hex block hash, 128 hex signature, extraInfo a JSON object, at most 4096
characters), a wildcard origin matches host labels only, and extraInfo `multisig`/`impersonate` is ignored
(the identity is always the signer). Times are in milliseconds (the record's unit), not seconds.

Successful verifications are cached by token (bounded LRU); expiry is re-checked on every call.

A block hash the record does not hold (minted before this host started, or by a client that read another
shard's block) is looked up on the chain once, as MultiversX's own native-auth server does against its API:
`verify_async` asks the `resolve_block` hook (the gateway's block by hash) after everything else about the
token checked out, signature included, and remembers what it verified (and, for a while, what it did not
find), so a token survives a restart and verifies on every host.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, Protocol

from multiversx_sdk import Message, MessageComputer, UserVerifier

from gasless.chain.addresses import InvalidAddress, KnownAddress, parse_address

TOKEN_INVALID = "TOKEN_INVALID"
TOKEN_EXPIRED = "TOKEN_EXPIRED"

MAX_TOKEN_CHARS = 4096
MAX_TTL_SECONDS = 86_400  # NativeAuthServer's ceiling for max_expiry_seconds
LEGACY_SUFFIX = "{}"

_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_BLOCK_HASH = re.compile(r"[0-9a-fA-F]{64}")
_TTL = re.compile(r"[0-9]{1,10}")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{128}")  # Ed25519: 64 bytes
# What a wildcard `*` may stand for: one or more host labels (no scheme, path, port or userinfo).
_HOST_LABELS = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
_SCHEMES = ("http://", "https://")

_MESSAGE_COMPUTER = MessageComputer()


class NativeAuthError(Exception):
    """A token that does not verify. `code` is the service's error code, the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"NativeAuthError({self.code!r}, {self.message!r})"


def _invalid(message: str) -> NativeAuthError:
    return NativeAuthError(TOKEN_INVALID, message)


class UnknownBlock(NativeAuthError):
    """The token checked out but for its block hash, which the record does not hold."""

    def __init__(self, block_hash: str) -> None:
        super().__init__(TOKEN_INVALID, f"unknown block {block_hash}")
        self.block_hash = block_hash


class BlockUnavailable(Exception):
    """The chain could not be asked about a block (no gateway answered): neither known nor unknown."""


# A block hash the chain did not know is not asked about again for this long (a client's typo, or one
# minting tokens on random hashes, costs one lookup a minute).
UNKNOWN_BLOCK_TTL_S = 60.0
RESOLVED_BLOCKS = 100_000  # block timestamps verified on the chain, kept (LRU)


class BlockLookup(Protocol):
    """The service's own rolling record of recent shard-1 blocks (never a gateway call per request)."""

    def timestamp_ms(self, block_hash: str) -> int | None: ...

    def latest_timestamp_ms(self) -> int | None: ...


@dataclass(frozen=True)
class NativeAuthIdentity:
    address: str  # the signer, bech32
    origin: str
    block_hash: str  # lower-case hex
    ttl_seconds: int
    issued_ms: int  # the block's timestamp
    expires_ms: int  # issued_ms + ttl_seconds * 1000
    extra_info: dict[str, Any]


@dataclass(frozen=True)
class _Wildcard:
    scheme: str  # "", "http://" or "https://"
    suffix: str  # ".example.com" (may carry a port)

    def matches(self, origin: str) -> bool:
        if not (origin.startswith(self.scheme) and origin.endswith(self.suffix)):
            return False
        middle = origin[len(self.scheme) : len(origin) - len(self.suffix)]
        if not self.scheme:  # "*.example.com" accepts the bare host and either scheme, like NativeAuthServer
            for scheme in _SCHEMES:
                if middle.startswith(scheme):
                    middle = middle[len(scheme) :]
                    break
        return _HOST_LABELS.fullmatch(middle) is not None


class NativeAuthVerifier:
    """Verifies native-auth tokens; thread-safe. `verify` returns the identity or raises NativeAuthError."""

    def __init__(
        self,
        blocks: BlockLookup,
        *,
        accepted_origins: Collection[str],
        max_ttl_seconds: int = MAX_TTL_SECONDS,
        cache_size: int = 4096,
        resolve_block: Callable[[str], Awaitable[int | None]] | None = None,
    ) -> None:
        if isinstance(accepted_origins, str) or not accepted_origins:
            raise ValueError("accepted_origins must be a non-empty collection of origins")
        if isinstance(max_ttl_seconds, bool) or not 0 < max_ttl_seconds <= MAX_TTL_SECONDS:
            raise ValueError(f"max_ttl_seconds must be in 1..{MAX_TTL_SECONDS}")
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self.blocks = blocks
        self.max_ttl_seconds = max_ttl_seconds
        self.cache_size = cache_size
        exact: set[str] = set()
        wildcards: list[_Wildcard] = []
        self._any_origin = False
        for origin in accepted_origins:
            if not isinstance(origin, str) or not origin:
                raise ValueError(f"invalid accepted origin: {origin!r}")
            if origin == "*":
                self._any_origin = True
            elif "*" in origin:
                wildcards.append(_parse_wildcard(origin))
            else:
                exact.add(origin)
        self._exact = frozenset(exact)
        self._wildcards = tuple(wildcards)
        self._cache: OrderedDict[str, NativeAuthIdentity] = OrderedDict()
        self._lock = threading.Lock()
        # `resolve_block(hash)`: the block's timestamp (ms) on the chain, None when the chain does not know
        # it; raises BlockUnavailable when it cannot tell.
        self.resolve_block = resolve_block
        self._resolved: OrderedDict[str, int] = OrderedDict()
        self._unknown: dict[str, float] = {}  # block hash -> monotonic time until which it stays unknown

    # Public ---------------------------------------------------------------------------------------------
    def verify(self, token: str) -> NativeAuthIdentity:
        if not isinstance(token, str):
            raise _invalid("the token is not a string")
        if len(token) > MAX_TOKEN_CHARS:
            raise _invalid(f"the token is longer than {MAX_TOKEN_CHARS} characters")

        with self._lock:
            identity = self._cache.get(token)
            if identity is not None:
                self._cache.move_to_end(token)

        if identity is None:
            identity = self._verify_uncached(token)
            if self.cache_size:
                with self._lock:
                    self._cache[token] = identity
                    self._cache.move_to_end(token)
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        else:
            try:
                self._check_expiry(identity)
            except NativeAuthError:
                with self._lock:
                    self._cache.pop(token, None)
                raise

        # The cached identity is shared: hand out a copy of its only mutable part.
        if identity.extra_info:
            identity = replace(identity, extra_info=copy.deepcopy(identity.extra_info))
        return identity

    async def verify_async(self, token: str) -> NativeAuthIdentity:
        """`verify`, and for a block hash the record does not hold, one look at the chain.
        BlockUnavailable when the chain could not be asked (the caller answers 503, not 401)."""
        try:
            return self.verify(token)
        except UnknownBlock as exc:
            if self.resolve_block is None:
                raise
            block_hash = exc.block_hash
            now = time.monotonic()
            if self._unknown.get(block_hash, 0.0) > now:
                raise
            timestamp_ms = await self.resolve_block(block_hash)
            if timestamp_ms is None:
                if len(self._unknown) >= RESOLVED_BLOCKS:
                    self._unknown = {h: t for h, t in self._unknown.items() if t > now}
                self._unknown[block_hash] = now + UNKNOWN_BLOCK_TTL_S
                raise
            with self._lock:
                self._resolved[block_hash] = timestamp_ms
                while len(self._resolved) > RESOLVED_BLOCKS:
                    self._resolved.popitem(last=False)
            return self.verify(token)

    def _block_timestamp_ms(self, block_hash: str) -> int | None:
        found = self.blocks.timestamp_ms(block_hash)
        if found is None:
            with self._lock:
                found = self._resolved.get(block_hash)
        return found

    def is_origin_accepted(self, origin: str) -> bool:
        if self._any_origin or origin in self._exact:
            return True
        # NativeAuthServer also accepts a bare host when "https://host" is accepted.
        if f"https://{origin}" in self._exact:
            return True
        return any(w.matches(origin) for w in self._wildcards)

    # Internals ------------------------------------------------------------------------------------------
    def _verify_uncached(self, token: str) -> NativeAuthIdentity:
        parts = token.split(".")
        if len(parts) != 3:
            raise _invalid("a token has three dot-separated parts")
        address_part, body_part, signature_part = parts

        try:
            address = parse_address(_decode_text(address_part, "address"))
        except InvalidAddress:
            raise _invalid("the token's address is not a valid address") from None

        body = _decode_text(body_part, "body")
        body_fields = body.split(".")
        if len(body_fields) != 4:
            raise _invalid("a token body has four dot-separated parts")
        origin_field, block_hash, ttl_field, extra_field = body_fields

        origin = _decode_text(origin_field, "origin")
        if not _BLOCK_HASH.fullmatch(block_hash):
            raise _invalid("the block hash is not 64 hex digits")
        block_hash = block_hash.lower()
        if not _TTL.fullmatch(ttl_field):
            raise _invalid("the ttl is not a decimal number of seconds")
        ttl = int(ttl_field)
        try:
            extra_info = json.loads(_decode_text(extra_field, "extraInfo"))
        except (ValueError, RecursionError):
            raise _invalid("extraInfo is not JSON") from None
        if not isinstance(extra_info, dict):
            raise _invalid("extraInfo is not a JSON object")
        if not _SIGNATURE.fullmatch(signature_part):
            raise _invalid("the signature is not 64 hex-encoded bytes")
        signature = bytes.fromhex(signature_part)

        if ttl > self.max_ttl_seconds:
            raise _invalid(f"the ttl {ttl} s is above the maximum {self.max_ttl_seconds} s")
        if not self.is_origin_accepted(origin):
            raise _invalid(f"the origin {_shorten(origin)!r} is not accepted")

        issued_ms = self._block_timestamp_ms(block_hash)
        if issued_ms is None:
            # Only a token that is otherwise good earns a look at the chain (verify_async).
            if not _signature_matches(address, body, signature):
                raise _invalid("the signature does not match the token")
            raise UnknownBlock(block_hash)
        identity = NativeAuthIdentity(
            address=address.to_bech32(),
            origin=origin,
            block_hash=block_hash,
            ttl_seconds=ttl,
            issued_ms=issued_ms,
            expires_ms=issued_ms + ttl * 1000,
            extra_info=extra_info,
        )
        self._check_expiry(identity)

        if not _signature_matches(address, body, signature):
            raise _invalid("the signature does not match the token")
        return identity

    def _check_expiry(self, identity: NativeAuthIdentity) -> None:
        latest_ms = self.blocks.latest_timestamp_ms()
        if latest_ms is not None and identity.expires_ms < latest_ms:
            raise NativeAuthError(TOKEN_EXPIRED, "the token has expired (on the chain's clock)")


def _signature_matches(address: KnownAddress, body: str, signature: bytes) -> bool:
    verifier = UserVerifier.from_address(address)
    for signed_text in (f"{address.to_bech32()}{body}", f"{address.to_bech32()}{body}{LEGACY_SUFFIX}"):
        message = Message(data=signed_text.encode(), address=address)
        if verifier.verify(_MESSAGE_COMPUTER.compute_bytes_for_verifying(message), signature):
            return True
    return False


def _decode_text(value: str, what: str) -> str:
    """Strict base64url (padding optional) to UTF-8 text."""
    if not _B64URL.fullmatch(value):
        raise _invalid(f"the {what} is not base64url")
    unpadded = value.rstrip("=")
    if len(unpadded) % 4 == 1 or (unpadded != value and len(value) % 4):
        raise _invalid(f"the {what} is not base64url")
    try:
        raw = base64.urlsafe_b64decode(unpadded + "=" * (-len(unpadded) % 4))
        text = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise _invalid(f"the {what} is not base64url-encoded UTF-8") from None
    # Canonical only (unused trailing bits zero), so one signed token has one spelling.
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != unpadded:
        raise _invalid(f"the {what} is not canonical base64url")
    return text


def _parse_wildcard(origin: str) -> _Wildcard:
    scheme, sep, suffix = origin.partition("*")
    if "*" in suffix or scheme not in ("", *_SCHEMES) or not suffix.startswith(".") or len(suffix) < 2:
        raise ValueError(f"invalid wildcard origin {origin!r} (expected like 'https://*.example.com')")
    return _Wildcard(scheme, suffix)


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
