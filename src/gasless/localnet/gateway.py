"""The gateway (proxy) REST API of localnet, in the real response shapes and envelopes.

Every answer is `{"data": ..., "error": "", "code": "successful"}`; errors carry the node's text in `error`
with `code` `bad_request` (HTTP 400) or `internal_issue` (HTTP 500), as mx-chain-proxy-go does.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from typing import Any

from aiohttp import web

from gasless.chain.addresses import METACHAIN, InvalidAddress, address_of, parse_address
from gasless.chain.codec import WireError, tx_from_wire
from gasless.localnet.chain import HyperBlock, LocalChain, TxRecord
from gasless.localnet.processing import NodeError
from gasless.localnet.vm import ContractError, LogEvent

CHAIN_KEY: web.AppKey[LocalChain] = web.AppKey("chain", LocalChain)
# Requests this gateway received, by method and route ("GET /address/{address}"), and VM queries by function
# ("POST /vm-values/query getRelayerState"): what a client costs it, and what it asks.
REQUESTS_KEY: web.AppKey[Counter[str]] = web.AppKey("requests", Counter)


def ok(data: Any) -> web.Response:
    return web.json_response({"data": data, "error": "", "code": "successful"}, dumps=_dumps)


def fail(message: str, status: int = 400) -> web.Response:
    code = "bad_request" if status == 400 else "internal_issue"
    return web.json_response({"data": None, "error": message, "code": code}, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _chain(request: web.Request) -> LocalChain:
    return request.app[CHAIN_KEY]


def _address_param(request: web.Request) -> bytes:
    try:
        return parse_address(request.match_info["address"]).get_public_key()
    except InvalidAddress:
        raise web.HTTPBadRequest(
            text=_dumps({"data": None, "error": "cannot decode address", "code": "bad_request"}),
            content_type="application/json",
        ) from None


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=_dumps({"data": None, "error": "invalid JSON body", "code": "bad_request"}),
            content_type="application/json",
        ) from None


# Network ----------------------------------------------------------------------------------------------
async def network_config(request: web.Request) -> web.Response:
    chain = _chain(request)
    cfg, rules = chain.config, chain.config.rules
    return ok(
        {
            "config": {
                "erd_chain_id": cfg.chain_id,
                "erd_denomination": 18,
                "erd_gas_per_data_byte": rules.gas_per_data_byte,
                "erd_gas_price_modifier": str(rules.gas_price_modifier),
                "erd_latest_tag_software_version": "localnet",
                "erd_meta_consensus_group_size": 1,
                "erd_min_gas_limit": rules.min_gas_limit,
                "erd_min_gas_price": rules.min_gas_price,
                "erd_min_transaction_version": cfg.min_tx_version,
                "erd_num_metachain_nodes": 1,
                "erd_num_nodes_in_shard": 1,
                "erd_num_shards_without_meta": cfg.num_shards,
                "erd_rewards_top_up_gradient_point": "0",
                "erd_round_duration": cfg.round_ms,
                "erd_rounds_per_epoch": cfg.rounds_per_epoch,
                "erd_shard_consensus_group_size": 1,
                "erd_start_time": chain.genesis_ms // 1000,
                "erd_top_up_factor": "0.5",
                "erd_extra_gas_limit_guarded_tx": rules.extra_gas_guarded,
                "erd_extra_gas_limit_relayed_tx": rules.extra_gas_relayed,
                "erd_max_gas_per_transaction": rules.max_gas_per_tx,
            }
        }
    )


async def network_status(request: web.Request) -> web.Response:
    chain = _chain(request)
    try:
        shard = int(request.match_info["shard"])
    except ValueError:
        return fail("invalid shard ID")
    if shard != METACHAIN and not 0 <= shard < chain.config.num_shards:
        return fail("invalid shard ID")
    return ok({"status": chain.shard_status(shard)})


# Accounts ---------------------------------------------------------------------------------------------
def _account_json(chain: LocalChain, pubkey: bytes) -> dict[str, Any]:
    account = chain.world.peek(pubkey)
    bech32 = address_of(pubkey).to_bech32()
    data: dict[str, Any] = {
        "address": bech32,
        "nonce": account.nonce if account else 0,
        "balance": str(account.balance if account else 0),
        "username": account.username if account else "",
        "code": "",
        "codeHash": None,
        "rootHash": None,
        "codeMetadata": None,
        "developerReward": "0",
        "ownerAddress": "",
    }
    if account is not None and account.contract is not None:
        data["code"] = account.contract.name.encode().hex()
        data["codeMetadata"] = _b64(b"\x05\x00")  # upgradeable, readable
        data["ownerAddress"] = address_of(account.owner).to_bech32() if account.owner else ""
    return data


def _block_info(chain: LocalChain, pubkey: bytes) -> dict[str, Any]:
    shard = chain.shard_for(pubkey, pubkey)
    last = chain.blocks[shard][-1]
    return {"nonce": last.nonce, "hash": last.hash, "rootHash": last.hash}


async def get_account(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    return ok({"account": _account_json(chain, pubkey), "blockInfo": _block_info(chain, pubkey)})


async def get_nonce(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    account = chain.world.peek(pubkey)
    return ok({"nonce": account.nonce if account else 0, "blockInfo": _block_info(chain, pubkey)})


async def get_balance(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    account = chain.world.peek(pubkey)
    return ok({"balance": str(account.balance if account else 0), "blockInfo": _block_info(chain, pubkey)})


async def get_esdts(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    account = chain.world.peek(pubkey)
    tokens = {
        token: {"tokenIdentifier": token, "balance": str(amount), "properties": "", "nonce": 0}
        for token, amount in sorted((account.esdt if account else {}).items())
        if amount > 0
    }
    return ok({"esdts": tokens, "blockInfo": _block_info(chain, pubkey)})


async def get_esdt(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    token = request.match_info["token"]
    amount = chain.world.esdt_balance(pubkey, token)
    return ok(
        {
            "tokenData": {"tokenIdentifier": token, "balance": str(amount), "properties": ""},
            "blockInfo": _block_info(chain, pubkey),
        }
    )


async def get_guardian_data(request: web.Request) -> web.Response:
    chain, pubkey = _chain(request), _address_param(request)
    account = chain.world.peek(pubkey)
    guardian = account.guardian if account else None
    data: dict[str, Any] = {"guarded": False}
    if guardian is not None:
        data = {
            "activeGuardian": {
                "address": address_of(guardian.address).to_bech32(),
                "activationEpoch": guardian.activation_epoch,
                "serviceUID": guardian.service_uid,
            },
            "guarded": guardian.activation_epoch <= chain.epoch,
        }
    return ok({"guardianData": data, "blockInfo": _block_info(chain, pubkey)})


# Transactions -----------------------------------------------------------------------------------------
async def send_transaction(request: web.Request) -> web.Response:
    chain = _chain(request)
    body = await _json_body(request)
    try:
        tx = tx_from_wire(body)
        return ok({"txHash": chain.submit(tx)})
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    except NodeError as exc:
        return fail(f"transaction generation failed: {exc.message}")


async def send_multiple(request: web.Request) -> web.Response:
    chain = _chain(request)
    body = await _json_body(request)
    if not isinstance(body, list):
        return fail("invalid tx fields")
    # The proxy drops what fails its own field checks first, then keys `txsHashes` by position among the
    # rest; a transaction the node refuses is left out (mx-chain-proxy-go SendMultipleTransactions).
    checked = []
    for item in body:
        try:
            checked.append(tx_from_wire(item))
        except WireError:
            continue
    hashes: dict[str, str] = {}
    for index, tx in enumerate(checked):
        try:
            hashes[str(index)] = chain.submit(tx)
        except NodeError:
            continue
    return ok({"numOfSentTxs": len(hashes), "txsHashes": hashes})


async def simulate_transaction(request: web.Request) -> web.Response:
    chain = _chain(request)
    body = await _json_body(request)
    check = request.query.get("checkSignature", "true").lower() != "false"
    try:
        tx = tx_from_wire(body)
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    return ok({"result": chain.simulate(tx, check_signature=check)})


async def transaction_cost(request: web.Request) -> web.Response:
    chain = _chain(request)
    body = await _json_body(request)
    try:
        tx = tx_from_wire(body)
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    units, message, _ = chain.estimate(tx)
    return ok({"txGasUnits": units, "returnMessage": message, "smartContractResults": {}, "logs": None})


def _record(request: web.Request) -> TxRecord | None:
    record = _chain(request).records.get(request.match_info["hash"].lower())
    return None if record is None or record.dropped else record  # a dropped transaction is forgotten


def _not_found(request: web.Request) -> web.Response:
    # The proxy answers 404 on the `sender` path (any error there) and 500 without it
    # (mx-chain-proxy-go api/groups/baseTransactionGroup.go getTransaction).
    return fail("transaction not found", status=404 if request.query.get("sender") else 500)


async def get_transaction(request: web.Request) -> web.Response:
    record = _record(request)
    if record is None:
        return _not_found(request)
    with_results = request.query.get("withResults", "false").lower() == "true"
    data = transaction_json(_chain(request), record, with_results=with_results)
    if not request.query.get("sender"):
        # Only the proxy's path without `sender` sets these, from the destination's notarization
        # (process/transactionProcessor.go GetTransaction); the node never does.
        data["hyperblockNonce"] = data["notarizedAtDestinationInMetaNonce"]
        data["hyperblockHash"] = data["notarizedAtDestinationInMetaHash"]
    return ok({"transaction": data})


async def get_transaction_status(request: web.Request) -> web.Response:
    record = _record(request)
    if record is None:
        return _not_found(request)
    return ok({"status": record.reported()})


async def get_process_status(request: web.Request) -> web.Response:
    """As the proxy's computeTransactionStatus: `invalid` reads `fail`; a failure in the logs (`signalError`)
    reads `fail` with the event's data as the reason; otherwise `success` once completed, else `pending`."""
    record = _record(request)
    if record is None:
        return _not_found(request)
    if record.status == "invalid":
        return ok({"status": "fail", "reason": ""})
    if record.status == "pending" or record.destination is None:
        return ok({"status": "pending", "reason": ""})
    if record.status == "fail":
        events = record.outcome.events if record.outcome else []
        error = next((e for e in events if e.identifier == "signalError"), None)
        reason = (error.data[0] if error and error.data else record.reason.encode()).decode(
            "utf-8", "replace"
        )
        return ok({"status": "fail", "reason": reason})
    return ok({"status": "success", "reason": ""})


