"""A host's tracker finds its own in-flight intents, plus those of the hosts it adopted; the adopter
adopts exactly the hosts that are gone (on SQLite: every host id but its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gasless.db import create_engine, upgrade
from gasless.db.leader import SingletonRunner
from gasless.relay.ownership import HostIntents, OrphanAdopter
from gasless.relay.repository import IntentRepository

SENDER = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"


def intent(nonce: int, host_id: str, state: str) -> dict[str, Any]:
    return {
        "sender": SENDER,
        "nonce": nonce,
        "slot_seq": 0,
        "tx_hash": f"{nonce:064x}",
        "bytes_sha256": f"{nonce + 1000:064x}",
        "state": state,
        "seq": 1,
        "sender_shard": 1,
        "receiver": SENDER,
        "relayer": SENDER,
        "cross_shard": False,
        "gas_limit": 50_000,
        "gas_price": 1_000_000_000,
        "value_atto": 0,
        "lease_kind": "std",
        "billing": {},
        "intent_key": None,
        "tx": {"nonce": nonce},
        "host_id": host_id,
        "request_id": None,
        "received_at_ms": 1,
        "cosigned_at_ms": 2,
        "send_attempts": 0,
        "updated_at_ms": 2,
    }


async def test_tracker_reads_are_scoped_to_the_host_and_its_adoptions(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'own.db'}"
    engine = create_engine(url)
    try:
        await upgrade(engine)
        shared = IntentRepository(engine)
        pks = {}
        for nonce, host, state in [
            (1, "a", "COSIGNED"),
            (2, "a", "EXECUTED"),
            (3, "a", "FINALIZED"),
            (4, "b", "COSIGNED"),
            (5, "b", "BROADCAST"),
            (6, "c", "DEAD"),
        ]:
            pks[nonce] = await shared.commit(intent(nonce, host, state), None, 0)
        mine = HostIntents(engine, "a")
        assert {r.nonce for r in await mine.in_flight()} == {1, 2}
        assert set(await mine.in_flight_stamps()) == {pks[1], pks[2]}
        assert {r.nonce for r in await mine.unbroadcast()} == {1}
        assert await mine.hosts_with_in_flight() == {"b"}  # c has nothing in flight

        runner = SingletonRunner(url, host_id="a", scope="test:localnet")
        adopter = OrphanAdopter(mine, runner)
        assert await adopter.adopt_once() == frozenset({"b"})  # SQLite: only this host is present
        assert {r.nonce for r in await mine.in_flight()} == {1, 2, 4, 5}
        assert set(await mine.in_flight_stamps()) == {pks[n] for n in (1, 2, 4, 5)}
        assert {r.nonce for r in await mine.unbroadcast()} == {1, 4}
        await adopter.stop()  # leadership lost: the adopted intents are let go
        assert {r.nonce for r in await mine.in_flight()} == {1, 2}
    finally:
        await engine.dispose()
