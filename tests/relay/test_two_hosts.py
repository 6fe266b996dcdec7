"""Two real `gasless serve` processes (hosts a and b) on one PostgreSQL and one Redis, against one
`gasless localnet` process: each accepts what the other issued, one broadcast for bytes sent to both, the
singleton workers move when their host is killed and the survivor finishes the dead host's intents,
metrics on the admin port, and log lines that never carry a secret.

The processes are shared by the module; the SIGKILL test is the last one (it kills host b).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from multiversx_sdk import Transaction, TransactionComputer, UserPEM, UserSecretKey
from process_kit import free_port, port_pair, reap, wait_until  # type: ignore[import-not-found]
from relay_kit import MASTER_SECRET, key_in_shard  # type: ignore[import-not-found]
from serve_kit import Host, fresh_database, serve_env, servers, start_host, stop  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of, parse_address
from gasless.chain.codec import signing_bytes
from gasless.localnet.genesis import load_or_create_wallet
from gasless.localnet.owner import owner_call, unpause
from gasless.relay.checks import presence_message

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
# The singleton roles every host runs (one leader each), as /readyz and the metrics name them.
ROLES = (
    "retention",
    "webhook-retention",
    "intent-recovery",
    "latency-rollup",
    "status-feed",
    "mirror",
    "notices",
)

_computer = TransactionComputer()


@dataclass
class Cluster:
    gateway: str
    info: dict[str, Any]
    owner: Any
    hosts: dict[str, Host] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # values no log line may contain
    database_url: str = ""
    redis_url: str = ""
    tmp: Path = Path()

    def grant(self, key: UserSecretKey) -> None:
        address = address_of(key.generate_public_key().buffer)
        asyncio.run(owner_call(self.gateway, self.owner, self.info["contract"], "grant", [address, 3, 1]))

    def faults(self, body: dict[str, Any]) -> None:
        requests.post(f"{self.gateway}/localnet/faults", json=body, timeout=5).raise_for_status()

    def submissions(self, tx_hash: str) -> int:
        answer = requests.get(f"{self.gateway}/localnet/submissions/{tx_hash}", timeout=5).json()
        return int(answer["data"]["submissions"])

    def relayer_signature(self, tx: Transaction) -> str:
        """The relayer's signature over `tx` (Ed25519 is deterministic: the one the hosts made)."""
        wanted = tx.relayer.to_bech32()
        for entry in self.info["relayers"]:
            if entry["address"] == wanted:
                key = UserPEM.from_file(Path(entry["pem"])).secret_key
                return str(key.sign(signing_bytes(tx)).hex())
        raise AssertionError(f"{wanted} is not a localnet relayer")


def cluster_env(
    cluster: Cluster,
    *,
    host_id: str,
    port: int,
    metrics_port: int,
    data_dir: Path,
    database_url: str,
    redis_url: str,
    gateway: str | None = None,
) -> dict[str, str]:
    """The environment of a `gasless serve` of this cluster (no config file of the test run leaks in)."""
    return serve_env(
        cluster.info,
        [gateway or cluster.gateway],
        host_id=host_id,
        port=port,
        data_dir=data_dir,
        database_url=database_url,
        redis_url=redis_url,
        metrics_port=metrics_port,
        fence_ttl_ms=2000,
        GASLESS_APP_ORIGIN="http://127.0.0.1:3000",
    )


