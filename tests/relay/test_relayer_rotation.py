"""Relayer rotation end to end, with traffic flowing: two real `gasless serve` hosts (PostgreSQL, Redis) on a
`gasless localnet` process; a relayer is added (registered `draining` in the contract, its key loaded by a
rolling restart of both hosts, then set `active`) and another retired (`draining`, no fee left in flight,
`retired`), each step through `gasless admin`. A client relays all along the way a load balancer and the
client library would (another host when one is restarting, the same bytes again; a new signature for the
same nonce on RESIGN_REQUIRED). Nothing is refused, every accepted relay ends FINALIZED, and the compat
rendezvous answer (`GET /relayer/address/{user}`) moves only for the users the new relayer now wins and for
the users of the retired one (docs/keys.md, "Relayer funds and rotation")."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from multiversx_sdk import Transaction, TransactionComputer, UserPEM, UserSecretKey
from process_kit import free_port, run, wait_until  # type: ignore[import-not-found]
from relay_kit import key_in_shard  # type: ignore[import-not-found]
from serve_kit import fresh_database, serve_env, servers, spawn_serve, stop  # type: ignore[import-not-found]
from test_two_hosts import Cluster, start_cluster  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of, parse_address
from gasless.relay.checks import presence_message

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
SHARD = 1
_computer = TransactionComputer()


@dataclass
class Node:
    host_id: str
    port: int
    metrics_port: int
    keys: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Deployment:
    cluster: Cluster
    tmp: Path
    prefix: str
    nodes: dict[str, Node] = field(default_factory=dict)

    def env(self, node: Node) -> dict[str, str]:
        return serve_env(
            self.cluster.info,
            [self.cluster.gateway],
            host_id=node.host_id,
            port=node.port,
            data_dir=self.tmp / f"data-{node.host_id}",
            database_url=self.cluster.database_url,
            redis_url=self.cluster.redis_url,
            metrics_port=node.metrics_port,
            fence_ttl_ms=2000,
            GASLESS_REDIS_PREFIX=self.prefix,
            GASLESS_RELAYER_KEY_FILES=json.dumps(node.keys),
            GASLESS_APP_ORIGIN="http://127.0.0.1:3000",
            GASLESS_RELAYER_REFRESH_MS="300",
        )

    def start(self, node: Node) -> None:
        node.proc = spawn_serve(self.env(node), node.port, self.tmp / f"host-{node.host_id}.log", append=True)
        wait_until(
            lambda: requests.get(f"{node.base}/readyz", timeout=2).status_code == 200,
            node.host_id,
            90,
            proc=node.proc,
        )

    def restart(self, node: Node, keys: list[str]) -> None:
        """Stop the host cleanly (SIGTERM) and start it again on its ports with `keys`."""
        assert node.proc is not None
        stop(node.proc, 15)
        node.keys = keys
        self.start(node)

    def admin(self, *args: str) -> None:
        info = self.cluster.info
        done = run(
            "admin", *args,
            "--gateway", self.cluster.gateway, "--contract", info["contract"], "--owner-pem", info["ownerPem"],
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    def pool(self, relayer: str) -> list[dict[str, Any] | None]:
        """The relayer's entry in each host's /readyz (None where the host does not hold its key)."""
        found = []
        for node in self.nodes.values():
            entries = requests.get(f"{node.base}/readyz", timeout=5).json()["relayers"]
            found.append(next((e for e in entries if e["address"] == relayer), None))
        return found


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    server_url, redis_url = servers("rotation test")
    prefix = f"gasless-rotation-{uuid.uuid4().hex[:8]}"
    localnet: subprocess.Popen[bytes] | None = None
    deployment: Deployment | None = None
    with fresh_database(server_url, "gasless_rotation") as database_url:
        try:
            localnet, cluster = start_cluster(tmp_path, database_url, redis_url)
            deployment = Deployment(cluster, tmp_path, prefix)
            keys = [entry["pem"] for entry in cluster.info["relayers"]]
            for host_id in ("b", "a"):
                node = Node(host_id, free_port(), free_port(), list(keys))
                deployment.nodes[host_id] = node
                deployment.start(node)
            yield deployment
        finally:
            if deployment is not None:
                for node in deployment.nodes.values():
                    if node.proc is not None:
                        stop(node.proc, 15)
            if localnet is not None:
                stop(localnet, 15)
            import redis

            client = redis.Redis.from_url(redis_url)
            try:
                for key in client.scan_iter(match=f"{prefix}*"):
                    client.delete(key)
            finally:
                client.close()


# The client -----------------------------------------------------------------------------------------------
@dataclass
class Sender:
    key: UserSecretKey
    nonce: int = 0

    @property
    def address(self) -> str:
        return address_of(self.key.generate_public_key().buffer).to_bech32()


@dataclass
class Traffic:
    """Relays from a few senders, one after another, over both hosts, until stopped."""

    deployment: Deployment
    senders: list[Sender]
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (tx hash, relayer)
    assigned: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, relayer)
    refused: list[str] = field(default_factory=list)
    resigned: int = 0
    failed_over: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def hosts(self, first: int) -> list[str]:
        bases = [node.base for node in self.deployment.nodes.values()]
        return bases[first % 2 :] + bases[: first % 2]

    def call(self, path: str, body: dict[str, Any], first: int) -> requests.Response:
        """POST to a host that serves: the other one when this one is restarting (connection refused, or
        503 while it starts), as a load balancer would; the same body again (a relay is idempotent)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for base in self.hosts(first):
                try:
                    answer = requests.post(f"{base}{path}", json=body, timeout=15)
                except requests.RequestException:
                    self.failed_over += 1
                    continue
                if answer.status_code == 503 and answer.json().get("code") == "UPSTREAM_UNAVAILABLE":
                    self.failed_over += 1
                    continue
                if answer.status_code == 429:
                    time.sleep(int(answer.headers.get("Retry-After", "1")))
                    continue
                return answer
            time.sleep(0.2)
        raise AssertionError(f"no host served {path} for 60 s")

    def sign(self, sender: Sender, assignment: dict[str, Any]) -> Transaction:
        tx = Transaction(
            sender=address_of(sender.key.generate_public_key().buffer),
            receiver=address_of(key_in_shard(SHARD).generate_public_key().buffer),
            gas_limit=100_000,
            chain_id="localnet",
            nonce=sender.nonce,
            version=2,
            relayer=parse_address(assignment["relayer"]),
        )
        tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
        return tx

    def step(self, sender: Sender, first: int) -> None:
        now = int(time.time() * 1000)
        proof = {
            "kind": "key",
            "serverTimeMs": now,
            "signature": sender.key.sign(presence_message("localnet", sender.address, now)).hex(),
        }
        answer = self.call("/v1/relay/assign", {"sender": sender.address, "proof": proof}, first)
        assert answer.status_code == 200, answer.text
        assignment = answer.json()
        self.assigned.append((time.monotonic(), assignment["relayer"]))
        for _ in range(3):
            tx = self.sign(sender, assignment)
            relayed = self.call("/v1/relay", {"tx": tx.to_dictionary(), "lease": assignment["lease"]}, first)
            if relayed.status_code in (200, 202):
                self.accepted.append((relayed.json()["txHash"], assignment["relayer"]))
                sender.nonce += 1
                return
            problem = relayed.json()
            if problem.get("code") == "RESIGN_REQUIRED":  # the client library's rule: sign the same nonce
                self.resigned += 1
                assignment = problem["details"]["assignment"]
                self.assigned.append((time.monotonic(), assignment["relayer"]))
                continue
            self.refused.append(f"{relayed.status_code} {problem.get('code')}: {problem.get('detail')}")
            return
        self.refused.append("RESIGN_REQUIRED three times in a row")

    def run(self) -> None:
        turn = 0
        try:
            while not self.stop.is_set():
                self.step(self.senders[turn % len(self.senders)], turn)
                turn += 1
                time.sleep(0.1)
        except BaseException as exc:  # handed to the test
            self.errors.append(exc)

    def relays_on(self, relayer: str, since: float = 0.0) -> int:
        return sum(1 for at, chosen in self.assigned if chosen == relayer and at >= since)


