"""The API host's meta routes and start-up path, in process and as a real `gasless up`."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from fastapi.testclient import TestClient
from process_kit import answers, free_ports, listening, spawn

from gasless.core.settings import Settings
from gasless.hosting.app import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready_within(client: TestClient, timeout: float = 15.0) -> requests.Response:
    deadline = time.monotonic() + timeout
    while True:
        ready = client.get("/readyz")
        if ready.status_code == 200 or time.monotonic() > deadline:
            return ready
        time.sleep(0.05)


def test_health_and_readiness_against_localnet(localnet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path, gateway_urls=[localnet.url])
    with TestClient(create_app(settings)) as client:
        health = client.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok" and health.json()["chainId"] == "localnet"
        ready = ready_within(client)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {
            "restore": "ok",
            "database": "ok",
            "gateway": "ok",
            "clock": "ok",
            "signer": "ok",
        }


def test_readiness_is_503_when_no_gateway_answers(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{free_port()}"])
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["gateway"] == "unreachable"
        assert ready.json()["checks"]["restore"] != "ok"  # the relay core cannot start without a network
        assert ready.json()["status"] == "starting"
        assert client.get("/healthz").status_code == 200


def test_postgres_database_is_migrated_at_start(postgres_url: str, localnet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path, gateway_urls=[localnet.url], database_url=postgres_url)
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["checks"]["database"] == "ok"


def test_gasless_up_starts_the_embedded_default(tmp_path: Path) -> None:
    api_port, localnet_port, metrics_port, status_port = ports = free_ports(4)
    args = [
        "up",
        "--port", str(api_port),
        "--localnet-port", str(localnet_port),
        "--metrics-port", str(metrics_port),
        "--status-port", str(status_port),
        "--data-dir", str(tmp_path / "var"),
        "--round-ms", "100",
    ]  # fmt: skip
    # spawn reaps the process whatever happens (killed if it outlives the test).
    # Output to a file, not a terminal: nothing may be cut to 80 columns.
    with spawn(*args, log=tmp_path / "up.log", sigint_ignored=False) as up:
        up.wait_for(lambda: answers(f"http://127.0.0.1:{api_port}/readyz"), "ready", timeout=60)
        info = requests.get(f"http://127.0.0.1:{localnet_port}/localnet/info", timeout=2).json()["data"]
        assert info["chainId"] == "localnet"
        assert all(Path(r["pem"]).exists() for r in info["relayers"])
        assert len({r["shard"] for r in info["relayers"]}) == 3
        assert answers(f"http://127.0.0.1:{metrics_port}/metrics")
        # The status site runs as its own process, serving the feeds the API publishes.
        up.wait_for(
            lambda: answers(f"http://127.0.0.1:{status_port}/feed/status.json"), "the status feed", timeout=60
        )
        assert up.stopped_within(signal.SIGINT, 20) == 130, up.output()  # 128 + SIGINT, documented
    output = up.output()
    assert [port for port in ports if listening(port)] == [], output
    assert f"http://127.0.0.1:{api_port}" in output and f"http://127.0.0.1:{status_port}" in output
    assert len(info["contract"]) == 62 and info["contract"] in output  # the whole bech32 address
    assert all(r["pem"] in output for r in info["relayers"])  # whole paths, each on one line
    secret = tmp_path / "var" / "master-secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_text().strip()) >= 32


@pytest.mark.parametrize(
    "command", [["--help"], ["up", "--help"], ["localnet", "--help"], ["serve", "--help"]]
)
def test_cli_help_everywhere(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gasless.cli", *command], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "Usage" in result.stdout


def test_readiness_checks_redis_when_configured(redis_url: str, localnet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path, gateway_urls=[localnet.url], redis_url=redis_url)
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["checks"]["redis"] == "ok"
    unreachable = Settings(
        data_dir=tmp_path, gateway_urls=[localnet.url], redis_url=f"redis://127.0.0.1:{free_port()}/0"
    )
    with TestClient(create_app(unreachable)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"] == "unreachable"


def test_unknown_routes_and_methods_are_problem_documents(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{free_port()}"])
    with TestClient(create_app(settings)) as client:
        for response in (client.get("/v1/nothing-here"), client.post("/healthz")):
            assert response.status_code == 404
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            assert body["code"] == "NOT_FOUND"
            assert body["type"] == "https://docs.gasless.example/errors/not-found"
            assert body["instance"] == response.headers["Relay-Request-Id"]
            assert body["instance"].startswith("req_")
