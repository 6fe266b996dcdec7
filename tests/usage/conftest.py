"""Usage tests reuse the auth tests' fixtures (the relay suite's app on a real localnet, real native-auth
tokens, API keys) and add `seed`: ledger rows written straight into the host's database, as the tracker
would write them, for listing and summary tests that need many exactly-known rows."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import pytest
from relay_kit import load_conftest
from sqlalchemy import create_engine, delete, select

from gasless.chain.addresses import shard_of
from gasless.db import intents, settlement_batches, usage_ledger

_auth = load_conftest("auth")
env = _auth.env
make_env = _auth.make_env
unpaused_localnet = _auth.unpaused_localnet
problem = _auth.problem
auth = _auth.auth
auth_for = _auth.auth_for
platform_problem = _auth.platform_problem

_counter = itertools.count(1)


class LedgerSeed:
    """Writes intents (terminal) and their ledger rows into one env's database."""

    def __init__(self, env: Any) -> None:
        self.env = env
        url = env.settings.effective_database_url.replace("+aiosqlite", "")
        self.engine = create_engine(url, connect_args={"timeout": 10})

    def row(self, account: str, **fields: Any) -> dict[str, Any]:
        """One ledger row (and its intent); `fields` override the ledger columns."""
        n = next(_counter)
        sender = fields.pop("sender", account)
        tx_hash = fields.pop("tx_hash", hashlib.sha256(f"seed-{n}-{account}".encode()).hexdigest())
        status = fields.get("status", "success")
        billed = fields.get("billed", status != "dead")
        terminal = int(fields.pop("terminal_at_ms", 1_700_000_000_000))
        executed = None if status == "dead" else terminal
        received = fields.pop("received_at_ms", terminal - 900)
        values: dict[str, Any] = {
            "tx_hash": tx_hash,
            "account": account,
            "sender": sender,
            "nonce": n,
            "receiver": fields.pop("receiver", account),
            "function": fields.pop("function", None),
            "sender_shard": shard_of(sender),
            "relayer": fields.pop("relayer", account),
            "status": status,
            "billed": billed,
            "billing_class": "plan" if billed else None,
            "ru": 1 if billed else None,
            "payg_micro": 0 if billed else None,
            "period_id": None,
            "api_key_id": None,
            "gas_limit": 50_000,
            "gas_price": 1_000_000_000,
            "received_at_ms": received,
            "cosigned_at_ms": (received or terminal) + 3,
            "broadcast_at_ms": (received or terminal) + 10,
            "executed_block_ts_ms": executed,
            "finalized_at_ms": None,
            "terminal_at_ms": terminal,
            "dead_reason": "replaced" if status == "dead" else None,
            "first_ack_gateway": None,
            "batch_id": None,
            "leaf_index": None,
            "created_at_ms": terminal,
        }
        values.update(fields)
        state = "DEAD" if status == "dead" else "FINALIZED"
        with self.engine.begin() as conn:
            pk = conn.execute(
                intents.insert().values(
                    sender=sender,
                    nonce=n,
                    slot_seq=0,
                    tx_hash=tx_hash,
                    bytes_sha256=hashlib.sha256(tx_hash.encode()).hexdigest(),
                    state=state,
                    seq=1,
                    sender_shard=shard_of(sender),
                    receiver=values["receiver"],
                    relayer=values["relayer"],
                    cross_shard=False,
                    gas_limit=50_000,
                    gas_price=1_000_000_000,
                    value_atto=0,
                    lease_kind="std",
                    billing={"account": account},
                    tx={},
                    host_id="seed",
                    received_at_ms=received,
                    cosigned_at_ms=values["cosigned_at_ms"],
                    updated_at_ms=terminal,
                    send_attempts=0,
                )
            ).inserted_primary_key[0]
            conn.execute(usage_ledger.insert().values(intent_pk=pk, **values))
        return values

    def batch(self, batch_id: int, **fields: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                settlement_batches.insert().values(
                    batch_id=batch_id,
                    usage_root="ab" * 32,
                    row_count=1,
                    total_ru=1,
                    state="committed",
                    tx_hash="cd" * 32,
                    created_at_ms=1_700_000_000_000,
                    submitted_at_ms=1_700_000_001_000,
                    committed_at_ms=1_700_000_002_000,
                    **fields,
                )
            )

    def clear(self, account: str) -> None:
        with self.engine.begin() as conn:
            pks = [
                r.intent_pk
                for r in conn.execute(
                    select(usage_ledger.c.intent_pk).where(usage_ledger.c.account == account)
                )
            ]
            conn.execute(delete(usage_ledger).where(usage_ledger.c.account == account))
            if pks:
                conn.execute(delete(intents).where(intents.c.pk.in_(pks)))


@pytest.fixture
def seed_for() -> Any:
    """`seed_for(env)`: a LedgerSeed for an env (`env`, or one from `make_env`), disposed after the test."""
    kits: list[LedgerSeed] = []

    def make(env: Any) -> LedgerSeed:
        kits.append(LedgerSeed(env))
        return kits[-1]

    yield make
    for kit in kits:
        kit.engine.dispose()


@pytest.fixture
def seed(env: Any, seed_for: Any) -> Any:
    return seed_for(env)
