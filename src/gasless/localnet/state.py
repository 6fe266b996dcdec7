"""Accounts of the simulated network: EGLD balance, nonce, ESDT balances, guardian, contract code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gasless.chain.addresses import shard_of_pubkey

if TYPE_CHECKING:
    from gasless.localnet.vm import Contract


@dataclass
class Guardian:
    address: bytes
    activation_epoch: int
    service_uid: str = "localnet"


@dataclass
class Account:
    pubkey: bytes
    nonce: int = 0
    balance: int = 0
    esdt: dict[str, int] = field(default_factory=dict)
    guardian: Guardian | None = None
    username: str = ""
    contract: Contract | None = None
    owner: bytes | None = None  # contract owner

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.pubkey)

    @property
    def is_guarded(self) -> bool:
        return self.guardian is not None


class WorldState:
    """All accounts, keyed by public key. An unknown key reads as an empty account that does not exist."""

    def __init__(self) -> None:
        self.accounts: dict[bytes, Account] = {}

    def exists(self, pubkey: bytes) -> bool:
        return pubkey in self.accounts

    def get(self, pubkey: bytes) -> Account:
        """The account, created empty on first touch (for writes)."""
        account = self.accounts.get(pubkey)
        if account is None:
            account = Account(pubkey=pubkey)
            self.accounts[pubkey] = account
        return account

    def peek(self, pubkey: bytes) -> Account | None:
        return self.accounts.get(pubkey)

    def esdt_balance(self, pubkey: bytes, token: str) -> int:
        account = self.accounts.get(pubkey)
        return account.esdt.get(token, 0) if account else 0

    def move(self, sender: bytes, receiver: bytes, token: str, amount: int) -> None:
        """Move funds that have already been checked to be available."""
        if amount == 0:
            return
        src, dst = self.get(sender), self.get(receiver)
        if token == "EGLD":
            src.balance -= amount
            dst.balance += amount
        else:
            src.esdt[token] = src.esdt.get(token, 0) - amount
            dst.esdt[token] = dst.esdt.get(token, 0) + amount
