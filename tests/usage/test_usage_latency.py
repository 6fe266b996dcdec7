"""GET /v1/usage/latency from the rollups: real relays on localnet, grouped by shard, relayer, sender and
gateway; a window without data has no groups; the route is not mistaken for /v1/usage/{txHash}. And the
sketch's merge property: percentiles of merged rollups match the raw figures within the documented error."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gasless.usage.rollups import RELATIVE_ERROR, decode, encode, merged, new_histogram, percentile, record


def _wait(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.05)
    return value


def _relay(env: Any, sender: Any) -> str:
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    sender.nonce += 1
    return str(answer.json()["txHash"])


def test_latency_by_shard_relayer_sender_and_gateway_after_real_relays(env: Any, auth: Any) -> None:
    owner = auth.account()
    hashes = [_relay(env, owner) for _ in range(3)]
    for tx_hash in hashes:
        env.wait_state(tx_hash, ("FINALIZED",))
    headers = auth.bearer(owner)

    def measured() -> Any:
        answer = env.client.get(
            "/v1/usage/latency", params={"account": owner.address, "window": "1h"}, headers=headers
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        return body if body["groups"] and body["groups"][0]["count"] == 3 else None

    body = _wait(measured)
    assert body["groupBy"] == "shard" and body["rollupMs"] == 60_000 and body["windowMs"] == 3_600_000
    assert body["sloTargetInclusionP99Ms"] is None and body["relativeError"] == RELATIVE_ERROR
    (group,) = body["groups"]
    assert group["key"] == str(owner.shard)
    for figure in ("added", "inclusion"):
        p50, p95, p99 = (group[figure][f"p{q}Ms"] for q in (50, 95, 99))
        assert p50 is not None and p50 <= p95 <= p99
    assert sum(b["count"] for b in group["bins"]) == 3 and group["bins"][-1]["leMs"] is None
    assert {s["txHash"] for s in group["samples"]} == set(hashes)

    by_gateway = env.client.get(
        "/v1/usage/latency", params={"account": owner.address, "groupBy": "gateway"}, headers=headers
    ).json()
    assert [g["key"] for g in by_gateway["groups"]] == [env.localnet.urls[0]]  # the first to acknowledge
    for group_by in ("relayer", "sender", "gateway"):
        answer = env.client.get(
            "/v1/usage/latency",
            params={"account": owner.address, "window": "30d", "groupBy": group_by},
            headers=headers,
        ).json()
        assert answer["rollupMs"] == 3_600_000 and sum(g["count"] for g in answer["groups"]) == 3, answer
    by_sender = env.client.get(
        "/v1/usage/latency", params={"account": owner.address, "groupBy": "sender"}, headers=headers
    ).json()
    assert [g["key"] for g in by_sender["groups"]] == [owner.address]

    # An account without traffic: no groups (never a zero-filled one).
    other = auth.account()
    empty = env.client.get("/v1/usage/latency", params={"account": other.address}, headers=auth.bearer(other))
    assert empty.status_code == 200 and empty.json()["groups"] == []
    bad = env.client.get(
        "/v1/usage/latency", params={"account": owner.address, "window": "2d"}, headers=headers
    )
    assert bad.status_code == 400 and bad.json()["code"] == "MALFORMED_REQUEST"
    assert env.client.get("/v1/usage/latency", params={"account": owner.address}).status_code == 401


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.lists(st.integers(min_value=1, max_value=600_000), min_size=1, max_size=60), min_size=1, max_size=6
    ),
    q=st.sampled_from([50, 90, 95, 99]),
)
def test_merged_rollup_percentiles_match_the_raw_figures(parts: list[list[int]], q: int) -> None:
    encoded = []
    for part in parts:  # one rollup per minute, say, each stored encoded
        histogram = new_histogram()
        for value in part:
            record(histogram, value)
        encoded.append(encode(histogram))
        assert decode(encoded[-1]).get_total_count() == len(part)
    values = sorted(v for part in parts for v in part)
    # The rank the rollups use (HdrHistogram's): the value at count round(q% of n), at least the first.
    rank = max(1, int(q / 100 * len(values) + 0.5))
    exact = values[rank - 1]
    estimate = percentile(merged(encoded), q)
    assert estimate is not None
    assert abs(estimate - exact) <= RELATIVE_ERROR * exact + 1, (estimate, exact)


def test_the_summary_series_reads_its_percentiles_from_the_rollups(env: Any, auth: Any) -> None:
    owner = auth.account()
    hashes = [_relay(env, owner) for _ in range(2)]
    for tx_hash in hashes:
        env.wait_state(tx_hash, ("FINALIZED",))
    headers = auth.bearer(owner)

    def measured() -> Any:
        summary = env.client.get(
            "/v1/usage/summary", params={"account": owner.address, "bucket": "hour"}, headers=headers
        ).json()
        series = [b for b in summary["series"] if b["txCount"]]
        return series if series and series[-1]["inclusion"]["p50Ms"] is not None else None

    series = _wait(measured)
    inclusion = series[-1]["inclusion"]
    assert inclusion["p50Ms"] <= inclusion["p95Ms"] <= inclusion["p99Ms"]


def _merge_processes() -> list[int]:
    """This test process's children that are multiprocessing workers (the rollups' merge process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and b"multiprocessing" in command:
            found.append(int(entry.name))
    return found


