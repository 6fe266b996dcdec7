"""Property: for any ledger, GET /v1/usage/summary totals equal the sums over the GET /v1/usage rows with
`billed = true` (RU, pay-as-you-go money, count, failures), and the series adds up to the totals."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PERIOD = 1_699_920_000_000  # day-aligned
DAY = 86_400_000

row_strategy = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["success", "failed", "dead"]),
        "klass": st.sampled_from(["plan", "payg", "sponsor", "free"]),
        "ru": st.integers(min_value=0, max_value=25),
        "price": st.integers(min_value=0, max_value=1_000),
        "offset": st.integers(min_value=0, max_value=30 * DAY - 1),
        "inclusion": st.integers(min_value=0, max_value=60_000),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledger=st.lists(row_strategy, max_size=30))
def test_summary_equals_billed_rows(env: Any, auth: Any, seed: Any, ledger: list[dict[str, Any]]) -> None:
    owner = getattr(env, "_usage_owner", None)
    if owner is None:
        owner = env._usage_owner = auth.account()
    account = owner.address
    seed.clear(account)
    for row in ledger:
        billed = row["status"] != "dead"
        klass = row["klass"]
        terminal = PERIOD + row["offset"]
        seed.row(
            account,
            status=row["status"],
            billed=billed,
            billing_class=klass if billed else None,
            ru=row["ru"] if billed else None,
            payg_micro=row["ru"] * row["price"] if billed and klass == "payg" else (0 if billed else None),
            period_id=PERIOD if billed and klass in ("plan", "sponsor") else None,
            terminal_at_ms=terminal,
            received_at_ms=terminal - row["inclusion"],
        )
    headers = auth.bearer(owner)
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"account": account, "limit": 200, **({"cursor": cursor} if cursor else {})}
        page = env.client.get("/v1/usage", params=params, headers=headers).json()
        rows += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert len(rows) == len(ledger)
    billed_rows = [r for r in rows if r["billed"]]
    response = env.client.get(
        "/v1/usage/summary", params={"account": account, "periodId": PERIOD, "bucket": "day"}, headers=headers
    )
    assert response.status_code == 200, response.text
    summary = response.json()
    totals = summary["totals"]
    assert totals["ru"] == sum(r["ru"] for r in billed_rows)
    assert totals["paygMicro"] == sum(r["paygMicro"] for r in billed_rows)
    assert totals["txCount"] == len(billed_rows)
    assert totals["failCount"] == sum(1 for r in billed_rows if r["status"] == "failed")
    for status in ("success", "failed", "dead"):
        assert totals["txCountByStatus"][status] == sum(1 for r in rows if r["status"] == status)
    assert sum(totals["ruByClass"].values()) == totals["ru"]
    series = summary["series"]
    assert sum(b["ru"] for b in series) == totals["ru"]
    assert sum(b["txCount"] for b in series) == totals["txCount"]
    assert sum(b["paygMicro"] for b in series) == totals["paygMicro"]
    assert sum(t["ru"] for t in summary["topSenders"]) == totals["ru"]  # one sender: the account
