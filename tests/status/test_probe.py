"""The synthetic probe: a transfer per shard every interval through the relay core, recorded for the status
components; its traffic changes no public figure (network latency, status, registry statistics)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from relay_kit import key_in_shard  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of
from gasless.client.keys import UserKey


def _wait(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.1)
    return value


def test_probe_traffic_feeds_the_components_and_no_public_figure(make_env: Any, tmp_path: Path) -> None:
    keys = [UserKey(key_in_shard(shard)) for shard in range(3)]
    pems = []
    for key in keys:
        path = tmp_path / f"probe-{key.shard}.pem"
        path.write_text(key.to_pem_text())
        pems.append(path)
    env = make_env(probe_enabled=True, probe_interval_ms=300, probe_key_files=pems)
    for key in keys:
        env.owner("grant", [address_of(key.public_key), 5, 1])

    def probed() -> Any:
        status = env.client.get("/v1/status").json()
        shards = [c for c in status["components"] if c["id"].startswith("relaying-shard-")]
        return status if all(c["probe"] and c["probe"]["outcome"] == "success" for c in shards) else None

    _wait(probed, "a successful probe in every shard")

    def finalized_probes() -> Any:
        counts = []
        for key in keys:
            intent = env.client.get(f"/v1/relay/{key.address}:1")
            counts.append(intent.status_code == 200 and intent.json()["state"] == "FINALIZED")
        return all(counts)

    _wait(finalized_probes, "two probe transfers per shard finalized")
    # The rollups have counted them (marked), and no public figure moved.
    _wait(
        lambda: (
            all(row.rolled_up for row in _ledger(env) if row.finalized_at_ms is not None)
            and len(_ledger(env)) >= 6
        ),
        "the probe rows taken by the rollup",
    )
    network = env.client.get("/v1/network").json()
    assert all(s["samples"] == 0 and s["relays24h"] == 0 for s in network["shards"]), network["shards"]
    status = env.client.get("/v1/status").json()
    assert status["relays24h"] == 0 and status["availabilityDaily90"][-1]["availabilityPct"] is None
    assert all(entry["samples"] == 0 for entry in status["latency"])
    registry = env.client.get("/v1/relayers").json()["items"]
    assert all(item["statistics"]["relays"] == 0 for item in registry)
    assert {row.route for row in _ledger(env)} == {"probe"}


def _ledger(env: Any) -> list[Any]:
    from sqlalchemy import create_engine, select

    from gasless.db import usage_ledger

    engine = create_engine(env.settings.effective_database_url.replace("+aiosqlite", ""))
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(usage_ledger)).all())
    finally:
        engine.dispose()
