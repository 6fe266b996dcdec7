"""`gasless serve --workers 2`: one host, two API worker processes behind one port, on one PostgreSQL and
one Redis, against one `gasless localnet` process.

Each worker is an instance of its own (`a.0`, `a.1`) to the signer fence, intent ownership and singleton
presence; clients see host `a` with two boot epochs. A worker killed with SIGKILL after its commit point
loses nothing: its intent is finished, the parent starts it again, and the new one takes no connection
before it can relay (every relay sent meanwhile succeeds). The parent's SIGTERM stops every worker; the
parent's SIGKILL makes them stop themselves.

The processes are shared by the module; the tests run in order (the last ones stop the parent).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from process_kit import free_port, port_pair, reap, wait_until  # type: ignore[import-not-found]
from serve_kit import Host, fresh_database, servers, spawn_serve, stop  # type: ignore[import-not-found]
from test_two_hosts import (  # type: ignore[import-not-found]
    ROLES,
    Cluster,
    assign,
    cluster_env,
    new_sender,
    signed,
    start_cluster,
    wait_state,
)

from gasless.core.settings import MAX_WORKERS

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@dataclass
class WorkersHost:
    cluster: Cluster
    host: Host  # the one API port (and worker 0's metrics port)
    metrics_port: int
    parent: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def workers(self) -> dict[int, int]:
        """{worker index: pid} of the parent's living children."""
        pids = Path(f"/proc/{self.parent.pid}/task/{self.parent.pid}/children").read_text().split()
        found: dict[int, int] = {}
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"--worker" in argv:
                found[int(argv[argv.index(b"--worker") + 1])] = int(pid)
        return found

    def scrape(self, index: int) -> str:
        return requests.get(f"http://127.0.0.1:{self.metrics_port + index}/metrics", timeout=5).text

    def relays_served(self, index: int) -> float:
        for line in self.scrape(index).splitlines():
            if line.startswith("gasless_http_request_duration_seconds_count{") and all(
                part in line for part in ('method="POST"', 'route="/v1/relay"', 'status_class="2xx"')
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def boots_ready(self, not_ready: list[str] | None = None) -> set[int]:
        """Boot epochs of the workers that answered /readyz 200 over fresh connections, 20 tries; other
        answers are appended to `not_ready`."""
        boots = set()
        for _ in range(20):
            answer = requests.get(f"{self.host.base}/readyz", timeout=5)
            if answer.status_code == 200:
                boots.add(int(answer.json()["bootEpochMs"]))
            elif not_ready is not None:
                not_ready.append(answer.text)
        return boots


def relay_once(cluster: Cluster, host: Host) -> requests.Response:
    return ready_relay(cluster, host)()


def ready_relay(cluster: Cluster, host: Host) -> Callable[[], requests.Response]:
    """A relay signed and assigned, to be sent later: its sender's plan is granted by a transaction, so
    this is done before any fault holds the gateway's sends."""
    key, sender = new_sender(cluster)
    assignment = assign(cluster, host, key, sender)
    tx = signed(cluster, key, assignment)
    return lambda: host.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkersHost]:
    server_url, redis_url = servers("API workers suite")
    tmp = tmp_path_factory.mktemp("api-workers")
    localnet: subprocess.Popen[bytes] | None = None
    parent: subprocess.Popen[bytes] | None = None
    with fresh_database(server_url, "gasless_api_workers") as database_url:
        try:
            localnet, cluster = start_cluster(tmp, database_url, redis_url)
            port, metrics_port = free_port(), port_pair()
            log_path = tmp / "workers.log"
            env = {
                **cluster_env(
                    cluster,
                    host_id="a",
                    port=port,
                    metrics_port=metrics_port,
                    data_dir=tmp / "data",
                    database_url=database_url,
                    redis_url=redis_url,
                ),
                # Long enough that a restarted worker waits seconds for its predecessor's claim to lapse.
                "GASLESS_SIGNER_FENCE_TTL_MS": "8000",
            }
            parent = spawn_serve(env, port, log_path, args=("--workers", "2"))
            host = Host("a", f"http://127.0.0.1:{port}", parent, log_path, f"http://127.0.0.1:{metrics_port}")
            workers = WorkersHost(cluster, host, metrics_port, parent, log_path, env)
            # Both workers ready, each asked on its own metrics port (the API port is the kernel's choice).
            for k in (0, 1):
                wait_until(lambda k=k: "gasless_host_ready 1.0" in workers.scrape(k), f"worker {k} ready")
            yield workers
        finally:
            if parent is not None:
                stop(parent, 60)
            if localnet is not None:
                stop(localnet, 15)


