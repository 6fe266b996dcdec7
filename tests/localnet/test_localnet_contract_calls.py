"""The billing contract executing on localnet: real signed calls with USDC attached, views and events."""

from __future__ import annotations

import asyncio
import base64

import pytest
import requests
from multiversx_sdk import (
    AwaitingOptions,
    ProxyNetworkProvider,
    SmartContractQuery,
    TransactionComputer,
    TransactionEventsParser,
)

from gasless.chain.abi import decode_outputs, load_billing_abi
from gasless.chain.addresses import parse_address
from gasless.chain.calls import contract_call
from gasless.localnet.owner import OwnerCallFailed, owner_call, unpause

computer = TransactionComputer()
USDC = "USDC-c0ffee"
DEPOSIT = 5_000_000  # 5 USDC


def wallets(net, shard: int):  # type: ignore[no-untyped-def]
    user = next(u for u in net.net.genesis.users if u.shard == shard)
    relayer = next(r for r in net.net.genesis.relayers if r.shard == shard)
    return user, relayer


def relayed_deposit(net, provider, shard: int, amount: int = DEPOSIT):  # type: ignore[no-untyped-def]
    user, relayer = wallets(net, shard)
    tx = contract_call(
        abi=load_billing_abi(),
        chain_id="localnet",
        sender=user.address,
        contract=parse_address(net.net.info["contract"]),
        function="deposit",
        arguments=[],
        gas_limit=20_000_000,
        nonce=provider.get_account(user.address).nonce,
        relayer=relayer.address,
        payment_token=USDC,
        payment_amount=amount,
    )
    message = computer.compute_bytes_for_signing(tx)
    tx.signature = user.secret_key.sign(message)
    tx.relayer_signature = relayer.secret_key.sign(message)
    tx_hash = provider.send_transaction(tx)
    provider.await_transaction_completed(tx_hash, AwaitingOptions(timeout_in_milliseconds=10_000))
    return user, relayer, provider.get_transaction(tx_hash)


def account_view(net, provider, user):  # type: ignore[no-untyped-def]
    contract = parse_address(net.net.info["contract"])
    response = provider.query_contract(
        SmartContractQuery(
            contract=contract, function="getAccount", arguments=[user.address.get_public_key()]
        )
    )
    assert response.return_code == "ok"
    return decode_outputs(load_billing_abi(), "getAccount", response.return_data_parts)[0]


@pytest.fixture
def unpaused(localnet):  # type: ignore[no-untyped-def]
    asyncio.run(unpause(localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"]))
    return localnet


def test_contract_is_deployed_paused_and_refuses_deposits(localnet) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(localnet.url)
    user, _, tx = relayed_deposit(localnet, provider, 1)
    # As on the real network: the node's status of a reverted call is `success`; the failure is in the logs,
    # and process-status (which the SDK's provider reads) says `fail`, its reason the VM's return code.
    assert tx.status.is_failed
    assert tx.raw["status"] == "success"
    errors = [e for e in tx.raw["logs"]["events"] if e["identifier"] == "signalError"]
    assert len(errors) == 1 and base64.b64decode(errors[0]["topics"][1]) == b"ERR_PAUSED"
    process = requests.get(f"{localnet.url}/transaction/{tx.hash.hex()}/process-status", timeout=5).json()[
        "data"
    ]
    assert process == {"status": "fail", "reason": "@" + b"user error".hex()}
    assert account_view(localnet, provider, user) is None
    # The USDC came back to the sender.
    esdt = requests.get(f"{localnet.url}/address/{user.address.to_bech32()}/esdt/{USDC}", timeout=5).json()
    assert esdt["data"]["tokenData"]["balance"] == str(1_000 * 10**6)


@pytest.mark.parametrize("shard", [1, 0])  # the contract lives in shard 1: same shard, then cross-shard
def test_deposit_with_usdc_changes_views_and_emits_its_event(unpaused, shard: int) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(unpaused.url)
    relayer_before = provider.get_account(wallets(unpaused, shard)[1].address).balance
    user, relayer, tx = relayed_deposit(unpaused, provider, shard)
    assert tx.status.is_successful, tx.raw
    assert (tx.raw["sourceShard"], tx.raw["destinationShard"]) == (shard, 1)
    view = account_view(unpaused, provider, user)
    assert view is not None and view.credits_micro == DEPOSIT
    parser = TransactionEventsParser(load_billing_abi())
    deposit_events = [e for e in tx.logs.events if e.topics and e.topics[0] == b"deposit"]
    assert len(deposit_events) == 1
    event = parser.parse_event(deposit_events[0])
    assert event.account == user.address.get_public_key() == event.payer
    assert event.amount == DEPOSIT and event.credits_after == DEPOSIT
    # The relayer paid the fee and got the unused gas back.
    refunds = [r for r in tx.raw["smartContractResults"] if r["returnMessage"] == "gas refund for relayer"]
    assert len(refunds) == 1 and refunds[0]["receiver"] == relayer.address.to_bech32()
    assert provider.get_account(relayer.address).balance == relayer_before - int(tx.raw["fee"])
    assert int(tx.raw["fee"]) < int(tx.raw["initiallyPaidFee"])


def test_paused_venue_reverts_the_deposit(unpaused) -> None:  # type: ignore[no-untyped-def]
    provider = ProxyNetworkProvider(unpaused.url)
    requests.post(f"{unpaused.url}/localnet/pause", json={"venue": True}, timeout=5).raise_for_status()
    user, _, tx = relayed_deposit(unpaused, provider, 1)
    assert tx.status.is_failed
    signal = [e for e in tx.logs.events if e.identifier == "signalError"]
    assert signal and signal[0].topics[1] == b"ERR_SWAP_VENUE_PAUSED"
    assert account_view(unpaused, provider, user) is None
    requests.post(f"{unpaused.url}/localnet/pause", json={"venue": False}, timeout=5).raise_for_status()
    _, _, again = relayed_deposit(unpaused, provider, 1)
    assert again.status.is_successful


def test_owner_only_calls_and_views_through_the_gateway(unpaused) -> None:  # type: ignore[no-untyped-def]
    net = unpaused
    with pytest.raises(OwnerCallFailed, match="ERR_NOT_OWNER"):
        asyncio.run(
            owner_call(net.url, net.net.genesis.relayers[0], net.net.info["contract"], "setPaused", [True])
        )
    asyncio.run(
        owner_call(net.url, net.net.genesis.owner, net.net.info["contract"], "setDepositsPaused", [True])
    )
    provider = ProxyNetworkProvider(net.url)
    contract = parse_address(net.net.info["contract"])
    raw = provider.query_contract(
        SmartContractQuery(contract=contract, function="getPauseState", arguments=[])
    )
    pause = decode_outputs(load_billing_abi(), "getPauseState", raw.return_data_parts)[0]
    assert (pause.paused, pause.deposits_paused) == (False, True)
    raw = provider.query_contract(
        SmartContractQuery(contract=contract, function="getRateClasses", arguments=[])
    )
    classes = decode_outputs(load_billing_abi(), "getRateClasses", raw.return_data_parts)[0]
    assert [(c.id, c.ru_per_sec, c.ru_burst, c.max_gas_limit, c.ru_per_hour) for c in classes][:2] == [
        (1, 1, 15, 100_000_000, 300),
        (2, 5, 25, 600_000_000, 600),
    ]