def start_cluster(tmp: Path, database_url: str, redis_url: str) -> tuple[subprocess.Popen[bytes], Cluster]:
    """A `gasless localnet` process (100 ms rounds) with its billing contract unpaused, and the cluster
    (no host yet) that serves it from `database_url` and `redis_url`. The process is stopped here if it
    never answers."""
    gateway_port = free_port()
    localnet = subprocess.Popen(
        [
            sys.executable, "-m", "gasless.cli", "localnet",
            "--port", str(gateway_port), "--data-dir", str(tmp), "--round-ms", "100",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        gateway = f"http://127.0.0.1:{gateway_port}"
        info = wait_until(
            lambda: requests.get(f"{gateway}/localnet/info", timeout=2).json()["data"],
            "localnet",
            proc=localnet,
        )
        owner = load_or_create_wallet(Path(info["ownerPem"]).parent, "owner")
        asyncio.run(unpause(gateway, owner, info["contract"]))
    except BaseException:
        stop(localnet, 15)
        raise
    cluster = Cluster(
        gateway,
        info,
        owner,
        secrets=[MASTER_SECRET],
        database_url=database_url,
        redis_url=redis_url,
        tmp=tmp,
    )
    return localnet, cluster


def _spawn_host(
    cluster: Cluster,
    tmp: Path,
    host_id: str,
    database_url: str,
    redis_url: str,
    *,
    gateway: str | None = None,
    name: str | None = None,
) -> Host:
    """A `gasless serve` process, ready; with another `gateway` (one that does not answer) it stays starting
    and is returned as soon as it serves `/healthz`."""
    port, metrics_port = free_port(), free_port()
    env = {
        **cluster_env(
            cluster,
            host_id=host_id,
            port=port,
            metrics_port=metrics_port,
            data_dir=tmp / f"data-{name or host_id}",
            database_url=database_url,
            redis_url=redis_url,
            gateway=gateway,
        ),
        "GASLESS_LOG_LEVEL": "DEBUG",
    }
    return start_host(
        env,
        host_id,
        port,
        tmp / f"host-{name or host_id}.log",
        metrics=f"http://127.0.0.1:{metrics_port}",
        until="/readyz" if gateway is None else "/healthz",
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    server_url, redis_url = servers("two-host suite")
    tmp = tmp_path_factory.mktemp("two-hosts")
    procs: list[subprocess.Popen[bytes]] = []
    with fresh_database(server_url, "gasless_two_hosts") as database_url:
        try:
            localnet, cluster = start_cluster(tmp, database_url, redis_url)
            procs.append(localnet)
            # b first: it takes the singleton roles, which the last test moves by killing it.
            for host_id in ("b", "a"):
                host = _spawn_host(cluster, tmp, host_id, database_url, redis_url)
                procs.append(host.proc)
                cluster.hosts[host_id] = host
            yield cluster
        finally:
            for proc in reversed(procs):
                stop(proc, 15)


# Helpers ------------------------------------------------------------------------------------------------
def proof(key: UserSecretKey, sender: str) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return {
        "kind": "key",
        "serverTimeMs": now,
        "signature": key.sign(presence_message("localnet", sender, now)).hex(),
    }


def new_sender(cluster: Cluster, *, plan: bool = True) -> tuple[UserSecretKey, str]:
    key = key_in_shard(1)
    if plan:
        cluster.grant(key)
    return key, address_of(key.generate_public_key().buffer).to_bech32()


def assign(cluster: Cluster, host: Host, key: UserSecretKey, sender: str, **headers: str) -> dict[str, Any]:
    body: dict[str, Any] = {"sender": sender}
    if "Authorization" not in headers:
        body["proof"] = proof(key, sender)
        cluster.secrets.append(body["proof"]["signature"])
    answer = host.post("/v1/relay/assign", body, headers=headers)
    assert answer.status_code == 200, answer.text
    cluster.secrets.append(answer.json()["lease"])
    return dict(answer.json())


def signed(cluster: Cluster, key: UserSecretKey, assignment: dict[str, Any], nonce: int = 0) -> Transaction:
    tx = Transaction(
        sender=address_of(key.generate_public_key().buffer),
        receiver=address_of(key_in_shard(1).generate_public_key().buffer),
        gas_limit=100_000,
        chain_id="localnet",
        nonce=nonce,
        version=2,
        relayer=parse_address(assignment["relayer"]),
    )
    tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
    cluster.secrets += [tx.signature.hex(), cluster.relayer_signature(tx)]
    return tx


def wait_state(host: Host, ident: str, state: str) -> dict[str, Any]:
    def reached() -> Any:
        body = host.get(f"/v1/relay/{ident}").json()
        return body if body.get("state") == state else None

    return dict(wait_until(reached, f"{ident} {state} on host {host.host_id}"))


def logged(host: Host, request_ids: list[str]) -> str | None:
    """The host's log once every one of `request_ids` is in it."""
    text = host.log_path.read_text()
    return text if all(request_id in text for request_id in request_ids) else None


# Tests ------------------------------------------------------------------------------------------------
def test_hosts_report_their_identity_readiness_and_leadership(cluster: Cluster) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    health = {h.host_id: h.get("/healthz").json() for h in (a, b)}
    assert health["a"]["hostId"] == "a" and health["b"]["hostId"] == "b"
    # Stream event ids (`<hostId>.<bootEpochMs>.<seq>`) differ per host and per process start.
    assert health["a"]["bootEpochMs"] > health["b"]["bootEpochMs"]
    ready = {h.host_id: h.get("/readyz") for h in (a, b)}
    for answer in ready.values():
        assert answer.status_code == 200
        assert answer.json()["checks"] == {
            "restore": "ok", "database": "ok", "gateway": "ok", "redis": "ok", "clock": "ok", "signer": "ok",
        }  # fmt: skip
    # Each singleton runs on exactly one host: b, which started first.
    assert ready["b"].json()["singletons"] == dict.fromkeys(ROLES, "leader")
    assert ready["a"].json()["singletons"] == dict.fromkeys(ROLES, "standby")


def test_a_host_on_a_server_without_autovacuum_says_so(cluster: Cluster) -> None:
    async def server_setting() -> str:
        import asyncpg
        from sqlalchemy.engine import make_url

        url = make_url(cluster.database_url).set(drivername="postgresql")
        conn = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            return str(await conn.fetchval("SHOW autovacuum"))
        finally:
            await conn.close()

    off = asyncio.run(server_setting()) != "on"
    for host in cluster.hosts.values():
        warnings = [
            line
            for line in map(
                json.loads, filter(lambda t: t.startswith("{"), host.log_path.read_text().splitlines())
            )
            if line.get("event", "").startswith("PostgreSQL autovacuum is off")
        ]
        # Once a start (a host restarted by an earlier test logged it again).
        assert bool(warnings) == off and all(w["level"] == "warning" for w in warnings), warnings


def test_a_lease_minted_on_a_is_accepted_on_b(cluster: Cluster) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, sender = new_sender(cluster)
    assignment = assign(cluster, a, key, sender)
    tx = signed(cluster, key, assignment)
    relayed = b.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]})
    assert relayed.status_code in (200, 202), relayed.text
    assert relayed.json()["duplicate"] is False
    # Either host answers for the intent (one shared database).
    final = wait_state(a, relayed.json()["txHash"], "FINALIZED")
    assert final["outcome"] == "success" and final["id"] == f"{sender}:0"


