"""localnet's transaction routes (send, send-multiple, simulate, cost, lookups, process-status, the pool)
and a transaction as the gateway shows it (`transaction_json`, also in the blocks that list it).
"""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

from gasless.chain.addresses import InvalidAddress, address_of, parse_address
from gasless.chain.codec import WireError, tx_from_wire
from gasless.localnet.chain import LocalChain, TxRecord
from gasless.localnet.envelope import b64, chain_of, fail, json_body, ok
from gasless.localnet.processing import NodeError
from gasless.localnet.vm import LogEvent


async def send_transaction(request: web.Request) -> web.Response:
    chain = chain_of(request)
    body = await json_body(request)
    try:
        tx = tx_from_wire(body)
        return ok({"txHash": chain.submit(tx)})
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    except NodeError as exc:
        return fail(f"transaction generation failed: {exc.message}")


async def send_multiple(request: web.Request) -> web.Response:
    chain = chain_of(request)
    body = await json_body(request)
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
    chain = chain_of(request)
    body = await json_body(request)
    check = request.query.get("checkSignature", "true").lower() != "false"
    try:
        tx = tx_from_wire(body)
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    return ok({"result": chain.simulate(tx, check_signature=check)})


async def transaction_cost(request: web.Request) -> web.Response:
    chain = chain_of(request)
    body = await json_body(request)
    try:
        tx = tx_from_wire(body)
    except WireError as exc:
        return fail(f"transaction generation failed: {exc}")
    units, message, _ = chain.estimate(tx)
    return ok({"txGasUnits": units, "returnMessage": message, "smartContractResults": {}, "logs": None})


def _record(request: web.Request) -> TxRecord | None:
    record = chain_of(request).records.get(request.match_info["hash"].lower())
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
    data = transaction_json(chain_of(request), record, with_results=with_results)
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
    chain = chain_of(request)
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
        "data": b64(tx.data) if tx.data else "",
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
        "topics": [b64(t) for t in event.topics],
        "data": b64(event.data[0]) if event.data else None,
        "additionalData": [b64(d) for d in event.data] if event.data else None,
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
        "data": b64(tx.data) if tx.data else None,
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
