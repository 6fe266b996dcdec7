"""The contract mirror through HTTP on a real localnet: events followed from finalised hyperblocks into the
account record, the authorised senders, the purchase timeline (kinds, window, pages, CSV), the quota; a
restart resumes the cursor without applying an event twice."""

from __future__ import annotations

import csv
import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multiversx_sdk import Address
from relay_kit import RelayEnv, start_env, user_call

USDC = 1_000_000
REF = bytes(range(32))


def fund(env: RelayEnv, address: str, usdc: int) -> None:
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/faucet",
        data=json.dumps({"address": address, "egldAtto": str(10**18), "usdcMicro": usdc}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).read()


def timeline(env: RelayEnv, account: str, **params: Any) -> list[dict[str, Any]]:
    response = env.client.get(f"/v1/account/{account}/purchases", params={"limit": 200, **params})
    assert response.status_code == 200, response.text
    return response.json()["items"]  # type: ignore[no-any-return]


@pytest.fixture
def story(env: RelayEnv) -> dict[str, Any]:
    """An account that deposited, bought Starter, added two senders, removed one, and was granted Growth."""
    owner = env.new_sender(1, plan=False)
    fund(env, owner.address, 200 * USDC)
    s1, s2 = (env.new_sender(1, plan=False) for _ in range(2))
    hashes = {
        "deposit": user_call(env, owner.key, "deposit", [], usdc=50 * USDC),
        "subscribe": user_call(env, owner.key, "subscribe", [1, 1, 9 * USDC, REF]),
        "add": user_call(
            env,
            owner.key,
            "addSenders",
            [USDC, [Address.new_from_bech32(s1.address), Address.new_from_bech32(s2.address)]],
        ),
        "remove": user_call(env, owner.key, "removeSenders", [[Address.new_from_bech32(s1.address)]]),
    }
    hashes["grant"] = env.owner("grant", [Address.new_from_bech32(owner.address), 3, 2])
    env.wait_mirror()
    return {"owner": owner, "senders": (s1.address, s2.address), "hashes": hashes}


def test_mirror_follows_the_contract_events(env: RelayEnv, story: dict[str, Any]) -> None:
    owner = story["owner"].address
    s1, s2 = story["senders"]
    account = env.client.get(f"/v1/account/{owner}")
    assert account.status_code == 200, account.text
    body = account.json()
    # 50 deposited - 9 Starter - 2 senders x 50 RU x 200 micro (the sender fee); Growth granted is an upgrade.
    assert body["creditsMicro"] == 50 * USDC - 9 * USDC - 2 * 50 * 200
    assert body["runningPlan"]["tierId"] == 3 and body["runningPlan"]["tierName"] == "Growth"
    assert body["runningPlan"]["months"] == 2 and body["runningPlan"]["includedRu"] == 600_000
    assert body["queuedPlan"] is None and body["senderCount"] == 1 and body["suspended"] is False
    assert account.headers["cache-control"].startswith("public") and account.headers["etag"]
    # The authorised senders: s1 removed, s2 stays.
    senders = env.client.get(f"/v1/account/{owner}/senders").json()["items"]
    assert senders == [{"address": s2}]
    # The timeline, newest first, with the design's kinds.
    rows = timeline(env, owner)
    assert [r["kind"] for r in rows] == ["grant", "sender_fee", "plan_purchase", "deposit"]
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["deposit"]["amountMicro"] == 50 * USDC and by_kind["deposit"]["details"]["payer"] == owner
    assert by_kind["deposit"]["txHash"] == story["hashes"]["deposit"]
    assert by_kind["plan_purchase"]["tierId"] == 1 and by_kind["plan_purchase"]["details"]["kind"] == "Start"
    assert by_kind["plan_purchase"]["details"]["ref"] == REF.hex()
    assert by_kind["sender_fee"]["details"]["senderCount"] == 2
    assert by_kind["grant"]["tierId"] == 3 and by_kind["grant"]["details"]["months"] == 2
    assert all(r["blockTsMs"] > 0 and r["hyperblockNonce"] > 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: (r["hyperblockNonce"], r["eventIndex"]), reverse=True)


def test_purchases_filters_pages_and_csv(env: RelayEnv, story: dict[str, Any], problem: Any) -> None:
    owner = story["owner"].address
    rows = timeline(env, owner)
    assert [r["kind"] for r in timeline(env, owner, kind="deposit,grant")] == ["grant", "deposit"]
    # Time window (inclusive) around the plan purchase alone.
    purchase = next(r for r in rows if r["kind"] == "plan_purchase")
    at = purchase["blockTsMs"]
    window = timeline(env, owner, **{"from": at, "to": at})
    assert purchase in window and all(r["blockTsMs"] == at for r in window)
    # Pages of one row each walk the whole timeline in order, then stop.
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        page = env.client.get(f"/v1/account/{owner}/purchases", params=params).json()
        seen += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == rows
    # A cursor is bound to its filters.
    first = env.client.get(f"/v1/account/{owner}/purchases", params={"limit": 1}).json()
    problem(
        env.client.get(
            f"/v1/account/{owner}/purchases",
            params={"limit": 1, "kind": "deposit", "cursor": first["nextCursor"]},
        ),
        "CURSOR_INVALID",
    )
    bad = env.client.get(f"/v1/account/{owner}/purchases", params={"kind": "deposit,refund"})
    assert problem(bad, "MALFORMED_REQUEST")["details"]["field"] == "kind"
    # CSV streams every matching row, no cursor.
    answer = env.client.get(f"/v1/account/{owner}/purchases", params={"format": "csv", "limit": 1})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(answer.text)))
    assert [r["kind"] for r in table] == [r["kind"] for r in rows]
    assert [r["txHash"] for r in table] == [r["txHash"] for r in rows]
    only = list(
        csv.DictReader(
            io.StringIO(
                env.client.get(
                    f"/v1/account/{owner}/purchases", params={"format": "csv", "kind": "sender_fee"}
                ).text
            )
        )
    )
    assert len(only) == 1 and json.loads(only[0]["details"])["senderCount"] == 2
    stranger = env.new_sender(1, plan=False)
    problem(env.client.get(f"/v1/account/{stranger.address}/purchases"), "NOT_FOUND")
    problem(env.client.get(f"/v1/account/{stranger.address}"), "NOT_FOUND")