async def get_pool(request: web.Request) -> web.Response:
    chain = _chain(request)
    by_sender = request.query.get("by-sender")
    if not by_sender:
        return fail("fetching the entire pool is not allowed")
    try:
        sender_pk = parse_address(by_sender).get_public_key()
    except InvalidAddress:
        return fail("cannot decode address")
    records = chain.pool_of(sender_pk)
    account = chain.world.peek(sender_pk)
    account_nonce = account.nonce if account else 0
    if request.query.get("last-nonce", "").lower() == "true":
        nonce = max((r.tx.nonce for r in records), default=account_nonce - 1 if account_nonce else 0)
        return ok({"nonce": nonce})
    if request.query.get("nonce-gaps", "").lower() == "true":
        gaps = []
        expected = account_nonce
        for nonce in sorted({r.tx.nonce for r in records}):
            if nonce > expected:
                gaps.append({"from": expected, "to": nonce - 1})
            expected = max(expected, nonce + 1)
        return ok({"nonceGaps": {"sender": by_sender, "gaps": gaps}})
    fields = request.query.get("fields", "hash,nonce,sender,receiver,gaslimit,gasprice")
    wanted = {f.strip().lower() for f in fields.split(",")}
    return ok({"txPool": {"transactions": [{"txFields": _pool_fields(r, wanted)} for r in records]}})


