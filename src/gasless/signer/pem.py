"""Relayer keys from PEM files, one or more per shard, signing in process."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from multiversx_sdk import UserPEM, UserSecretKey
from nacl.signing import SigningKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.signer.base import RelayerKey, SignerUnavailable


class PemSigner:
    """Signs with secret keys loaded from PEM files (the embedded default and small deployments)."""

    def __init__(self, keys: Iterable[UserSecretKey]) -> None:
        # The SDK's `UserSecretKey.sign` derives the key pair from the seed again on every call (as costly
        # as the signature itself: 80 against 42 us a signature here); the same PyNaCl signing key it makes
        # is made once per relayer instead. Ed25519 is deterministic: the signatures are the SDK's, byte
        # for byte (and the local network executes a relayed transaction only with a valid one).
        self._keys: dict[str, SigningKey] = {}
        self._relayers: list[RelayerKey] = []
        for key in keys:
            pubkey = key.generate_public_key().buffer
            address = address_of(pubkey)
            self._keys[address.to_bech32()] = SigningKey(key.buffer)
            self._relayers.append(RelayerKey(address, shard_of_pubkey(pubkey)))

    @classmethod
    def from_files(cls, paths: Iterable[Path]) -> PemSigner:
        keys: list[UserSecretKey] = []
        for path in paths:
            try:
                keys.append(UserPEM.from_file(Path(path)).secret_key)
            except (OSError, ValueError) as exc:
                raise SignerUnavailable(f"relayer key {path} could not be loaded: {exc}") from exc
        return cls(keys)

    def relayers(self) -> list[RelayerKey]:
        return list(self._relayers)

    async def sign(self, relayer: str, message: bytes) -> bytes:
        key = self._keys.get(relayer)
        if key is None:
            raise SignerUnavailable(f"no key loaded for relayer {relayer}")
        # Ed25519 signing is ~40 us: cheaper inline than a thread hop.
        return bytes(key.sign(message).signature)

    def check(self) -> None:
        if not self._keys:
            raise SignerUnavailable("no relayer keys loaded")
