"""Accounts of the simulated network: EGLD balance, nonce, ESDT balances, guardian, contract code."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gasless.chain.addresses import shard_of_pubkey


class ContractCode(Protocol):
    """What the world state needs of a contract model (`gasless.localnet.vm.Contract`): its state, which a
    dry run's journal copies and restores."""

    name: str
    state: Any


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
    contract: ContractCode | None = None
    owner: bytes | None = None  # contract owner

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.pubkey)

    @property
    def is_guarded(self) -> bool:
        return self.guardian is not None


class WorldState:
    """All accounts, keyed by public key. An unknown key reads as an empty account that does not exist.

    A journal (see `journaled`) records the first-touch copy of every account and contract state written
    during a dry run (simulation, cost estimation), so the run can be undone exactly.
    """

    def __init__(self) -> None:
        self.accounts: dict[bytes, Account] = {}
        self._journal: dict[bytes, tuple[Account | None, Any]] | None = None

    def exists(self, pubkey: bytes) -> bool:
        return pubkey in self.accounts

    def get(self, pubkey: bytes) -> Account:
        """The account for writing, created empty on first touch."""
        account = self.accounts.get(pubkey)
        if self._journal is not None and pubkey not in self._journal:
            self._journal[pubkey] = _journal_copy(account)
        if account is None:
            account = Account(pubkey=pubkey)
            self.accounts[pubkey] = account
        return account

    @contextmanager
    def journaled(self) -> Iterator[None]:
        """Everything written inside is undone on exit (for simulation and cost estimation)."""
        if self._journal is not None:
            raise RuntimeError("journals do not nest")
        self._journal = {}
        try:
            yield
        finally:
            journal, self._journal = self._journal, None
            for pubkey, (saved, contract_state) in journal.items():
                if saved is None:
                    self.accounts.pop(pubkey, None)
                    continue
                self.accounts[pubkey] = saved
                if saved.contract is not None:
                    saved.contract.state = contract_state

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


def _journal_copy(account: Account | None) -> tuple[Account | None, Any]:
    if account is None:
        return None, None
    # The contract object itself is shared; only its state is copied.
    saved = replace(account, esdt=dict(account.esdt))
    state = copy.deepcopy(account.contract.state) if account.contract is not None else None
    return saved, state