def _pool_fields(record: TxRecord, wanted: set[str]) -> dict[str, Any]:
    tx = record.tx
    everything: dict[str, Any] = {
        "hash": record.hash,
        "nonce": tx.nonce,
        "sender": tx.sender.to_bech32(),
        "receiver": tx.receiver.to_bech32(),
        "gaslimit": tx.gas_limit,
        "gasprice": tx.gas_price,
        "value": str(tx.value),
        "data": _b64(tx.data) if tx.data else "",
        "signature": tx.signature.hex(),
        "relayer": tx.relayer.to_bech32() if tx.relayer else "",
        "relayersignature": tx.relayer_signature.hex(),
        "guardian": tx.guardian.to_bech32() if tx.guardian else "",
        "guardiansignature": tx.guardian_signature.hex(),
    }
    if "*" in wanted:
        return everything
    return {k: v for k, v in everything.items() if k in wanted}


def _event_json(event: LogEvent) -> dict[str, Any]:
    return {
        "address": address_of(event.address).to_bech32(),
        "identifier": event.identifier,
        "topics": [_b64(t) for t in event.topics],
        "data": _b64(event.data[0]) if event.data else None,
        "additionalData": [_b64(d) for d in event.data] if event.data else None,
    }


def transaction_json(chain: LocalChain, record: TxRecord, *, with_results: bool) -> dict[str, Any]:
    tx = record.tx
    outcome = record.outcome
    source, dest = record.source, record.destination
    executed = dest if dest is not None else source
    data: dict[str, Any] = {
        "type": "normal",
        "processingTypeOnSource": "SCInvoking" if tx.data else "MoveBalance",
        "processingTypeOnDestination": "SCInvoking" if tx.data else "MoveBalance",
        "hash": record.hash,
        "nonce": tx.nonce,
        "round": executed.round if executed else 0,
        "epoch": executed.epoch if executed else chain.epoch,
        "value": str(tx.value),
        "receiver": tx.receiver.to_bech32(),
        "sender": tx.sender.to_bech32(),
        "gasPrice": tx.gas_price,
        "gasLimit": tx.gas_limit,
        "gasUsed": outcome.gas_used if outcome else tx.gas_limit,
        "data": _b64(tx.data) if tx.data else None,
        "signature": tx.signature.hex(),
        "sourceShard": record.sender_shard,
        "destinationShard": record.receiver_shard,
        "blockNonce": executed.nonce if executed else 0,
        "blockHash": executed.hash if executed else "",
        "miniblockHash": executed.miniblock_hash if executed else "",
        "notarizedAtSourceInMetaNonce": record.source_hyper.nonce if record.source_hyper else 0,
        "NotarizedAtSourceInMetaHash": record.source_hyper.hash if record.source_hyper else "",
        "notarizedAtDestinationInMetaNonce": record.destination_hyper.nonce
        if record.destination_hyper
        else 0,
        "notarizedAtDestinationInMetaHash": record.destination_hyper.hash if record.destination_hyper else "",
        "timestamp": executed.timestamp_ms // 1000 if executed else 0,
        "timestampMs": executed.timestamp_ms if executed else 0,
        "status": record.reported(),
        "fee": str(outcome.fee) if outcome else "0",
        "initiallyPaidFee": str(record.initially_paid_fee),
        "chainID": tx.chain_id,
        "version": tx.version,
        "options": tx.options,
        "isRelayed": chain.is_relayed(record),
    }
    if tx.relayer is not None:
        data["relayerAddress"] = tx.relayer.to_bech32()
        data["relayerSignature"] = tx.relayer_signature.hex()
    if tx.guardian is not None:
        data["guardian"] = tx.guardian.to_bech32()
        data["guardianSignature"] = tx.guardian_signature.hex()
    if record.status == "invalid" or record.failed_at_source:
        data["receipt"] = {
            "value": "0",
            "sender": tx.sender.to_bech32(),
            "data": record.reason,
            "txHash": record.hash,
        }
    if with_results and outcome is not None:
        data["smartContractResults"] = [
            _scr_json(record, index, result) for index, result in enumerate(outcome.results)
        ]
        if outcome.events:
            data["logs"] = {
                "address": tx.sender.to_bech32(),
                "events": [_event_json(e) for e in outcome.events],
            }
    return data


