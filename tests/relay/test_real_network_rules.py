"""The part after the co-signature, against a localnet that answers as the real gateway and node do
(docs/chain.md): finality from a lookup, outcomes from the logs, `invalid` billed, simulation's real shapes,
transactions the node drops, a history node's 404, `{"txPool": null}` and a throttling gateway."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from multiversx_sdk import Transaction
from relay_kit import Sender, _addr, fund, key_in_shard, localnet_post

from gasless.chain.addresses import address_of

# Every hyperblock read hangs far past the gateway client's timeout: the tracker learns only from lookups.
HYPERBLOCKS_HANG = {"/hyperblock/": 120_000}


def ledger(env: Any, tx_hash: str) -> tuple[str, bool] | None:
    """(status, billed) of the usage row of `tx_hash`, read from the service database."""
    from sqlalchemy import create_engine, select

    from gasless.db import usage_ledger

    engine = create_engine(env.settings.effective_database_url.replace("+aiosqlite", ""))
    try:
        with engine.connect() as conn:
            row = conn.execute(
                select(usage_ledger.c.status, usage_ledger.c.billed).where(usage_ledger.c.tx_hash == tx_hash)
            ).first()
    finally:
        engine.dispose()
    return None if row is None else (str(row.status), bool(row.billed))


def gateway(env: Any, path: str) -> Any:
    with urllib.request.urlopen(f"{env.localnet.url}{path}", timeout=5) as answer:
        return json.loads(answer.read())["data"]


def contract_call(env: Any, sender: Sender, assignment: dict[str, Any], data: bytes, gas: int) -> Transaction:
    return env.build(sender, assignment, receiver=env.contract, data=data, gas_limit=gas)


def accepted(env: Any, tx: Transaction, lease: str) -> dict[str, Any]:
    response = env.relay(tx, lease)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


# 1. Finality by lookup -----------------------------------------------------------------------------------
def test_an_intent_seen_only_by_lookup_becomes_final(env: Any) -> None:
    """The lookup with `sender` carries no `hyperblockNonce` (only the proxy's path without `sender` sets it):
    finality comes from `notarizedAtDestinationInMetaNonce`. Same shard and cross-shard."""
    senders = [env.new_sender(1), env.new_sender(1)]
    receivers = [None, address_of(key_in_shard(0).generate_public_key().buffer).to_bech32()]
    env.faults(gateway={"latencyMs": HYPERBLOCKS_HANG})
    try:
        hashes = []
        for sender, receiver in zip(senders, receivers, strict=True):
            assignment = env.assign(sender)
            hashes.append(
                accepted(env, env.build(sender, assignment, receiver=receiver), assignment["lease"])
            )
        for relayed in hashes:
            final = env.wait_state(relayed["txHash"], ("FINALIZED",), timeout=40)
            assert final["outcome"] == "success"
    finally:
        env.faults(gateway={"latencyMs": {}})


# 2. Outcomes from the logs ------------------------------------------------------------------------------
@pytest.mark.parametrize("shard", [1, 0], ids=["same-shard", "cross-shard"])
def test_a_reverted_call_is_a_failure_with_its_reason_and_billed(make_env: Any, shard: int) -> None:
    """The node reports a reverted call as `success`; the tracker asks process-status and reads the reason
    from the `signalError` event. (Simulation off, so the call reaches the chain.)"""
    env = make_env(simulate="never")
    sender = env.new_sender(shard)
    assignment = env.assign(sender)
    relayed = accepted(
        env, contract_call(env, sender, assignment, b"noSuchEndpoint", 5_000_000), assignment["lease"]
    )
    final = env.wait_state(relayed["txHash"], ("FINALIZED",), timeout=30)
    chain_tx = gateway(env, f"/transaction/{relayed['txHash']}?withResults=true")["transaction"]
    assert chain_tx["status"] == "success"  # what the node says
    assert final["outcome"] == "fail", final  # what happened
    assert "invalid function" in final["failure"]["message"], final
    assert ledger(env, relayed["txHash"]) == ("failed", True)


# 3. `invalid` costs the relayer a fee: billed as a failed execution ----------------------------------------
def test_an_invalid_transaction_is_executed_as_a_failure_and_billed(env: Any) -> None:
    """The sender's value is covered when the relay is accepted, but a transaction of its own drains the
    balance first: the node puts the relayed one in an invalid miniblock, uses its nonce and charges the
    relayer the fee. The intent is an executed failure (billed), not a dead one (free)."""
    sender = env.new_sender(1)
    fund(env, sender.address, 10**18)
    # The sender's own transfer of most of its balance, held in the pool while shard 1 is stalled.
    env.localnet.call(lambda: env.localnet.net.chain.faults.stalled_shards.add(1))
    try:
        drain = Transaction(
            sender=_addr(sender.address),
            receiver=address_of(key_in_shard(1).generate_public_key().buffer),
            gas_limit=50_000,
            chain_id=env.settings.network.chain_id,
            nonce=0,
            value=9 * 10**17,
            gas_price=1_000_000_000,
            version=2,
        )
        from multiversx_sdk import TransactionComputer

        drain.signature = sender.key.sign(TransactionComputer().compute_bytes_for_signing(drain))
        answer = localnet_post(env, "/transaction/send", drain.to_dictionary())
        assert not answer.get("error"), answer
        sender.nonce = 1
        assignment = env.assign(sender)
        relayed = accepted(env, env.build(sender, assignment, value=5 * 10**17), assignment["lease"])
    finally:
        env.localnet.call(lambda: env.localnet.net.chain.faults.stalled_shards.discard(1))
    final = env.wait_state(relayed["txHash"], ("FINALIZED", "DEAD"), timeout=30)
    chain_tx = gateway(env, f"/transaction/{relayed['txHash']}")["transaction"]
    assert chain_tx["status"] == "invalid" and int(chain_tx["fee"]) > 0
    assert final["state"] == "FINALIZED" and final["outcome"] == "fail", final
    assert final["failure"]["message"].startswith("invalid on chain"), final
    assert ledger(env, relayed["txHash"]) == ("failed", True)


# 4. Simulation in the real shapes ------------------------------------------------------------------------
def test_a_cross_shard_call_that_would_revert_is_refused_by_simulation(env: Any, problem: Any) -> None:
    """A cross-shard simulation answers one result per shard; the receiver shard's `fail` is a refusal."""
    sender = env.new_sender(0)  # the contract lives in shard 1
    assignment = env.assign(sender)
    tx = contract_call(env, sender, assignment, b"noSuchEndpoint", 5_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "SIMULATION_FAILED")
    assert "invalid function" in body["details"]["returnMessage"], body


def test_overprovisioned_gas_is_measured_with_the_cost_route_cross_shard(env: Any, problem: Any) -> None:
    sender = env.new_sender(0)
    assignment = env.assign(sender)
    tx = contract_call(env, sender, assignment, b"setAutoRenew@01", 100_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "GAS_OVERPROVISIONED")
    assert body["details"]["actual"] == 100_000_000 and body["details"]["limit"] < 100_000_000


def test_a_simulation_without_a_verdict_is_refused_never_passed(
    env: Any, problem: Any, nothing_sent: Any
) -> None:
    """A simulate answer that gives no verdict (no `status`, a shard's result missing, no result) cannot be
    judged: 503 UPSTREAM_UNAVAILABLE with nothing sent, never a pass. The localnet's simulate answers so for
    a while (set on its own loop, as the shard stall above); put back, the same call relays."""
    sender = env.new_sender(1)  # has an account: setAutoRenew@01 succeeds on chain
    assignment = env.assign(sender)
    data = b"setAutoRenew@01"
    probe = env.build(sender, assignment, receiver=env.contract, data=data, gas_limit=50_000_000, sign=False)
    needed = localnet_post(env, "/transaction/cost", probe.to_dictionary())["data"]["txGasUnits"]
    tx = contract_call(env, sender, assignment, data, needed)
    chain = env.localnet.net.chain
    no_verdicts: list[Any] = [
        {"hash": "ab" * 32, "receipts": None},
        {"senderShard": {"status": "success", "hash": "ab" * 32}},
        None,
    ]
    for answer in no_verdicts:
        env.localnet.call(setattr, chain, "simulate", lambda _tx, check_signature, a=answer: a)
        try:
            response = env.relay(tx, assignment["lease"])
        finally:
            env.localnet.call(delattr, chain, "simulate")
        body = problem(response, "UPSTREAM_UNAVAILABLE")
        assert "no verdict" in body["detail"], (answer, body)
    nothing_sent(env, tx, "UPSTREAM_UNAVAILABLE")
    response = env.relay(tx, assignment["lease"])
    assert response.status_code in (200, 202), response.text
    assert env.wait_state(response.json()["txHash"], ("FINALIZED",), timeout=30)["outcome"] == "success"


# 5. Transactions the node drops --------------------------------------------------------------------------
def test_a_transaction_the_node_drops_is_dead_promptly_with_its_reason(env: Any) -> None:
    """A guarded relayer makes the transaction "not executable": it leaves the pool without a block. The
    tracker sees it unknown, out of the pool and its nonce unused over several rounds and a re-send, and
    ends it DEAD (unbilled) well before the 15-minute give-up."""
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    guardian = address_of(key_in_shard(1).generate_public_key().buffer).to_bech32()
    localnet_post(
        env,
        "/localnet/guardian",
        {"address": assignment["relayer"], "guardian": guardian, "activationEpoch": 0},
    )
    try:
        relayed = accepted(env, env.build(sender, assignment), assignment["lease"])
        final = env.wait_state(relayed["txHash"], ("DEAD", "FINALIZED"), timeout=30)
    finally:
        localnet_post(env, "/localnet/guardian", {"address": assignment["relayer"], "guardian": ""})
    assert final["state"] == "DEAD", final
    assert final["deadReason"].startswith("dropped by the network without execution"), final
    assert "guarded" in final["deadReason"], final
    assert ledger(env, relayed["txHash"]) == ("dead", False)


# 6. A history node's 404 --------------------------------------------------------------------------------
def test_a_sender_path_404_does_not_kill_an_executed_intent(env: Any) -> None:
    """The proxy answers any failure of the sender shard's history nodes as 404 on the `sender` path. With
    the nonce moved, that looks like a replacement; the lookup without `sender` finds the transaction."""
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    env.faults(gateway={"latencyMs": HYPERBLOCKS_HANG, "historyNotFound": True})
    try:
        relayed = accepted(env, env.build(sender, assignment), assignment["lease"])
        final = env.wait_state(relayed["txHash"], ("FINALIZED", "DEAD"), timeout=40)
    finally:
        env.faults(gateway={"latencyMs": {}, "historyNotFound": False})
    assert final["state"] == "FINALIZED" and final["outcome"] == "success", final


# 7. `{"txPool": null}` -----------------------------------------------------------------------------------
def test_a_pool_answered_null_is_unknown_not_empty(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    env.faults(gateway={"poolNull": True})
    try:
        response = env.relay(tx, assignment["lease"])
    finally:
        env.faults(gateway={"poolNull": False})
    problem(response, "UPSTREAM_UNAVAILABLE")
    nothing_sent(env, tx, "UPSTREAM_UNAVAILABLE")
    # The same request passes once the pool answers (retryable means it can succeed).
    assert env.relay(tx, assignment["lease"]).status_code in (200, 202)


# 8. A throttling gateway --------------------------------------------------------------------------------
def test_a_throttling_gateway_is_back_pressure_not_an_outage(env: Any) -> None:
    """429 with Retry-After: the read waits and asks again instead of refusing UPSTREAM_UNAVAILABLE."""
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    env.faults(gateway={"throttleNext": 3})
    response = env.relay(tx, assignment["lease"])
    assert response.status_code in (200, 202), response.text
    assert env.wait_state(response.json()["txHash"], ("FINALIZED",), timeout=30)["outcome"] == "success"