def test_same_bytes_on_both_hosts_are_broadcast_once(cluster: Cluster) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, sender = new_sender(cluster)
    assignment = assign(cluster, b, key, sender)
    body = {"tx": signed(cluster, key, assignment).to_dictionary(), "lease": assignment["lease"]}
    barrier = threading.Barrier(2)
    answers: dict[str, requests.Response] = {}

    def send(host: Host) -> None:
        barrier.wait()
        answers[host.host_id] = host.post("/v1/relay", body)

    threads = [threading.Thread(target=send, args=(h,)) for h in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {h: r.status_code in (200, 202) for h, r in answers.items()} == {"a": True, "b": True}, [
        r.text for r in answers.values()
    ]
    documents = [r.json() for r in answers.values()]
    assert sorted(d["duplicate"] for d in documents) == [False, True]
    assert documents[0]["txHash"] == documents[1]["txHash"]
    tx_hash = documents[0]["txHash"]
    wait_state(b, tx_hash, "FINALIZED")
    assert cluster.submissions(tx_hash) == 1


def test_native_auth_api_key_and_errors_leave_no_secret_in_any_log_line(cluster: Cluster) -> None:
    from gasless.client.actions import action_headers
    from gasless.client.keys import UserKey
    from gasless.client.native_auth import make_native_auth_token

    a, b = cluster.hosts["a"], cluster.hosts["b"]
    native = a.get("/v1/network").json()["nativeAuth"]
    key, sender = new_sender(cluster)
    token = make_native_auth_token(
        key, origin=native["origins"][0], block_hash=native["blockHash"], ttl_seconds=600
    )
    # A real sponsor key (a made-up one is refused before the relay checks): created on b with the
    # account's per-action signature over b's challenge, then used on a.
    raw = json.dumps({"label": "logs"}).encode()
    key_headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    keys_url = f"{b.base}/v1/account/{sender}/keys"
    challenge = requests.post(keys_url, data=raw, headers=key_headers, timeout=10)
    assert challenge.json()["code"] == "ACTION_SIGNATURE_INVALID", challenge.text
    signed_headers = action_headers(UserKey(key), "createApiKey", raw, challenge.json()["details"])
    created = requests.post(keys_url, data=raw, headers={**key_headers, **signed_headers}, timeout=10)
    assert created.status_code == 201, created.text
    api_key = created.json()["secret"]
    cluster.secrets += [token, api_key, *signed_headers.values()]
    # A native-auth token made against a's network view is accepted on b.
    assignment = assign(cluster, b, key, sender, Authorization=f"Bearer {token}")
    tx = signed(cluster, key, assignment)
    relayed = a.post(
        "/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]}, headers={"X-Api-Key": api_key}
    )
    assert relayed.status_code in (200, 202), relayed.text
    request_ids = {"a": [relayed.headers["Relay-Request-Id"]], "b": []}
    # Refusals carrying secrets: a forged lease, a broken token, a wrong proof signature.
    forged = assignment["lease"][:-4] + ("AAAA" if not assignment["lease"].endswith("AAAA") else "BBBB")
    cluster.secrets.append(forged)
    other = signed(cluster, key, assignment, nonce=1)
    bad_lease = b.post(
        "/v1/relay", {"tx": other.to_dictionary(), "lease": forged}, headers={"X-Api-Key": api_key}
    )
    assert bad_lease.status_code == 403 and bad_lease.json()["code"] == "LEASE_INVALID", bad_lease.text
    bad_token = b.post("/v1/relay/assign", {"sender": sender}, headers={"Authorization": f"Bearer {token}x"})
    assert bad_token.status_code == 401 and bad_token.json()["code"] == "TOKEN_INVALID"
    wrong = proof(key_in_shard(1), sender)
    cluster.secrets.append(wrong["signature"])
    bad_proof = a.post("/v1/relay/assign", {"sender": sender, "proof": wrong})
    assert bad_proof.status_code == 401 and bad_proof.json()["code"] == "ASSIGN_PROOF_INVALID"
    request_ids["b"] += [bad_lease.headers["Relay-Request-Id"], bad_token.headers["Relay-Request-Id"]]
    request_ids["a"].append(bad_proof.headers["Relay-Request-Id"])
    wait_state(a, relayed.json()["txHash"], "FINALIZED")

    for host in (a, b):
        text = wait_until(lambda h=host: logged(h, request_ids[h.host_id]), f"host {host.host_id} logs")
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
        # Library records (uvicorn, asyncio, redis) come through the same JSON pipeline, at DEBUG too.
        assert {"uvicorn.error", "asyncio"} <= {line.get("logger") for line in lines}
        assert any(line["level"] == "debug" for line in lines)
        for request_id in request_ids[host.host_id]:
            access = [x for x in lines if x.get("request_id") == request_id and x.get("event") == "request"]
            assert len(access) == 1 and access[0]["host_id"] == host.host_id, access
            assert access[0]["route"].startswith("/v1/relay") and access[0]["status"] >= 200
        leaked = [secret for secret in cluster.secrets if secret in text]
        assert leaked == [], f"host {host.host_id} logged secrets: {[s[:12] for s in leaked]}"
        assert "[redacted]" in text  # the redaction did have something to mask


def test_metrics_on_the_admin_port_after_relays(cluster: Cluster) -> None:
    # Relays of its own on both hosts (the module's other tests may run on another xdist worker).
    for host_id in ("a", "b", "a"):
        host = cluster.hosts[host_id]
        key, sender = new_sender(cluster)
        assignment = assign(cluster, host, key, sender)
        tx = signed(cluster, key, assignment)
        relayed = host.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]})
        assert relayed.status_code in (200, 202), relayed.text
        wait_state(host, relayed.json()["txHash"], "FINALIZED")
    scraped = {h: cluster.hosts[h].scrape() for h in ("a", "b")}
    for host_id, samples in scraped.items():
        relay_counts = [
            value
            for labels, value in samples["gasless_http_request_duration_seconds_count"]
            if labels == {"method": "POST", "route": "/v1/relay", "status_class": "2xx"}
        ]
        assert relay_counts and relay_counts[0] >= 1, host_id
        buckets = [
            labels["le"]
            for labels, _ in samples["gasless_http_request_duration_seconds_bucket"]
            if labels["route"] == "/v1/relay"
        ]
        assert "0.8" in buckets and "+Inf" in buckets
        assert samples["gasless_tracker_in_flight"][0][1] >= 0
        assert samples["gasless_broadcaster_pending_sends"][0][1] >= 0
    # Stage figures are observed by the host that moved the intent; together they saw every relay.
    stages: dict[str, float] = {}
    for samples in scraped.values():
        for labels, value in samples["gasless_relay_stage_seconds_count"]:
            stages[labels["stage"]] = stages.get(labels["stage"], 0) + value
    assert stages["acceptToCosign"] >= 3 and stages["added"] >= 3 and stages["total"] >= 3, stages
    leader = {
        h: {labels["role"]: value for labels, value in scraped[h]["gasless_singleton_leader"]}
        for h in scraped
    }
    assert leader == {
        "b": dict.fromkeys(ROLES, 1.0),
        "a": dict.fromkeys(ROLES, 0.0),
    }
    # The admin port serves metrics and health only; the API port does not serve metrics.
    a = cluster.hosts["a"]
    assert requests.get(f"{a.metrics}/healthz", timeout=5).status_code == 200
    assert requests.get(f"{a.metrics}/v1/network", timeout=5).status_code == 404
    assert a.get("/metrics").status_code == 404