def _scr_json(record: TxRecord, index: int, result: dict[str, Any]) -> dict[str, Any]:
    tx = record.tx
    return {
        "hash": hashes_of(record.hash, index),
        "nonce": tx.nonce + 1 if result.get("kind") == "refund" else 0,
        "value": int(result.get("value", 0)),
        "receiver": address_of(result["receiver"]).to_bech32(),
        "sender": address_of(result["sender"]).to_bech32(),
        "data": result.get("data", ""),
        "prevTxHash": record.hash,
        "originalTxHash": record.hash,
        "gasLimit": 0,
        "gasPrice": tx.gas_price,
        "callType": 0,
        "returnMessage": result.get("returnMessage", ""),
        "originalSender": tx.sender.to_bech32(),
    }


def hashes_of(parent: str, index: int) -> str:
    return hashlib.blake2b(f"{parent}:{index}".encode(), digest_size=32).hexdigest()


# Blocks -----------------------------------------------------------------------------------------------
def _hyper_json(chain: LocalChain, hyper: HyperBlock, with_txs: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "nonce": hyper.nonce,
        "round": hyper.round,
        "hash": hyper.hash,
        "prevBlockHash": hyper.prev_hash,
        "epoch": hyper.epoch,
        "numTxs": len(hyper.tx_hashes),
        "shardBlocks": [
            {"hash": b.hash, "nonce": b.nonce, "round": b.round, "shard": b.shard} for b in hyper.shard_blocks
        ],
        "timestamp": hyper.timestamp_ms // 1000,
        "timestampMs": hyper.timestamp_ms,
        "status": "on-chain",
    }
    if with_txs:
        data["transactions"] = [
            transaction_json(chain, chain.records[h], with_results=False) for h in hyper.tx_hashes
        ]
    return data


