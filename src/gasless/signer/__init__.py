"""Relayer key custody and co-signing. The hot path sees only the `Signer` interface: keys from PEM files
(`PemSigner`) or held in a PKCS#11 token (`Pkcs11Signer`, docs/keys.md), chosen by `open_signer`."""

from gasless.signer.base import (
    RelayerKey,
    Signer,
    SignerError,
    SignerFenced,
    SignerTimeout,
    SignerUnavailable,
    sign_with_deadline,
)
from gasless.signer.custody import open_signer
from gasless.signer.fence import FencedSigner
from gasless.signer.pem import PemSigner
from gasless.signer.pkcs11 import Pkcs11Signer

__all__ = [
    "FencedSigner",
    "PemSigner",
    "Pkcs11Signer",
    "RelayerKey",
    "Signer",
    "SignerError",
    "SignerFenced",
    "SignerTimeout",
    "SignerUnavailable",
    "open_signer",
    "sign_with_deadline",
]
