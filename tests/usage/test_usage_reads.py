"""GET /v1/usage, /v1/usage/{txHash} and /v1/usage/summary through HTTP: ledger rows seeded exactly as
the tracker writes them (for filters, order and pages), and real relays on the localnet end to end."""

from __future__ import annotations

import time
from typing import Any

T0 = 1_700_000_000_000


def _get(env: Any, auth: Any, who: Any, path: str, **params: Any) -> Any:
    return env.client.get(path, params=params, headers=auth.bearer(who))


def _all(env: Any, auth: Any, who: Any, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    headers = auth.bearer(who)
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = env.client.get("/v1/usage", params=query, headers=headers)
        assert response.status_code == 200, response.text
        page = response.json()
        items += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return items


def test_listing_order_filters_and_pages(env: Any, auth: Any, seed: Any, problem: Any) -> None:
    owner, other, helper = auth.account(), auth.account(), auth.stranger(2)
    a = owner.address
    rows = [
        seed.row(a, terminal_at_ms=T0 + 5_000, function="claimRewards"),
        seed.row(a, terminal_at_ms=T0 + 4_000, status="failed"),
        seed.row(a, terminal_at_ms=T0 + 4_000),  # same time: txHash decides
        seed.row(a, terminal_at_ms=T0 + 3_000, status="dead", billed=False),
        seed.row(a, terminal_at_ms=T0 + 2_000, billing_class="payg", payg_micro=700, sender=helper.address),
        seed.row(a, terminal_at_ms=T0 + 1_000, period_id=T0 - 10, api_key_id="key_abc", received_at_ms=T0),
    ]
    seed.row(other.address, terminal_at_ms=T0 + 6_000)  # another account's row never shows

    expected = sorted(rows, key=lambda r: (r["terminal_at_ms"], r["tx_hash"]), reverse=True)
    everything = _all(env, auth, owner, account=a)
    assert [r["txHash"] for r in everything] == [r["tx_hash"] for r in expected]
    paged = _all(env, auth, owner, account=a, limit=2)
    assert [r["txHash"] for r in paged] == [r["tx_hash"] for r in expected]

    dead = next(r for r in everything if r["status"] == "dead")
    assert dead["billed"] is False and dead["deadReason"] == "replaced" and dead["state"] == "DEAD"
    assert dead["billingClass"] is None and dead["ru"] is None and dead["periodId"] is None
    billed = next(r for r in everything if r["txHash"] == rows[5]["tx_hash"])
    assert billed["billingClass"] == "plan" and billed["ru"] == 1 and billed["periodId"] == T0 - 10
    assert billed["apiKeyId"] == "key_abc" and billed["latency"]["inclusionMs"] == 1_000
    assert billed["executedBlockTsMs"] == T0 + 1_000 and billed["inFlight"] is False

    def hashes(**params: Any) -> list[str]:
        return [r["txHash"] for r in _all(env, auth, owner, account=a, **params)]

    assert hashes(status="dead") == [rows[3]["tx_hash"]]
    assert set(hashes(status="success,failed")) == {r["tx_hash"] for r in rows} - {rows[3]["tx_hash"]}
    assert hashes(q="claimR") == [rows[0]["tx_hash"]]
    assert hashes(q=rows[2]["tx_hash"][:10].upper()) == [rows[2]["tx_hash"]]
    assert hashes(q="50%") == []  # treated as text, never as a pattern
    assert hashes(sender=helper.address) == [rows[4]["tx_hash"]]
    assert hashes(shard="2") == [rows[4]["tx_hash"]]
    assert hashes(billingClass="payg") == [rows[4]["tx_hash"]]
    assert hashes(periodId=T0 - 10) == [rows[5]["tx_hash"]]
    assert hashes(apiKeyId="key_abc") == [rows[5]["tx_hash"]]
    assert rows[5]["tx_hash"] in hashes(minInclusionMs=1_000)
    assert hashes(minInclusionMs=1_001) == []  # seeded rows take 900 ms otherwise

    # Cursors: tampered, or minted for other filters, are CURSOR_INVALID.
    first = _get(env, auth, owner, "/v1/usage", account=a, limit=2).json()
    cursor = first["nextCursor"]
    body, tag = cursor.split(".")
    tampered = f"{body}.{'A' if tag[0] != 'A' else 'B'}{tag[1:]}"
    problem(_get(env, auth, owner, "/v1/usage", account=a, limit=2, cursor=tampered), "CURSOR_INVALID")
    other_filters = _get(env, auth, owner, "/v1/usage", account=a, status="dead", cursor=cursor)
    problem(other_filters, "CURSOR_INVALID")

    # Bad input and access.
    refused = _get(env, auth, owner, "/v1/usage", account=a, state="DEAD")
    assert problem(refused, "MALFORMED_REQUEST")["details"] == {"field": "state"}
    bad_status = _get(env, auth, owner, "/v1/usage", account=a, status="done")
    assert problem(bad_status, "MALFORMED_REQUEST")["details"] == {"field": "status"}
    short_q = _get(env, auth, owner, "/v1/usage", account=a, q="ab")
    assert problem(short_q, "MALFORMED_REQUEST")["details"] == {"field": "q"}
    assert env.client.get("/v1/usage", params={"account": a}).status_code == 401
    forbidden = _get(env, auth, other, "/v1/usage", account=a)
    assert forbidden.status_code == 403 and forbidden.json()["code"] == "FORBIDDEN"


def test_read_key_lists_and_single_row_with_settlement(env: Any, auth: Any, seed: Any, problem: Any) -> None:
    owner, other = auth.account(), auth.account()
    seed.batch(7)
    settled = seed.row(owner.address, terminal_at_ms=T0, batch_id=7, leaf_index=3, first_ack_gateway="gw-1")
    key = auth.create_key(owner, policy={"scopes": ["read"]})
    listed = env.client.get(
        "/v1/usage", params={"account": owner.address}, headers={"X-Api-Key": key["secret"]}
    )
    assert listed.status_code == 200, listed.text
    assert [r["txHash"] for r in listed.json()["items"]] == [settled["tx_hash"]]
    assert listed.headers["Cache-Control"] == "private, no-store"
    assert "RateLimit-Limit" in listed.headers

    detail = _get(env, auth, owner, f"/v1/usage/{settled['tx_hash']}")
    assert detail.status_code == 200, detail.text
    body = detail.json()
    # One UsageRow, its members at the top level (as the listing's items), and the settlement batch and the
    # acknowledgements added by this route; the listing's items carry them null.
    assert body["txHash"] == settled["tx_hash"] and body["batchId"] == 7 and "row" not in body
    assert set(listed.json()["items"][0]) == set(body)
    assert listed.json()["items"][0]["settlement"] is None
    assert listed.json()["items"][0]["acknowledgements"] is None
    assert body["settlement"]["batchId"] == 7 and body["settlement"]["leafIndex"] == 3
    assert body["settlement"]["state"] == "committed" and body["settlement"]["usageRoot"] == "ab" * 32
    assert body["acknowledgements"] == [
        {"gateway": "gw-1", "atMs": settled["broadcast_at_ms"], "first": True}
    ]

    assert _get(env, auth, other, f"/v1/usage/{settled['tx_hash']}").json()["code"] == "FORBIDDEN"
    problem(_get(env, auth, owner, f"/v1/usage/{'0' * 64}"), "NOT_FOUND")
    assert env.client.get(f"/v1/usage/{settled['tx_hash']}").status_code == 401
    problem(_get(env, auth, owner, "/v1/usage/xyz"), "MALFORMED_REQUEST")


def test_summary_totals_series_and_tops(env: Any, auth: Any, seed: Any) -> None:
    owner = auth.account()
    a = owner.address
    period = T0 - T0 % 86_400_000  # day-aligned, so the buckets are the days of the period
    day = 86_400_000
    seed.row(a, terminal_at_ms=period + 10, period_id=period, ru=3, receiver="r1" * 31, received_at_ms=period)
    seed.row(a, terminal_at_ms=period + 20, period_id=period, ru=2, status="failed", received_at_ms=period)
    seed.row(a, terminal_at_ms=period + day + 5, billing_class="payg", ru=4, payg_micro=400)
    seed.row(a, terminal_at_ms=period + day + 6, status="dead", billed=False)
    seed.row(a, terminal_at_ms=period + 40 * day, period_id=period + 30 * day, ru=9)  # next period
    summary = _get(env, auth, owner, "/v1/usage/summary", account=a, periodId=period, bucket="day")
    assert summary.status_code == 200, summary.text
    body = summary.json()
    totals = body["totals"]
    assert (totals["ru"], totals["paygMicro"], totals["txCount"], totals["failCount"]) == (9, 400, 3, 1)
    assert totals["txCountByStatus"] == {"success": 2, "failed": 1, "dead": 1, "rejected": 0}
    assert totals["ruByClass"] == {"plan": 5, "payg": 4}
    assert [(b["startMs"] - period) // day for b in body["series"]] == [0, 1]
    first = body["series"][0]
    assert (first["ru"], first["txCount"], first["failCount"]) == (5, 2, 1)
    # Seeded in 2023 (older than the rollups keep): no measured percentile, never one from raw rows.
    assert first["inclusion"] == {"p50Ms": None, "p95Ms": None, "p99Ms": None}
    assert body["topSenders"] == [{"address": a, "ru": 9, "txCount": 3}]
    assert body["topReceivers"][0] == {"address": a, "ru": 6, "txCount": 2}
    hourly = _get(env, auth, owner, "/v1/usage/summary", account=a, periodId=period, bucket="hour").json()
    assert sum(b["ru"] for b in hourly["series"]) == 9 and len(hourly["series"]) == 2


def _relay(env: Any, sender: Any, **build: Any) -> Any:
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, **build)
    response = env.relay(tx, assignment["lease"])
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def _wait(check: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition never held")


def test_relays_on_localnet_show_in_usage_with_rejections(env: Any, auth: Any) -> None:
    owner = auth.account()
    relayed = _relay(env, owner)
    assert relayed.status_code in (200, 202), relayed.text
    tx_hash = relayed.json()["txHash"]
    env.wait_state(relayed.json()["id"], ("EXECUTED", "FINALIZED"))
    rows = _wait(lambda: _all(env, auth, owner, account=owner.address))
    assert [r["txHash"] for r in rows] == [tx_hash]
    row = rows[0]
    assert row["billed"] is True and row["billingClass"] == "plan" and row["ru"] == 1
    assert row["status"] == "success" and row["periodId"] is not None
    assert row["latency"]["inclusionMs"] is not None and row["relayer"] == relayed.json()["relayer"]

    # A submission refused before the commit point: only with includeInFlight, as REJECTED.
    assignment = env.assign(owner)
    stale = env.build(owner, assignment, nonce=owner.nonce - 1)
    assert env.relay(stale, assignment["lease"]).status_code == 409

    def rejected() -> list[dict[str, Any]]:
        listed = _all(env, auth, owner, account=owner.address, includeInFlight="true")
        return [r for r in listed if r["state"] == "REJECTED"]

    shown = _wait(rejected)[0]
    assert (
        shown["rejectCode"] == "INTENT_ALREADY_EXECUTED"
        and shown["billed"] is False
        and shown["status"] is None
    )
    assert "signature" not in shown
    assert [r["txHash"] for r in _all(env, auth, owner, account=owner.address)] == [tx_hash]
    only_rejected = _all(env, auth, owner, account=owner.address, includeInFlight="true", state="REJECTED")
    assert [r["state"] for r in only_rejected] == ["REJECTED"]

    summary = _get(env, auth, owner, "/v1/usage/summary", account=owner.address).json()
    assert summary["totals"]["ru"] == 1 and summary["totals"]["txCountByStatus"]["rejected"] == 1
    assert summary["periodId"] == row["periodId"]