async def hyperblock_by_nonce(request: web.Request) -> web.Response:
    chain = _chain(request)
    try:
        nonce = int(request.match_info["nonce"])
    except ValueError:
        return fail("invalid block nonce parameter")
    if not 0 <= nonce < len(chain.hyperblocks):
        return fail("block not found", status=500)
    return ok({"hyperblock": _hyper_json(chain, chain.hyperblocks[nonce])})


async def hyperblock_by_hash(request: web.Request) -> web.Response:
    chain = _chain(request)
    block = chain.block_index.get(request.match_info["hash"])
    if not isinstance(block, HyperBlock):
        return fail("block not found", status=500)
    return ok({"hyperblock": _hyper_json(chain, block)})


def _shard_block_json(chain: LocalChain, block: Any, with_txs: bool) -> dict[str, Any]:
    if isinstance(block, HyperBlock):
        data = _hyper_json(chain, block, with_txs=False)
        data["shard"] = METACHAIN
        return data
    data = {
        "nonce": block.nonce,
        "round": block.round,
        "epoch": block.epoch,
        "shard": block.shard,
        "hash": block.hash,
        "prevBlockHash": block.prev_hash,
        "numTxs": len(block.tx_hashes),
        "timestamp": block.timestamp_ms // 1000,
        "timestampMs": block.timestamp_ms,
        "status": "on-chain",
    }
    if with_txs:
        txs = [transaction_json(chain, chain.records[h], with_results=False) for h in block.tx_hashes]
        data["miniBlocks"] = [{"hash": block.hash, "type": "TxBlock", "transactions": txs}] if txs else []
    return data


def _blocks_of(chain: LocalChain, shard: int) -> list[Any] | None:
    if shard == METACHAIN:
        return chain.hyperblocks
    return chain.blocks.get(shard)


async def block_by_nonce(request: web.Request) -> web.Response:
    chain = _chain(request)
    try:
        shard, nonce = int(request.match_info["shard"]), int(request.match_info["nonce"])
    except ValueError:
        return fail("invalid block nonce parameter")
    blocks = _blocks_of(chain, shard)
    if blocks is None:
        return fail("invalid shard ID")
    found = next((b for b in reversed(blocks) if b.nonce == nonce), None)
    if found is None:
        return fail("block not found", status=500)
    with_txs = request.query.get("withTxs", "false").lower() == "true"
    return ok({"block": _shard_block_json(chain, found, with_txs)})