def rendezvous(deployment: Deployment, users: list[str]) -> dict[str, str]:
    """Each user's compat relayer; both hosts give the same answer."""
    answers: dict[str, str] = {}
    for user in users:
        seen = set()
        for node in deployment.nodes.values():
            while True:
                answer = requests.get(f"{node.base}/relayer/address/{user}", timeout=5)
                if answer.status_code != 429:
                    break
                time.sleep(int(answer.headers.get("Retry-After", "1")))
            assert answer.status_code == 200, answer.text
            seen.add(answer.json()["relayerAddress"])
        assert len(seen) == 1, (user, seen)
        answers[user] = seen.pop()
    return answers


def test_a_relayer_added_and_one_retired_with_traffic_flowing(deployment: Deployment) -> None:
    cluster = deployment.cluster
    relayers = [r for r in cluster.info["relayers"] if r["shard"] == SHARD]
    retiring = relayers[0]["address"]
    users = [address_of(key_in_shard(SHARD).generate_public_key().buffer).to_bech32() for _ in range(24)]
    before = rendezvous(deployment, users)

    # The new relayer: a key of the shard, funded, known to the contract as draining (never assigned).
    key = key_in_shard(SHARD)
    added = address_of(key.generate_public_key().buffer).to_bech32()
    pem = deployment.tmp / "relayer-new.pem"
    UserPEM(label=added, secret_key=key).save(pem)
    requests.post(
        f"{cluster.gateway}/localnet/faucet", json={"address": added, "egldAtto": 10 * 10**18}, timeout=5
    ).raise_for_status()
    deployment.admin("relayer-state", added, "draining")

    # A sender keeps its relayer while that stays assignable, and each sender's choice among the shard's
    # relayers is as good as random: with the added one of three, 6 senders all miss it 8.8% of the time,
    # 24 senders 0.006% of the time.
    senders = []
    for _ in range(24):
        sender = Sender(key_in_shard(SHARD))
        cluster.grant(sender.key)
        senders.append(sender)
    traffic = Traffic(deployment, senders)
    worker = threading.Thread(target=traffic.run, name="traffic", daemon=True)
    worker.start()
    try:
        wait_until(lambda: len(traffic.accepted) >= 10 or traffic.errors, "traffic flowing", 60)
        # Add: a rolling restart loads the key on each host in turn, the other serving meanwhile.
        for host_id in ("a", "b"):
            node = deployment.nodes[host_id]
            deployment.restart(node, [*node.keys, str(pem)])
            mark = len(traffic.accepted)
            wait_until(lambda m=mark: len(traffic.accepted) >= m + 5 or traffic.errors, "traffic after", 60)
        assert [e and (e["state"], e["assignable"]) for e in deployment.pool(added)] == [
            ("draining", False)
        ] * 2
        assert traffic.relays_on(added) == 0
        deployment.admin("relayer-state", added, "active")
        wait_until(
            lambda: all(e and e["assignable"] for e in deployment.pool(added)), "added is assignable", 30
        )
        active_since = time.monotonic()
        wait_until(lambda: traffic.relays_on(added, active_since) >= 3 or traffic.errors, "relays on it", 60)
        with_added = rendezvous(deployment, users)

        # Retire: draining first (no new assignments), then retired once nothing of it is in flight.
        deployment.admin("relayer-state", retiring, "draining")
        wait_until(
            lambda: all(e and e["state"] == "draining" for e in deployment.pool(retiring)),
            "draining seen",
            30,
        )
        drained_since = time.monotonic()
        wait_until(
            lambda: all(e and e["inFlightAtto"] == "0" for e in deployment.pool(retiring)),
            "no fee in flight",
            60,
        )
        deployment.admin("relayer-state", retiring, "retired")
        wait_until(
            lambda: all(e and e["state"] == "retired" for e in deployment.pool(retiring)), "retired seen", 30
        )
        mark = len(traffic.accepted)
        wait_until(lambda: len(traffic.accepted) >= mark + 10 or traffic.errors, "traffic after retiring", 60)
        after = rendezvous(deployment, users)
    finally:
        traffic.stop.set()
        worker.join(60)
    assert not traffic.errors, traffic.errors
    assert traffic.refused == [], traffic.refused  # nothing refused that a relayer could take
    # No new assignment went to the retiring relayer once both hosts saw it draining.
    assert traffic.relays_on(retiring, drained_since) == 0

    # Nothing lost: every accepted relay ended FINALIZED with success.
    base = deployment.nodes["a"].base
    for tx_hash, _ in traffic.accepted:

        def final(h: str = tx_hash) -> Any:
            answer = requests.get(f"{base}/v1/relay/{h}", timeout=5)
            if answer.status_code == 429:
                time.sleep(int(answer.headers.get("Retry-After", "1")))
                return None
            body = answer.json()
            return body if body.get("final") else None

        body = wait_until(final, f"{tx_hash} final", 60)
        assert (body["state"], body["outcome"]) == ("FINALIZED", "success"), body

    # The compat answer: adding moved only the users the new relayer wins; retiring moved exactly the
    # retired relayer's users (each to another relayer of the shard).
    assert {u for u in users if with_added[u] != before[u]} == {u for u in users if with_added[u] == added}
    moved = {u for u in users if after[u] != with_added[u]}
    assert moved == {u for u in users if with_added[u] == retiring}
    assert retiring not in after.values()

    # The operator's view: the table lists the new relayer active and the retired one, whole addresses.
    table = run("admin", "relayers", "--api", base)
    assert table.returncode == 0, table.stderr
    rows: dict[str, list[str]] = {}
    for line in table.stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].startswith("erd1"):
            rows[cells[0]] = cells
    assert rows[added][2:4] == ["active", "yes"], table.stdout
    assert rows[retiring][2:4] == ["retired", "no"], table.stdout
    print(
        f"rotation: {len(traffic.accepted)} relays accepted, {traffic.resigned} re-signed on RESIGN_REQUIRED, "
        f"{traffic.failed_over} requests sent to the other host, {traffic.relays_on(added)} assigned to the "
        f"new relayer; compat answers moved: {len(moved)} of {len(users)} on retirement"
    )
