"""GET /v1/status after real relays on localnet: every member with measured values, null where the interface contract
says (a day without data, 30 days not yet reached); float labels and components follow the relayers and the
contract; open incidents show; the feed publisher writes the three files atomically."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

DAY_MS = 86_400_000


def _wait(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return value


def _relay(env: Any, sender: Any) -> str:
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    sender.nonce += 1
    return str(answer.json()["txHash"])


def test_status_members_are_measured_after_real_relays(env: Any, operator: Any) -> None:
    sender = env.new_sender(1)
    for tx_hash in [_relay(env, sender) for _ in range(2)]:
        env.wait_state(tx_hash, ("FINALIZED",))
    stale = env.build(sender, env.assign(sender), nonce=0)  # a correct 4xx: counts as available
    assert env.relay(stale, env.assign(sender)["lease"]).status_code == 409

    def measured() -> Any:
        answer = env.client.get("/v1/status")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        # relays24h counts the usage rows; the latency figures come from the rollups, merged a moment later.
        rolled = body["latency"][1]["samples"] == 2 and body["latency30d"][1]["samples"] == 2
        return body if body["relays24h"] == 2 and rolled else None

    status = _wait(measured, "the relays measured")
    assert status["overall"] == "operational"
    ids = [c["id"] for c in status["components"]]
    assert ids == [
        "api",
        "relaying-shard-0",
        "relaying-shard-1",
        "relaying-shard-2",
        "gateways",
        "contract",
        "exchange-venue",
    ]
    assert all(c["status"] == "operational" for c in status["components"]), status["components"]
    assert status["floatPerShard"] == {"0": "ok", "1": "ok", "2": "ok"}
    assert "balance" not in json.dumps(status).lower()
    one = status["latency"][1]
    assert one["samples"] == 2 and one["addedP50Ms"] is not None and one["inclusionP99Ms"] is not None
    assert status["latency"][0]["samples"] == 0 and status["latency"][0]["addedP50Ms"] is None
    month = status["latency30d"][1]
    assert month["samples"] == 2 and month["windowMs"] == 30 * DAY_MS and month["measuredFromMs"] is not None
    days = status["availabilityDaily90"]
    assert len(days) == 90 and days[-1]["dayStartMs"] == int(time.time() * 1000) // DAY_MS * DAY_MS
    assert days[-1]["availabilityPct"] == 100.0 and days[0]["availabilityPct"] is None
    assert status["availability30d"] is None  # fewer than 30 days of data
    assert status["openIncidents"] == []


def test_components_follow_relayers_contract_and_incidents(env: Any, operator: Any) -> None:
    operator.set_relayer_state(env, "retired", *operator.relayers_in(env, 2))
    env.owner("setPaused", [True])
    try:

        def degraded() -> Any:
            body = env.client.get("/v1/status").json()
            by_id = {c["id"]: c for c in body["components"]}
            return body if by_id["contract"]["status"] == "degraded" else None

        status = _wait(degraded, "the pause shown")
        by_id = {c["id"]: c for c in status["components"]}
        assert status["floatPerShard"]["2"] == "critical" and by_id["relaying-shard-2"]["status"] == "outage"
        assert status["overall"] == "outage"
    finally:
        env.owner("setPaused", [False])
    service = env.client.app.state.host.incident_service
    declared = env.client.portal.call(
        partial(service.declare, title="Slow inclusion", body="Investigating", shard=1)
    )
    assert declared.status == "investigating"  # what `gasless admin incident open` does
    status = env.client.get("/v1/status").json()
    assert [i["title"] for i in status["openIncidents"]] == ["Slow inclusion"]
    assert {c["id"]: c for c in status["components"]}["relaying-shard-1"]["status"] == "degraded"
    assert status["availabilityDaily90"][-1]["incidents"] == 1


def test_the_feed_publisher_writes_three_files(make_env: Any, tmp_path: Path) -> None:
    feed = tmp_path / "feeds"
    env = make_env(status_feed_dir=feed, status_feed_ms=200)
    _wait(
        lambda: all((feed / name).exists() for name in ("status.json", "incidents.json", "telemetry.json")),
        "feeds",
    )
    status = json.loads((feed / "status.json").read_text())
    assert set(status) >= {"components", "floatPerShard", "availabilityDaily90", "latency30d"}
    assert json.loads((feed / "incidents.json").read_text()) == {"items": [], "nextCursor": None}
    telemetry = json.loads((feed / "telemetry.json").read_text())
    assert set(telemetry) == {"latency30d", "availabilityDaily90", "generatedAtMs"}
    first = status["generatedAtMs"]
    _wait(lambda: json.loads((feed / "status.json").read_text())["generatedAtMs"] > first, "republished")

    async def temporaries() -> list[Path]:
        # Looked at from the service's loop, where each file is written and renamed in one step: from the
        # test's thread the glob could land between the two and see a write in progress.
        return list(feed.glob(".*.tmp"))

    assert not env.client.portal.call(temporaries)
    assert env.client.get("/v1/status").status_code == 200


def test_the_accounts_relayers_and_outages(env: Any) -> None:
    from gasless.client.native_auth import make_native_auth_token

    sender = env.new_sender(1)
    relayed = [_relay(env, sender) for _ in range(2)]
    for tx_hash in relayed:
        env.wait_state(tx_hash, ("FINALIZED",))
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(
        sender.key, origin=env.settings.network.app_origin, block_hash=block, ttl_seconds=600
    )
    headers = {"Authorization": f"Bearer {token}"}

    def listed() -> Any:
        body = env.client.get(f"/v1/account/{sender.address}/relayers", headers=headers).json()
        return body if body["items"] and body["items"][0]["relays"] == 2 else None

    body = _wait(listed, "the account's relayers")
    (relayer,) = body["items"]
    assert relayer["succeeded"] == 2 and relayer["state"] == "active" and relayer["shard"] == 1
    assert body["toMs"] - body["fromMs"] == 30 * DAY_MS
    assert env.client.get(f"/v1/account/{sender.address}/relayers").status_code == 401
    # A window ending at the epoch starts there too (found by schemathesis: a start before 1970 was a 500).
    early = env.client.get(f"/v1/account/{sender.address}/relayers", params={"to": 0}, headers=headers)
    assert early.status_code == 200, early.text
    assert (early.json()["fromMs"], early.json()["toMs"], early.json()["items"]) == (0, 0, [])

    # An incident over the account's traffic (declared before it, still open) shows with the impact.
    service = env.client.app.state.host.incident_service
    env.client.portal.call(partial(service.declare, title="Gateway trouble", body="Looking", shard=1))
    assert env.client.get(f"/v1/account/{sender.address}/outages", headers=headers).json()["items"] == []
    later = [_relay(env, sender) for _ in range(2)]
    for tx_hash in later:
        env.wait_state(tx_hash, ("FINALIZED",))

    def impacted() -> Any:
        page = env.client.get(f"/v1/account/{sender.address}/outages", headers=headers).json()
        return page if page["items"] and page["items"][0]["impact"]["addedP50Ms"] is not None else None

    page = _wait(impacted, "the outage with its impact")
    (outage,) = page["items"]
    assert outage["incident"]["title"] == "Gateway trouble" and page["nextCursor"] is None
    assert outage["impact"]["relays"] == 2 and outage["impact"]["failures"] == 0
    assert outage["impact"]["addedP50Ms"] <= outage["impact"]["addedP99Ms"]