async def block_by_hash(request: web.Request) -> web.Response:
    chain = _chain(request)
    try:
        shard = int(request.match_info["shard"])
    except ValueError:
        return fail("invalid shard ID")
    found = chain.block_index.get(request.match_info["hash"].lower())
    found_shard = METACHAIN if isinstance(found, HyperBlock) else getattr(found, "shard", None)
    if found is None or found_shard != shard:
        # The proxy's text when that shard's nodes do not have it (process/blockProcessor.go).
        return fail("sending request error, getting block failed: block not found", status=500)
    with_txs = request.query.get("withTxs", "false").lower() == "true"
    return ok({"block": _shard_block_json(chain, found, with_txs)})


async def blocks_by_round(request: web.Request) -> web.Response:
    chain = _chain(request)
    try:
        round_ = int(request.match_info["round"])
    except ValueError:
        return fail("invalid round parameter")
    found = [b for shard in chain.blocks.values() for b in shard if b.round == round_]
    found += [h for h in chain.hyperblocks if h.round == round_]
    return ok({"blocks": [_shard_block_json(chain, b, with_txs=False) for b in found]})


# VM queries -------------------------------------------------------------------------------------------
async def vm_query(request: web.Request) -> web.Response:
    chain = _chain(request)
    body = await _json_body(request)
    if not isinstance(body, dict):
        return fail("invalid query")
    try:
        contract_pk = parse_address(body.get("scAddress", "")).get_public_key()
        caller = parse_address(body["caller"]).get_public_key() if body.get("caller") else None
        args = [bytes.fromhex(a) for a in body.get("args", []) or []]
        function = str(body.get("funcName", ""))
    except (InvalidAddress, ValueError, TypeError):
        return fail("invalid query arguments")
    if REQUESTS_KEY in request.app:
        request.app[REQUESTS_KEY][f"POST /vm-values/query {function}"] += 1
    account = chain.world.peek(contract_pk)
    if account is None or account.contract is None:
        return fail("executeQuery: executeQuery: contract not found", status=400)
    try:
        parts = account.contract.query(function, args, caller, chain.now_ms())
        data = {
            "returnData": [_b64(p) for p in parts],
            "returnCode": "ok",
            "returnMessage": "",
            "gasRemaining": 0,
        }
    except ContractError as exc:
        code = "function not found" if exc.message.startswith("invalid function") else "user error"
        data = {"returnData": [], "returnCode": code, "returnMessage": exc.message, "gasRemaining": 0}
    return ok({"data": data})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/network/config", network_config)
    r.add_get("/network/status/{shard}", network_status)
    r.add_get("/address/{address}", get_account)
    r.add_get("/address/{address}/nonce", get_nonce)
    r.add_get("/address/{address}/balance", get_balance)
    r.add_get("/address/{address}/esdt", get_esdts)
    r.add_get("/address/{address}/esdt/{token}", get_esdt)
    r.add_get("/address/{address}/guardian-data", get_guardian_data)
    r.add_post("/transaction/send", send_transaction)
    r.add_post("/transaction/send-multiple", send_multiple)
    r.add_post("/transaction/simulate", simulate_transaction)
    r.add_post("/transaction/cost", transaction_cost)
    r.add_get("/transaction/pool", get_pool)
    r.add_get("/transaction/{hash}", get_transaction)
    r.add_get("/transaction/{hash}/status", get_transaction_status)
    r.add_get("/transaction/{hash}/process-status", get_process_status)
    r.add_get("/hyperblock/by-nonce/{nonce}", hyperblock_by_nonce)
    r.add_get("/hyperblock/by-hash/{hash}", hyperblock_by_hash)
    r.add_get("/block/{shard}/by-nonce/{nonce}", block_by_nonce)
    r.add_get("/block/{shard}/by-hash/{hash}", block_by_hash)
    r.add_get("/blocks/by-round/{round}", blocks_by_round)
    r.add_post("/vm-values/query", vm_query)
