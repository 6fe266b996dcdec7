"""`/readyz` answers 503 while the host restores its state and while its clock is off the chain's; in the
second case no lease is minted either. Both driven through localnet's fault injection, over HTTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests
from fastapi.testclient import TestClient
from relay_kit import key_in_shard, relay_settings  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of
from gasless.hosting.app import create_app


def wait_readyz(client: TestClient, status: int, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get("/readyz")
        if answer.status_code == status:
            return dict(answer.json())
        if time.monotonic() > deadline:
            raise AssertionError(f"/readyz never answered {status}: {answer.status_code} {answer.text}")
        time.sleep(0.05)


def set_faults(localnet: Any, body: dict[str, Any]) -> None:
    requests.post(f"{localnet.url}/localnet/faults", json=body, timeout=5).raise_for_status()


def test_readyz_is_503_while_the_host_restores(tmp_path: Path, unpaused_localnet: Any, problem: Any) -> None:
    localnet = unpaused_localnet
    # Shard statuses time out: the relay core cannot finish starting, though the gateway answers.
    set_faults(localnet, {"gateway": {"latencyMs": {"/network/status": 5_000}}})
    settings = relay_settings(tmp_path, localnet, gateway_timeout_ms=500)
    try:
        with TestClient(create_app(settings)) as client:
            deadline = time.monotonic() + 10
            while True:
                body = client.get("/readyz")
                restore = body.json()["checks"]["restore"]
                if restore.startswith("network:") or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert body.status_code == 503, body.text
            assert body.json()["status"] == "starting"
            assert restore == "network: GatewayUnavailable", body.json()
            assert body.json()["checks"]["gateway"] == "ok"  # not a gateway outage: the restore is pending
            assert body.json()["singletons"] == {}
            assert client.get("/healthz").status_code == 200
            # Routes that need the restored state say so, with a retry hint.
            sender = address_of(key_in_shard(1).generate_public_key().buffer).to_bech32()
            refused = client.post("/v1/relay/assign", json={"sender": sender})
            assert problem(refused, "UPSTREAM_UNAVAILABLE")["details"]["retryAfterMs"] == 1_000
            set_faults(localnet, {"gateway": {"latencyMs": {}}})
            ready = wait_readyz(client, 200)
            assert ready["status"] == "ok" and ready["checks"]["restore"] == "ok"
            assert ready["singletons"] == {
                "retention": "leader",
                "webhook-retention": "leader",
                "intent-recovery": "leader",
                "latency-rollup": "leader",
                "status-feed": "leader",
                "mirror": "leader",
                "notices": "leader",
            }
    finally:
        set_faults(localnet, {"gateway": {"latencyMs": {}}})


def test_clock_offset_makes_the_host_unready_and_stops_leases(env: Any, problem: Any) -> None:
    sender = env.new_sender(1, plan=False)
    assert env.client.get("/readyz").status_code == 200
    # The chain's clock runs a minute ahead of ours.
    env.faults(chain={"clockOffsetMs": 60_000})
    try:
        body = wait_readyz(env.client, 503)
        assert body["status"] == "unavailable"
        assert body["checks"]["clock"].startswith("offset -"), body
        assert all(v == "ok" for k, v in body["checks"].items() if k != "clock"), body
        refused = env.client.post(
            "/v1/relay/assign", json={"sender": sender.address, "proof": env.proof(sender)}
        )
        document = problem(refused, "UPSTREAM_UNAVAILABLE")
        assert "clock" in document["detail"] and document["details"]["retryAfterMs"] == 5_000
    finally:
        env.faults(chain={"clockOffsetMs": 0})
    wait_readyz(env.client, 200)
    assert env.assign(sender)["relayer"]
