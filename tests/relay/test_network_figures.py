"""GET /v1/network's measured members: shards[] (latency from the rollups after real relays, relays24h, the
newest block and the stalled flag), contractPause (getPauseState) and swapVenue; nativeAuth.maxTtlMs."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any


def _wait(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return value


def _pause(env: Any, **flags: Any) -> None:
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/pause",
        data=json.dumps(flags).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).read()


def test_shards_carry_measured_latency_after_real_relays(env: Any) -> None:
    sender = env.new_sender(1)
    for _ in range(2):
        assignment = env.assign(sender)
        answer = env.relay(env.build(sender, assignment), assignment["lease"])
        assert answer.status_code in (200, 202), answer.text
        env.wait_state(answer.json()["txHash"], ("FINALIZED",))
        sender.nonce += 1

    def measured() -> Any:
        document = env.client.get("/v1/network").json()
        shard = document["shards"][1]
        return document if shard["samples"] == 2 else None

    document = _wait(measured, "shard 1 measured")
    assert document["nativeAuth"]["maxTtlMs"] == 86_400_000 and "maxTtlSeconds" not in document["nativeAuth"]
    shards = document["shards"]
    assert [s["shard"] for s in shards] == [0, 1, 2]
    one = shards[1]
    assert one["relays24h"] == 2 and one["windowMs"] == 3_600_000
    assert one["addedP50Ms"] is not None and one["addedP50Ms"] <= one["addedP99Ms"]
    assert one["inclusionP50Ms"] <= one["inclusionP95Ms"] <= one["inclusionP99Ms"]
    quiet = shards[0]  # nothing relayed there: measured values only, so none
    assert quiet["samples"] == 0 and quiet["relays24h"] == 0 and quiet["addedP50Ms"] is None
    assert all(s["lastBlockTsMs"] and s["stalled"] is False for s in shards)
    assert document["contractPause"] == {"paused": False, "depositsPaused": False}
    assert document["swapVenue"] == {"state": "active"}


def test_stalled_shard_and_pauses_show(env: Any) -> None:
    env.faults(chain={"stalledShards": [2]})
    try:
        _wait(lambda: env.client.get("/v1/network").json()["shards"][2]["stalled"], "shard 2 stalled")
    finally:
        env.faults(chain={"stalledShards": []})
    _wait(lambda: not env.client.get("/v1/network").json()["shards"][2]["stalled"], "shard 2 moving again")
    try:
        _pause(env, venue=True, contract={"paused": True})
        _wait(
            lambda: (
                (d := env.client.get("/v1/network").json())["swapVenue"] == {"state": "paused"}
                and d["contractPause"]["paused"]
            ),
            "the pauses shown",
        )
    finally:
        _pause(env, venue=False, contract={"paused": False})
