"""`GET /v1/incidents` and `GET /v1/incidents/{incidentId}` through HTTP, with incidents declared, updated
and resolved by the operator's `gasless admin incident` commands: the model, status moves, append-only
history, filters, time windows, pages and cursors, caching (ETag, 304), and the problems."""

from __future__ import annotations

import json
import re
import time
from typing import Any

ID = re.compile(r"inc_[0-9a-f]{20}")
KEYS = {
    "id",
    "title",
    "status",
    "impact",
    "shard",
    "source",
    "kind",
    "createdAtMs",
    "updatedAtMs",
    "resolvedAtMs",
    "updates",
}


def _tick() -> None:
    time.sleep(0.005)  # creation times in ms: keep consecutive incidents apart


def test_nothing_yet_and_not_found(api: Any, problem: Any) -> None:
    response = api.get("/v1/incidents")
    assert response.status_code == 200
    assert response.json() == {"items": [], "nextCursor": None}
    assert response.headers["Cache-Control"] == "public, max-age=5" and response.headers["ETag"]
    assert "RateLimit-Limit" in response.headers  # the public-read route class
    for unknown in ("inc_0123456789abcdef0123", "inc_nothex", "garbage", "inc_" + "a" * 200):
        body = problem(api.get(f"/v1/incidents/{unknown}"), "NOT_FOUND")
        assert unknown[:20] in body["detail"]


def test_operator_incident_lifecycle_visible_over_http(api: Any, admin: Any, problem: Any) -> None:
    opened = admin.open("Shard 2 inclusion delayed", "Transactions in shard 2 wait longer.", "--shard", "2")
    ident = opened["id"]
    assert ID.fullmatch(ident)
    got = api.get(f"/v1/incidents/{ident}")
    assert got.status_code == 200 and got.json() == opened
    incident = got.json()
    assert set(incident) == KEYS
    assert incident["status"] == "investigating" and incident["impact"] == "minor"
    assert incident["shard"] == 2 and incident["source"] == "operator" and incident["kind"] is None
    assert incident["resolvedAtMs"] is None and incident["createdAtMs"] == incident["updatedAtMs"]
    first = incident["updates"]
    assert first == [
        {
            "seq": 1,
            "status": "investigating",
            "body": "Transactions in shard 2 wait longer.",
            "atMs": incident["createdAtMs"],
        }
    ]

    # Open -> another open status -> the same one again ("still monitoring") -> resolved.
    history = [first[0]]
    for status, body in (
        ("identified", "A gateway of shard 2 lags."),
        ("monitoring", "Gateway replaced; watching inclusion times."),
        ("monitoring", "Inclusion p99 back under 6 s."),
        ("resolved", "Inclusion times are normal again."),
    ):
        _tick()
        updated = admin.update(ident, status, body)
        assert updated["status"] == status
        # Append-only: what was there is unchanged, one update is added at the end.
        assert updated["updates"][:-1] == history
        history = updated["updates"]
        assert history[-1]["seq"] == len(history) and history[-1]["body"] == body
        assert history[-1]["atMs"] == updated["updatedAtMs"]
        assert api.get(f"/v1/incidents/{ident}").json() == updated
    final = api.get(f"/v1/incidents/{ident}")
    incident = final.json()
    assert incident["status"] == "resolved" and incident["resolvedAtMs"] == incident["updatedAtMs"]
    assert [u["seq"] for u in incident["updates"]] == [1, 2, 3, 4, 5]
    assert final.headers["Cache-Control"] == "public, max-age=3600"  # resolved is final

    # Resolved is final: no more updates of any status; the history stays as it was.
    for status in ("investigating", "resolved"):
        result = admin.run("update", ident, "--status", status, "--body", "again")
        assert result.exit_code == 1 and "MALFORMED_REQUEST" in result.output and "final" in result.output
    assert api.get(f"/v1/incidents/{ident}").json() == incident

    # Refused commands: unknown incident, a status or impact outside the vocabulary, blank text.
    unknown = admin.run("update", "inc_0123456789abcdef0123", "--status", "identified", "--body", "x")
    assert unknown.exit_code == 1 and "NOT_FOUND" in unknown.output
    assert admin.run("update", ident, "--status", "closed", "--body", "x").exit_code == 2
    assert admin.run("open", "--title", "t", "--body", "b", "--impact", "huge").exit_code == 2
    assert admin.run("open", "--title", "t", "--body", "b", "--status", "resolved").exit_code == 1
    assert admin.run("open", "--title", "t", "--body", "b", "--shard", "3").exit_code == 2
    blank = admin.run("open", "--title", "   ", "--body", "b")
    assert blank.exit_code == 1 and "title" in blank.output
    assert api.incidents()["items"] == [incident]

    # `list` shows it: a table on stdout (nothing on stderr), or one JSON line per incident with --json.
    listed = admin.run("list")
    assert listed.exit_code == 0 and ident in listed.stdout and not listed.stderr, listed.output
    as_json = admin.run("list", "--json")
    assert as_json.exit_code == 0 and not as_json.stderr, as_json.output
    assert [json.loads(line)["id"] for line in as_json.stdout.strip().splitlines()] == [ident]


