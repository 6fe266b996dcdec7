"""Key custody and co-signing. The hot path sees only the `Signer` interface: relayer keys from PEM files
(`PemSigner`) or held in a PKCS#11 token (`Pkcs11Signer`, docs/keys.md), chosen by `open_signer`. The
billing contract owner's key is held the same way (`OwnerSigner`: `PemOwnerSigner`, `Pkcs11OwnerSigner`),
chosen by `open_owner_signer`."""

from gasless.signer.base import (
    RelayerKey,
    Signer,
    SignerError,
    SignerFenced,
    SignerTimeout,
    SignerUnavailable,
    sign_with_deadline,
)
from gasless.signer.custody import open_owner_signer, open_signer
from gasless.signer.fence import FencedSigner
from gasless.signer.owner import OwnerKeyRefused, OwnerSigner, PemOwnerSigner, Pkcs11OwnerSigner
from gasless.signer.pem import PemSigner
from gasless.signer.pkcs11 import Pkcs11Signer

__all__ = [
    "FencedSigner",
    "OwnerKeyRefused",
    "OwnerSigner",
    "PemOwnerSigner",
    "PemSigner",
    "Pkcs11OwnerSigner",
    "Pkcs11Signer",
    "RelayerKey",
    "Signer",
    "SignerError",
    "SignerFenced",
    "SignerTimeout",
    "SignerUnavailable",
    "open_owner_signer",
    "open_signer",
    "sign_with_deadline",
]