def test_a_starting_host_answers_a_replay_of_bytes_another_host_cosigned(cluster: Cluster) -> None:
    """No error after the co-signature: b co-signed, and a host that cannot relay yet (its gateway does not
    answer, so it stays starting) answers the retried bytes from the shared database."""
    b = cluster.hosts["b"]
    key, sender = new_sender(cluster)
    assignment = assign(cluster, b, key, sender)
    body = {"tx": signed(cluster, key, assignment).to_dictionary(), "lease": assignment["lease"]}
    first = b.post("/v1/relay", body)
    assert first.status_code in (200, 202), first.text
    starting = _spawn_host(
        cluster,
        cluster.tmp,
        "a",
        cluster.database_url,
        cluster.redis_url,
        gateway=f"http://127.0.0.1:{free_port()}",  # nothing listens: the host never finishes starting
        name="a-starting",
    )
    try:
        ready = starting.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "starting", ready.text
        replay = starting.post("/v1/relay", body)
        assert replay.status_code in (200, 202), replay.text
        answer = replay.json()
        assert answer["duplicate"] is True and answer["txHash"] == first.json()["txHash"]
        assert answer["id"] == f"{sender}:0"
        # Bytes no host co-signed get the error, and nothing is sent: the next nonce stays unused.
        other = {
            "tx": signed(cluster, key, assignment, nonce=1).to_dictionary(),
            "lease": assignment["lease"],
        }
        refused = starting.post("/v1/relay", other)
        assert refused.status_code == 503 and refused.json()["code"] == "UPSTREAM_UNAVAILABLE", refused.text
        assert "Retry-After" in refused.headers
        assert b.get(f"/v1/intents/{sender}/1").status_code == 404
    finally:
        stop(starting.proc, 15)
    final = wait_state(b, first.json()["txHash"], "FINALIZED")
    assert cluster.submissions(final["txHash"]) == 1


