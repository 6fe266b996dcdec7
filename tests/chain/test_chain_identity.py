"""A service database belongs to one chain: a host refuses to serve it against another one (a reset devnet,
a fresh localnet, a localnet restored from an older saved chain). In process (readiness, relay routes, no
workers) and as `gasless serve` (exit status, one line); on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
from fastapi.testclient import TestClient
from relay_kit import MASTER_SECRET, relay_settings, wait_ready

from gasless.chain.addresses import METACHAIN
from gasless.chain.identity import ChainIdentity, ChainIdentityRepository
from gasless.core.settings import Settings
from gasless.db import create_engine
from gasless.hosting.app import create_app

Start = Callable[..., Any]  # the run_localnet fixture (tests/conftest.py)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_time(net: Any) -> int:
    config = requests.get(f"{net.url}/network/config", timeout=5).json()["data"]["config"]
    return int(config["erd_start_time"])


def meta_nonce(net: Any, final: bool = True) -> int:
    status = requests.get(f"{net.url}/network/status/{METACHAIN}", timeout=5).json()["data"]["status"]
    return int(status["erd_highest_final_nonce" if final else "erd_nonce"])


def stored_identity(database_url: str) -> ChainIdentity | None:
    async def load() -> ChainIdentity | None:
        engine = create_engine(database_url)
        try:
            return await ChainIdentityRepository(engine).load()
        finally:
            await engine.dispose()

    return asyncio.run(load())


def settings_for(tmp_path: Path, net: Any, database_url: str) -> Settings:
    return relay_settings(tmp_path, net, database_url=database_url)


def serve_once(tmp_path: Path, net: Any, database_url: str) -> None:
    """A host runs on the database against `net` until ready, then stops (recording what it saw)."""
    with TestClient(create_app(settings_for(tmp_path, net, database_url))) as client:
        wait_ready(client)


def refusal(client: TestClient) -> dict[str, Any]:
    """/readyz once the host has refused its chain."""

    def refused() -> dict[str, Any] | None:
        body = client.get("/readyz").json()
        return body if body["checks"]["restore"].startswith("chain mismatch:") else None

    return wait_until(refused, "the host to refuse the chain")  # type: ignore[no-any-return]


SOMEONE = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"  # a well-formed address


def assert_refuses_to_serve(client: TestClient) -> dict[str, Any]:
    """Readiness 503 with the reason, the relay routes 503 UPSTREAM_UNAVAILABLE, no worker running."""
    body = refusal(client)
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
    assert body["singletons"] == {}
    reason = body["checks"]["restore"].removeprefix("chain mismatch: ")
    for response in (
        client.post("/v1/relay", json={"nonce": 0}),
        client.post("/v1/relay/assign", json={"sender": SOMEONE}),
        client.get(f"/v1/relay/{SOMEONE}:0"),
    ):
        assert response.status_code == 503, response.text
        problem = response.json()
        assert problem["code"] == "UPSTREAM_UNAVAILABLE" and reason in problem["detail"]
    host = client.app.state.host  # type: ignore[attr-defined]
    # Nothing that acts on the database's state was started: no tracker (nor re-broadcasts), no singletons
    # (recovery, mirror, settlement, retention), no relay service.
    assert host.tracker is None and host.broadcaster is None and host.singletons is None
    assert host.mirror_follower is None and host.settlement_worker is None and host.relay_service is None
    assert host.signer is None and host.restored is False
    return body


def test_a_database_of_another_chain_is_refused(
    tmp_path: Path, database_url: str, run_localnet: Start
) -> None:
    first = run_localnet(tmp_path / "first")
    serve_once(tmp_path, first, database_url)
    recorded = stored_identity(database_url)
    first_start = start_time(first)
    assert recorded is not None
    assert (recorded.chain_id, recorded.start_time_ms) == ("localnet", first_start * 1000)
    assert 0 <= recorded.final_nonce <= meta_nonce(first)
    hyperblock = requests.get(f"{first.url}/hyperblock/by-nonce/{recorded.final_nonce}", timeout=5).json()
    assert recorded.final_hash == hyperblock["data"]["hyperblock"]["hash"]
    # A restart against the same chain is served (and the recorded height only moves forward).
    serve_once(tmp_path, first, database_url)
    again = stored_identity(database_url)
    assert again is not None and again.final_nonce >= recorded.final_nonce
    first.close()

    # Another chain (a fresh localnet, as a devnet after a reset): another genesis time.
    wait_until(lambda: int(time.time()) > first_start, "the next second (a new genesis time)")
    second = run_localnet(tmp_path / "second")
    second_start = start_time(second)
    with TestClient(create_app(settings_for(tmp_path, second, database_url))) as client:
        reason = assert_refuses_to_serve(client)["checks"]["restore"]
    assert f"erd_start_time {first_start}" in reason and f"erd_start_time {second_start}" in reason
    assert stored_identity(database_url) == again  # the refused chain wrote nothing

    # `gasless serve` says so in one line and exits non-zero.
    env = {
        **os.environ,
        "COLUMNS": "100",
        "GASLESS_PROFILE": "localnet",
        "GASLESS_MASTER_SECRET": MASTER_SECRET,
        "GASLESS_GATEWAY_URLS": second.url,
        "GASLESS_DATABASE_URL": database_url,
        "GASLESS_DATA_DIR": str(tmp_path),
        "GASLESS_API_PORT": str(free_port()),
        "GASLESS_METRICS_PORT": "0",
        "GASLESS_CONTRACT_ADDRESS": second.net.info["contract"],
        "GASLESS_RELAYER_KEY_FILES": ",".join(r["pem"] for r in second.net.info["relayers"]),
    }
    served = subprocess.run(
        [sys.executable, "-m", "gasless.cli", "serve"], capture_output=True, text=True, timeout=120, env=env
    )
    assert served.returncode == 2, served.stdout + served.stderr
    lines = [line for line in served.stderr.splitlines() if line.startswith("cannot start:")]
    assert len(lines) == 1, served.stdout + served.stderr
    assert f"erd_start_time {first_start}" in lines[0] and f"erd_start_time {second_start}" in lines[0]
    assert "GASLESS_DATABASE_URL" in lines[0]


def test_a_chain_restored_from_an_older_state_is_refused(
    tmp_path: Path, database_url: str, run_localnet: Start
) -> None:
    data_dir = tmp_path / "localnet"
    run_localnet(data_dir).close()
    older = tmp_path / "older-chain"
    shutil.copytree(data_dir / "chain", older)  # the chain as saved at that stop
    net = run_localnet(data_dir)  # resumes it, and goes on
    saved_nonce = meta_nonce(net, final=False)
    with TestClient(create_app(settings_for(tmp_path, net, database_url))) as client:
        wait_ready(client)
        network = client.app.state.host.network  # type: ignore[attr-defined]
        # The host has seen the chain go on (it records what it saw, at the latest when it stops).
        wait_until(lambda: network.meta_highest_final_nonce > saved_nonce + 5, "the chain to go on")
    net.close()
    seen = stored_identity(database_url)
    assert seen is not None and seen.final_nonce > saved_nonce + 5

    # The older saved chain is put back: same genesis, but the blocks the database saw are gone.
    shutil.rmtree(data_dir / "chain")
    shutil.copytree(older, data_dir / "chain")
    restored = run_localnet(data_dir)
    assert restored.net.resumed is True and start_time(restored) * 1000 == seen.start_time_ms
    with TestClient(create_app(settings_for(tmp_path, restored, database_url))) as client:
        reason = assert_refuses_to_serve(client)["checks"]["restore"]
    assert f"final hyperblock {seen.final_nonce}" in reason
    assert stored_identity(database_url) == seen
