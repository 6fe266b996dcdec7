"""A real `gasless serve` process killed with SIGKILL right after the commit point loses nothing.

The send is held up at the gateway so the process answers 202 (co-signed, not yet acknowledged) and is
then killed before any gateway took the transaction. After a restart, orphan recovery re-broadcasts the
stored intent before `/readyz` answers 200, and the intent reaches FINALIZED with its original timestamps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from multiversx_sdk import Transaction, TransactionComputer
from relay_kit import MASTER_SECRET, key_in_shard  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of, parse_address
from gasless.relay.checks import presence_message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(localnet: Any, tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GASLESS_PROFILE": "localnet",
        "GASLESS_HOST_ID": "a",
        "GASLESS_MASTER_SECRET": MASTER_SECRET,
        "GASLESS_GATEWAY_URLS": json.dumps(localnet.urls),
        "GASLESS_DATABASE_URL": f"sqlite+aiosqlite:///{(tmp_path / 'crash.db').as_posix()}",
        "GASLESS_DATA_DIR": str(tmp_path),
        "GASLESS_CONTRACT_ADDRESS": localnet.net.info["contract"],
        "GASLESS_RELAYER_KEY_FILES": json.dumps([str(w.path) for w in localnet.net.genesis.relayers]),
        # A short fence: the restarted process may take the signer identity over soon after the kill.
        "GASLESS_SIGNER_FENCE_TTL_MS": "1000",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_ready(base: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = requests.get(f"{base}/readyz", timeout=1)
            last = response.json()
            if response.status_code == 200:
                return dict(last)
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"not ready: {last}")


def faults(localnet: Any, body: dict[str, Any]) -> None:
    requests.post(f"{localnet.url}/localnet/faults", json=body, timeout=5).raise_for_status()


def test_sigkill_after_commit_point_loses_nothing(tmp_path: Path, unpaused_localnet: Any) -> None:
    localnet = unpaused_localnet
    import asyncio

    from gasless.localnet.owner import owner_call

    key = key_in_shard(1)
    sender = address_of(key.generate_public_key().buffer)
    asyncio.run(
        owner_call(
            localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"], "grant", [sender, 3, 1]
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = spawn(localnet, tmp_path, port)
    try:
        wait_ready(base)
        now = int(time.time() * 1000)
        proof = {
            "kind": "key",
            "serverTimeMs": now,
            "signature": key.sign(presence_message("localnet", sender.to_bech32(), now)).hex(),
        }
        assignment = requests.post(
            f"{base}/v1/relay/assign", json={"sender": sender.to_bech32(), "proof": proof}, timeout=5
        ).json()
        tx = Transaction(
            sender=sender,
            receiver=address_of(key_in_shard(1).generate_public_key().buffer),
            gas_limit=100_000,
            chain_id="localnet",
            nonce=0,
            version=2,
            relayer=parse_address(assignment["relayer"]),
        )
        tx.signature = key.sign(TransactionComputer().compute_bytes_for_signing(tx))
        # Hold every send at the gateway: the commit happens, no gateway acknowledges.
        faults(localnet, {"gateway": {"latencyMs": {"/transaction/send": 120_000}}})
        response = requests.post(
            f"{base}/v1/relay", json={"tx": tx.to_dictionary(), "lease": assignment["lease"]}, timeout=10
        )
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["state"] == "COSIGNED"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    tx_hash = body["txHash"]
    localnet.wait_rounds(3)
    assert localnet.call(lambda: tx_hash not in localnet.net.chain.records)  # nothing reached the chain
    faults(localnet, {"gateway": {"latencyMs": {"/transaction/send": 0}}})

    restarted = spawn(localnet, tmp_path, port)
    try:
        wait_ready(base)
        deadline = time.monotonic() + 30
        intent: dict[str, Any] = {}
        while time.monotonic() < deadline:
            intent = requests.get(f"{base}/v1/relay/{tx_hash}", timeout=5).json()
            if intent["state"] == "FINALIZED":
                break
            time.sleep(0.1)
        assert intent["state"] == "FINALIZED", intent
        assert intent["receivedAtMs"] == body["intent"]["receivedAtMs"]
        assert intent["cosignedAtMs"] == body["intent"]["cosignedAtMs"]
        assert intent["outcome"] == "success"
        assert localnet.call(lambda: localnet.net.chain.submissions[tx_hash]) >= 1
    finally:
        restarted.send_signal(signal.SIGTERM)
        try:
            restarted.wait(10)
        except subprocess.TimeoutExpired:
            restarted.kill()