def test_two_workers_serve_one_port_as_host_a_with_their_own_identities(served: WorkersHost) -> None:
    assert sorted(served.workers()) == [0, 1]
    # Which worker takes a connection is the kernel's choice: ask until both answered, keeping each one's
    # latest answer (the singleton roles settle within a try or two of their election).
    latest: dict[int, dict[str, Any]] = {}

    def one_leader_per_role() -> bool:
        answer = requests.get(f"{served.host.base}/readyz", timeout=5).json()
        latest[answer["bootEpochMs"]] = answer
        return len(latest) == 2 and all(
            sorted(a["singletons"][role] for a in latest.values()) == ["leader", "standby"] for role in ROLES
        )

    # Each singleton runs on exactly one worker (they start together, so the roles may split between
    # them): they are distinct instances to the leader election.
    wait_until(one_leader_per_role, "each role led by exactly one of the two workers")
    # One host to clients; two processes, whose boot epochs (stream event ids) differ by construction.
    assert {answer["hostId"] for answer in latest.values()} == {"a"}
    assert {boot % MAX_WORKERS for boot in latest} == {0, 1}

    # Worker k's metrics on the metrics port + k, where the same split shows.
    def metrics_split() -> bool:
        scraped = [served.scrape(k) for k in (0, 1)]
        return all(
            sorted(f'gasless_singleton_leader{{role="{role}"}} 1.0' in text for text in scraped)
            == [False, True]
            for role in ROLES
        )

    wait_until(metrics_split, "each role's leader gauge set on exactly one worker's metrics port")
    log_lines = [
        json.loads(line) for line in served.log_path.read_text().splitlines() if line.startswith("{")
    ]
    assert {line.get("host_id") for line in log_lines if line.get("event") == "host ready"} == {"a.0", "a.1"}


def test_relays_through_the_one_port_are_served_by_both_workers(served: WorkersHost) -> None:
    hashes: list[str] = []

    def both_relayed() -> bool:
        # Each request on a fresh connection: the kernel hands it to either worker.
        relayed = relay_once(served.cluster, served.host)
        assert relayed.status_code in (200, 202), relayed.text
        hashes.append(relayed.json()["txHash"])
        return len(hashes) >= 8 and all(served.relays_served(k) >= 1 for k in (0, 1))

    wait_until(both_relayed, "relays served by both workers", timeout=120)
    for tx_hash in hashes:
        final = wait_state(served.host, tx_hash, "FINALIZED")
        assert final["outcome"] == "success"
        assert served.cluster.submissions(tx_hash) == 1


def test_a_worker_killed_after_its_commit_point_loses_nothing_and_comes_back_ready(
    served: WorkersHost,
) -> None:
    cluster, host = served.cluster, served.host
    before = {k: served.relays_served(k) for k in (0, 1)}
    send = ready_relay(cluster, host)  # the sender's plan granted while sends still pass
    # Hold every send at the gateway: a worker commits, no gateway acknowledges, then it dies.
    cluster.faults({"gateway": {"latencyMs": {"/transaction/send": 120_000}}})
    try:
        relayed = send()
        assert relayed.status_code == 202 and relayed.json()["state"] == "COSIGNED", relayed.text
        after = {k: served.relays_served(k) for k in (0, 1)}
        (victim,) = [k for k in (0, 1) if after[k] > before[k]]
        os.kill(served.workers()[victim], signal.SIGKILL)
    finally:
        cluster.faults({"gateway": {"latencyMs": {}}})
    # While the new worker starts (its predecessor's signer claim must lapse first), the port keeps
    # answering, and never with a refusal nor a /readyz 503: the starting worker takes no connection
    # before it can relay.
    refused: list[str] = []

    def new_worker_relayed() -> bool:
        answer = relay_once(cluster, host)
        if answer.status_code not in (200, 202):
            refused.append(answer.text)
        served.boots_ready(not_ready=refused)  # /readyz through the port: never a 503 meanwhile
        return served.relays_served(victim) >= 1  # the new process's own count, on its metrics port

    wait_until(new_worker_relayed, f"the restarted worker {victim} relays", timeout=90)
    assert refused == []
    # Nothing lost: the intent co-signed by the dead worker is broadcast and followed to the end.
    final = wait_state(host, relayed.json()["txHash"], "FINALIZED")
    assert final["outcome"] == "success"
    assert final["cosignedAtMs"] == relayed.json()["intent"]["cosignedAtMs"]
    logged = [json.loads(line) for line in served.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("event") == "API worker exited" and line["worker"] == victim for line in logged)


def test_sigterm_stops_every_worker_cleanly(served: WorkersHost) -> None:
    pids = list(served.workers().values())
    assert len(pids) == 2
    served.parent.send_signal(signal.SIGTERM)
    assert served.parent.wait(60) == 128 + signal.SIGTERM
    for pid in pids:  # reaped by the parent: gone, not zombies
        assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{served.host.base}/healthz", timeout=2)


def test_workers_stop_themselves_when_their_parent_is_killed(served: WorkersHost) -> None:
    """A parent killed with SIGKILL cannot forward anything: its workers see the pipe close and stop."""
    port = free_port()
    env = {**served.env, "GASLESS_API_BASE_URL": f"http://127.0.0.1:{port}"}
    parent = spawn_serve(env, port, served.log_path, args=("--workers", "2"), append=True)
    try:
        workers = WorkersHost(served.cluster, served.host, served.metrics_port, parent, served.log_path)
        wait_until(lambda: len(workers.workers()) == 2, "two workers started")
        pids = list(workers.workers().values())
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=2).status_code == 200, "serving")
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: all(not _alive(pid) for pid in pids), "both workers stopped", timeout=60)
    finally:
        reap(parent)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped by init yet, counts as stopped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
