"""Who reads and acknowledges notices and preferences, pages and cursors, and refused bodies."""

from __future__ import annotations

from typing import Any

from notice_kit import FAST, notices, put_prefs, wait_until  # type: ignore[import-not-found]


def test_roles_pages_and_refusals(served: Any, problem: Any, platform_problem: Any) -> None:
    server, _env, auth = served(**FAST)
    account, sender, stranger = auth.account(), auth.stranger(), auth.stranger()
    auth.add_sender(account, sender)
    owner = auth.bearer(account)
    for label in ("one", "two", "three"):
        auth.create_key(account, label=label)
    read_key = auth.create_key(account, label="reader", policy={"scopes": ["read"]})
    items = wait_until(
        lambda: (
            [n for n in notices(server.client, account, owner)["items"] if n["kind"] == "key.created"][3:]
            or None
        ),
        "four key notices",
    )
    assert items
    path = f"/v1/account/{account.address}"

    # Pages, newest first, with a cursor bound to its filters.
    first = notices(server.client, account, owner, limit=2)
    assert len(first["items"]) == 2 and first["nextCursor"]
    second = notices(server.client, account, owner, limit=2, cursor=first["nextCursor"])
    seqs = [n["seq"] for n in first["items"] + second["items"]]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)
    moved = server.client.get(
        f"{path}/notices", params={"limit": 2, "cursor": first["nextCursor"], "sinceSeq": 1}, headers=owner
    )
    assert moved.status_code == 400 and moved.json()["code"] == "CURSOR_INVALID", moved.text

    # An authorised sender reads notices, but neither acknowledges nor sees the preferences.
    as_sender = auth.bearer(sender)
    assert server.client.get(f"{path}/notices", headers=as_sender).status_code == 200
    refused = server.client.post(f"{path}/notices/ack", json={"upToSeq": 1}, headers=as_sender)
    platform_problem(refused, "FORBIDDEN", {"role": "sender"})
    sender_prefs = server.client.get(f"{path}/notifications", headers=as_sender)
    platform_problem(sender_prefs, "FORBIDDEN", {"role": "sender"})
    platform_problem(put_prefs(server.client, account, as_sender, {}), "FORBIDDEN", {"role": "sender"})
    # A stranger reads nothing; no credential is 401.
    stranger_read = server.client.get(f"{path}/notices", headers=auth.bearer(stranger))
    platform_problem(stranger_read, "FORBIDDEN", {"role": None})
    assert server.client.get(f"{path}/notices").status_code == 401

    # A read key reads and acknowledges (the dashboard's credential).
    key_headers = {"X-Api-Key": read_key["secret"]}
    listed = server.client.get(f"{path}/notices", headers=key_headers)
    assert listed.status_code == 200, listed.text
    newest = listed.json()["items"][0]["seq"]
    assert (
        server.client.post(f"{path}/notices/ack", json={"upToSeq": newest}, headers=key_headers).status_code
        == 204
    )
    after = notices(server.client, account, owner, unacknowledged="true")
    assert after["acknowledgedSeq"] == newest and all(n["seq"] > newest for n in after["items"])

    # Bodies the schemas refuse: 400 MALFORMED_REQUEST.
    for body in ({}, {"upToSeq": -1}, {"upToSeq": "5"}, {"upToSeq": 1, "extra": True}):
        problem(server.client.post(f"{path}/notices/ack", json=body, headers=owner), "MALFORMED_REQUEST")
    for body in (
        {"email": {"address": "not-an-address"}},
        {"thresholds": {"planUsedPct": [0]}},
        {"thresholds": {"planUsedPct": [10, 20, 30, 40, 50, 60]}},
        {"kinds": {"no.such.kind": False}},
        {"surprise": 1},
    ):
        problem(put_prefs(server.client, account, owner, body), "MALFORMED_REQUEST")
    defaults = server.client.get(f"{path}/notifications", headers=owner).json()
    assert defaults["email"] is None and defaults["updatedAtMs"] is None
    assert defaults["thresholds"] == {
        "planUsedPct": [80, 100],
        "escrowBelowMicro": None,
        "paygSpentMicro": None,
    }


def test_a_kind_switch_that_is_not_a_boolean_is_refused(served: Any, problem: Any) -> None:
    """`kinds` maps a kind to a boolean (schema `NotificationPrefsUpdate`): `0`, `1` or `"false"` is not
    coerced but refused as a problem document, and the stored preferences stay as they were."""
    server, _env, auth = served(**FAST)
    account = auth.account()
    owner = auth.bearer(account)
    document = server.client.get("/openapi.json").json()
    kinds = document["components"]["schemas"]["NotificationPrefsUpdate"]["properties"]["kinds"]
    assert kinds["additionalProperties"] == {"type": "boolean"}, kinds
    switched = put_prefs(server.client, account, owner, {"kinds": {"plan.threshold": False}})
    assert switched.status_code == 200 and switched.json()["kinds"]["plan.threshold"] is False, switched.text
    for value in (0, 1, "false", None):
        refused = put_prefs(server.client, account, owner, {"kinds": {"plan.threshold": value}})
        problem(refused, "MALFORMED_REQUEST")
    kept = server.client.get(f"/v1/account/{account.address}/notifications", headers=owner).json()
    assert kept["kinds"]["plan.threshold"] is False and kept["updatedAtMs"] == switched.json()["updatedAtMs"]
