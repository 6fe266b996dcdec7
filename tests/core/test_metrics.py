"""Per-app Prometheus registry: request histogram labels, stage observation rules, the admin app."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import requests
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gasless.chain.gateway import GatewayClient, GatewayUnavailable
from gasless.core.metrics import HostMetrics, admin_app
from gasless.core.settings import Settings
from gasless.hosting.app import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(registry: Any, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        found += [(s.labels, s.value) for s in family.samples if s.name == name]
    return found


def test_request_histogram_uses_route_templates_and_status_classes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{free_port()}"])
    app = create_app(settings)
    other = create_app(settings)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/no/such/path/1").status_code == 404
        assert client.get("/no/such/path/2").status_code == 404
        hash_ = "ab" * 32
        assert client.get(f"/v1/relay/{hash_}").status_code == 503  # still starting: no network
    registry = app.state.host.metrics.registry
    counts = {
        (labels["method"], labels["route"], labels["status_class"]): value
        for labels, value in samples(registry, "gasless_http_request_duration_seconds_count")
    }
    assert counts == {
        ("GET", "/healthz", "2xx"): 1.0,
        ("GET", "<unmatched>", "4xx"): 2.0,  # never the raw path: label values stay bounded
        ("GET", "/v1/relay/{id}", "5xx"): 1.0,
    }
    # One registry per app: the other app saw nothing.
    assert samples(other.state.host.metrics.registry, "gasless_http_request_duration_seconds_count") == []
    assert samples(registry, "gasless_host_ready") == [({}, 0.0)]


def row(state: str, **times: int | None) -> Any:
    base = {
        "received_at_ms": 1_000,
        "cosigned_at_ms": 1_050,
        "broadcast_at_ms": None,
        "executed_block_ts_ms": None,
        "finalized_at_ms": None,
    }
    return SimpleNamespace(state=state, **{**base, **times})


def test_stage_figures_are_observed_once_per_closing_transition() -> None:
    metrics = HostMetrics()
    metrics.observe_intent(row("BROADCAST", broadcast_at_ms=1_080))
    metrics.observe_intent(row("EXECUTED", broadcast_at_ms=1_080, executed_block_ts_ms=1_700))
    metrics.observe_intent(
        row("FINALIZED", broadcast_at_ms=1_080, executed_block_ts_ms=1_700, finalized_at_ms=3_000)
    )
    # An intent executed before any acknowledgement: its accept-to-cosign figure is still taken, once.
    metrics.observe_intent(row("EXECUTED", executed_block_ts_ms=1_800))
    sums = {
        labels["stage"]: value
        for labels, value in samples(metrics.registry, "gasless_relay_stage_seconds_sum")
    }
    counts = {
        labels["stage"]: value
        for labels, value in samples(metrics.registry, "gasless_relay_stage_seconds_count")
    }
    assert counts == {
        "acceptToCosign": 2,
        "cosignToBroadcast": 1,
        "added": 1,
        "inclusion": 2,
        "finality": 1,
        "total": 1,
    }
    assert sums["acceptToCosign"] == 0.1 and sums["added"] == 0.08 and sums["cosignToBroadcast"] == 0.03
    assert sums["inclusion"] == 1.5 and sums["finality"] == 1.3 and sums["total"] == 2.0
    states = {
        labels["state"]: v for labels, v in samples(metrics.registry, "gasless_intent_transitions_total")
    }
    assert states == {"BROADCAST": 1, "EXECUTED": 2, "FINALIZED": 1}


def test_admin_app_serves_metrics_and_health_only() -> None:
    metrics = HostMetrics()
    metrics.gateway_errors.labels("http://gw:1", "timeout").inc()
    with TestClient(admin_app(metrics.registry)) as client:
        scraped = client.get("/metrics")
        assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
        assert 'gasless_gateway_errors_total{gateway="http://gw:1",kind="timeout"} 1.0' in scraped.text
        assert client.get("/healthz").text == "ok\n"
        assert client.get("/v1/relay").status_code == 404


async def test_gateway_failures_are_counted_by_kind_but_node_answers_are_not(localnet: Any) -> None:
    metrics = HostMetrics()
    dead = f"http://127.0.0.1:{free_port()}"
    async with aiohttp.ClientSession() as session:
        client = GatewayClient(session, [localnet.url, dead], timeout_ms=2_000)
        client.on_failure = metrics.gateway_failed
        # "transaction not found" is a 500 from the node: an answer, not a failure.
        assert await client.transaction("ab" * 32) is None
        assert samples(metrics.registry, "gasless_gateway_errors_total") == []
        requests.post(f"{localnet.url}/localnet/faults", json={"gateway": {"errorRate": 1.0}}, timeout=5)
        try:
            with pytest.raises(GatewayUnavailable):
                await client.network_config()
        finally:
            requests.delete(f"{localnet.url}/localnet/faults", timeout=5)
    errors = {
        (labels["gateway"], labels["kind"]): value
        for labels, value in samples(metrics.registry, "gasless_gateway_errors_total")
    }
    assert errors == {(localnet.url, "http_5xx"): 1.0, (dead, "connection"): 1.0}