def test_a_large_batch_is_merged_in_the_merge_process_with_the_same_figures(
    env: Any, auth: Any, seed: Any
) -> None:
    """120 terminal rows at once (at least the offload threshold, 100): read and merged in a child process,
    then written by the host; the percentiles match the raw figures within the sketch's error."""
    owner = auth.account()
    now = int(time.time() * 1000)
    added = list(range(5, 125))  # one addedMs per row
    for index, value in enumerate(added):
        terminal = now - 2_000 + index
        received = terminal - 900
        seed.row(
            owner.address,
            terminal_at_ms=terminal,
            received_at_ms=received,
            broadcast_at_ms=received + value,
            finalized_at_ms=terminal + 50,
        )
    headers = auth.bearer(owner)

    def measured() -> Any:
        answer = env.client.get(
            "/v1/usage/latency", params={"account": owner.address, "window": "1h"}, headers=headers
        )
        assert answer.status_code == 200, answer.text
        groups = answer.json()["groups"]
        return groups[0] if groups and groups[0]["count"] == len(added) else None

    group = _wait(measured, timeout=60)
    assert _merge_processes(), "the batch was not merged in a child process"
    for q in (50, 95, 99):
        rank = max(1, int(q / 100 * len(added) + 0.5))
        exact = sorted(added)[rank - 1]
        assert abs(group["added"][f"p{q}Ms"] - exact) <= RELATIVE_ERROR * exact + 1, (q, group["added"])


def test_a_merge_raced_by_another_writer_writes_nothing_and_nothing_is_lost(
    make_env: Any, auth_for: Any, seed_for: Any
) -> None:
    """Two leaders (a failover) merging into the same rollups: the one whose read is older than the other's
    write stores nothing (it would overwrite the other's histograms with its own), and the next merge
    counts its rows; every row is counted once."""
    env = make_env(latency_rollup_enabled=False)  # the merges below are the only writers
    auth, seed = auth_for(env), seed_for(env)
    owner = auth.account()
    rollups = env.client.app.state.host.rollups
    now = int(time.time() * 1000)

    def rows(count: int, first_terminal: int) -> None:
        for index in range(count):
            terminal = first_terminal + index
            seed.row(owner.address, terminal_at_ms=terminal, finalized_at_ms=terminal + 50)

    async def read_and_merge(limit: int) -> Any:
        from gasless.db.engine import run_read_off_loop
        from gasless.usage.rollups import prepare, read_batch

        read = await run_read_off_loop(rollups.engine, lambda conn: read_batch(conn, limit))
        return prepare(read, 1_000, now)

    rows(3, now - 1_000)
    stale = env.client.portal.call(read_and_merge, 3)  # leader A reads and merges its three rows ...
    rows(2, now - 2_000)  # ... two more rows land in the same buckets, earlier ...
    counted_by_b = env.client.portal.call(partial(rollups.roll_up, 1_000, now, limit=2))
    assert counted_by_b == 2  # ... and leader B counts them
    assert env.client.portal.call(rollups.write, stale) == 0  # A's write would drop B's two: refused
    assert env.client.portal.call(rollups.roll_up, 1_000, now) == 3  # A's rows, merged again

    answer = env.client.get(
        "/v1/usage/latency", params={"account": owner.address, "window": "1h"}, headers=auth.bearer(owner)
    )
    assert answer.status_code == 200, answer.text
    assert [group["count"] for group in answer.json()["groups"]] == [5]
    assert env.client.portal.call(rollups.roll_up, 1_000, now) == 0


def test_the_samples_are_read_by_the_accounts_index_on_a_migrated_database(env: Any, auth: Any) -> None:
    """The statements GET /v1/usage/latency runs, explained on the host's own (migrated) SQLite database:
    the account's rows are found by `(account, terminal_at_ms)`. The planner once preferred
    `(rolled_up, terminal_at_ms)`, which walks every account's rows of the window: 17x the CPU at 10 M rows
    (docs/performance.md, target 5)."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine, make_url

    owner = auth.account()
    env.wait_state(_relay(env, owner), ("FINALIZED",))
    headers = auth.bearer(owner)
    params = {"account": owner.address, "window": "1h"}

    def rolled_up() -> bool:
        answer = env.client.get("/v1/usage/latency", params=params, headers=headers)
        assert answer.status_code == 200, answer.text
        return bool(answer.json()["groups"])

    _wait(rolled_up)
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "FROM usage_ledger" in statement and statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        assert env.client.get("/v1/usage/latency", params=params, headers=headers).status_code == 200
    finally:
        event.remove(Engine, "before_cursor_execute", capture)
    assert statements, "GET /v1/usage/latency read no usage rows"
    database = make_url(env.settings.database_url).database
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        for statement, parameters in statements:
            plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + statement, parameters)]
            assert any("(account=? AND terminal_at_ms>?)" in step for step in plan), (statement, plan)
            assert not any("rolled_up" in step for step in plan), (statement, plan)
