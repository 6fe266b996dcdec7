"""The gateway (proxy) REST API of localnet, in the real response shapes and envelopes.

The network, accounts, blocks and VM queries are answered here; the transaction routes and a transaction's
shape in `localnet/transactions`; the envelope (`{"data": ..., "error": "", "code": "successful"}`, errors as
mx-chain-proxy-go gives them) in `localnet/envelope`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gasless.chain.addresses import METACHAIN, InvalidAddress, address_of, parse_address
from gasless.localnet.chain import HyperBlock, LocalChain
from gasless.localnet.envelope import REQUESTS_KEY, address_param, b64, chain_of, fail, json_body, ok
from gasless.localnet.transactions import (
    get_pool,
    get_process_status,
    get_transaction,
    get_transaction_status,
    send_multiple,
    send_transaction,
    simulate_transaction,
    transaction_cost,
    transaction_json,
)
from gasless.localnet.vm import ContractError


# Network ----------------------------------------------------------------------------------------------
async def network_config(request: web.Request) -> web.Response:
    chain = chain_of(request)
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
    chain = chain_of(request)
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
        data["codeMetadata"] = b64(b"\x05\x00")  # upgradeable, readable
        data["ownerAddress"] = address_of(account.owner).to_bech32() if account.owner else ""
    return data


def _block_info(chain: LocalChain, pubkey: bytes) -> dict[str, Any]:
    shard = chain.shard_for(pubkey, pubkey)
    last = chain.blocks[shard][-1]
    return {"nonce": last.nonce, "hash": last.hash, "rootHash": last.hash}


async def get_account(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
    return ok({"account": _account_json(chain, pubkey), "blockInfo": _block_info(chain, pubkey)})


async def get_nonce(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
    account = chain.world.peek(pubkey)
    return ok({"nonce": account.nonce if account else 0, "blockInfo": _block_info(chain, pubkey)})


async def get_balance(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
    account = chain.world.peek(pubkey)
    return ok({"balance": str(account.balance if account else 0), "blockInfo": _block_info(chain, pubkey)})


async def get_esdts(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
    account = chain.world.peek(pubkey)
    tokens = {
        token: {"tokenIdentifier": token, "balance": str(amount), "properties": "", "nonce": 0}
        for token, amount in sorted((account.esdt if account else {}).items())
        if amount > 0
    }
    return ok({"esdts": tokens, "blockInfo": _block_info(chain, pubkey)})


async def get_esdt(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
    token = request.match_info["token"]
    amount = chain.world.esdt_balance(pubkey, token)
    return ok(
        {
            "tokenData": {"tokenIdentifier": token, "balance": str(amount), "properties": ""},
            "blockInfo": _block_info(chain, pubkey),
        }
    )


async def get_guardian_data(request: web.Request) -> web.Response:
    chain, pubkey = chain_of(request), address_param(request)
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
    chain = chain_of(request)
    try:
        nonce = int(request.match_info["nonce"])
    except ValueError:
        return fail("invalid block nonce parameter")
    if not 0 <= nonce < len(chain.hyperblocks):
        return fail("block not found", status=500)
    return ok({"hyperblock": _hyper_json(chain, chain.hyperblocks[nonce])})


async def hyperblock_by_hash(request: web.Request) -> web.Response:
    chain = chain_of(request)
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
    chain = chain_of(request)
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
    chain = chain_of(request)
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
    chain = chain_of(request)
    try:
        round_ = int(request.match_info["round"])
    except ValueError:
        return fail("invalid round parameter")
    found = [b for shard in chain.blocks.values() for b in shard if b.round == round_]
    found += [h for h in chain.hyperblocks if h.round == round_]
    return ok({"blocks": [_shard_block_json(chain, b, with_txs=False) for b in found]})


# VM queries -------------------------------------------------------------------------------------------
async def vm_query(request: web.Request) -> web.Response:
    chain = chain_of(request)
    body = await json_body(request)
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
            "returnData": [b64(p) for p in parts],
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