def test_killing_the_leader_moves_the_singletons_and_the_survivor_finishes_its_intents(
    cluster: Cluster,
) -> None:
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    key, sender = new_sender(cluster)
    assignment = assign(cluster, b, key, sender)
    tx = signed(cluster, key, assignment)
    # Hold every send at the gateway: b commits, no gateway acknowledges, then b dies.
    cluster.faults({"gateway": {"latencyMs": {"/transaction/send": 120_000}}})
    try:
        relayed = b.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]})
        assert relayed.status_code == 202 and relayed.json()["state"] == "COSIGNED", relayed.text
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
    finally:
        cluster.faults({"gateway": {"latencyMs": {}}})
    tx_hash = relayed.json()["txHash"]

    def a_leads() -> Any:
        body = a.get("/readyz").json()
        return body if body["singletons"] == dict.fromkeys(ROLES, "leader") else None

    wait_until(a_leads, "a takes the singleton roles over")
    # b's intent, never acknowledged by a gateway, is re-broadcast and followed to the end by a.
    final = wait_state(a, tx_hash, "FINALIZED")
    assert final["outcome"] == "success"
    assert final["cosignedAtMs"] == relayed.json()["intent"]["cosignedAtMs"]
    assert cluster.submissions(tx_hash) >= 1
    leader = {labels["role"]: value for labels, value in a.scrape()["gasless_singleton_leader"]}
    assert leader == dict.fromkeys(ROLES, 1.0)
    adopted = [json.loads(line) for line in a.log_path.read_text().splitlines() if "adopting" in line]
    assert [entry["hosts"] for entry in adopted] == [["b"]]