def test_quota_states(env: RelayEnv, story: dict[str, Any]) -> None:
    owner = story["owner"].address
    _, s2 = story["senders"]
    quota = env.client.get(f"/v1/account/{owner}/quota").json()
    assert quota["state"] == "active" and quota["resolvedFrom"] == "account" and quota["account"] == owner
    assert quota["includedRu"] == 600_000 and quota["usedRu"] == 0 and quota["remainingRu"] == 600_000
    assert quota["periodId"] == quota["periodStartMs"] <= quota["evaluatedAtMs"] < quota["periodEndMs"]
    assert quota["tierId"] == 3 and quota["rateClass"] == 3
    # An authorised sender: the account that would pay.
    via = env.client.get(f"/v1/account/{s2}/quota").json()
    assert via["resolvedFrom"] == "authorised_sender" and via["account"] == owner and via["address"] == s2
    assert via["state"] == "active"
    # No account at all: 200 with NO_ACCOUNT.
    nobody = env.new_sender(1, plan=False)
    answer = env.client.get(f"/v1/account/{nobody.address}/quota")
    assert answer.status_code == 200
    assert answer.json()["state"] == "NO_ACCOUNT" and answer.json()["account"] is None
    # Suspension halts it (a derived state, never on chain).
    env.owner("setAccountSuspended", [Address.new_from_bech32(owner), True])
    env.wait_mirror()
    halted = env.client.get(f"/v1/account/{owner}/quota").json()
    assert halted["state"] == "halted" and halted["haltReason"] == "suspended"
    assert env.client.get(f"/v1/account/{owner}").json()["suspended"] is True


def test_quota_exhausted_and_deposit_only_accounts(env: RelayEnv) -> None:
    from sqlalchemy import create_engine, insert

    from gasless.db.tables import account_period_usage

    payer = env.new_sender(1, plan=False)
    fund(env, payer.address, 20 * USDC)
    user_call(env, payer.key, "deposit", [], usdc=10 * USDC)
    env.wait_mirror()
    credits_only = env.client.get(f"/v1/account/{payer.address}/quota").json()
    assert credits_only["state"] == "halted" and credits_only["haltReason"] == "no_plan"
    user_call(env, payer.key, "subscribe", [1, 1, 9 * USDC, REF])
    env.wait_mirror()
    quota = env.client.get(f"/v1/account/{payer.address}/quota").json()
    assert quota["state"] == "active" and quota["includedRu"] == 30_000
    engine = create_engine(env.settings.effective_database_url.replace("+aiosqlite", ""))
    with engine.begin() as conn:
        conn.execute(
            insert(account_period_usage).values(
                account=payer.address, period_id=quota["periodId"], ru_used=30_000, updated_at_ms=1
            )
        )
    engine.dispose()
    spent = env.client.get(f"/v1/account/{payer.address}/quota").json()
    assert spent["state"] == "halted" and spent["haltReason"] == "quota_exhausted"
    assert spent["usedRu"] == 30_000 and spent["remainingRu"] == 0


@pytest.fixture
def restartable(tmp_path: Path, unpaused_localnet: Any) -> Iterator[Any]:
    envs: list[Iterator[RelayEnv]] = []

    def start() -> RelayEnv:
        gen = start_env(tmp_path, unpaused_localnet)
        envs.append(gen)
        return next(gen)

    def stop() -> None:
        with pytest.raises(StopIteration):
            next(envs.pop())

    yield start, stop
    while envs:
        stop()


def test_restart_resumes_the_cursor_without_duplicates(restartable: Any) -> None:
    start, stop = restartable
    env = start()
    owner = env.new_sender(1, plan=False)
    fund(env, owner.address, 100 * USDC)
    user_call(env, owner.key, "deposit", [], usdc=5 * USDC)
    env.wait_mirror()
    before = timeline(env, owner.address)
    cursor = env.client.app.state.host.mirror_follower.cursor
    assert [r["kind"] for r in before] == ["deposit"]
    stop()
    # While no host follows the chain, more events happen; the restarted mirror picks them up once.
    user_call(env, owner.key, "deposit", [], usdc=7 * USDC)
    env.owner("grant", [Address.new_from_bech32(owner.address), 2, 1])
    env = start()
    env.wait_mirror()
    after = timeline(env, owner.address)
    assert [r["kind"] for r in after] == ["grant", "deposit", "deposit"]
    assert after[2] == before[0]
    assert [r["amountMicro"] for r in after[1:]] == [7 * USDC, 5 * USDC]
    assert env.client.app.state.host.mirror_follower.cursor > cursor
    assert env.client.get(f"/v1/account/{owner.address}").json()["creditsMicro"] == 12 * USDC
