"""localnet through the real gateway API, driven by multiversx-sdk's ProxyNetworkProvider."""

from __future__ import annotations

import time

import pytest
import requests
from multiversx_sdk import (
    Address,
    AwaitingOptions,
    ProxyNetworkProvider,
    Transaction,
    TransactionComputer,
    UserSecretKey,
)
from multiversx_sdk.network_providers.errors import NetworkProviderError

from gasless.chain.addresses import METACHAIN, shard_of

computer = TransactionComputer()
CHAIN = "localnet"


def relayed_tx(sender, relayer, receiver: Address, nonce: int, **kw) -> Transaction:  # type: ignore[no-untyped-def]
    data = kw.pop("data", b"")
    tx = Transaction(
        sender=sender.address,
        receiver=receiver,
        nonce=nonce,
        chain_id=CHAIN,
        version=2,
        gas_limit=kw.pop("gas_limit", 50_000 + 50_000 + 1_500 * len(data)),
        gas_price=kw.pop("gas_price", 10**9),
        data=data,
        relayer=relayer.address,
        value=kw.pop("value", 0),
        **kw,
    )
    tx.signature = sender.secret_key.sign(computer.compute_bytes_for_signing(tx))
    tx.relayer_signature = relayer.secret_key.sign(computer.compute_bytes_for_signing(tx))
    return tx


def relayer_in(net, shard: int):  # type: ignore[no-untyped-def]
    return next(r for r in net.net.genesis.relayers if r.shard == shard)


def user_in(net, shard: int):  # type: ignore[no-untyped-def]
    return next(u for u in net.net.genesis.users if u.shard == shard)


def error_of(exc: NetworkProviderError) -> str:
    data = exc.data
    return data.get("error", "") if isinstance(data, dict) else str(data)


