"""GatewayClient against answers shaped like the real gateway's, served by a small aiohttp app.

Each body below is written by hand from the structs that produce it on the network: mx-chain-proxy-go@f9c9ac2
(`data/`, `api/groups/`, `process/`), mx-chain-go@7ba82b2 (`api/groups/`, `statusHandler/`, `node/`) and
mx-chain-core-go@v1.4.0 (`data/transaction/apiTransactionResult.go`, `data/api/`, `data/vm/`). docs/chain.md
lists the endpoints, the members the service reads and where each is defined.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multiversx_sdk import Address, Transaction, UserSecretKey

from gasless.chain.addresses import METACHAIN
from gasless.chain.codec import tx_from_wire, tx_hash, tx_to_wire
from gasless.chain.gateway import GatewayClient, GatewayRejected, GatewayUnavailable
from gasless.chain.network import NetworkParams, ShardStatus

ALICE = Address.new_from_bech32("erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th")
BOB = Address.new_from_bech32("erd1spyavw0956vq68xj8y4tenjpq2wd5a9p2c6j8gsz7ztyrnpxrruqzu66jx")
RELAYER = UserSecretKey(bytes.fromhex("11" * 32)).generate_public_key().to_address("erd")
GUARDIAN = UserSecretKey(bytes.fromhex("22" * 32)).generate_public_key().to_address("erd")
CONTRACT = Address.new_from_hex("00000000000000000500" + "ab" * 22, "erd")
TOKEN = "USDC-c76f1f"
HASH = "5f1c" + "0" * 56 + "a1b2"


def b64(raw: bytes | str) -> str:
    return base64.b64encode(raw.encode() if isinstance(raw, str) else raw).decode()


def ok(data: Any) -> dict[str, Any]:
    """The envelope: proxy `data.GenericAPIResponse` (data/api.go:10-14), codes at data/api.go:29-38."""
    return {"data": data, "error": "", "code": "successful"}


def failed(message: str, code: str = "internal_issue") -> dict[str, Any]:
    return {"data": None, "error": message, "code": code}


Answer = tuple[int, Any] | Callable[[Any], tuple[int, Any]]


@dataclass
class FakeGateway:
    url: str = ""
    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    # (method, path, query, JSON body) of every request, in order
    seen: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)

    def on(self, method: str, path: str, body: Any, status: int = 200) -> None:
        self.answers[(method, path)] = (status, body)

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.seen]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[FakeGateway, GatewayClient]]:
    fake = FakeGateway()

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        fake.seen.append((request.method, request.path, dict(request.query), body))
        answer = fake.answers.get((request.method, request.path))
        if answer is None:
            return web.Response(status=404, text="404 page not found")  # gin's own answer: no envelope
        status, payload = answer(body) if callable(answer) else answer
        return web.json_response(payload, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            client = GatewayClient(session, [fake.url], timeout_ms=2_000)
            yield fake, client
            await client.aclose()
    finally:
        await runner.cleanup()


def relayed_wire(nonce: int = 7, data: bytes = b"ping") -> dict[str, Any]:
    tx = Transaction(
        sender=ALICE,
        receiver=BOB,
        nonce=nonce,
        chain_id="1",
        version=2,
        gas_limit=50_000 + 50_000 + 1_500 * len(data),
        gas_price=1_000_000_000,
        data=data,
        relayer=RELAYER,
        signature=b"\x01" * 64,
        relayer_signature=b"\x02" * 64,
    )
    return tx_to_wire(tx)


def hash_of(wire: dict[str, Any]) -> str:
    return tx_hash(Transaction.new_from_dictionary(wire))


# Network --------------------------------------------------------------------------------------------------
# mx-chain-go statusHandler/statusMetricsProvider.go:237-270 (ConfigMetrics), wrapped as {"config": ...} by
# api/groups/networkGroup.go:164-186; the proxy forwards the node's envelope unchanged
# (process/nodeStatusProcessor.go:116-137, api/groups/baseNetworkGroup.go:71-79).
CONFIG = {
    "erd_num_shards_without_meta": 3,
    "erd_num_nodes_in_shard": 400,
    "erd_num_metachain_nodes": 400,
    "erd_shard_consensus_group_size": 63,
    "erd_meta_consensus_group_size": 400,
    "erd_min_gas_price": 1_000_000_000,
    "erd_min_gas_limit": 50_000,
    "erd_extra_gas_limit_guarded_tx": 50_000,
    "erd_extra_gas_limit_relayed_tx": 50_000,
    "erd_max_gas_per_transaction": 600_000_000,
    "erd_round_duration": 6_000,
    "erd_start_time": 1_596_117_600,
    "erd_denomination": 18,
    "erd_min_transaction_version": 1,
    "erd_rounds_per_epoch": 14_400,
    "erd_gas_per_data_byte": 1_500,
    "erd_rewards_top_up_gradient_point": "2000000000000000000000000",
    "erd_chain_id": "1",
    "erd_latest_tag_software_version": "v1.10.0",
    "erd_top_up_factor": "0.500000",
    "erd_gas_price_modifier": "0.01",
    "erd_adaptivity": "false",
    "erd_hysteresis": "0.200000",
}

# statusMetricsProvider.go:426-456 (NetworkMetrics), wrapped as {"status": ...} by networkGroup.go:214-236.
META_STATUS = {
    "erd_nonce": 25_001_234,
    "erd_block_timestamp": 1_745_490_000,
    "erd_block_timestamp_ms": 1_745_490_000_000,  # erd_block_timestamp * 1000 (common/common.go:208-210)
    "erd_highest_final_nonce": 25_001_233,
    "erd_current_round": 25_101_500,
    "erd_round_at_epoch_start": 25_099_200,
    "erd_nonce_at_epoch_start": 24_998_950,
    "erd_epoch_number": 1_743,
    "erd_rounds_per_epoch": 14_400,
    "erd_rounds_passed_in_current_epoch": 2_300,
    "erd_nonces_passed_in_current_epoch": 2_284,
}


async def test_network_config_parses_into_params(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    fake.on("GET", "/network/config", ok({"config": CONFIG}))
    params = NetworkParams.from_config(await client.network_config())
    assert (params.chain_id, params.round_duration_ms, params.num_shards) == ("1", 6_000, 3)
    assert (params.min_gas_price, params.min_gas_limit, params.gas_per_data_byte) == (10**9, 50_000, 1_500)
    assert params.gas_price_modifier == Decimal("0.01")
    assert (params.extra_gas_guarded, params.extra_gas_relayed) == (50_000, 50_000)
    assert (params.max_gas_per_tx, params.rounds_per_epoch) == (600_000_000, 14_400)
    assert (params.start_time_ms, params.min_tx_version) == (1_596_117_600_000, 1)


async def test_network_status_parses_into_shard_status(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    fake.on("GET", f"/network/status/{METACHAIN}", ok({"status": META_STATUS}))
    status = ShardStatus.from_status(METACHAIN, await client.network_status(METACHAIN), observed_at_ms=1)
    assert (status.nonce, status.highest_final_nonce) == (25_001_234, 25_001_233)
    assert (status.round, status.epoch, status.block_ts_ms) == (25_101_500, 1_743, 1_745_490_000_000)
    seconds_only = {k: v for k, v in META_STATUS.items() if k != "erd_block_timestamp_ms"}
    assert ShardStatus.from_status(0, seconds_only, 1).block_ts_ms == 1_745_490_000_000


# Accounts -------------------------------------------------------------------------------------------------
async def test_account_at_block(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # proxy data.AccountModel / data.Account / data.BlockInfo (data/account.go:6-29, data/blockInfo.go:4-8),
    # built by api/groups/baseAccountsGroup.go:76-80.
    account = {
        "address": ALICE.to_bech32(),
        "nonce": 42,
        "balance": "1250000000000000000",
        "username": "",
        "code": "",
        "codeHash": None,
        "rootHash": b64(b"\x07" * 32),
        "codeMetadata": None,
        "developerReward": "0",
        "ownerAddress": "",
    }
    block_info = {"nonce": 9_812_345, "hash": "ab" * 32, "rootHash": "cd" * 32}
    fake.on("GET", f"/address/{ALICE.to_bech32()}", ok({"account": account, "blockInfo": block_info}))
    got, block = await client.account_at_block(ALICE.to_bech32())
    assert (got["nonce"], got["balance"], block) == (42, "1250000000000000000", 9_812_345)


async def test_esdt_balance(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # mx-chain-go api/groups/addressGroup.go:74-78 (esdtTokenData), 399-419; forwarded by the proxy
    # (process/accountProcessor.go:189-219).
    token_data = {"tokenIdentifier": TOKEN, "balance": "1500000", "properties": ""}
    path = f"/address/{ALICE.to_bech32()}/esdt/{TOKEN}"
    fake.on("GET", path, ok({"tokenData": token_data, "blockInfo": {"nonce": 9_812_345}}))
    assert await client.esdt_balance(ALICE.to_bech32(), TOKEN) == 1_500_000


async def test_guardian_data(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # mx-chain-core-go data/api/guardianData.go:4-15, wrapped by mx-chain-go addressGroup.go:324-338.
    guarded = {
        "activeGuardian": {"address": GUARDIAN.to_bech32(), "activationEpoch": 1_700, "serviceUID": "svc"},
        "guarded": True,
    }
    fake.on("GET", f"/address/{ALICE.to_bech32()}/guardian-data", ok({"guardianData": guarded}))
    fake.on("GET", f"/address/{BOB.to_bech32()}/guardian-data", ok({"guardianData": {"guarded": False}}))
    data = await client.guardian_data(ALICE.to_bech32())
    assert data["guarded"] is True and data["activeGuardian"]["address"] == GUARDIAN.to_bech32()
    assert await client.guardian_data(BOB.to_bech32()) == {"guarded": False}  # guardians are omitempty


# Pool -----------------------------------------------------------------------------------------------------
async def test_pool_for_sender(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # proxy data.TransactionsPoolForSender / WrappedTransaction (data/transaction.go:208-234); the node's field
    # names are lower case (node/external/transactionAPI/fieldsHandler.go:7-27).
    fields = {"hash": HASH, "nonce": 7, "gasprice": 1_000_000_000, "relayer": RELAYER.to_bech32()}
    fake.on("GET", "/transaction/pool", ok({"txPool": {"transactions": [{"txFields": fields}]}}))
    assert await client.pool_for_sender(ALICE.to_bech32()) == [fields]
    assert fake.seen[-1][2] == {"by-sender": ALICE.to_bech32(), "fields": "hash,nonce,gasprice,relayer"}
    fake.on("GET", "/transaction/pool", ok({"txPool": {"transactions": []}}))
    assert await client.pool_for_sender(ALICE.to_bech32(), fields="nonce") == []


# Transactions ---------------------------------------------------------------------------------------------
# mx-chain-core-go data/transaction/apiTransactionResult.go:11-74 (ApiTransactionResult), :114-127 (logs).
EXECUTED = {
    "type": "normal",
    "processingTypeOnSource": "RelayedTxV3",
    "processingTypeOnDestination": "RelayedTxV3",
    "hash": HASH,
    "nonce": 7,
    "round": 25_101_480,
    "epoch": 1_743,
    "value": "0",
    "receiver": CONTRACT.to_bech32(),
    "sender": ALICE.to_bech32(),
    "gasPrice": 1_000_000_000,
    "gasLimit": 6_000_000,
    "gasUsed": 2_123_456,
    "data": b64("ping@01"),
    "signature": "01" * 64,
    "sourceShard": 1,
    "destinationShard": 1,
    "blockNonce": 9_812_300,
    "blockHash": "aa" * 32,
    "notarizedAtSourceInMetaNonce": 25_001_210,
    "NotarizedAtSourceInMetaHash": "bb" * 32,  # sic: capital N in the struct tag
    "notarizedAtDestinationInMetaNonce": 25_001_210,
    "notarizedAtDestinationInMetaHash": "bb" * 32,
    "miniblockType": "TxBlock",
    "miniblockHash": "cc" * 32,
    "timestamp": 1_745_489_880,
    "timestampMs": 1_745_489_880_000,
    "logs": {
        "address": CONTRACT.to_bech32(),
        "events": [
            {
                "address": CONTRACT.to_bech32(),
                "identifier": "completedTxEvent",
                "topics": [b64(bytes.fromhex(HASH))],
                "data": None,
                "additionalData": None,
            }
        ],
    },
    "status": "success",
    "operation": "transfer",
    "function": "ping",
    "initiallyPaidFee": "1234500000000000",
    "fee": "1134500000000000",
    "isRelayed": True,
    "relayerAddress": RELAYER.to_bech32(),
    "relayerSignature": "02" * 64,
    "chainID": "1",
    "version": 2,
    "options": 0,
}


async def test_transaction_without_sender_carries_the_hyperblock(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # Without `sender` the proxy copies notarizedAtDestinationInMeta* into hyperblock*
    # (process/transactionProcessor.go:363-373).
    proxied = {**EXECUTED, "hyperblockNonce": 25_001_210, "hyperblockHash": "bb" * 32}
    fake.on("GET", f"/transaction/{HASH}", ok({"transaction": proxied}))
    tx = await client.transaction(HASH)
    assert tx is not None and tx["status"] == "success"
    assert tx["hyperblockNonce"] == tx["notarizedAtDestinationInMetaNonce"] == 25_001_210
    assert fake.seen[-1][2] == {"withResults": "true"}


async def test_transaction_with_sender_has_no_hyperblock(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # With `sender` the proxy returns the observer's answer as is (process/transactionProcessor.go:978-1012),
    # and the node never sets hyperblockNonce (omitempty: the member is absent).
    fake.on("GET", f"/transaction/{HASH}", ok({"transaction": EXECUTED}))
    tx = await client.transaction(HASH, sender=ALICE.to_bech32())
    assert tx is not None and tx["blockNonce"] == 9_812_300 and "hyperblockNonce" not in tx
    assert fake.seen[-1][2] == {"withResults": "true", "sender": ALICE.to_bech32()}


async def test_transaction_not_found_is_none_on_both_paths(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # Sender path: 404 for any failure (transactionProcessor.go:376-387, api/groups/baseTransactionGroup.go:267-279).
    fake.on("GET", f"/transaction/{HASH}", failed("transaction not found"), status=404)
    assert await client.transaction(HASH, sender=ALICE.to_bech32()) is None
    # Without sender: 500 (baseTransactionGroup.go:242-246, transactionProcessor.go:836).
    fake.on("GET", f"/transaction/{HASH}", failed("transaction not found"), status=500)
    assert await client.transaction(HASH) is None


async def test_invalid_transaction_carries_its_receipt(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # An invalid transaction: receipt with the fee charged and the error text (mx-chain-go
    # process/transaction/shardProcess.go:338-343; ApiReceipt at apiTransactionResult.go:107-112).
    receipt = {
        "value": 1_234_500_000_000_000,
        "sender": ALICE.to_bech32(),
        "data": "insufficient funds",
        "txHash": HASH,
    }
    invalid = {**EXECUTED, "status": "invalid", "miniblockType": "InvalidBlock", "receipt": receipt}
    invalid.pop("logs")
    fake.on("GET", f"/transaction/{HASH}", ok({"transaction": invalid}))
    tx = await client.transaction(HASH, sender=ALICE.to_bech32())
    assert tx is not None and tx["status"] == "invalid" and tx["receipt"]["data"] == "insufficient funds"


# Simulate and cost ----------------------------------------------------------------------------------------
async def test_simulate_intra_shard(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wire = relayed_wire()
    # proxy data.TransactionSimulationResults (data/transaction.go:123-130): status, failReason, scResults,
    # receipts, hash; no gasUsed, no logs.
    fake.on("POST", "/transaction/simulate", ok({"result": {"status": "success", "hash": hash_of(wire)}}))
    result = await client.simulate(wire)
    assert result == {"status": "success", "hash": hash_of(wire)}
    assert fake.seen[-1][2] == {"checkSignature": "false"} and fake.seen[-1][3] == wire


async def test_simulate_failure_and_cross_shard(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wire = relayed_wire()
    failure = {"status": "fail", "failReason": "insufficient funds", "hash": hash_of(wire)}
    fake.on("POST", "/transaction/simulate", ok({"result": failure}))
    assert (await client.simulate(wire))["failReason"] == "insufficient funds"
    # Sender and receiver in different shards: one result per shard (transactionProcessor.go:237-247).
    both = {"senderShard": {"status": "success", "hash": hash_of(wire)}, "receiverShard": failure}
    fake.on("POST", "/transaction/simulate", ok({"result": both}))
    result = await client.simulate(wire)
    assert set(result) == {"senderShard", "receiverShard"} and "status" not in result


async def test_cost(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wire = relayed_wire()
    # proxy data.TxCostResponseData (data/transaction.go:170-175).
    fake.on(
        "POST",
        "/transaction/cost",
        ok({"txGasUnits": 1_234_567, "returnMessage": "", "smartContractResults": {}}),
    )
    assert (await client.cost(wire))["txGasUnits"] == 1_234_567
    refused = {"txGasUnits": 0, "returnMessage": "contract is paused", "smartContractResults": None}
    fake.on("POST", "/transaction/cost", ok(refused))
    assert await client.cost(wire) == refused  # a 200: the refusal is in returnMessage


# VM query ---------------------------------------------------------------------------------------------------
def vm_output(code: str, message: str, *parts: bytes) -> dict[str, Any]:
    """mx-chain-core-go data/vm/vmOutputApi.go:10-20, wrapped as {"data": ..., "blockInfo": ...} by the proxy
    (api/groups/baseVmValuesGroup.go:165-167, data/vmValues.go:9-12)."""
    output = {
        "returnData": [b64(p) if p else "" for p in parts],
        "returnCode": code,
        "returnMessage": message,
        "gasRemaining": 0,
        "gasRefund": 0,
        "outputAccounts": {},
        "deletedAccounts": None,
        "touchedAccounts": None,
        "logs": None,
    }
    return ok({"data": output, "blockInfo": {"nonce": 9_812_345, "hash": "ab" * 32, "rootHash": "cd" * 32}})


async def test_vm_query(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    fake.on("POST", "/vm-values/query", vm_output("ok", "", b"\x01\x02", b""))
    parts = await client.vm_query(CONTRACT.to_bech32(), "getSettlement", [b"\x05"], caller=ALICE.to_bech32())
    assert parts == [b"\x01\x02", b""]
    body = fake.seen[-1][3]
    assert body == {
        "scAddress": CONTRACT.to_bech32(),
        "funcName": "getSettlement",
        "args": ["05"],
        "caller": ALICE.to_bech32(),
    }
    # A VM failure is a 200 through the proxy (scQueryProcessor.go:90-93): only returnCode says it.
    fake.on("POST", "/vm-values/query", vm_output("user error", "unknown batch"))
    with pytest.raises(GatewayRejected) as err:
        await client.vm_query(CONTRACT.to_bech32(), "getSettlement")
    assert (err.value.message, err.value.status) == ("unknown batch", 200)


# Blocks -----------------------------------------------------------------------------------------------------
async def test_block_by_nonce(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    # mx-chain-core-go data/api/apiBlock.go:11-42, wrapped as {"block": ...} (proxy data/block.go:9-18).
    block = {
        "nonce": 9_812_345,
        "round": 25_101_500,
        "epoch": 1_743,
        "shard": 1,
        "numTxs": 0,
        "hash": "AB" * 32,
        "prevBlockHash": "ef" * 32,
        "stateRootHash": "cd" * 32,
        "status": "on-chain",
        "pubKeyBitmap": "ff",
        "timestamp": 1_745_490_000,
        "timestampMs": 1_745_490_000_000,
    }
    fake.on("GET", "/block/1/by-nonce/9812345", ok({"block": block}))
    got = await client.block_by_nonce(1, 9_812_345)
    assert (got["hash"], got["nonce"], got["timestampMs"]) == ("AB" * 32, 9_812_345, 1_745_490_000_000)


async def test_block_by_hash(gateway) -> None:  # type: ignore[no-untyped-def]
    """The block a native-auth token names, read by hash (NetworkView.block_timestamp_ms)."""
    fake, client = gateway
    block_hash = "9f" * 32
    # apiBlock.go:11-42 again; the node writes the hash in lower-case hex (blockAPI/shardBlock.go:90-118).
    block = {
        "nonce": 9_812_340,
        "round": 25_101_495,
        "epoch": 1_743,
        "shard": 1,
        "numTxs": 2,
        "hash": block_hash,
        "prevBlockHash": "ee" * 32,
        "stateRootHash": "cd" * 32,
        "status": "on-chain",
        "pubKeyBitmap": "ff",
        "timestamp": 1_745_489_970,
        "timestampMs": 1_745_489_970_000,
    }
    fake.on("GET", f"/block/1/by-hash/{block_hash}", ok({"block": block}))
    got = await client.block_by_hash(1, block_hash)
    assert got is not None and (got["hash"], got["timestampMs"]) == (block_hash, 1_745_489_970_000)
    # Not in that shard's storage: the node's `getting block failed: ...` (mx-chain-go api/groups/
    # blockGroup.go:128-133), wrapped by the proxy as its observers' error (process/blockProcessor.go:64-77,
    # process/accountProcessor.go:581-588) and answered 500 (api/groups/baseBlockGroup.go:72-76): no block,
    # not an outage.
    fake.on(
        "GET",
        f"/block/0/by-hash/{block_hash}",
        failed("sending request error, getting block failed: key not found"),
        status=500,
    )
    assert await client.block_by_hash(0, block_hash) is None
    # A hash that is not hex: 400 before any observer is asked (api/shared/shared.go:73-81).
    fake.on(
        "GET", "/block/1/by-hash/zz", failed("invalid block hash parameter:zz", "bad_request"), status=400
    )
    assert await client.block_by_hash(1, "zz") is None
    # Anything else that is not the gateway speaking (a load balancer's page) is an outage, not "no block".
    fake.answers[("GET", f"/block/2/by-hash/{block_hash}")] = (502, "<html>bad gateway</html>")
    with pytest.raises(GatewayUnavailable):
        await client.block_by_hash(2, block_hash)


# Hyperblocks --------------------------------------------------------------------------------------------
HYPER_NONCE = META_STATUS["erd_highest_final_nonce"]
HYPER_HASH = "e1" * 32
HYPER_TS_MS = 1_745_489_994_000


def relayed_call(data: bytes, nonce: int) -> Transaction:
    """A guarded Relayed-V3 call with both usernames: every member a listing can carry."""
    return Transaction(
        sender=ALICE,
        receiver=CONTRACT,
        nonce=nonce,
        value=10**15,
        chain_id="1",
        version=2,
        options=2,  # guarded
        gas_limit=6_000_000,
        gas_price=1_000_000_000,
        data=data,
        sender_username="alice",
        receiver_username="billing",
        guardian=GUARDIAN,
        relayer=RELAYER,
        signature=b"\x01" * 64,
        guardian_signature=b"\x03" * 64,
        relayer_signature=b"\x02" * 64,
    )


def listed(tx: Transaction, source: int, destination: int) -> dict[str, Any]:
    """A transaction as a hyperblock lists it: the node's unmarshaller (mx-chain-go node/external/
    transactionAPI/unmarshaller.go:131-165: signatures in hex, bytes in base64, the relayer as
    `relayerAddress`), then the block's own members (node/external/blockAPI/baseBlock.go:255-266); no
    `blockNonce`, no timestamps, no `hyperblockNonce`, no logs."""
    entry: dict[str, Any] = {
        "type": "normal",
        "processingTypeOnSource": "RelayedTxV3" if tx.relayer else "MoveBalance",
        "processingTypeOnDestination": "SCInvoking" if tx.data else "MoveBalance",
        "hash": tx_hash(tx),
        "nonce": tx.nonce,
        "round": 25_101_490,
        "epoch": 1_743,
        "value": str(tx.value),
        "receiver": tx.receiver.to_bech32(),
        "sender": tx.sender.to_bech32(),
        "gasPrice": tx.gas_price,
        "gasLimit": tx.gas_limit,
        "signature": tx.signature.hex(),
        "sourceShard": source,
        "destinationShard": destination,
        "miniblockType": "TxBlock",
        "miniblockHash": "cc" * 32,
        "status": "success",
        "operation": "transfer",
        "initiallyPaidFee": "1234500000000000",
        "chainID": tx.chain_id,
        "version": tx.version,
        "options": tx.options,  # no omitempty: always there
    }
    if tx.data:
        entry["data"] = b64(tx.data)
    if tx.sender_username:
        entry["senderUsername"] = b64(tx.sender_username)
    if tx.receiver_username:
        entry["receiverUsername"] = b64(tx.receiver_username)
    if tx.guardian:
        entry["guardian"] = tx.guardian.to_bech32()
        entry["guardianSignature"] = tx.guardian_signature.hex()
    if tx.relayer:
        entry["isRelayed"] = True
        entry["relayerAddress"] = tx.relayer.to_bech32()
        entry["relayerSignature"] = tx.relayer_signature.hex()
    return entry


OURS = relayed_call(b"ping@01", 7)
SETTLE = relayed_call(b"settleUsage@05@" + b"ab".hex().encode(), 8)
TRANSFER = Transaction(
    sender=BOB,
    receiver=ALICE,
    nonce=3,
    value=10**17,
    chain_id="1",
    version=2,
    gas_limit=50_000,
    gas_price=1_000_000_000,
    signature=b"\x04" * 64,
)
# mx-chain-core-go data/api/apiHyperBlock.go:8-27 (NotarizedBlock: data/api/apiBlock.go:79-87), built by the
# proxy from the metablock and the shard blocks it notarizes (process/hyperblockBuilder.go:27-56).
HYPERBLOCK = {
    "hash": HYPER_HASH,
    "prevBlockHash": "e0" * 32,
    "stateRootHash": "cd" * 32,
    "nonce": HYPER_NONCE,
    "round": 25_101_499,
    "epoch": 1_743,
    "numTxs": 3,
    "accumulatedFees": "0",
    "developerFees": "0",
    "timestamp": HYPER_TS_MS // 1000,
    "timestampMs": HYPER_TS_MS,
    "shardBlocks": [
        {"hash": "9f" * 32, "nonce": 9_812_340, "round": 25_101_495, "shard": 1, "rootHash": "cd" * 32},
        {"hash": "8f" * 32, "nonce": 9_700_001, "round": 25_101_496, "shard": 0, "rootHash": "ce" * 32},
    ],
    "transactions": [listed(OURS, 1, 1), listed(TRANSFER, 0, 1), listed(SETTLE, 1, 1)],
    "status": "on-chain",
}


async def test_hyperblock_by_nonce_as_the_tracker_reads_it(gateway) -> None:  # type: ignore[no-untyped-def]
    """The tracker follows the hyperblocks (gasless.relay.chain_reads): a tracked intent listed there is
    settled at that hyperblock, on its timestamp, as the listing carries neither."""
    from gasless.relay.chain_reads import ChainReads

    fake, client = gateway
    fake.on("GET", f"/hyperblock/by-nonce/{HYPER_NONCE}", ok({"hyperblock": HYPERBLOCK}))
    meta = ShardStatus.from_status(METACHAIN, {**META_STATUS, "erd_nonce": HYPER_NONCE}, observed_at_ms=1)
    reads = ChainReads(client, SimpleNamespace(status=lambda shard: meta))  # type: ignore[arg-type]
    seen = await reads.hyperblocks({41: SimpleNamespace(tx_hash=tx_hash(OURS))})  # type: ignore[dict-item]
    assert list(seen) == [41]
    chain_tx = seen[41]
    assert (chain_tx["hash"], chain_tx["status"]) == (tx_hash(OURS), "success")
    assert chain_tx["hyperblockNonce"] == HYPER_NONCE and chain_tx["timestampMs"] == HYPER_TS_MS
    assert reads.following and reads.hyper_cursor == HYPER_NONCE + 1
    assert fake.paths() == [f"/hyperblock/by-nonce/{HYPER_NONCE}"]


async def test_hyperblock_listing_rebuilds_the_cosigned_transaction(gateway) -> None:  # type: ignore[no-untyped-def]
    """A restored database recovers the relays it does not know from the listings (gasless.relay.restored):
    the transaction rebuilt from the listed members must hash to the listed hash."""
    from gasless.relay.restored import chain_wire, relayer_of
    from gasless.settlement.restored import is_settle_call

    fake, client = gateway
    fake.on("GET", f"/hyperblock/by-nonce/{HYPER_NONCE}", ok({"hyperblock": HYPERBLOCK}))
    listing = (await client.get(f"/hyperblock/by-nonce/{HYPER_NONCE}"))["hyperblock"]["transactions"]
    ours, transfer, settle = listing
    assert relayer_of(ours) == RELAYER.to_bech32() and relayer_of(transfer) is None
    for entry in listing:
        rebuilt = tx_from_wire(chain_wire(entry))
        assert tx_hash(rebuilt) == entry["hash"]
    rebuilt = tx_from_wire(chain_wire(ours))
    assert (rebuilt.sender_username, rebuilt.receiver_username) == ("alice", "billing")
    assert rebuilt.guardian == GUARDIAN and rebuilt.relayer_signature == b"\x02" * 64
    assert [is_settle_call(e, CONTRACT.to_bech32()) for e in listing] == [False, False, True]


async def test_hyperblock_by_nonce_as_the_contract_mirror_reads_it(gateway, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The contract mirror (gasless.mirror.follower) reads the final hyperblocks, fetches the successful
    calls to the contract with their results, and dates their events with the hyperblock."""
    from gasless.mirror import follower as follower_module
    from gasless.mirror.follower import MirrorFollower
    from gasless.mirror.repository import MirrorStep

    fake, client = gateway
    fake.on("GET", f"/network/status/{METACHAIN}", ok({"status": META_STATUS}))
    fake.on("GET", f"/hyperblock/by-nonce/{HYPER_NONCE}", ok({"hyperblock": HYPERBLOCK}))
    for tx in (OURS, SETTLE):
        fake.on("GET", f"/transaction/{tx_hash(tx)}", ok({"transaction": {**EXECUTED, "hash": tx_hash(tx)}}))
    decoded: list[tuple[str, int, int, int]] = []

    def decode(transaction: dict[str, Any], contract: str, **at: int) -> list[Any]:
        decoded.append((transaction["hash"], at["hyperblock_nonce"], at["tx_position"], at["block_ts_ms"]))
        return []

    monkeypatch.setattr(follower_module, "decode_transaction_events", decode)
    applied: list[MirrorStep] = []

    class Repo:
        async def cursor(self) -> int:
            return HYPER_NONCE - 1

        async def apply(self, step: MirrorStep) -> list[int]:
            applied.append(step)
            return []

    mirror = MirrorFollower(Repo(), client, CONTRACT.to_bech32())  # type: ignore[arg-type]
    assert await mirror.step() is False
    assert [(s.cursor, s.cursor_hash) for s in applied] == [(HYPER_NONCE, HYPER_HASH)]
    assert decoded == [
        (tx_hash(OURS), HYPER_NONCE, 0, HYPER_TS_MS),
        (tx_hash(SETTLE), HYPER_NONCE, 2, HYPER_TS_MS),
    ]
    assert f"/transaction/{tx_hash(TRANSFER)}" not in fake.paths()  # not to the contract: not fetched


