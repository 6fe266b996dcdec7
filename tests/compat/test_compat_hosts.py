"""The kit against real served hosts: over a socket with plain HTTP (httpx2), the kit's cache file and
relayer survive a restart of the service on the same URL, and hosts a and b answer the same address and
each relays what the kit signed for it (PostgreSQL + Redis suite)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import test_two_hosts  # type: ignore[import-not-found]
from kit_client import ALICE_ADDRESS, KitClient  # type: ignore[import-not-found]
from relay_kit import ServedApi  # type: ignore[import-not-found]
from test_client_flow import Served, start_served  # type: ignore[import-not-found]
from test_two_hosts import Cluster, new_sender  # type: ignore[import-not-found]

from gasless.hosting.app import create_app

cluster = test_two_hosts.cluster  # this module's own two hosts (module scope)


async def test_the_kits_cache_survives_a_restart_of_the_service(
    make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any
) -> None:
    """The kit keeps `.relayer_cache.json` keyed by the relayer's URL: after the service restarts on the same
    URL it asks nothing and relays its next proof with the cached relayer, which the restarted host still
    names for that user."""
    first = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    try:
        user = await first.new_sender(1)
        key, address = user.secret_key, user.address
        kit = KitClient(first.url, tmp_path)
        relayer = kit.relayer_address(address)
        cached = json.loads((tmp_path / ".relayer_cache.json").read_text())
        tx_hash = kit.relay(kit.build(key, nonce=0, receiver=ALICE_ADDRESS))  # the kit's 10 050 000 gas
        wait_finalized(first.url, tx_hash)
    finally:
        first.server.stop()
    second = serve_again(first)  # same database and URL, new process state
    try:
        assert requests.get(f"{second.url}/health", timeout=5).json() == {"status": "ok"}
        again = requests.get(f"{second.url}/relayer/address/{address}", timeout=5).json()["relayerAddress"]
        assert again == relayer
        kit = KitClient(second.url, tmp_path)
        next_proof = kit.build(key, nonce=1, receiver=ALICE_ADDRESS)
        assert next_proof["relayer"] == relayer
        assert json.loads((tmp_path / ".relayer_cache.json").read_text()) == cached  # not asked again
        assert wait_finalized(second.url, kit.relay(next_proof))["relayer"] == relayer
    finally:
        second.server.stop()


def serve_again(previous: Served) -> Served:
    """The same settings served again on the URL `previous` had (the kit's cache is keyed by it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(previous.url.rsplit(":", 1)[1])))
    server = ServedApi(create_app(previous.settings), sock).start()
    return Served(previous.url, previous.settings, previous.localnet, server)


def wait_finalized(base: str, tx_hash: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        intent = requests.get(f"{base}/v1/relay/{tx_hash}", timeout=5).json()
        if intent.get("state") == "FINALIZED":
            return intent  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, intent
        time.sleep(0.1)


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
    # Plain transfers of 1 RU each: the hosts share the sender's bucket (burst 5) through Redis, and a
    # second relay of the kit's 10 050 000 gas (6 RU) would wait 6 s for it to refill.
    first = kit_a.relay(kit_a.build(key, nonce=0, receiver=ALICE_ADDRESS, gas_limit=100_000))
    second = kit_b.relay(kit_b.build(key, nonce=1, receiver=ALICE_ADDRESS, gas_limit=100_000))
    assert first != second
    for tx_hash in (first, second):
        wait_finalized(a.base, tx_hash)
