"""The billing contract owner's key: it signs the settlement worker's `settleUsage` batches and the contract
calls of `gasless admin`. It is held as the relayer keys are (docs/keys.md): a wallet PEM file read into
the process (`PemOwnerSigner`; `GASLESS_SIGNER=pem`, `GASLESS_OWNER_KEY_FILE`), or a key in the PKCS#11
token that signs inside it and is never read out (`Pkcs11OwnerSigner`; `pkcs11`,
`GASLESS_PKCS11_OWNER_KEY`). `OwnerTransactor` (gasless.settlement.owner_tx) sees only `OwnerSigner`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from multiversx_sdk import UserPEM, UserSecretKey

from gasless.chain.addresses import KnownAddress, address_of
from gasless.signer.pkcs11 import Pkcs11Config, Pkcs11Signer


class OwnerKeyRefused(Exception):
    """The owner key cannot be used as configured (a file that is not a wallet PEM, a key the token does not
    hold as a signing key that cannot be exported, a PIN the token refuses)."""


class OwnerSigner(Protocol):
    """The contract owner's address and its Ed25519 signatures."""

    @property
    def address(self) -> KnownAddress:
        """The owner's address (its public key's)."""
        ...

    async def sign(self, message: bytes) -> bytes:
        """A raw Ed25519 signature of `message` (a transaction's signing bytes); a SignerError when the
        key's store cannot sign now."""
        ...

    async def aclose(self) -> None:
        """Let go of the key's store (a token's sessions); nothing for a PEM key."""
        ...


class PemOwnerSigner:
    """The owner key read from its wallet PEM file, signing in process (the multiversx-sdk key)."""

    def __init__(self, key: UserSecretKey) -> None:
        self._key = key
        self._address = address_of(key.generate_public_key().buffer)

    @classmethod
    def from_file(cls, path: Path) -> PemOwnerSigner:
        return cls(UserPEM.from_file(Path(path)).secret_key)

    @property
    def address(self) -> KnownAddress:
        return self._address

    async def sign(self, message: bytes) -> bytes:
        return bytes(self._key.sign(message))

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class Pkcs11OwnerSigner:
    """The owner key held in the PKCS#11 token. It signs through a `Pkcs11Signer` of one session on that one
    key, so it is found and checked (Ed25519, sensitive, not extractable, its public key matching), each
    signature verified, its token watched and recovered, exactly as a relayer key is."""

    def __init__(self, signer: Pkcs11Signer) -> None:
        [key] = signer.keys
        self._signer = signer
        self._address = address_of(key.pubkey)
        self._bech32 = self._address.to_bech32()

    @classmethod
    def open(cls, config: Pkcs11Config) -> Pkcs11OwnerSigner:
        """Load the module, log in, find and check the key (blocking; a host runs it in a thread).
        Pkcs11Refused: the configuration is wrong; Pkcs11Unavailable: the token cannot be used now."""
        if len(config.keys) != 1:
            raise ValueError("the owner signer holds exactly one key")
        return cls(Pkcs11Signer.open(config))

    @property
    def address(self) -> KnownAddress:
        return self._address

    def unavailable(self) -> str | None:
        """Why the token cannot sign now (None: it can)."""
        return self._signer.unavailable()

    async def sign(self, message: bytes) -> bytes:
        return await self._signer.sign(self._bech32, message)

    def close(self) -> None:
        self._signer.close()

    async def aclose(self) -> None:
        await self._signer.aclose()
