"""localnet saves its chain under its data directory and resumes it: real gateways, stopped and started."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from multiversx_sdk import AwaitingOptions, ProxyNetworkProvider, Transaction, TransactionComputer
from test_localnet_contract_calls import DEPOSIT, USDC, account_view, relayed_deposit

from gasless import __version__
from gasless.chain.addresses import METACHAIN, address_of
from gasless.core.settings import LOCALNET_PAYMENT_TOKEN
from gasless.localnet.chain import ChainConfig
from gasless.localnet.owner import unpause
from gasless.localnet.persist import FORMAT, SHAPE, SavedChainError
from gasless.localnet.server import Localnet

computer = TransactionComputer()
ROUND_MS = 100
Start = Callable[..., Any]  # the run_localnet fixture: data_dir -> a RunningLocalnet (tests/conftest.py)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def get(net: Any, path: str) -> Any:
    body = requests.get(f"{net.url}{path}", timeout=5).json()
    assert body["code"] == "successful", body
    return body["data"]


def meta_status(net: Any) -> dict[str, Any]:
    return get(net, f"/network/status/{METACHAIN}")["status"]  # type: ignore[no-any-return]


def newest_blocks(net: Any) -> dict[int, dict[str, Any]]:
    """The newest block of every shard and of the metachain (nonce, round, timestamp)."""
    out = {}
    for shard in (0, 1, 2, METACHAIN):
        nonce = get(net, f"/network/status/{shard}")["status"]["erd_nonce"]
        out[shard] = get(net, f"/block/{shard}/by-nonce/{nonce}")["block"]
    return out


def transfer(net: Any, shard: int, value: int) -> tuple[Any, Transaction]:
    """A relayed EGLD transfer from the shard's relayer (funded) to a new address, sent."""
    relayer = next(r for r in net.net.genesis.relayers if r.shard == shard)
    receiver = address_of(bytes(range(shard, shard + 32)))
    provider = ProxyNetworkProvider(net.url)
    tx = Transaction(
        sender=relayer.address,
        receiver=receiver,
        nonce=provider.get_account(relayer.address).nonce,
        chain_id="localnet",
        gas_limit=50_000,
        value=value,
    )
    tx.signature = relayer.secret_key.sign(computer.compute_bytes_for_signing(tx))
    return receiver, tx