# Sends ------------------------------------------------------------------------------------------------------
async def test_broadcast_single_send(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wire = relayed_wire()
    # api/groups/baseTransactionGroup.go:69: {"txHash": ...}.
    fake.answers[("POST", "/transaction/send")] = lambda body: (200, ok({"txHash": hash_of(body)}))
    ack = await client.broadcast(wire).first_ack
    assert ack.ok and ack.tx_hash == hash_of(wire) and ack.status == 200
    assert fake.paths() == ["/transaction/send"]


async def test_broadcast_send_multiple_keys_hashes_by_index(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wires = [relayed_wire(nonce=7), relayed_wire(nonce=8)]

    def send_multiple(body: list[dict[str, Any]]) -> tuple[int, Any]:
        # baseTransactionGroup.go:140-149; txsHashes is a Go map[int]string, so its JSON keys are "0", "1".
        hashes = {str(i): hash_of(w) for i, w in enumerate(body)}
        return 200, ok({"numOfSentTxs": len(body), "txsHashes": hashes})

    fake.answers[("POST", "/transaction/send-multiple")] = send_multiple
    sent = [client.broadcast(w) for w in wires]  # asked for in one turn: they leave together
    acks = [await s.first_ack for s in sent]
    assert [a.tx_hash for a in acks] == [hash_of(w) for w in wires]
    assert fake.paths() == ["/transaction/send-multiple"] and len(fake.seen[0][3]) == 2


async def test_send_multiple_without_a_hash_resends_that_one_alone(gateway) -> None:  # type: ignore[no-untyped-def]
    fake, client = gateway
    wires = [relayed_wire(nonce=7), relayed_wire(nonce=8)]
    # The node skips a transaction it refuses (mx-chain-go api/groups/transactionGroup.go:403-416); sent
    # alone, it answers with the reason (400, "transaction generation failed: ...").
    fake.on(
        "POST", "/transaction/send-multiple", ok({"numOfSentTxs": 1, "txsHashes": {"0": hash_of(wires[0])}})
    )
    refusal = (
        "transaction generation failed: invalid transaction lowerNonceInTx: true, veryHighNonceInTx: false"
    )
    fake.on("POST", "/transaction/send", failed(refusal), status=400)
    sent = [client.broadcast(w, hash_of(w)) for w in wires]
    first, second = [await s.first_ack for s in sent]
    assert first.tx_hash == hash_of(wires[0])
    assert (second.ok, second.status, second.error) == (False, 400, refusal)
    assert fake.paths() == ["/transaction/send-multiple", "/transaction/send"]


async def test_send_multiple_keys_shifted_by_a_refused_one_are_matched_by_hash(gateway) -> None:  # type: ignore[no-untyped-def]
    """The proxy keys `txsHashes` by position among the transactions that passed its own field checks
    (mx-chain-proxy-go process/transactionProcessor.go SendMultipleTransactions): with the first one
    refused there, key "0" is the second transaction's hash. Matched by position, the first send would be
    acknowledged with the second's hash and the second never; matched by hash, only the second is."""
    fake, client = gateway
    wires = [relayed_wire(nonce=7), relayed_wire(nonce=8)]
    fake.on(
        "POST", "/transaction/send-multiple", ok({"numOfSentTxs": 1, "txsHashes": {"0": hash_of(wires[1])}})
    )
    fake.on("POST", "/transaction/send", failed("invalid chain ID"), status=400)
    sent = [client.broadcast(w, hash_of(w)) for w in wires]
    first, second = [await s.first_ack for s in sent]
    assert (first.ok, first.error) == (False, "invalid chain ID")
    assert second.ok and second.tx_hash == hash_of(wires[1])
    assert fake.paths() == ["/transaction/send-multiple", "/transaction/send"]


# What the proxy answers when it could not ask, or must be asked again -------------------------------------
async def test_a_pool_answered_null_is_not_an_empty_pool(gateway) -> None:  # type: ignore[no-untyped-def]
    """Every observer of the sender's shard failed: the proxy answers `200 {"txPool": null}`
    (process/transactionProcessor.go:1397-1408). That is not "no pending transactions"."""
    from gasless.chain.gateway import GatewayUnavailable

    fake, client = gateway
    fake.on("GET", "/transaction/pool", ok({"txPool": None}))
    with pytest.raises(GatewayUnavailable):
        await client.pool_for_sender(ALICE.to_bech32())


async def test_process_status_and_the_failure_in_the_logs(gateway) -> None:  # type: ignore[no-untyped-def]
    """process-status answers `{"status", "reason"}` (api/groups/baseTransactionGroup.go:251-265); the
    reason is the failure event's data (the VM's return code), the message is the event's second topic."""
    from gasless.chain.outcomes import contract_failure, process_reason

    fake, client = gateway
    fake.on(
        "GET",
        f"/transaction/{HASH}/process-status",
        ok({"status": "fail", "reason": "@" + b"user error".hex()}),
    )
    status, reason = await client.process_status(HASH)
    assert (status, process_reason(reason)) == ("fail", "user error")
    reverted = {
        **EXECUTED,
        "status": "success",  # what the node says of a reverted call
        "logs": {
            "address": CONTRACT.to_bech32(),
            "events": [
                {
                    "address": CONTRACT.to_bech32(),
                    "identifier": "signalError",
                    "topics": [b64(bytes(ALICE.get_public_key())), b64("ERR_PAUSED")],
                    "data": b64("@" + b"user error".hex()),
                    "additionalData": None,
                }
            ],
        },
    }
    assert contract_failure(reverted) == "ERR_PAUSED"
    fake.on("GET", f"/transaction/{HASH}/process-status", ok({"status": "pending", "reason": ""}))
    assert await client.process_status(HASH) == ("pending", None)


async def test_a_429_without_retry_after_is_waited_for_not_an_outage(gateway) -> None:  # type: ignore[no-untyped-def]
    """The proxy's limiter and the nodes' throttles answer 429 without Retry-After (api/middleware/
    rateLimiter.go:77-83): the read waits and asks again within its budget."""
    fake, client = gateway
    answers = iter([(429, failed("your IP exceeded the limit", "bad_request")), (200, ok({"nonce": 3}))])
    fake.answers[("GET", "/address/x/nonce")] = lambda body: next(answers)
    assert await client.get("/address/x/nonce") == {"nonce": 3}
    assert fake.paths() == ["/address/x/nonce", "/address/x/nonce"]
