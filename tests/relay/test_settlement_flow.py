"""Settlement end to end on localnet: billed ledger rows -> batch -> settleUsage signed by the owner key ->
usageSettled final and mirrored -> committed -> proof served (409 before) and verified against the chain,
with the library and with `gasless verify-proof`; and the operator's `gasless admin` commands."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from relay_kit import RelayEnv
from sqlalchemy import create_engine, insert, select, update
from typer.testing import CliRunner

from gasless.cli import app as cli
from gasless.client.native_auth import make_native_auth_token
from gasless.db.tables import intents, settlement_batches, usage_ledger
from gasless.settlement import usage_settled_events, verify_proof

runner = CliRunner()


def _sync_url(env: RelayEnv) -> str:
    return env.settings.effective_database_url.replace("+aiosqlite", "")


def relay_finalized(env: RelayEnv, sender: Any, count: int) -> list[str]:
    hashes = []
    for _ in range(count):
        assignment = env.assign(sender)
        tx = env.build(sender, assignment)
        answer = env.relay(tx, assignment["lease"])
        assert answer.status_code in (200, 202), answer.text
        hashes.append(answer.json()["txHash"])
        sender.nonce += 1
    for tx_hash in hashes:
        env.wait_state(tx_hash, ("FINALIZED",), timeout=30)
    return hashes


def ledger_rows(
    env: RelayEnv, hashes: list[str], *, account: str, billing_class: str, ru: int, payg: int
) -> None:
    """Billed usage rows for executed intents with the given billing (the billing core writes the row
    when the intent executes; the test fixes its class and amounts, e.g. a pay-as-you-go charge)."""
    engine = create_engine(_sync_url(env))
    billing = {
        "account": account,
        "billed": True,
        "billing_class": billing_class,
        "ru": ru,
        "payg_micro": payg,
    }
    with engine.begin() as conn:
        for tx_hash in hashes:
            intent = conn.execute(select(intents).where(intents.c.tx_hash == tx_hash)).one()
            written = conn.execute(
                update(usage_ledger).where(usage_ledger.c.tx_hash == tx_hash).values(**billing)
            ).rowcount
            if written:
                continue
            conn.execute(
                insert(usage_ledger).values(
                    tx_hash=tx_hash,
                    intent_pk=intent.pk,
                    sender=intent.sender,
                    nonce=intent.nonce,
                    receiver=intent.receiver,
                    function=None,
                    sender_shard=intent.sender_shard,
                    relayer=intent.relayer,
                    status="success",
                    period_id=None,
                    api_key_id=None,
                    gas_limit=intent.gas_limit,
                    gas_price=intent.gas_price,
                    cosigned_at_ms=intent.cosigned_at_ms,
                    executed_block_ts_ms=intent.executed_block_ts_ms,
                    terminal_at_ms=intent.executed_block_ts_ms or intent.cosigned_at_ms,
                    created_at_ms=int(time.time() * 1000),
                    **billing,
                )
            )
    engine.dispose()


def refused(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code


def bearer(env: RelayEnv, who: Any) -> dict[str, str]:
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(
        who.key, origin=env.settings.network.app_origin, block_hash=block, ttl_seconds=600
    )
    return {"Authorization": f"Bearer {token}"}


def batch_state(env: RelayEnv, batch_id: int) -> str | None:
    engine = create_engine(_sync_url(env))
    with engine.connect() as conn:
        state = conn.scalar(
            select(settlement_batches.c.state).where(settlement_batches.c.batch_id == batch_id)
        )
    engine.dispose()
    return state


def gateway_tx(env: RelayEnv, tx_hash: str) -> dict[str, Any]:
    with urllib.request.urlopen(
        f"{env.localnet.url}/transaction/{tx_hash}?withResults=true", timeout=5
    ) as answer:
        return json.loads(answer.read())["data"]["transaction"]  # type: ignore[no-any-return]


def test_settlement_end_to_end(make_env: Any, unpaused_localnet: Any, tmp_path: Path, problem: Any) -> None:
    pem = unpaused_localnet.net.genesis.owner.path
    env: RelayEnv = make_env(owner_key_file=pem, settlement_interval_ms=3_600_000)
    worker = env.client.app.state.host.settlement_worker
    assert worker is not None
    plan_user = env.new_sender(1)
    payg_user = env.new_sender(1)
    plan_hashes = relay_finalized(env, plan_user, 3)
    payg_hashes = relay_finalized(env, payg_user, 1)
    ledger_rows(env, plan_hashes, account=plan_user.address, billing_class="plan", ru=1, payg=0)
    ledger_rows(env, payg_hashes, account=payg_user.address, billing_class="payg", ru=2, payg=400)

    # Before any batch: 409, saying when the next batch is due at the latest.
    early = env.client.get(f"/v1/usage/{plan_hashes[1]}/proof", headers=bearer(env, plan_user))
    assert early.status_code == 409, early.text
    body = early.json()
    assert body["details"]["batchId"] is None and body["retryable"] is True
    assert body["code"] == "IDEMPOTENCY_IN_PROGRESS" and body["details"]["reason"] == "PROOF_PENDING"
    assert 0 < body["details"]["nextBatchDueMs"] - int(time.time() * 1000) <= 3_600_000
    assert int(early.headers["Retry-After"]) >= 1
    # Credentials come first, then the row, then the caller's right to it.
    refused(env.client.get(f"/v1/usage/{plan_hashes[1]}/proof"), 401, "UNAUTHENTICATED")
    problem(env.client.get(f"/v1/usage/{'ab' * 32}/proof", headers=bearer(env, plan_user)), "NOT_FOUND")
    refused(
        env.client.get(f"/v1/usage/{payg_hashes[0]}/proof", headers=bearer(env, plan_user)), 403, "FORBIDDEN"
    )
    problem(env.client.get("/v1/usage/xyz/proof", headers=bearer(env, plan_user)), "MALFORMED_REQUEST")

    worker.settle_now()
    deadline = time.monotonic() + 30
    while batch_state(env, 1) != "committed":
        assert time.monotonic() < deadline, f"batch 1 is {batch_state(env, 1)}"
        time.sleep(0.1)

    proofs = {}
    for tx_hash, who in [*((h, plan_user) for h in plan_hashes), (payg_hashes[0], payg_user)]:
        answer = env.client.get(f"/v1/usage/{tx_hash}/proof", headers=bearer(env, who))
        assert answer.status_code == 200, answer.text
        proofs[tx_hash] = answer.json()
    assert sorted(p["leafIndex"] for p in proofs.values()) == [0, 1, 2, 3]
    proof = proofs[plan_hashes[1]]
    assert proof["batchId"] == 1 and proof["rowCount"] == 4 and len(proof["path"]) == 2
    # The chain's event is the authority: the library verifier checks the proof against it.
    events = usage_settled_events(gateway_tx(env, proof["settlement"]["txHash"]), env.contract)
    assert len(events) == 1 and events[0]["usage_root"] == proof["usageRoot"]
    assert events[0]["row_count"] == 4 and events[0]["total_ru"] == 3 * 1 + 2
    assert all(verify_proof(p, events[0]) for p in proofs.values())
    # The CLI fetches the event from the gateway itself.
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(proof))
    result = runner.invoke(cli, ["verify-proof", str(path), "--gateway", env.localnet.url])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("valid")
    forged = dict(proof, leafData=proof["leafData"][:-2] + ("00" if proof["leafData"][-2:] != "00" else "01"))
    path.write_text(json.dumps(forged))
    result = runner.invoke(cli, ["verify-proof", str(path), "--gateway", env.localnet.url])
    assert result.exit_code == 1 and "INVALID" in result.output
    # The PAYG charge reached the contract: the timeline shows the settlement.
    env.wait_mirror()
    rows = env.client.get(f"/v1/account/{payg_user.address}/purchases", params={"kind": "payg_settlement"})
    settled = rows.json()["items"]
    assert len(settled) == 1 and settled[0]["details"]["batchId"] == 1 and settled[0]["details"]["ru"] == 2
    # Requested 400 micro; the contract caps the debit by the (empty) escrow.
    assert settled[0]["details"]["requested"] == 400 and settled[0]["amountMicro"] == 0


def test_admin_commands(env: RelayEnv) -> None:
    pem = str(env.localnet.net.genesis.owner.path)
    common = ["--gateway", env.localnet.url, "--contract", env.contract, "--owner-pem", pem]
    someone = env.new_sender(1, plan=False)
    result = runner.invoke(cli, ["admin", "grant", someone.address, "2", "3", *common])
    assert result.exit_code == 0, result.output
    env.wait_mirror()
    account = env.client.get(f"/v1/account/{someone.address}").json()
    assert account["runningPlan"]["tierId"] == 2 and account["runningPlan"]["months"] == 3
    grant = env.client.get(f"/v1/account/{someone.address}/purchases").json()["items"]
    assert [r["kind"] for r in grant] == ["grant"] and grant[0][
        "txHash"
    ] == result.stdout.strip().splitlines()[-1]

    assert runner.invoke(cli, ["admin", "pause", "deposits", *common]).exit_code == 0
    env.wait_mirror()
    pause = env.client.app.state.host.mirror_repo
    assert asyncio.run(pause.view("pause")) == {"paused": False, "depositsPaused": True}
    assert runner.invoke(cli, ["admin", "unpause", "deposits", *common]).exit_code == 0
    env.wait_mirror()
    assert asyncio.run(pause.view("pause")) == {"paused": False, "depositsPaused": False}
    assert runner.invoke(cli, ["admin", "pause", "everything", *common]).exit_code == 2

    # settle-now with no billed rows: a root-only batch, committed once final.
    db = ["--database-url", env.settings.effective_database_url]
    result = runner.invoke(cli, ["admin", "settle-now", *common, *db])
    assert result.exit_code == 0, result.output
    batch = json.loads(result.stdout.strip().splitlines()[-1])
    assert batch["batch_id"] == 1 and batch["row_count"] == 0 and batch["usage_root"] == "00" * 32
    env.wait_mirror()
    status = runner.invoke(cli, ["admin", "status", *db])
    assert status.exit_code == 0, status.output
    info = json.loads(status.stdout.strip().splitlines()[-1])
    assert info["lastBatch"]["state"] == "committed" and info["cursor"]["hyperblockNonce"] > 0
    # A call the contract refuses: the operator sees its reason and a failing exit code.
    bad = runner.invoke(cli, ["admin", "grant", someone.address, "99", "1", *common])
    assert bad.exit_code == 1 and "ERR_UNKNOWN_TIER" in bad.output