def test_a_stopped_localnet_resumes_its_chain(tmp_path: Path, run_localnet: Start) -> None:
    data_dir = tmp_path / "localnet"
    with run_localnet(data_dir) as first:
        assert first.net.info["resumed"] is False
        provider = ProxyNetworkProvider(first.url)
        asyncio.run(unpause(first.url, first.net.genesis.owner, first.net.info["contract"]))
        user, relayer, deposit = relayed_deposit(first, provider, 1)
        assert deposit.status.is_successful, deposit.raw
        receiver, tx = transfer(first, 2, 7 * 10**15)
        tx_hash = provider.send_transaction(tx)
        provider.await_transaction_completed(tx_hash, AwaitingOptions(timeout_in_milliseconds=10_000))
        sender = next(r for r in first.net.genesis.relayers if r.shard == 2)
        before = {
            "config": get(first, "/network/config")["config"],
            "user": get(first, f"/address/{user.address.to_bech32()}")["account"],
            "user_usdc": get(first, f"/address/{user.address.to_bech32()}/esdt/{USDC}")["tokenData"],
            "relayer": get(first, f"/address/{relayer.address.to_bech32()}")["account"],
            "sender": get(first, f"/address/{sender.address.to_bech32()}")["account"],
            "receiver": get(first, f"/address/{receiver.to_bech32()}")["account"],
            "deposit": get(first, f"/transaction/{deposit.hash.hex()}?withResults=true")["transaction"],
            "transfer": get(first, f"/transaction/{tx_hash.hex()}")["transaction"],
            "view": account_view(first, provider, user),
        }
        genesis_hyperblock = get(first, "/hyperblock/by-nonce/0")["hyperblock"]
    # Stopped: nothing answers; the saved chain stays.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{first.url}/network/config", timeout=2)
    last = before["transfer"]

    with run_localnet(data_dir) as second:
        assert second.net.info["resumed"] is True
        assert get(second, "/network/config")["config"] == before["config"]  # erd_start_time: same chain
        assert get(second, "/hyperblock/by-nonce/0")["hyperblock"]["hash"] == genesis_hyperblock["hash"]
        # Accounts: balances, nonces, ESDT.
        assert get(second, f"/address/{user.address.to_bech32()}")["account"] == before["user"]
        assert (
            get(second, f"/address/{user.address.to_bech32()}/esdt/{USDC}")["tokenData"]
            == before["user_usdc"]
        )
        assert get(second, f"/address/{relayer.address.to_bech32()}")["account"] == before["relayer"]
        assert get(second, f"/address/{sender.address.to_bech32()}")["account"] == before["sender"]
        assert get(second, f"/address/{receiver.to_bech32()}")["account"]["balance"] == str(7 * 10**15)
        # Contract state: the deposit made before the restart shows in the contract view.
        provider = ProxyNetworkProvider(second.url)
        view = account_view(second, provider, user)
        assert view == before["view"] and view.credits_micro == DEPOSIT
        # Transactions from before the restart, with their results and events.
        assert (
            get(second, f"/transaction/{deposit.hash.hex()}?withResults=true")["transaction"]
            == before["deposit"]
        )
        assert get(second, f"/transaction/{tx_hash.hex()}")["transaction"] == last
        assert get(second, f"/transaction/{tx_hash.hex()}/status") == {"status": "success"}
        # Blocks go on from where they stopped: higher nonces, later timestamps, the same history below.
        hyper = get(second, f"/hyperblock/by-nonce/{last['hyperblockNonce']}")["hyperblock"]
        assert hyper["hash"] == last["hyperblockHash"]
        assert tx_hash.hex() in {t["hash"] for t in hyper["transactions"]}
        stopped_at = meta_status(second)
        wait_until(lambda: meta_status(second)["erd_nonce"] > stopped_at["erd_nonce"] + 2, "new rounds")
        blocks = newest_blocks(second)
        assert blocks[METACHAIN]["nonce"] > last["hyperblockNonce"]
        assert blocks[METACHAIN]["timestampMs"] > last["timestampMs"]
        assert blocks[METACHAIN]["round"] > last["round"]
        for shard in (0, 1, 2):
            previous = get(second, f"/block/{shard}/by-nonce/{blocks[shard]['nonce'] - 1}")["block"]
            assert blocks[shard]["prevBlockHash"] == previous["hash"]
            assert blocks[shard]["timestampMs"] > previous["timestampMs"]
        # And the chain works on: a new transfer from the same sender takes the next nonce.
        receiver2, tx2 = transfer(second, 2, 10**15)
        assert tx2.nonce == last["nonce"] + 1
        hash2 = provider.send_transaction(tx2)
        done = provider.await_transaction_completed(hash2, AwaitingOptions(timeout_in_milliseconds=10_000))
        assert done.status.is_successful
        assert done.raw["timestampMs"] > last["timestampMs"]


def test_the_pool_and_the_chain_faults_survive_a_restart(tmp_path: Path, run_localnet: Start) -> None:
    data_dir = tmp_path / "localnet"
    with run_localnet(data_dir) as first:
        requests.post(f"{first.url}/localnet/faults", json={"chain": {"stalledShards": [2]}}, timeout=5)
        _, tx = transfer(first, 2, 10**15)
        tx_hash = ProxyNetworkProvider(first.url).send_transaction(tx).hex()
        sender = tx.sender.to_bech32()
        assert get(first, f"/transaction/pool?by-sender={sender}")["txPool"]["transactions"]
    with run_localnet(data_dir) as second:
        assert get(second, "/localnet/faults")["chain"]["stalledShards"] == [2]
        pool = get(second, f"/transaction/pool?by-sender={sender}")["txPool"]["transactions"]
        assert [entry["txFields"]["hash"] for entry in pool] == [tx_hash]
        assert get(second, f"/transaction/{tx_hash}/status") == {"status": "pending"}
        requests.delete(f"{second.url}/localnet/faults", timeout=5).raise_for_status()
        wait_until(
            lambda: get(second, f"/transaction/{tx_hash}/process-status")["status"] == "success", "execution"
        )


