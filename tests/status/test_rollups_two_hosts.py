"""Two hosts on one PostgreSQL: relays through a and b land in the same minute rollups, each counted once
(the rollup singleton marks the usage rows it merged, whichever host leads the role)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import test_two_hosts  # type: ignore[import-not-found]
from test_two_hosts import Cluster, assign, new_sender, signed  # type: ignore[import-not-found]

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
cluster = test_two_hosts.cluster  # this module's own hosts


def test_relays_through_both_hosts_are_counted_once(cluster: Cluster) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    before = a.get("/v1/network").json()["shards"][1]["samples"]
    hashes = []
    for index, host in enumerate((a, b, a, b)):
        key, sender = new_sender(cluster)
        assignment = assign(cluster, host, key, sender)
        tx = signed(cluster, key, assignment)
        answer = host.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]})
        assert answer.status_code in (200, 202), (index, answer.text)
        hashes.append(answer.json()["txHash"])

    def counted(host: Any) -> Any:
        shard = host.get("/v1/network").json()["shards"][1]
        return shard if shard["samples"] >= before + 4 else None

    deadline = time.monotonic() + 60
    while not (counted(a) and counted(b)):
        assert time.monotonic() < deadline, "the four relays not counted"
        time.sleep(0.2)
    assert a.get("/v1/network").json()["shards"][1]["samples"] == before + 4
    assert b.get("/v1/network").json()["shards"][1]["samples"] == before + 4
    status = a.get("/v1/status")
    assert status.status_code == 200, status.text
    assert status.json()["relays24h"] >= 4


def test_status_registry_and_account_reads_answer_on_postgresql(cluster: Cluster) -> None:
    from gasless.client.native_auth import make_native_auth_token

    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, sender = new_sender(cluster)
    assignment = assign(cluster, a, key, sender)
    answer = a.post(
        "/v1/relay", {"tx": signed(cluster, key, assignment).to_dictionary(), "lease": assignment["lease"]}
    )
    assert answer.status_code in (200, 202), answer.text
    for host in (a, b):
        assert host.get("/v1/status").status_code == 200
        registry = host.get("/v1/relayers")
        assert registry.status_code == 200 and len(registry.json()["items"]) == 6
    block = a.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(key, origin="http://127.0.0.1:3000", block_hash=block, ttl_seconds=600)
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 60
    while True:
        latency = b.get("/v1/usage/latency", params={"account": sender, "window": "1h"}, headers=headers)
        assert latency.status_code == 200, latency.text
        if latency.json()["groups"]:
            break
        assert time.monotonic() < deadline, "the relay never measured"
        time.sleep(0.2)
    assert latency.json()["groups"][0]["count"] == 1
    relayers = b.get(f"/v1/account/{sender}/relayers", headers=headers)
    assert relayers.status_code == 200 and relayers.json()["items"][0]["relays"] == 1, relayers.text
    outages = b.get(f"/v1/account/{sender}/outages", headers=headers)
    assert outages.status_code == 200 and outages.json()["items"] == []