def test_sdk_reads_network_config_and_status(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    config = provider.get_network_config()
    assert config.chain_id == CHAIN
    assert (config.min_gas_price, config.min_gas_limit, config.gas_per_data_byte) == (10**9, 50_000, 1_500)
    assert config.gas_price_modifier == pytest.approx(0.01)
    assert config.num_shards == 3
    assert config.round_duration == 100
    assert config.raw["erd_extra_gas_limit_relayed_tx"] == 50_000
    localnet.wait_rounds(3)
    status = provider.get_network_status(METACHAIN)
    assert status.block_nonce >= 2
    assert status.highest_final_block_nonce == status.block_nonce - 1


def test_relayed_v3_transfer_end_to_end_with_the_sdk(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 1), relayer_in(localnet, 1)
    receiver = user_in(localnet, 1).address
    account = provider.get_account(sender.address)
    assert account.balance == 0 and account.nonce == 0 and not account.is_guarded  # gasless: no EGLD at all
    relayer_before = provider.get_account(relayer.address).balance
    tx = relayed_tx(sender, relayer, receiver, account.nonce, data=b"hello")
    tx_hash = provider.send_transaction(tx)
    assert tx_hash == computer.compute_transaction_hash(tx)
    done = provider.await_transaction_completed(tx_hash, AwaitingOptions(timeout_in_milliseconds=10_000))
    assert done.status.is_successful
    on_chain = provider.get_transaction(tx_hash)
    assert on_chain.raw["isRelayed"] is True
    assert on_chain.raw["relayerAddress"] == relayer.address.to_bech32()
    # The node's fee formula, paid by the relayer: move gas includes the relayed extra.
    expected_fee = (50_000 + 50_000 + 1_500 * 5) * 10**9
    assert int(on_chain.raw["fee"]) == expected_fee
    assert provider.get_account(relayer.address).balance == relayer_before - expected_fee
    assert provider.get_account(sender.address).nonce == 1


def test_cross_shard_runs_source_then_destination_and_finality_one_block_later(localnet) -> None:  # type: ignore[no-untyped-def]
    """As on the real network: the metachain notarizes the source block at least a round after it was
    proposed, the destination executes only after that, and its block is notarized at least a round later
    again; the status is `pending` until the destination executed."""
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer, receiver = user_in(localnet, 1), relayer_in(localnet, 1), user_in(localnet, 0)
    tx = relayed_tx(sender, relayer, receiver.address, 0)
    tx_hash = provider.send_transaction(tx).hex()
    seen_pending_notarized = False
    deadline = time.time() + 10
    raw: dict = {}
    while time.time() < deadline:
        raw = provider.do_get_generic(f"transaction/{tx_hash}?withResults=true").to_dictionary()[
            "transaction"
        ]
        if raw["notarizedAtSourceInMetaNonce"] and raw["status"] == "pending":
            seen_pending_notarized = True
        if raw["notarizedAtDestinationInMetaNonce"]:
            break
        time.sleep(0.02)
    assert raw["status"] == "success"
    assert raw["sourceShard"] == 1 and raw["destinationShard"] == 0
    assert raw["notarizedAtDestinationInMetaNonce"] >= raw["notarizedAtSourceInMetaNonce"] + 2
    assert seen_pending_notarized
    # Only the lookup without `sender` carries hyperblockNonce (the proxy copies the destination's
    # notarization into it); with `sender` it is absent, as the node never sets it.
    hyper = raw["hyperblockNonce"]
    assert hyper == raw["notarizedAtDestinationInMetaNonce"]
    by_sender = provider.do_get_generic(
        f"transaction/{tx_hash}?withResults=true&sender={sender.address.to_bech32()}"
    ).to_dictionary()["transaction"]
    assert "hyperblockNonce" not in by_sender
    assert by_sender["notarizedAtDestinationInMetaNonce"] == hyper
    # Final exactly when the next hyperblock exists.
    meta = provider.get_network_status(METACHAIN)
    while meta.block_nonce < hyper + 1:
        time.sleep(0.02)
        meta = provider.get_network_status(METACHAIN)
    assert meta.highest_final_block_nonce >= hyper
    block = provider.do_get_generic(f"hyperblock/by-nonce/{hyper}").to_dictionary()["hyperblock"]
    assert [t["status"] for t in block["transactions"] if t["hash"] == tx_hash] == ["success"]
    # A hyperblock lists what executed at its destination only, not the source half.
    source = provider.do_get_generic(
        f"hyperblock/by-nonce/{raw['notarizedAtSourceInMetaNonce']}"
    ).to_dictionary()["hyperblock"]
    assert tx_hash not in [t["hash"] for t in source["transactions"]]


@pytest.mark.parametrize(
    "case, expected",
    [
        ("bad_sender_signature", "transaction generation failed: ed25519: invalid signature"),
        ("relayer_other_shard", "transaction generation failed: shard ID missmatch"),
        ("gas_too_low", "transaction generation failed: insufficient gas limit in tx"),
        (
            "nonce_too_high",
            "transaction generation failed: invalid transaction lowerNonceInTx: false, veryHighNonceInTx: true",
        ),
        ("gas_price_low", "transaction generation failed: insufficient gas price in tx"),
        ("wrong_chain", "transaction generation failed: invalid chain ID"),
        ("bad_relayer_signature", "transaction generation failed: ed25519: invalid signature"),
        ("version_1_with_options", "transaction generation failed: invalid transaction version"),
        ("relayer_without_signature", "transaction generation failed: invalid relayed transaction"),
        ("guardian_on_unguarded", "transaction generation failed: guardian address not expected"),
    ],
)
def test_refusals_carry_the_node_error_strings(localnet, case: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 2), relayer_in(localnet, 2)
    kwargs: dict = {}
    if case == "relayer_other_shard":
        relayer = relayer_in(localnet, 0)
    if case == "gas_too_low":
        kwargs["gas_limit"] = 50_000  # a relayed transfer needs 100 000
    if case == "gas_price_low":
        kwargs["gas_price"] = 10**9 - 1
    nonce = 101 if case == "nonce_too_high" else 0
    tx = relayed_tx(sender, relayer, sender.address, nonce, **kwargs)
    if case == "wrong_chain":
        tx.chain_id = "D"
        tx.signature = sender.secret_key.sign(computer.compute_bytes_for_signing(tx))
        tx.relayer_signature = relayer.secret_key.sign(computer.compute_bytes_for_signing(tx))
    if case == "bad_sender_signature":
        tx.signature = UserSecretKey.generate().sign(computer.compute_bytes_for_signing(tx))
    if case == "bad_relayer_signature":
        tx.relayer_signature = UserSecretKey.generate().sign(computer.compute_bytes_for_signing(tx))
    if case == "version_1_with_options":
        tx.version, tx.options = 1, 1
    if case == "relayer_without_signature":
        tx.relayer_signature = b""
    if case == "guardian_on_unguarded":
        tx.guardian = user_in(localnet, 0).address
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(tx)
    assert error_of(err.value) == expected
    response = requests.post(f"{localnet.url}/transaction/send", json=tx.to_dictionary(), timeout=5)
    assert response.status_code == 400
    assert response.json() == {"data": None, "error": expected, "code": "bad_request"}


def test_nonce_gap_waits_in_the_pool_and_is_reported(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 0), relayer_in(localnet, 0)
    gapped = relayed_tx(sender, relayer, sender.address, 3)
    provider.send_transaction(gapped)
    bech32 = sender.address.to_bech32()
    gaps = provider.do_get_generic(f"transaction/pool?by-sender={bech32}&nonce-gaps=true").to_dictionary()
    assert gaps["nonceGaps"]["gaps"] == [{"from": 0, "to": 2}]
    last = provider.do_get_generic(f"transaction/pool?by-sender={bech32}&last-nonce=true").to_dictionary()
    assert last["nonce"] == 3
    localnet.wait_rounds(4)  # blocks went by without it
    assert provider.get_transaction_status(computer.compute_transaction_hash(gapped)).status == "pending"
    for nonce in range(3):
        provider.send_transaction(relayed_tx(sender, relayer, sender.address, nonce))
    done = provider.await_transaction_completed(
        computer.compute_transaction_hash(gapped), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert done.status.is_successful
    assert provider.get_account(sender.address).nonce == 4


def test_replacement_with_higher_gas_price_wins_the_nonce(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 1), relayer_in(localnet, 1)
    localnet.call(lambda: localnet.net.chain.faults.stalled_shards.add(1))
    first = relayed_tx(sender, relayer, sender.address, 0, data=b"first")
    second = relayed_tx(sender, relayer, sender.address, 0, data=b"second", gas_price=2 * 10**9)
    provider.send_transaction(first)
    provider.send_transaction(second)
    localnet.call(lambda: localnet.net.chain.faults.stalled_shards.discard(1))
    winner = provider.await_transaction_completed(
        computer.compute_transaction_hash(second), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert winner.status.is_successful
    # The loser left the pool without a block: the node no longer knows it.
    loser = requests.get(
        f"{localnet.url}/transaction/{computer.compute_transaction_hash(first).hex()}", timeout=5
    )
    assert loser.status_code == 500 and loser.json()["error"] == "transaction not found"


def test_plain_transaction_and_insufficient_funds(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    relayer = relayer_in(localnet, 2)
    other = user_in(localnet, 2)
    tx = Transaction(
        sender=relayer.address,
        receiver=other.address,
        nonce=0,
        chain_id=CHAIN,
        version=2,
        gas_limit=50_000,
        value=10**18,
    )
    tx.signature = relayer.secret_key.sign(computer.compute_bytes_for_signing(tx))
    done = provider.await_transaction_completed(
        provider.send_transaction(tx), AwaitingOptions(timeout_in_milliseconds=10_000)
    )
    assert done.status.is_successful
    assert provider.get_account(other.address).balance == 10**18
    # A plain transaction from an account that cannot pay the fee never enters the pool.
    broke = UserSecretKey.generate()
    broke_address = broke.generate_public_key().to_address("erd")
    bad = Transaction(
        sender=broke_address, receiver=other.address, nonce=0, chain_id=CHAIN, version=2, gas_limit=50_000
    )
    bad.signature = broke.sign(computer.compute_bytes_for_signing(bad))
    with pytest.raises(NetworkProviderError) as err:
        provider.send_transaction(bad)
    assert (
        error_of(err.value)
        == f"transaction generation failed: insufficient funds for address {broke_address.to_bech32()}"
    )


def test_send_multiple_skips_invalid_entries(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 0), relayer_in(localnet, 0)
    good = relayed_tx(sender, relayer, sender.address, 0)
    bad = relayed_tx(sender, relayer, sender.address, 1)
    bad.signature = bytes(64)
    sent, hashes = provider.send_transactions([good, bad])
    assert sent == 1
    assert hashes[0] == computer.compute_transaction_hash(good) and hashes[1] == b""


def test_simulate_and_cost(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 1), relayer_in(localnet, 1)
    tx = relayed_tx(sender, relayer, sender.address, 0, data=b"note")
    simulated = provider.simulate_transaction(tx, check_signature=True)
    assert simulated.status.is_successful
    assert provider.get_account(sender.address).nonce == 0  # a simulation changes nothing
    cost = provider.estimate_transaction_cost(relayed_tx(sender, relayer, sender.address, 0, data=b"note"))
    assert cost.gas_limit == 50_000 + 50_000 + 4 * 1_500


def test_unknown_hash_and_bad_address(localnet) -> None:  # type: ignore[no-untyped-def]
    response = requests.get(f"{localnet.url}/transaction/{'ab' * 32}", timeout=5)
    assert response.status_code == 500
    assert response.json()["error"] == "transaction not found"
    response = requests.get(f"{localnet.url}/address/erd1notanaddress", timeout=5)
    assert response.status_code == 400
    assert shard_of(user_in(localnet, 2).address) == 2


def test_an_executed_transaction_sent_again_is_refused_with_lower_nonce(localnet) -> None:  # type: ignore[no-untyped-def]
    """Its nonce is used: the node refuses it as any lower nonce (mx-chain-go txValidator), while the same
    transaction sent again while it waits in the pool is simply accepted."""
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 1), relayer_in(localnet, 1)
    nonce = provider.get_account(sender.address).nonce
    tx = relayed_tx(sender, relayer, sender.address, nonce)
    tx_hash = provider.send_transaction(tx)
    provider.await_transaction_completed(tx_hash, AwaitingOptions(timeout_in_milliseconds=10_000))
    again = requests.post(f"{localnet.url}/transaction/send", json=tx.to_dictionary(), timeout=5)
    assert again.status_code == 400
    assert again.json()["error"] == (
        "transaction generation failed: invalid transaction lowerNonceInTx: true, veryHighNonceInTx: false"
    )


def test_a_not_executable_transaction_leaves_the_pool_without_a_block(localnet) -> None:  # type: ignore[no-untyped-def]
    """A guarded relayer: accepted by `send`, then left out of the block and dropped from the pool; nobody
    pays and the sender's nonce is not used. The node no longer knows it."""
    provider = ProxyNetworkProvider(localnet.url)
    sender, relayer = user_in(localnet, 2), relayer_in(localnet, 2)
    guardian = user_in(localnet, 0).address.to_bech32()
    body = {"address": relayer.address.to_bech32(), "guardian": guardian, "activationEpoch": 0}
    assert requests.post(f"{localnet.url}/localnet/guardian", json=body, timeout=5).ok
    try:
        before = provider.get_account(relayer.address).balance
        nonce = provider.get_account(sender.address).nonce
        tx_hash = provider.send_transaction(relayed_tx(sender, relayer, sender.address, nonce)).hex()
        deadline = time.time() + 10
        while time.time() < deadline:
            answer = requests.get(f"{localnet.url}/transaction/{tx_hash}", timeout=5)
            if answer.status_code != 200:
                break
            assert answer.json()["data"]["transaction"]["status"] == "pending"
            time.sleep(0.02)
        assert answer.status_code == 500 and answer.json()["error"] == "transaction not found"
        pool = requests.get(
            f"{localnet.url}/transaction/pool?by-sender={sender.address.to_bech32()}", timeout=5
        ).json()["data"]["txPool"]["transactions"]
        assert pool == []
        assert provider.get_account(sender.address).nonce == nonce
        assert provider.get_account(relayer.address).balance == before
    finally:
        body["guardian"] = ""
        requests.post(f"{localnet.url}/localnet/guardian", json=body, timeout=5)