def test_fresh_starts_a_new_chain_with_the_same_wallets(tmp_path: Path, run_localnet: Start) -> None:
    data_dir = tmp_path / "localnet"
    with run_localnet(data_dir) as first:
        _, tx = transfer(first, 1, 10**15)
        tx_hash = ProxyNetworkProvider(first.url).send_transaction(tx).hex()
        wait_until(lambda: get(first, f"/transaction/{tx_hash}/status")["status"] == "success", "execution")
        first_info = get(first, "/localnet/info")
        first_start = get(first, "/network/config")["config"]["erd_start_time"]
    wait_until(lambda: int(time.time()) > first_start, "the next second (a new genesis time)")

    async def fresh() -> Localnet:
        return Localnet(
            data_dir=data_dir,
            payment_token=LOCALNET_PAYMENT_TOKEN,
            config=ChainConfig(round_ms=ROUND_MS),
            fresh=True,
        )

    net = asyncio.run(fresh())
    assert net.resumed is False and net.chain.genesis_ms // 1000 > first_start
    assert tx_hash not in net.chain.records and len(net.chain.hyperblocks) == 1
    assert net.info["owner"] == first_info["owner"] and net.info["relayers"] == first_info["relayers"]
    net.store.unlock()  # type: ignore[union-attr]  # never started: release the directory by hand


def submissions(net: Any, tx_hash: str) -> int:
    return int(get(net, f"/localnet/submissions/{tx_hash}")["submissions"])


def test_submission_counts_survive_restarts_and_the_head_does_not_grow_with_them(
    tmp_path: Path, run_localnet: Start
) -> None:
    data_dir = tmp_path / "localnet"
    head = data_dir / "chain" / "head.bin"
    with run_localnet(data_dir) as first:
        requests.post(f"{first.url}/localnet/faults", json={"chain": {"stalledShards": [2]}}, timeout=5)
        _, tx = transfer(first, 2, 10**15)
        provider = ProxyNetworkProvider(first.url)
        tx_hash = provider.send_transaction(tx).hex()
        provider.send_transaction(tx)  # the same transaction again: the pool keeps one, both are counted
        assert submissions(first, tx_hash) == 2
    head_size = head.stat().st_size
    with run_localnet(data_dir) as second:
        assert submissions(second, tx_hash) == 2
        ProxyNetworkProvider(second.url).send_transaction(tx)
        # Many hashes sent once each (refused: a nonce far ahead is still counted, as on any send).
        relayer = tx.sender
        for nonce in range(500):
            other = Transaction(
                sender=relayer,
                receiver=tx.receiver,
                nonce=10**6 + nonce,
                chain_id="localnet",
                gas_limit=50_000,
            )
            other.signature = bytes(64)
            requests.post(f"{second.url}/transaction/send", json=other.to_dictionary(), timeout=5)
    with run_localnet(data_dir) as third:
        assert submissions(third, tx_hash) == 3
    # The counts are in the history's frames: 500 more hashes left the head's size where it was.
    assert abs(head.stat().st_size - head_size) < 2_000, (head_size, head.stat().st_size)


def test_a_failed_snapshot_keeps_its_submission_counts_for_the_next(tmp_path: Path) -> None:
    data_dir = tmp_path / "localnet"

    async def scenario() -> None:
        net = _localnet(data_dir)
        await net.start()
        try:
            assert net.store is not None
            net.chain.count_submission("ab" * 32)
            real_write = net.store.write

            def failing(snapshot: Any) -> int:
                raise OSError("disk full")

            net.store.write = failing  # type: ignore[method-assign]
            with pytest.raises(OSError):
                await net.save()
            net.store.write = real_write  # type: ignore[method-assign]
            net.chain.count_submission("cd" * 32)
        finally:
            await net.stop()  # the last snapshot, written

    asyncio.run(scenario())
    resumed = _localnet(data_dir)
    assert resumed.chain.submissions["ab" * 32] == 1
    assert resumed.chain.submissions["cd" * 32] == 1


