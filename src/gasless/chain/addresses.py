"""Addresses on multiversx-sdk, with the decoding cached.

Decoding bech32 in the SDK is pure Python (about 130 us each); a relayer sees the same few addresses over
and over (its own relayers, the contract, frequent senders), so parsed addresses are memoised and carry
their bech32 text, which the SDK's signing-bytes serializer then reads instead of re-encoding.
"""

from __future__ import annotations

from functools import lru_cache

from multiversx_sdk import Address
from multiversx_sdk.core.address import get_shard_of_pubkey
from multiversx_sdk.core.constants import METACHAIN_ID

HRP = "erd"
NUM_SHARDS = 3
METACHAIN = METACHAIN_ID


class InvalidAddress(ValueError):
    """Not a bech32 address of this network (bad checksum, wrong prefix, wrong length, mixed case)."""


class KnownAddress(Address):
    """An SDK Address that remembers its bech32 form and can be hashed (dict keys, sets)."""

    __slots__ = ("_bech32",)

    def __init__(self, pubkey: bytes, bech32: str) -> None:
        super().__init__(pubkey, HRP)
        self._bech32 = bech32

    def to_bech32(self) -> str:
        return self._bech32

    def __hash__(self) -> int:
        return hash(self.pubkey)

    def __repr__(self) -> str:
        return f"Address({self._bech32})"


@lru_cache(maxsize=131_072)
def parse_address(value: str) -> KnownAddress:
    """A bech32 `erd1...` address, or InvalidAddress."""
    if not isinstance(value, str) or not value or value != value.lower():
        raise InvalidAddress(f"invalid address: {value!r}")
    try:
        parsed = Address.new_from_bech32(value)
    except Exception as exc:  # the SDK raises several error types for bad input
        raise InvalidAddress(f"invalid address: {value!r}") from exc
    if parsed.get_hrp() != HRP or len(parsed.get_public_key()) != 32:
        raise InvalidAddress(f"invalid address: {value!r}")
    return KnownAddress(parsed.get_public_key(), value)


@lru_cache(maxsize=131_072)
def address_of(pubkey: bytes) -> KnownAddress:
    """The address of a 32-byte public key."""
    if len(pubkey) != 32:
        raise InvalidAddress("a public key has 32 bytes")
    return KnownAddress(pubkey, Address(pubkey, HRP).to_bech32())


def is_address(value: object) -> bool:
    try:
        parse_address(value)  # type: ignore[arg-type]
        return True
    except InvalidAddress:
        return False


def shard_of_pubkey(pubkey: bytes, num_shards: int = NUM_SHARDS) -> int:
    return get_shard_of_pubkey(pubkey, num_shards)


def shard_of(address: str | Address, num_shards: int = NUM_SHARDS) -> int:
    if isinstance(address, str):
        address = parse_address(address)
    return get_shard_of_pubkey(address.get_public_key(), num_shards)


def is_contract_pubkey(pubkey: bytes) -> bool:
    return pubkey[:8] == b"\x00" * 8