# `gasless up --hosts 2` ------------------------------------------------------------------------------------
def test_up_with_two_hosts_refuses_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GASLESS_DATABASE_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "gasless.cli", "up", "--hosts", "2", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "200"},
    )
    assert result.returncode == 2
    assert "two hosts need PostgreSQL" in result.stderr and "--database-url" in result.stderr
    assert not (tmp_path / "localnet").exists()  # refused before anything started


def test_up_with_two_hosts_serves_a_and_b(tmp_path: Path, postgres_url: str, redis_url: str) -> None:
    api = port_pair()
    metrics, localnet_port = port_pair(api), free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("w") as output:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "gasless.cli", "up", "--hosts", "2",
                "--port", str(api), "--metrics-port", str(metrics), "--localnet-port", str(localnet_port),
                "--database-url", postgres_url, "--redis-url", redis_url,
                "--data-dir", str(tmp_path / "var"), "--round-ms", "100",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
            start_new_session=True,  # reap() kills its process group: without it a hung stop outlived the test
        )  # fmt: skip
    try:
        bases = {"a": f"http://127.0.0.1:{api}", "b": f"http://127.0.0.1:{api + 1}"}
        for host_id, base in bases.items():
            wait_until(lambda b=base: requests.get(f"{b}/readyz", timeout=2).status_code == 200, host_id)
            assert requests.get(f"{base}/healthz", timeout=2).json()["hostId"] == host_id
        leaders = []
        for port in (metrics, metrics + 1):
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            leaders.append('gasless_singleton_leader{role="retention"} 1.0' in text)
        assert sorted(leaders) == [False, True]  # exactly one host runs the retention singleton
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            reap(proc)  # killed if the stop hung: never an orphan holding the ports
    printed = log_path.read_text()
    assert proc.returncode == 130, printed  # 128 + SIGINT: stopped by the signal, cleanly
    assert bases["a"] in printed and bases["b"] in printed
    assert f"http://127.0.0.1:{metrics + 1}/metrics" in printed
    # Ctrl-C stopped everything: nothing answers any more.
    for port in (api, api + 1, localnet_port):
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
