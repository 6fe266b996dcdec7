"""The sender's key on the integrator's side: signing transactions (the SDK's way) and presence proofs.

`TxSigner` is what the flow needs from a key holder: its bech32 `address`, raw Ed25519 `sign` (presence
proofs) and `sign_transaction` (the SDK's `compute_bytes_for_signing`). `UserKey` is the PEM / hex one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from multiversx_sdk import Account, Transaction, UserPEM, UserSecretKey

from gasless.chain.addresses import HRP, shard_of_pubkey
from gasless.relay.checks import presence_message


@runtime_checkable
class TxSigner(Protocol):
    """Anything that can sign for one sender (a PEM key, a hardware wallet adapter, a KMS)."""

    @property
    def address(self) -> str: ...

    def sign(self, message: bytes) -> bytes:
        """A raw Ed25519 signature of `message` (no wallet prefix)."""
        ...

    def sign_transaction(self, tx: Transaction) -> bytes:
        """Sign `tx` as its sender: set `tx.signature` and return it."""
        ...


class UserKey:
    """A sender's secret key (wraps the SDK's `UserSecretKey`)."""

    def __init__(self, secret_key: UserSecretKey) -> None:
        if not isinstance(secret_key, UserSecretKey):
            raise TypeError("secret_key must be a multiversx_sdk UserSecretKey")
        self.secret_key = secret_key
        self._account = Account(secret_key, hrp=HRP)

    @classmethod
    def from_pem(cls, path: str | Path, index: int = 0) -> UserKey:
        return cls(UserPEM.from_file(Path(path), index).secret_key)

    @classmethod
    def from_secret_hex(cls, secret_hex: str) -> UserKey:
        return cls(UserSecretKey.new_from_string(secret_hex))

    @classmethod
    def generate(cls) -> UserKey:
        return cls(UserSecretKey.generate())

    @property
    def address(self) -> str:
        return self._account.address.to_bech32()

    @property
    def public_key(self) -> bytes:
        return self._account.address.get_public_key()

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._account.sign(message)

    def sign_transaction(self, tx: Transaction) -> bytes:
        if tx.sender.to_bech32() != self.address:
            raise ValueError(f"the transaction's sender is {tx.sender.to_bech32()}, not {self.address}")
        tx.signature = self._account.sign_transaction(tx)
        return tx.signature

    def to_pem_text(self, label: str | None = None) -> str:
        return UserPEM(label or self.address, self.secret_key).to_text()

    def __repr__(self) -> str:
        return f"UserKey({self.address})"


def presence_proof(
    secret_key: UserSecretKey | TxSigner,
    sender: str,
    chain_id: str,
    server_time_ms: int | None = None,
    kind: str = "key",
) -> dict[str, Any]:
    """The assign presence proof: raw Ed25519 over `relay/assign/v1|<chainId>|<sender>|<serverTimeMs>`."""
    if kind not in ("key", "sponsor"):
        raise ValueError("kind is 'key' or 'sponsor'")
    at_ms = int(time.time() * 1000) if server_time_ms is None else int(server_time_ms)
    signature = secret_key.sign(presence_message(chain_id, sender, at_ms))
    return {"kind": kind, "serverTimeMs": at_ms, "signature": signature.hex()}