def test_etag_and_304(api: Any, admin: Any) -> None:
    ident = admin.open("Webhook deliveries delayed")["id"]
    for path in ("/v1/incidents", f"/v1/incidents/{ident}"):
        first = api.get(path)
        etag = first.headers["ETag"]
        again = api.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["ETag"] == etag and again.headers["Cache-Control"] == "public, max-age=5"
        assert api.get(path, headers={"If-None-Match": f"W/{etag}"}).status_code == 304
    before = {path: api.get(path).headers["ETag"] for path in ("/v1/incidents", f"/v1/incidents/{ident}")}
    admin.update(ident, "identified", "A receiver endpoint is slow.")
    for path, etag in before.items():
        changed = api.get(path, headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["ETag"] != etag
        assert "identified" in changed.text


def test_filters_pages_and_cursors(api: Any, admin: Any, problem: Any) -> None:
    made = []
    for n, (shard, status) in enumerate(
        [(0, None), (1, "identified"), (None, "resolved"), (1, None), (2, "monitoring"), (1, "resolved")]
    ):
        extra = ("--shard", str(shard)) if shard is not None else ()
        incident = admin.open(f"incident {n}", "first", *extra)
        if status is not None:
            incident = admin.update(incident["id"], status, f"now {status}")
        made.append(incident)
        _tick()
    newest_first = [i["id"] for i in reversed(made)]
    assert [i["id"] for i in api.incidents()["items"]] == newest_first

    assert [i["id"] for i in api.incidents(shard=1)["items"]] == [made[5]["id"], made[3]["id"], made[1]["id"]]
    assert [i["id"] for i in api.incidents(status="resolved")["items"]] == [made[5]["id"], made[2]["id"]]
    assert [i["id"] for i in api.incidents(status="investigating")["items"]] == [made[3]["id"], made[0]["id"]]
    assert [i["id"] for i in api.incidents(shard=1, status="resolved")["items"]] == [made[5]["id"]]
    assert api.incidents(shard=0, status="resolved") == {"items": [], "nextCursor": None}

    # Pages of 2 through every incident: newest first, each once, the last page without a cursor.
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 2}
    pages = 0
    while True:
        page = api.incidents(**params)
        pages += 1
        assert len(page["items"]) <= 2
        seen += [i["id"] for i in page["items"]]
        if page["nextCursor"] is None:
            break
        params = {"limit": 2, "cursor": page["nextCursor"]}
    assert seen == newest_first and pages == 3
    # A filtered listing pages the same way.
    page = api.incidents(shard=1, limit=2)
    rest = api.incidents(shard=1, limit=2, cursor=page["nextCursor"])
    assert [i["id"] for i in page["items"] + rest["items"]] == [made[5]["id"], made[3]["id"], made[1]["id"]]
    assert rest["nextCursor"] is None

    # A cursor belongs to its listing and filters; anything else is CURSOR_INVALID.
    cursor = api.incidents(limit=2)["nextCursor"]
    problem(api.get("/v1/incidents", params={"cursor": cursor, "shard": 1}), "CURSOR_INVALID")
    problem(api.get("/v1/incidents", params={"cursor": cursor[:-2] + "AA"}), "CURSOR_INVALID")
    problem(api.get("/v1/incidents", params={"cursor": "not-a-cursor"}), "CURSOR_INVALID")

    # Bad filters: the usual validation problem, naming the parameter.
    for params, field in (
        ({"shard": 3}, "shard"),
        ({"shard": "one"}, "shard"),
        ({"status": "closed"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"from": -1}, "from"),
        ({"from": 10, "to": 5}, "from"),
    ):
        body = problem(api.get("/v1/incidents", params=params), "MALFORMED_REQUEST")
        assert field in body["details"]["field"], (params, body)


def test_time_window_keeps_incidents_whose_lifetime_overlaps(api: Any, admin: Any) -> None:
    early = admin.open("early")
    _tick()
    early = admin.update(early["id"], "resolved", "over")
    _tick()
    late = admin.open("late")  # still open: it lasts until now
    ids = {"early": early["id"], "late": late["id"]}

    def window(**params: Any) -> list[str]:
        names = {v: k for k, v in ids.items()}
        return [names[i["id"]] for i in api.incidents(**params)["items"]]

    assert window() == ["late", "early"]
    assert window(**{"from": early["resolvedAtMs"]}) == ["late", "early"]  # inclusive
    assert window(**{"from": early["resolvedAtMs"] + 1}) == ["late"]
    assert window(to=late["createdAtMs"] - 1) == ["early"]
    assert window(to=early["createdAtMs"] - 1) == []
    assert window(**{"from": early["createdAtMs"], "to": early["createdAtMs"]}) == ["early"]
    now_ms = int(time.time() * 1000)
    assert window(**{"from": early["resolvedAtMs"] + 1, "to": now_ms + 60_000}) == ["late"]
    assert window(**{"from": now_ms + 60_000}) == []  # an open incident does not reach the future