def _localnet(data_dir: Path, round_ms: int = ROUND_MS) -> Localnet:
    return Localnet(
        data_dir=data_dir, payment_token=LOCALNET_PAYMENT_TOKEN, config=ChainConfig(round_ms=round_ms)
    )


async def _started_and_stopped(data_dir: Path) -> Localnet:
    net = _localnet(data_dir)
    await net.start()
    await net.stop()
    return net


def test_a_saved_chain_is_refused_when_it_cannot_be_resumed(tmp_path: Path) -> None:
    data_dir = tmp_path / "localnet"
    asyncio.run(_started_and_stopped(data_dir))
    chain_dir = data_dir / "chain"

    # Another round duration: the message says which value resumes it.
    with pytest.raises(SavedChainError, match=r"round_ms 100 \(asked: 600\).*--round-ms 100.*--fresh"):
        _localnet(data_dir, round_ms=600)

    # A process already runs this chain.
    running = _localnet(data_dir)
    with pytest.raises(SavedChainError, match="another localnet is running the chain"):
        _localnet(data_dir)
    running.store.unlock()  # type: ignore[union-attr]

    # Other wallets than the chain was created with.
    owner = data_dir / "wallets" / "owner.pem"
    saved_owner = owner.read_bytes()
    owner.unlink()
    with pytest.raises(SavedChainError, match="wallets .* are not the ones"):
        _localnet(data_dir)
    owner.write_bytes(saved_owner)

    # A format this version does not read (e.g. written by another version of gasless), or saved classes of
    # another shape (a field added or renamed since).
    head = chain_dir / "head.bin"
    saved_head = head.read_bytes()
    header = f"gasless-localnet-chain {FORMAT} {__version__} {SHAPE}\n".encode()
    assert saved_head.startswith(header)
    for written, found in (
        (f"0 0.0.9 {SHAPE}", f"0/{SHAPE}"),
        (f"{FORMAT} 0.0.9 0123abcd", f"{FORMAT}/0123abcd"),
    ):
        head.write_bytes(f"gasless-localnet-chain {written}\n".encode() + saved_head[len(header) :])
        expected = (
            f"has format {found} (written by gasless 0.0.9), and this gasless {__version__} reads format "
        )
        expected += f"{FORMAT}/{SHAPE}: start a new chain with --fresh"
        with pytest.raises(SavedChainError, match=re.escape(expected)):
            _localnet(data_dir)
    head.write_bytes(b"not a chain\n")
    with pytest.raises(SavedChainError, match="is not a saved localnet chain"):
        _localnet(data_dir)
    head.write_bytes(saved_head)
    net = _localnet(data_dir)
    assert net.resumed is True
    net.store.unlock()  # type: ignore[union-attr]


def test_history_bytes_past_the_head_are_ignored_and_a_damaged_history_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "localnet"
    first = asyncio.run(_started_and_stopped(data_dir))
    history = data_dir / "chain" / "history.bin"
    saved = history.read_bytes()
    # A crash while appending a frame: bytes the head does not cover.
    history.write_bytes(saved + b"\x00\x00\x00\x00\x00\x00\x10\x00partial frame")
    resumed = asyncio.run(_started_and_stopped(data_dir))
    assert resumed.resumed is True
    assert [h.hash for h in resumed.chain.hyperblocks[: len(first.chain.hyperblocks)]] == [
        h.hash for h in first.chain.hyperblocks
    ]
    assert b"partial frame" not in history.read_bytes()  # cut off by the next write
    # A flipped byte inside the covered history.
    damaged = bytearray(history.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    history.write_bytes(bytes(damaged))
    with pytest.raises(SavedChainError, match="damaged"):
        _localnet(data_dir)
