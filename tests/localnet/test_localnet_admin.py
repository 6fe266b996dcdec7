"""localnet's admin API: faucet, guardians, fault injection, snapshot, stepping rounds."""

from __future__ import annotations

import time

import pytest
import requests
from multiversx_sdk import (
    AwaitingOptions,
    ProxyNetworkProvider,
    Transaction,
    TransactionComputer,
    UserSecretKey,
)
from multiversx_sdk.network_providers.errors import NetworkProviderError

computer = TransactionComputer()


def post(url: str, path: str, body: dict) -> dict:
    response = requests.post(f"{url}{path}", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def users(net):  # type: ignore[no-untyped-def]
    return {u.shard: u for u in net.net.genesis.users}


def relayers(net):  # type: ignore[no-untyped-def]
    return {r.shard: r for r in reversed(net.net.genesis.relayers)}


def signed(sender, relayer, nonce: int, *, guardian=None, gas_limit: int = 100_000):  # type: ignore[no-untyped-def]
    tx = Transaction(
        sender=sender.address,
        receiver=sender.address,
        nonce=nonce,
        chain_id="localnet",
        version=2,
        gas_limit=gas_limit,
        relayer=relayer.address,
    )
    if guardian is not None:
        computer.apply_guardian(tx, guardian.generate_public_key().to_address("erd"))
    message = computer.compute_bytes_for_signing(tx)
    tx.signature = sender.secret_key.sign(message)
    tx.relayer_signature = relayer.secret_key.sign(message)
    if guardian is not None:
        tx.guardian_signature = guardian.sign(message)
    return tx


def test_faucet_credits_egld_and_usdc(localnet) -> None:  # type: ignore[no-untyped-def]
    key = UserSecretKey.generate()
    address = key.generate_public_key().to_address("erd").to_bech32()
    data = post(
        localnet.url,
        "/localnet/faucet",
        {"address": address, "egldAtto": str(10**30 + 7), "usdcMicro": 5_000_000},
    )
    assert data["balance"] == str(10**30 + 7) and data["usdcMicro"] == 5_000_000
    esdt = requests.get(f"{localnet.url}/address/{address}/esdt", timeout=5).json()["data"]["esdts"]
    assert esdt["USDC-c0ffee"]["balance"] == "5000000"
    bad = requests.post(f"{localnet.url}/localnet/faucet", json={"address": "erd1xyz"}, timeout=5)
    assert bad.status_code == 400


def test_guarded_sender_needs_the_guardian(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = users(localnet)[1], relayers(localnet)[1]
    guardian = UserSecretKey.generate()
    post(
        localnet.url,
        "/localnet/guardian",
        {
            "address": sender.address.to_bech32(),
            "guardian": guardian.generate_public_key().to_address("erd").to_bech32(),
        },
    )
    assert provider.get_account(sender.address).is_guarded
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(signed(sender, relayer, 0))
    assert "not allowed to bypass guardian" in str(err.value.data)
    # Guarded form but too little gas: the guarded extra is part of the minimum.
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(signed(sender, relayer, 0, guardian=guardian))
    assert "insufficient gas limit in tx" in str(err.value.data)
    wrong = UserSecretKey.generate()
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(signed(sender, relayer, 0, guardian=wrong, gas_limit=150_000))
    assert "mismatch between transaction guardian and configured account guardian" in str(err.value.data)
    tx = signed(sender, relayer, 0, guardian=guardian, gas_limit=150_000)
    tx.guardian_signature = wrong.sign(computer.compute_bytes_for_signing(tx))
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(tx)
    assert "ed25519: invalid signature when checking the guardian's signature" in str(err.value.data)
    good = signed(sender, relayer, 0, guardian=guardian, gas_limit=150_000)
    done = provider.await_transaction_completed(
        provider.send_transaction(good), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert done.status.is_successful


def test_gateway_faults_latency_errors_and_down(localnet) -> None:  # type: ignore[no-untyped-def]
    post(localnet.url, "/localnet/faults", {"gateway": {"latencyMs": {"/network/config": 300}}})
    start = time.perf_counter()
    assert requests.get(f"{localnet.url}/network/config", timeout=5).status_code == 200
    assert time.perf_counter() - start >= 0.3
    post(
        localnet.url, "/localnet/faults", {"gateway": {"latencyMs": {}, "errorRate": 1.0, "errorStatus": 502}}
    )
    assert requests.get(f"{localnet.url}/network/config", timeout=5).status_code == 502
    # Only the sends fail: the reads pass.
    post(localnet.url, "/localnet/faults", {"gateway": {"errorPaths": ["/transaction/send"]}})
    assert requests.get(f"{localnet.url}/network/config", timeout=5).status_code == 200
    assert requests.post(f"{localnet.url}/transaction/send", json={}, timeout=5).status_code == 502
    post(localnet.url, "/localnet/faults", {"gateway": {"errorRate": 0.0, "errorPaths": [], "down": True}})
    response = requests.get(f"{localnet.url}/network/config", timeout=5)
    assert response.status_code == 503 and response.json()["code"] == "internal_issue"
    requests.delete(f"{localnet.url}/localnet/faults", timeout=5)
    assert requests.get(f"{localnet.url}/network/config", timeout=5).status_code == 200


def test_dropped_ack_still_accepts_the_transaction(localnet) -> None:  # type: ignore[no-untyped-def]
    sender, relayer = users(localnet)[2], relayers(localnet)[2]
    post(localnet.url, "/localnet/faults", {"gateway": {"dropAcks": 1, "ackHangMs": 200}})
    tx = signed(sender, relayer, 0)
    response = requests.post(f"{localnet.url}/transaction/send", json=tx.to_dictionary(), timeout=5)
    assert response.status_code == 504
    provider = ProxyNetworkProvider(localnet.url)
    done = provider.await_transaction_completed(
        computer.compute_transaction_hash(tx), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert done.status.is_successful
    # Only the next one was dropped.
    assert (
        requests.post(
            f"{localnet.url}/transaction/send", json=signed(sender, relayer, 1).to_dictionary(), timeout=5
        ).status_code
        == 200
    )


def test_faults_are_per_gateway(localnet_two_gateways) -> None:  # type: ignore[no-untyped-def]
    first, second = localnet_two_gateways.urls
    post(first, "/localnet/faults", {"gateway": {"down": True}})
    assert requests.get(f"{first}/network/config", timeout=5).status_code == 503
    assert requests.get(f"{second}/network/config", timeout=5).status_code == 200
    # Both gateways serve one network.
    sender, relayer = users(localnet_two_gateways)[0], relayers(localnet_two_gateways)[0]
    tx = signed(sender, relayer, 0)
    tx_hash = ProxyNetworkProvider(second).send_transaction(tx).hex()
    post(first, "/localnet/faults", {"gateway": {"down": False}})
    assert requests.get(f"{first}/transaction/{tx_hash}/status", timeout=5).status_code == 200


def test_stalled_shard_holds_transactions_and_clock_offset(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    post(localnet.url, "/localnet/faults", {"chain": {"stalledShards": [0]}})
    stalled_at = provider.get_network_status(0).block_nonce
    sender, relayer = users(localnet)[0], relayers(localnet)[0]
    tx = signed(sender, relayer, 0)
    provider.send_transaction(tx)
    localnet.wait_rounds(4)
    assert provider.get_network_status(0).block_nonce == stalled_at
    assert provider.get_network_status(1).block_nonce > stalled_at
    assert provider.get_transaction_status(computer.compute_transaction_hash(tx)).status == "pending"
    post(localnet.url, "/localnet/faults", {"chain": {"stalledShards": [], "clockOffsetMs": -3_600_000}})
    done = provider.await_transaction_completed(
        computer.compute_transaction_hash(tx), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert done.status.is_successful
    status = provider.get_network_status(1)
    assert status.block_timestamp_ms < time.time() * 1000 - 3_000_000


def test_snapshot_and_rounds(localnet) -> None:  # type: ignore[no-untyped-def]
    snapshot = requests.get(f"{localnet.url}/localnet/snapshot", timeout=5).json()["data"]
    owner = localnet.net.info["owner"]
    assert snapshot["accounts"][owner]["esdt"]["USDC-c0ffee"] == str(10_000_000 * 10**6)
    before = snapshot["round"]
    after = post(localnet.url, "/localnet/rounds", {"count": 5})["round"]
    assert after >= before + 5
    info = requests.get(f"{localnet.url}/localnet/info", timeout=5).json()["data"]
    assert info["contract"] in snapshot["accounts"]
    assert snapshot["accounts"][info["contract"]]["contract"]["name"] == "gasless-billing"


def test_gateway_jitter_answers_concurrent_requests_out_of_order(localnet) -> None:  # type: ignore[no-untyped-def]
    """`jitterMs` delays each request by a random 0..N ms (seeded): requests sent 20 ms apart are answered
    in another order than they were sent."""
    import threading

    post(localnet.url, "/localnet/faults", {"gateway": {"jitterMs": 1_000, "seed": 7}})
    finished: list[int] = []
    lock = threading.Lock()

    def call(index: int) -> None:
        assert requests.get(f"{localnet.url}/network/config", timeout=10).status_code == 200
        with lock:
            finished.append(index)

    threads = []
    try:
        for index in range(10):
            threads.append(threading.Thread(target=call, args=(index,)))
            threads[-1].start()
            time.sleep(0.02)  # the order the requests are sent in, not a wait for a condition
        for thread in threads:
            thread.join(15)
    finally:
        requests.delete(f"{localnet.url}/localnet/faults", timeout=5)
    assert sorted(finished) == list(range(10)) and finished != list(range(10)), finished


def test_requests_are_counted_by_route_and_per_gateway(localnet_two_gateways) -> None:  # type: ignore[no-untyped-def]
    first, second = localnet_two_gateways.urls
    user = users(localnet_two_gateways)[1].address.to_bech32()
    for _ in range(3):
        assert requests.get(f"{first}/address/{user}", timeout=10).status_code == 200
    assert requests.get(f"{first}/network/config", timeout=10).status_code == 200
    requests.get(f"{first}/localnet/info", timeout=10)  # admin calls are not counted

    def counted(url: str) -> dict:
        response = requests.get(f"{url}/localnet/requests", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()["data"]["requests"]

    assert counted(first) == {"GET /address/{address}": 3, "GET /network/config": 1}
    assert counted(second) == {}
