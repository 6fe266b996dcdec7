"""Billing end to end on localnet, in one story through HTTP: a plan granted by the owner is relayed on
until QUOTA_EXHAUSTED; a sponsor's API key (created with the per-action signature) pays for a stranger;
the key is revoked and the next relay is refused; the billed rows are settled on chain by the owner key;
a proof of each row verifies against the chain's `usageSettled` event."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from relay_kit import RelayEnv
from sqlalchemy import create_engine, select

from gasless.chain.addresses import address_of
from gasless.db import settlement_batches, usage_ledger
from gasless.settlement import usage_settled_events, verify_proof
from gasless.settlement.proofs import ProofInvalid

M = 1_000_000
MONTH_MS = 2_592_000_000


def _addr(sender: Any) -> Any:
    return address_of(sender.key.generate_public_key().buffer)


def _relay(env: RelayEnv, sender: Any, headers: dict[str, str] | None = None) -> Any:
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    response = env.relay(tx, assignment["lease"], headers=headers or {})
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def _scalar_rows(env: RelayEnv, query: Any) -> list[Any]:
    engine = create_engine(env.settings.effective_database_url.replace("+aiosqlite", ""))
    try:
        with engine.connect() as conn:
            return list(conn.execute(query).all())
    finally:
        engine.dispose()


def _gateway_tx(env: RelayEnv, tx_hash: str) -> dict[str, Any]:
    url = f"{env.localnet.url}/transaction/{tx_hash}?withResults=true"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())["data"]["transaction"]  # type: ignore[no-any-return]


def _until(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_grant_exhaust_sponsor_revoke_settle_and_prove(
    make_env: Any, unpaused_localnet: Any, auth_for: Any, problem: Any
) -> None:
    env: RelayEnv = make_env(
        owner_key_file=unpaused_localnet.net.genesis.owner.path, settlement_interval_ms=3_600_000
    )
    auth = auth_for(env)

    # A plan of 2 RU granted by the owner: two transfers (1 RU each) pass, the third is QUOTA_EXHAUSTED.
    env.owner("setTier", [31, b"E2E", "Human", 2, 1 * M, 2, MONTH_MS, True, False])
    holder = env.new_sender(plan=False)
    env.owner("grant", [_addr(holder), 31, 1])
    planned = []
    for _ in range(2):
        response = _relay(env, holder)
        assert response.status_code in (200, 202), response.text
        assert response.json()["billing"]["billingClass"] == "plan"
        planned.append(response.json()["txHash"])
    exhausted = problem(_relay(env, holder), "QUOTA_EXHAUSTED")
    assert exhausted["details"]["reason"] == "PLAN_CAP"

    # A Builder account sponsors a stranger with a key made through HTTP (per-action signature).
    sponsor = env.new_sender(plan=False)
    env.owner("grant", [_addr(sponsor), 2, 1])
    key = auth.create_key(sponsor)
    stranger = env.new_sender(plan=False)
    sponsored = _relay(env, stranger, {"X-Api-Key": key["secret"]})
    assert sponsored.status_code in (200, 202), sponsored.text
    assert sponsored.json()["billing"]["authMode"] == "api_key"
    assert sponsored.json()["billing"]["account"] == sponsor.address

    # Revoked through HTTP: the next relay with the key is refused before anything is signed.
    revoked = env.client.delete(
        f"/v1/account/{sponsor.address}/keys/{key['keyId']}", headers=auth.bearer(sponsor)
    )
    assert revoked.status_code == 204, revoked.text
    refused = _relay(env, stranger, {"X-Api-Key": key["secret"]})
    assert refused.status_code == 401 and refused.json()["code"] == "API_KEY_INVALID", refused.text

    # Every accepted relay executes and becomes a billed ledger row.
    billed = [*planned, sponsored.json()["txHash"]]
    for tx_hash in billed:
        env.wait_state(tx_hash, ("EXECUTED", "FINALIZED"), timeout=30)
    rows = _until(
        lambda: (
            found
            if len(found := _scalar_rows(env, select(usage_ledger).where(usage_ledger.c.tx_hash.in_(billed))))
            == 3
            else None
        ),
        "three ledger rows",
    )
    by_hash = {row.tx_hash: row for row in rows}
    assert all(row.billed and row.status == "success" for row in rows)
    assert {by_hash[h].billing_class for h in planned} == {"plan"}
    assert by_hash[sponsored.json()["txHash"]].billing_class == "sponsor"
    assert by_hash[sponsored.json()["txHash"]].api_key_id == key["keyId"]

    # Settled on chain by the owner key; then each row's proof verifies against the chain's event.
    env.client.app.state.host.settlement_worker.settle_now()
    _until(
        lambda: _scalar_rows(
            env, select(settlement_batches.c.state).where(settlement_batches.c.state == "committed")
        ),
        "a committed settlement batch",
    )
    checks = [(h, holder) for h in planned] + [(sponsored.json()["txHash"], sponsor)]
    for tx_hash, who in checks:
        answer = env.client.get(f"/v1/usage/{tx_hash}/proof", headers=auth.bearer(who))
        assert answer.status_code == 200, answer.text
        proof = answer.json()
        events = usage_settled_events(_gateway_tx(env, proof["settlement"]["txHash"]), env.contract)
        assert len(events) == 1 and events[0]["usage_root"] == proof["usageRoot"]
        assert verify_proof(proof, events[0])
        # The same proof with another leaf does not verify.
        tampered = dict(
            proof, leafData=proof["leafData"][:-2] + ("00" if proof["leafData"][-2:] != "00" else "01")
        )
        with pytest.raises(ProofInvalid):
            verify_proof(tampered, events[0])
