"""Relayer key custody and co-signing. The hot path sees only the `Signer` interface, so a KMS or HSM
signer can replace the PEM one without touching the relay code."""

from gasless.signer.base import (
    RelayerKey,
    Signer,
    SignerError,
    SignerFenced,
    SignerTimeout,
    SignerUnavailable,
    sign_with_deadline,
)
from gasless.signer.fence import FencedSigner
from gasless.signer.pem import PemSigner

__all__ = [
    "FencedSigner",
    "PemSigner",
    "RelayerKey",
    "Signer",
    "SignerError",
    "SignerFenced",
    "SignerTimeout",
    "SignerUnavailable",
    "sign_with_deadline",
]
