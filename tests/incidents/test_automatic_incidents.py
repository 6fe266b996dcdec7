"""Automatic incidents: the platform admission budget binding on real relays raises the `platform_admission`
incident (seen at GET /v1/incidents) and a quiet period resolves it; two hosts raising or resolving at the
same moment make one incident and one resolution (SQLite and PostgreSQL); changes reach account streams."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from manual_clock import ManualClock
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gasless.core.metrics import HostMetrics
from gasless.db import create_engine, upgrade
from gasless.incidents.jobs import IncidentWatch
from gasless.incidents.repository import IncidentRepository
from gasless.incidents.schemas import Incident
from gasless.incidents.service import PLATFORM_ADMISSION, IncidentService
from gasless.streams.hub import StreamHub

M = 1_000_000


def _relay(env: Any, sender: Any, **build: Any) -> Any:
    assignment = env.assign(sender)
    response = env.relay(env.build(sender, assignment, **build), assignment["lease"])
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def _wait(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not reached in {timeout} s")


def _metric(host: Any, name: str, labels: dict[str, str] | None = None) -> float:
    return host.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_platform_budget_binding_raises_an_incident_then_quiet_resolves_it(
    make_env: Any, problem: Any
) -> None:
    # 15 RU of burst left after one large relay, never refilled in the test: every next relay binds.
    env = make_env(
        billing_platform_ru_per_second=0.001, billing_platform_ru_burst=25, incident_quiet_ms=1_500
    )
    host = env.client.app.state.host
    sender = env.new_sender()
    assert env.client.get("/v1/incidents").json()["items"] == []
    assert _relay(env, sender, gas_limit=100 * M).status_code in (200, 202)  # 15 RU
    for _ in range(2):
        body = problem(_relay(env, sender, gas_limit=100 * M), "RATE_LIMITED")
        assert body["details"]["scope"] == "platform"
    refused_at = time.time() * 1000

    page = _wait(
        lambda: env.client.get("/v1/incidents", params={"status": "investigating"}).json()["items"],
        "the platform_admission incident",
    )
    assert len(page) == 1
    incident = page[0]
    assert incident["kind"] == "platform_admission" and incident["source"] == "automatic"
    assert incident["status"] == "investigating" and incident["impact"] == "minor"
    assert incident["shard"] is None and incident["resolvedAtMs"] is None
    assert incident["title"] == PLATFORM_ADMISSION.title
    [first] = incident["updates"]
    assert first["seq"] == 1 and first["status"] == "investigating"
    assert "admission budget binds" in first["body"] and "429 RATE_LIMITED" in first["body"]
    counted = re.search(r"(\d+) relay requests? answered", first["body"])
    assert counted is not None and 1 <= int(counted.group(1)) <= 2
    assert env.client.get(f"/v1/incidents/{incident['id']}").json() == incident
    assert _metric(host, "gasless_platform_admission_refusals_total") == 2
    labels = {"kind": "platform_admission", "change": "raised"}
    _wait(lambda: _metric(host, "gasless_automatic_incidents_total", labels) == 1, "the raised count")

    # No refusal for 1 500 ms: resolved, with an update counting every refusal while it was open.
    resolved = _wait(
        lambda: (r := env.client.get(f"/v1/incidents/{incident['id']}").json())["status"] == "resolved" and r,
        "the quiet-period resolution",
    )
    assert (
        resolved["resolvedAtMs"] - refused_at >= 1_000
    )  # not before the quiet period (less the answer time)
    assert [u["seq"] for u in resolved["updates"]] == [1, 2]
    assert resolved["updates"][0] == first  # appended, never replaced
    assert resolved["updates"][1]["status"] == "resolved"
    assert "2 relay requests were refused" in resolved["updates"][1]["body"]
    labels = {"kind": "platform_admission", "change": "resolved"}
    _wait(lambda: _metric(host, "gasless_automatic_incidents_total", labels) == 1, "the resolved count")

    # Resolved is final: the budget binding again is a new incident.
    problem(_relay(env, sender, gas_limit=100 * M), "RATE_LIMITED")
    again = _wait(
        lambda: env.client.get("/v1/incidents", params={"status": "investigating"}).json()["items"],
        "a second incident",
    )
    assert len(again) == 1 and again[0]["id"] != incident["id"]
    assert [i["id"] for i in env.client.get("/v1/incidents").json()["items"]] == [
        again[0]["id"],
        incident["id"],
    ]


@pytest.fixture
async def two_hosts(database_url: str) -> AsyncIterator[tuple[IncidentService, IncidentService]]:
    """The incident services of two hosts, each with its own engine, on one migrated database, sharing
    one `ManualClock` (`service.clock`): a quiet period passes when the test says so."""
    await upgrade(database_url)
    engines = [create_engine(database_url), create_engine(database_url)]
    clock = ManualClock(time.time())
    try:
        yield (
            IncidentService(IncidentRepository(engines[0]), clock=clock),
            IncidentService(IncidentRepository(engines[1]), clock=clock),
        )
    finally:
        for engine in engines:
            await engine.dispose()


async def test_two_hosts_raising_at_once_open_one_incident(two_hosts: Any) -> None:
    a, b = two_hosts
    now = a.now_ms()
    results = await asyncio.gather(
        *(
            host.raise_automatic(PLATFORM_ADMISSION, occurrences=n, seen_at_ms=now)
            for n in range(1, 11)
            for host in (a, b)
        )
    )
    assert sum(r.created for r in results) == 1
    assert len({r.incident_id for r in results}) == 1
    row = await a.repo.get(results[0].incident_id)
    assert row.status == "investigating" and row.open_key == "platform_admission"
    assert row.occurrences == 2 * sum(range(1, 11)) and row.last_seen_at_ms == now
    assert len(row.updates) == 1
    page = await a.repo.page(
        shard=None, status=None, from_ms=None, to_ms=None, now_ms=now, after=None, limit=10
    )
    assert [r.id for r in page] == [row.id]

    # Not quiet yet: nothing to resolve. Quiet: both hosts try many times at once, exactly one wins.
    assert await a.resolve_if_quiet(PLATFORM_ADMISSION, quiet_ms=60_000) is None
    a.clock.advance(300)
    won = await asyncio.gather(
        *(host.resolve_if_quiet(PLATFORM_ADMISSION, quiet_ms=200) for _ in range(5) for host in (a, b))
    )
    assert sum(w is not None for w in won) == 1
    resolved = await b.repo.get(row.id)
    assert resolved.status == "resolved" and resolved.open_key is None
    assert resolved.resolved_at_ms == resolved.updates[-1].at_ms >= resolved.created_at_ms
    assert [(u.seq, u.status) for u in resolved.updates] == [(1, "investigating"), (2, "resolved")]
    assert f"{row.occurrences} relay requests were refused" in resolved.updates[1].body

    # The next occurrence opens a new incident; the resolved one is untouched.
    raised = await b.raise_automatic(PLATFORM_ADMISSION, occurrences=1, seen_at_ms=now)
    assert raised.created and raised.incident_id != row.id
    assert await a.repo.get(row.id) == resolved


async def test_a_touch_racing_the_resolution_is_never_lost(two_hosts: Any) -> None:
    """A host counting refusals while another resolves: either the touch lands first (and the incident is
    not quiet any more) or the resolution does (and the touch opens a new incident)."""
    a, b = two_hosts
    old = a.now_ms() - 10_000
    first = await a.raise_automatic(PLATFORM_ADMISSION, occurrences=1, seen_at_ms=old)
    now = a.now_ms()
    resolved, touched = await asyncio.gather(
        a.resolve_if_quiet(PLATFORM_ADMISSION, quiet_ms=5_000),
        b.raise_automatic(PLATFORM_ADMISSION, occurrences=3, seen_at_ms=now),
    )
    open_row = await a.repo.open_automatic("platform_admission")
    # The latest refusal is always in an open incident.
    assert open_row is not None and open_row.status == "investigating" and open_row.last_seen_at_ms == now
    if resolved is None:
        assert not touched.created and open_row.id == first.incident_id and open_row.occurrences == 4
    else:
        assert touched.created and open_row.id != first.incident_id and open_row.occurrences == 3


async def test_updates_are_append_only_in_the_database(two_hosts: Any) -> None:
    a, _ = two_hosts
    incident = await a.declare(title="Gateway errors", body="Looking into it.")
    await a.post_update(incident.id, status="identified", body="One gateway fails.")
    async with a.repo.engine.connect() as conn:
        for statement in (
            "UPDATE incident_updates SET body = 'rewritten' WHERE incident_id = :id",
            "DELETE FROM incident_updates WHERE incident_id = :id",
        ):
            with pytest.raises(DBAPIError, match="append-only"):
                async with conn.begin():
                    await conn.execute(text(statement), {"id": incident.id})
    after = await a.get(incident.id)
    assert [(u.seq, u.body) for u in after.updates] == [(1, "Looking into it."), (2, "One gateway fails.")]


async def test_watchers_of_two_hosts_raise_once_and_resolve_once(two_hosts: Any) -> None:
    published: dict[str, list[Incident]] = {"a": [], "b": []}
    watches = []
    for name, service in zip(("a", "b"), two_hosts, strict=True):
        watch = IncidentWatch(
            service,
            quiet_ms=400,
            poll_ms=60_000,  # ticks are driven by the test
            metrics=HostMetrics(),
            publish=published[name].append,
        )
        await watch.start()
        watches.append(watch)
    a, b = watches
    try:
        for _ in range(3):
            a.note()  # the limiter's hook: no I/O
        b.note()
        b.note()
        await asyncio.gather(a.tick(), b.tick())
        open_row = await a.service.repo.open_automatic("platform_admission")
        assert open_row is not None and open_row.occurrences == 5
        raised = [
            w.metrics.registry.get_sample_value(
                "gasless_automatic_incidents_total", {"kind": "platform_admission", "change": "raised"}
            )
            or 0
            for w in watches
        ]
        assert sum(raised) == 1
        assert [
            w.metrics.registry.get_sample_value("gasless_platform_admission_refusals_total") for w in watches
        ] == [
            3,
            2,
        ]
        b.note()
        await asyncio.gather(a.tick(), b.tick())
        assert (await a.service.repo.open_automatic("platform_admission")).occurrences == 6  # type: ignore[union-attr]

        a.service.clock.advance(500)  # past quiet_ms since the last refusal either host saw
        for _ in range(2):  # a host's ticks never overlap (one task per host)
            await asyncio.gather(a.tick(), b.tick())
        row = await a.service.repo.get(open_row.id)
        assert row is not None and row.status == "resolved" and len(row.updates) == 2
        resolved = [
            w.metrics.registry.get_sample_value(
                "gasless_automatic_incidents_total", {"kind": "platform_admission", "change": "resolved"}
            )
            or 0
            for w in watches
        ]
        assert sum(resolved) == 1
        await asyncio.gather(a.tick(), b.tick())
        # Each host published each change once (the raise, the resolution), whoever made it.
        for name in ("a", "b"):
            assert [(i.id, i.status) for i in published[name]] == [
                (open_row.id, "investigating"),
                (open_row.id, "resolved"),
            ], name
    finally:
        for watch in watches:
            await watch.stop()


def test_incident_changes_reach_account_streams(served: Any, sse: Any, admin_for: Any) -> None:
    server, env, auth = served()
    account = auth.account()
    admin = admin_for(env.settings.effective_database_url)
    stream = sse(server.client, {"account": account.address, "topics": "incidents"}, auth.bearer(account))
    try:
        assert set(stream.frame()) == {"id"}
        opened = admin.open("Relays delayed in shard 0", "Looking into it.", "--shard", "0")
        frame = stream.frame()
        assert frame["event"] == "incidents"
        doc = frame["data"]
        assert (
            doc["topic"] == "incidents" and doc["account"] == account.address and doc["key"] == opened["id"]
        )
        assert doc["data"] == opened
        updated = admin.update(opened["id"], "resolved", "Back to normal.")
        frame = stream.frame()
        assert frame["event"] == "incidents" and frame["data"]["data"] == updated
    finally:
        stream.close()


async def test_incident_events_reach_streams_open_or_recently_closed() -> None:
    """`StreamHub.deliver_everywhere`: accounts with a stream, or whose last stream ended within the replay
    window (a resume must not miss it); never accounts that never had a stream on this host, whose own
    changes are not even numbered (no client holds an id to resume them from)."""
    now = [1_000_000]
    hub = StreamHub(coalesce_ms=100, replay_ms=10_000, clock=lambda: now[0])
    open_stream, _ = hub.subscribe("erd1open", frozenset({"incidents"}), None)
    closed, _ = hub.subscribe("erd1closed", frozenset({"incidents"}), None)
    hub.unsubscribe(closed)
    long_gone, _ = hub.subscribe("erd1gone", frozenset({"incidents"}), None)
    now[0] -= 20_000
    hub.unsubscribe(long_gone)
    now[0] += 20_000
    hub.publish("erd1relayer", "intents", "x:1", {"state": "COSIGNED"})  # no stream ever

    hub.deliver_everywhere("incidents", "inc_1", {"status": "investigating"})
    event = open_stream.queue.get_nowait()
    assert event is not None and event.topic == "incidents" and '"key":"inc_1"' in event.doc
    assert [e.topic for e in hub.subscribe("erd1closed", frozenset({"incidents"}), 0)[1] or []] == [
        "incidents"
    ]
    assert hub.head("erd1gone") == 0 and hub.head("erd1relayer") == 0
    assert hub.wants("erd1open") and hub.wants("erd1closed") and not hub.wants("erd1relayer")
    hub.close()
