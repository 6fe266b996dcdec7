"""The signer interface and its failure kinds (each maps to one catalogue code)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from gasless.chain.addresses import KnownAddress


class SignerError(Exception):
    code = "SIGNER_UNAVAILABLE"


class SignerUnavailable(SignerError):
    """The signer cannot be reached (remote signer down, key not loaded)."""

    code = "SIGNER_UNAVAILABLE"


class SignerTimeout(SignerError):
    """The signer did not answer before its deadline; the signature, if made later, is discarded."""

    code = "SIGNER_TIMEOUT"


class SignerFenced(SignerError):
    """The signer cannot prove it is the only writer for its identity and refuses to sign."""

    code = "SIGNER_FENCED"


@dataclass(frozen=True)
class RelayerKey:
    address: KnownAddress
    shard: int

    @property
    def bech32(self) -> str:
        return self.address.to_bech32()


class Signer(Protocol):
    """Co-signs as one of the service's relayers. A signer whose keys live in a store that can fail while
    the host runs (a PKCS#11 token) also offers `unavailable() -> str | None`, why it cannot sign now, which
    makes the host unready (FencedSigner.readiness)."""

    def relayers(self) -> list[RelayerKey]:
        """Every relayer this signer holds a key for."""
        ...

    async def sign(self, relayer: str, message: bytes) -> bytes:
        """A raw Ed25519 signature of `message` by `relayer`'s key (the tx signing bytes)."""
        ...

    def check(self) -> None:
        """Raise a SignerError when the signer cannot sign right now (used by assign)."""
        ...


async def sign_with_deadline(signer: Signer, relayer: str, message: bytes, deadline_ms: int) -> bytes:
    """The relayer signature, or SignerTimeout when it is not back within `deadline_ms`."""
    try:
        # asyncio.timeout, not wait_for: no task per signature, so a signer that answers at once (the PEM
        # one) costs no trip through the event loop's queue.
        async with asyncio.timeout(deadline_ms / 1000):
            return await signer.sign(relayer, message)
    except TimeoutError:
        raise SignerTimeout(f"signer did not answer within {deadline_ms} ms") from None
