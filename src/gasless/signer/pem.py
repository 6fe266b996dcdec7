"""Relayer keys from PEM files, one or more per shard, signing in process."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from multiversx_sdk import UserPEM, UserSecretKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.signer.base import RelayerKey, SignerUnavailable


class PemSigner:
    """Signs with secret keys loaded from PEM files (the embedded default and small deployments)."""

    def __init__(self, keys: Iterable[UserSecretKey]) -> None:
        self._keys: dict[str, UserSecretKey] = {}
        self._relayers: list[RelayerKey] = []
        for key in keys:
            pubkey = key.generate_public_key().buffer
            address = address_of(pubkey)
            self._keys[address.to_bech32()] = key
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
        # Ed25519 signing is ~50 us: cheaper inline than a thread hop.
        return key.sign(message)

    def check(self) -> None:
        if not self._keys:
            raise SignerUnavailable("no relayer keys loaded")
