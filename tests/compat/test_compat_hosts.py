"""The kit against real served hosts: over a socket with plain HTTP (httpx2), the relayer address survives a
restart of the host, and hosts a and b answer the same address and each relays what the kit signed for it
(PostgreSQL + Redis suite)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import test_two_hosts  # type: ignore[import-not-found]
from kit_client import ALICE_ADDRESS, KitClient  # type: ignore[import-not-found]
from test_client_flow import start_served  # type: ignore[import-not-found]
from test_two_hosts import Cluster, new_sender  # type: ignore[import-not-found]

cluster = test_two_hosts.cluster  # this module's own two hosts (module scope)


async def test_the_address_survives_a_restart_and_the_kit_relays_over_a_socket(
    make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any
) -> None:
    first = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    try:
        user = await first.new_sender(1)
        key, address = user.secret_key, user.address
        kit = KitClient(first.url, tmp_path)
        relayer = kit.relayer_address(address)
        tx_hash = kit.relay(kit.build(key, nonce=0, receiver=ALICE_ADDRESS))
        deadline = time.monotonic() + 15
        while requests.get(f"{first.url}/v1/relay/{tx_hash}", timeout=5).json().get("state") != "FINALIZED":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        first.server.stop()
    second = start_served(
        make_env.__globals__, tmp_path, unpaused_localnet
    )  # same database, new process state
    try:
        again = requests.get(f"{second.url}/relayer/address/{address}", timeout=5).json()["relayerAddress"]
        assert again == relayer
    finally:
        second.server.stop()


@pytest.mark.postgres
@pytest.mark.redis
def test_hosts_a_and_b_answer_the_same_relayer_and_relay_the_kits_transactions(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, address = new_sender(cluster)
    from_a = requests.get(f"{a.base}/relayer/address/{address}", timeout=5).json()["relayerAddress"]
    from_b = requests.get(f"{b.base}/relayer/address/{address}", timeout=5).json()["relayerAddress"]
    assert from_a == from_b
    kit_a, kit_b = KitClient(a.base, tmp_path / "a"), KitClient(b.base, tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = kit_a.relay(kit_a.build(key, nonce=0, receiver=ALICE_ADDRESS))
    second = kit_b.relay(kit_b.build(key, nonce=1, receiver=ALICE_ADDRESS))
    assert first != second
    for tx_hash in (first, second):
        deadline = time.monotonic() + 30
        while requests.get(f"{a.base}/v1/relay/{tx_hash}", timeout=5).json().get("state") != "FINALIZED":
            assert time.monotonic() < deadline
            time.sleep(0.1)
