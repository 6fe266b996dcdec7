"""Backups that restore, under load, with real processes against localnet.

A `gasless serve` host relays in a loop (several senders, consecutive nonces); `gasless admin backup` copies
its database while it serves, at a moment when some relays are co-signed and answered 202 (no gateway
acknowledged them, their shard stalls); the loop goes on after the backup; then the loop and the host stop,
`gasless admin restore` puts the backup into a new place (refusing, in one line and status 2, to write over
a database that exists), and a host is started on the restored database. Checked:

- every relay acknowledged before the backup started is FINALIZED on the restored host;
- every relay co-signed after the snapshot is recovered from the chain (FINALIZED too, listed by
  `gasless admin restore-report`), and none of those acknowledged before the backup is listed as recovered;
- nothing was sent again by the restored host (localnet's count of sends of each hash did not move: the
  snapshot's co-signed intents were found on the chain), nothing was co-signed twice (every hash ever sent to
  localnet is a transaction it accepted, exactly one per (sender, nonce), the one acknowledged), and the same
  bytes sent again are answered `duplicate: true`;
- the restored host relays the senders' next nonces;
- the database the backup was taken from is retired: a host started on it again never co-signs.

Once on SQLite, once on PostgreSQL (pg_dump / pg_restore). And with the source left as it was and its host
still relaying, the restored host stays unready, signing nothing, until that host stops. And with settlement
running every second: the batches the old host settled after the backup are found on the contract by the
restored host's first start, which settles no usage row a second time.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import process_kit  # type: ignore[import-not-found]
import pytest
import requests
from multiversx_sdk import Transaction, TransactionComputer, UserSecretKey
from process_kit import error_line, free_port, reap  # type: ignore[import-not-found]
from relay_kit import MASTER_SECRET, key_in_shard  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of, parse_address
from gasless.localnet.owner import owner_call
from gasless.relay.checks import presence_message

_computer = TransactionComputer()
# process_kit's, waiting up to 60 s here (backups, restores, a first start's reconciliation, settlement).
wait_until = functools.partial(process_kit.wait_until, timeout=60.0)
SENDER_SHARDS = (0, 1, 2, 1)
BEFORE, AFTER = 25, 25  # relays acknowledged before the backup starts / after it is taken, at least


def host_env(
    localnet: Any, database_url: str, data_dir: Path, port: int, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GASLESS_") or k.endswith("_PORT")}
    info = localnet.net.info
    env.update(
        {
            "GASLESS_PROFILE": "localnet",
            "GASLESS_HOST_ID": "a",
            "GASLESS_MASTER_SECRET": MASTER_SECRET,
            "GASLESS_GATEWAY_URLS": json.dumps(localnet.urls),
            "GASLESS_DATABASE_URL": database_url,
            "GASLESS_DATA_DIR": str(data_dir),
            "GASLESS_CONTRACT_ADDRESS": info["contract"],
            "GASLESS_PAIR_ADDRESS": info["pair"],
            "GASLESS_WRAPPER_ADDRESS": info["wrapper"],
            "GASLESS_RELAYER_KEY_FILES": json.dumps([str(w.path) for w in localnet.net.genesis.relayers]),
            "GASLESS_API_BASE_URL": f"http://127.0.0.1:{port}",
            "GASLESS_METRICS_PORT": "0",
            "GASLESS_SIGNER_FENCE_TTL_MS": "1000",
            **(extra or {}),
        }
    )
    return env


@dataclass
class Host:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.base}{path}", timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        reap(self.proc)


def start_host(
    localnet: Any,
    database_url: str,
    tmp: Path,
    name: str,
    *,
    ready: bool = True,
    extra: dict[str, str] | None = None,
) -> Host:
    port = free_port()
    log = tmp / f"host-{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)],
            env=host_env(localnet, database_url, tmp / f"data-{name}", port, extra),
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )
    host = Host(f"http://127.0.0.1:{port}", proc, log)
    try:
        wanted = "/readyz" if ready else "/healthz"
        wait_until(lambda: host.get(wanted).status_code == 200, f"host {name} {wanted}", proc=proc, log=log)
    except BaseException:
        host.stop()
        raise
    return host


def gasless(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GASLESS_") or k.endswith("_PORT")}
    env.update({"GASLESS_PROFILE": "localnet", "NO_COLOR": "1"})
    return subprocess.run(
        [sys.executable, "-m", "gasless.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def last_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, f"status {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@dataclass
class Ack:
    sender: str
    nonce: int
    tx_hash: str
    at: float  # time.monotonic() of the answer
    body: dict[str, Any]  # what was relayed (the same bytes can be sent again)
    state: str  # as answered: COSIGNED (202) or BROADCAST (200)
    cosigned_at_ms: int  # the commit point's time (the service's clock)


@dataclass
class Load:
    """One thread per sender relaying consecutive nonces through `base` until stopped."""

    keys: list[UserSecretKey]
    base: str = ""
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    next_nonce: dict[str, int] = field(default_factory=dict)

    def start(self, base: str) -> None:
        self.base = base
        self.stop.clear()
        self.threads = [threading.Thread(target=self._run, args=(key,), daemon=True) for key in self.keys]
        for thread in self.threads:
            thread.start()

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def count(self, after: float = 0.0) -> int:
        return sum(1 for ack in list(self.acks) if ack.at > after)

    def cosigned_after(self, ms: int) -> int:
        return sum(1 for ack in list(self.acks) if ack.cosigned_at_ms > ms)

    def _run(self, key: UserSecretKey) -> None:
        sender = address_of(key.generate_public_key().buffer).to_bech32()
        session = requests.Session()
        nonce = self.next_nonce.get(sender, 0)
        try:
            assignment = assign(session, self.base, key, sender)
            while not self.stop.is_set():
                body = {
                    "tx": signed(key, assignment["relayer"], nonce).to_dictionary(),
                    "lease": assignment["lease"],
                }
                answer = relay_until_accepted(session, self.base, body, self.stop)
                if answer is None:
                    break
                if answer.status_code not in (200, 202):
                    self.errors.append(f"{sender}:{nonce}: {answer.status_code} {answer.text}")
                    break
                doc = answer.json()
                at = time.monotonic()
                cosigned = int(doc["intent"]["cosignedAtMs"])
                self.acks.append(Ack(sender, nonce, doc["txHash"], at, body, doc["state"], cosigned))
                nonce += 1
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{sender}: {exc!r}")
        finally:
            self.next_nonce[sender] = nonce


def assign(session: requests.Session, base: str, key: UserSecretKey, sender: str) -> dict[str, Any]:
    # A retryable refusal (the clock or the signer not ready yet on a loaded machine) is asked again, as a
    # client would, with a fresh proof: the same request passes once the host is ready.
    deadline = time.monotonic() + 60
    while True:
        now = int(time.time() * 1000)
        proof = {
            "kind": "key",
            "serverTimeMs": now,
            "signature": key.sign(presence_message("localnet", sender, now)).hex(),
        }
        answer = session.post(f"{base}/v1/relay/assign", json={"sender": sender, "proof": proof}, timeout=10)
        if answer.status_code == 200 or not _retryable(answer) or time.monotonic() > deadline:
            break
        time.sleep(max(0.05, (answer.json().get("details") or {}).get("retryAfterMs", 100) / 1000))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _retryable(answer: requests.Response) -> bool:
    return (
        answer.status_code in (429, 503)
        and answer.headers.get("content-type", "").startswith("application/problem+json")
        and bool(answer.json().get("retryable"))
    )


def signed(key: UserSecretKey, relayer: str, nonce: int) -> Transaction:
    tx = Transaction(
        sender=address_of(key.generate_public_key().buffer),
        receiver=address_of(key_in_shard(1).generate_public_key().buffer),
        gas_limit=100_000,
        chain_id="localnet",
        nonce=nonce,
        version=2,
        relayer=parse_address(relayer),
    )
    tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
    return tx


def relay_until_accepted(
    session: requests.Session, base: str, body: dict[str, Any], stop: threading.Event
) -> requests.Response | None:
    """The same bytes until an answer that is not a retryable refusal (rate limits under the load)."""
    while True:
        answer = session.post(f"{base}/v1/relay", json=body, timeout=15)
        if _retryable(answer):
            if stop.is_set():
                return None
            time.sleep(max(0.05, (answer.json().get("details") or {}).get("retryAfterMs", 100) / 1000))
            continue
        return answer


def final_states(host: Host, hashes: list[str], timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """Each intent once FINALIZED on `host` (an assertion error names those that are not)."""
    found: dict[str, dict[str, Any]] = {}

    def all_final() -> bool:
        for tx_hash in hashes:
            if tx_hash not in found:
                answer = host.get(f"/v1/relay/{tx_hash}")
                if answer.status_code == 429:  # the read limit: poll within it
                    time.sleep(int(answer.headers.get("Retry-After", "1")))
                    return False
                if answer.status_code == 200 and answer.json()["state"] == "FINALIZED":
                    found[tx_hash] = answer.json()
        time.sleep(0.2)
        return len(found) == len(hashes)

    try:
        wait_until(all_final, "every intent FINALIZED", timeout=timeout)
    except AssertionError:
        missing = {h: host.get(f"/v1/relay/{h}").text[:300] for h in hashes if h not in found}
        raise AssertionError(
            f"{len(missing)} of {len(hashes)} not FINALIZED: {list(missing.items())[:5]}"
        ) from None
    return found


def faults(localnet: Any, body: dict[str, Any]) -> None:
    requests.post(f"{localnet.url}/localnet/faults", json=body, timeout=5).raise_for_status()


def grant(localnet: Any, key: UserSecretKey) -> None:
    address = address_of(key.generate_public_key().buffer)
    asyncio.run(
        owner_call(
            localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"], "grant", [address, 3, 1]
        )
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(the serving database's URL, the restore target's URL, the restore's target options)."""
    if request.param == "sqlite":
        yield (
            f"sqlite+aiosqlite:///{(tmp_path / 'old' / 'gasless.db').as_posix()}",
            f"sqlite+aiosqlite:///{(tmp_path / 'new' / 'gasless.db').resolve().as_posix()}",
            ["--data-dir", str(tmp_path / "new")],
        )
        return
    if not (shutil.which("pg_dump") and shutil.which("pg_restore")):
        pytest.skip("PostgreSQL BACKUP TEST SKIPPED: pg_dump / pg_restore not installed (postgresql-client)")
    old = request.getfixturevalue("postgres_url")
    new = f"{old}_restored"  # a database that does not exist yet: the restore creates it
    try:
        yield old, new, ["--database-url", new]
    finally:
        asyncio.run(drop_database(old, new.rsplit("/", 1)[1]))


async def drop_database(url: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def test_a_backup_taken_under_load_restores_with_nothing_lost_and_nothing_cosigned_twice(
    tmp_path: Path, unpaused_localnet: Any, databases: tuple[str, str, list[str]]
) -> None:
    localnet = unpaused_localnet
    old_url, new_url, target = databases
    if old_url.startswith("sqlite"):
        (tmp_path / "old").mkdir()
    keys = [key_in_shard(shard) for shard in SENDER_SHARDS]
    for key in keys:
        grant(localnet, key)
    load = Load(keys)
    host = start_host(localnet, old_url, tmp_path, "old")
    try:
        load.start(host.base)
        wait_until(lambda: load.count() >= BEFORE or load.errors, f"{BEFORE} relays acknowledged")
        # Some relays co-signed and not acknowledged by any gateway when the snapshot is taken (202, stored
        # COSIGNED), and not executed either (their shard stalls): by the restore the chain has executed them,
        # and the restored host must not send them again.
        faults(localnet, {"gateway": {"dropAcks": -1, "ackHangMs": 1500}, "chain": {"stalledShards": [0]}})
        unacked_from, stalled = time.monotonic(), address_of(keys[0].generate_public_key().buffer).to_bech32()

        def unacknowledged() -> int:
            return sum(
                a.state == "COSIGNED" and a.sender == stalled for a in load.acks if a.at > unacked_from
            )

        wait_until(lambda: unacknowledged() >= 2 or load.errors, "relays answered 202, not executed")
        backup_started = time.monotonic()
        manifest = last_json(
            gasless("admin", "backup", "--to", str(tmp_path / "backup"), "--database-url", old_url)
        )
        backup_done = time.monotonic()
        requests.delete(f"{localnet.url}/localnet/faults", timeout=5).raise_for_status()
        again = gasless("admin", "backup", "--to", str(tmp_path / "backup"), "--database-url", old_url)
        assert again.returncode == 2 and "not an empty directory" in error_line(again)
        # After the backup: co-signed once the snapshot was complete (an answer can come up to 800 ms after
        # its commit point, so the answer's time does not tell).
        snapshot_done_ms = int(manifest["completedAtMs"])
        wait_until(
            lambda: load.cosigned_after(snapshot_done_ms) >= AFTER or load.errors,
            f"{AFTER} relays after the backup",
        )
        load.halt()
        assert not load.errors, load.errors
        acks = list(load.acks)
        before = [ack for ack in acks if ack.at < backup_started]
        after = [ack for ack in acks if ack.cosigned_at_ms > snapshot_done_ms]
        assert len(before) >= BEFORE and len(after) >= AFTER
        assert backup_done > backup_started
        # Everything settled on the chain before the host stops: the counts below are final.
        final_states(host, [ack.tx_hash for ack in acks])
    finally:
        load.halt()
        host.stop()
    assert manifest["kind"] == ("sqlite" if old_url.startswith("sqlite") else "postgresql")
    assert manifest["chain"]["finalHyperblock"] > 0 and manifest["intents"]["total"] >= len(before)
    sends_before = localnet.call(lambda: dict(localnet.net.chain.submissions))

    # Restore: never over a database that exists (the served one, or the restored one a second time).
    refused = gasless("admin", "restore", "--from", str(tmp_path / "backup"), "--database-url", old_url)
    assert refused.returncode == 2 and "restore refused" in error_line(refused), refused.stderr
    marker = last_json(gasless("admin", "restore", "--from", str(tmp_path / "backup"), *target))
    assert marker["state"] == "pending" and marker["sourceFence"]["state"] == "retired", marker
    again = gasless("admin", "restore", "--from", str(tmp_path / "backup"), *target)
    assert again.returncode == 2 and "never writes over a database" in error_line(again)

    restored = start_host(localnet, new_url, tmp_path, "restored")
    try:
        states = final_states(restored, [ack.tx_hash for ack in acks])
        assert {doc["outcome"] for doc in states.values()} == {"success"}
        # Nothing sent again: the chain's count of sends of each hash did not move with the restore.
        sends_after = localnet.call(lambda: dict(localnet.net.chain.submissions))
        moved = {h: (sends_before.get(h), n) for h, n in sends_after.items() if sends_before.get(h) != n}
        assert moved == {}, f"sent again after the restore: {list(moved.items())[:5]}"
        # Nothing co-signed twice: every hash ever sent is a transaction the chain took, one per (sender, nonce).
        slots = localnet.call(
            lambda: {
                h: (record.tx.sender.to_bech32(), record.tx.nonce)
                for h, record in localnet.net.chain.records.items()
                if h in sends_after
            }
        )
        ours = {ack.sender for ack in acks}
        assert not [h for h in sends_after if h not in slots], (
            "a send the chain refused: a second co-signature?"
        )
        by_slot: dict[tuple[str, int], list[str]] = {}
        for h, slot in slots.items():
            if slot[0] in ours:
                by_slot.setdefault(slot, []).append(h)
        assert {slot: hashes for slot, hashes in by_slot.items() if len(hashes) > 1} == {}
        assert {slot: hashes[0] for slot, hashes in by_slot.items()} == {
            (ack.sender, ack.nonce): ack.tx_hash for ack in acks
        }

        report = last_json(gasless("admin", "restore-report", "--database-url", new_url))
        assert report["restore"]["state"] == "reconciled", report["restore"]
        assert report["restore"]["cosignedFoundOnChain"] >= 1, report["restore"]
        recovered = {row["tx_hash"] for row in report["recovered"]}
        assert {ack.tx_hash for ack in after} <= recovered, (
            "a relay acknowledged after the backup was not recovered"
        )
        assert not recovered & {ack.tx_hash for ack in before}, "a relay of the backup was recovered again"
        assert report["restore"]["notRebuilt"] == []

        # The same bytes again: the stored answer, nothing signed (a relay after the backup, recovered).
        replay = requests.post(f"{restored.base}/v1/relay", json=after[-1].body, timeout=10)
        assert replay.status_code == 200, replay.text
        assert replay.json()["duplicate"] is True and replay.json()["txHash"] == after[-1].tx_hash
        # And relaying goes on with each sender's next nonce.
        load.start(restored.base)
        wait_until(
            lambda: len(load.acks) >= len(acks) + 2 * len(keys) or load.errors, "relays on the restored host"
        )
        load.halt()
        assert not load.errors, load.errors
        final_states(restored, [ack.tx_hash for ack in load.acks[len(acks) :]])
    finally:
        load.halt()
        restored.stop()

    # The database the backup was taken from is retired: a host on it never co-signs again.
    revived = start_host(localnet, old_url, tmp_path, "revived", ready=False)
    try:
        readiness = wait_until(
            lambda: (doc := revived.get("/readyz").json())["checks"].get("restore") == "ok" and doc,
            "the revived host restored its state",
        )
        assert readiness["checks"]["signer"] != "ok", readiness
        assert revived.get("/readyz").status_code == 503
    finally:
        revived.stop()


def test_a_restored_host_does_not_cosign_while_a_host_of_the_source_still_does(
    tmp_path: Path, unpaused_localnet: Any
) -> None:
    """The source left as it was (`--leave-source`, or a source the restore could not reach) and its host
    still relaying: the restored host sees co-signatures by our relayers that its database does not know
    and stays unready, signing nothing, until that host stops; then it recovers them all and serves."""
    localnet = unpaused_localnet
    (tmp_path / "old").mkdir()
    old_url = f"sqlite+aiosqlite:///{(tmp_path / 'old' / 'gasless.db').as_posix()}"
    new_url = f"sqlite+aiosqlite:///{(tmp_path / 'new' / 'gasless.db').resolve().as_posix()}"
    keys = [key_in_shard(shard) for shard in (0, 1)]
    for key in keys:
        grant(localnet, key)
    load = Load(keys)
    host = start_host(localnet, old_url, tmp_path, "old")
    restored: Host | None = None
    try:
        load.start(host.base)
        wait_until(lambda: load.count() >= 10 or load.errors, "relays acknowledged")
        last_json(gasless("admin", "backup", "--to", str(tmp_path / "backup"), "--database-url", old_url))
        marker = last_json(
            gasless(
                "admin", "restore", "--from", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "new"),
                "--leave-source",
            )
        )  # fmt: skip
        assert marker["sourceFence"]["state"] == "left"
        restored = start_host(localnet, new_url, tmp_path, "restored", ready=False)

        def refuses_while_relaying() -> bool:
            answer = restored.get("/readyz")
            assert answer.status_code == 503, f"ready while another host co-signs: {answer.text}"
            return "still co-signs" in answer.json()["checks"]["restore"]

        wait_until(refuses_while_relaying, "the restored host names the other co-signer")
        # It stays so as long as the old host relays (a few more relays, checked unready after each).
        seen = len(load.acks)
        wait_until(
            lambda: refuses_while_relaying() and len(load.acks) >= seen + 10, "more relays on the old host"
        )
        load.halt()
        assert not load.errors, load.errors
        acks = list(load.acks)
    finally:
        load.halt()
        host.stop()
    try:
        assert restored is not None
        wait_until(lambda: restored.get("/readyz").status_code == 200, "the restored host ready once quiet")
        final_states(restored, [ack.tx_hash for ack in acks])
        report = last_json(gasless("admin", "restore-report", "--database-url", new_url))
        assert report["restore"]["state"] == "reconciled" and report["restore"]["notRebuilt"] == []
        assert len(report["recovered"]) >= 10
    finally:
        if restored is not None:
            restored.stop()


# Settlement across a restore -------------------------------------------------------------------------------
def contract_settlements(localnet: Any) -> dict[int, dict[str, Any]]:
    """The batches the billing contract holds (localnet's snapshot of its storage), by id."""
    snapshot = requests.get(f"{localnet.url}/localnet/snapshot", timeout=10).json()["data"]
    state = snapshot["accounts"][localnet.net.info["contract"]]["contract"]["state"]
    return {int(batch["batch_id"]): batch for batch in state["settlements"]}


def batch_rows(database_url: str) -> tuple[dict[int, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(settlement_batches by id, the batched usage rows by tx hash) of a service database."""
    from gasless.db import create_engine, settlement_batches, usage_ledger

    async def read() -> tuple[dict[int, dict[str, Any]], dict[str, dict[str, Any]]]:
        engine = create_engine(database_url)
        try:
            async with engine.connect() as conn:
                batches = (await conn.execute(settlement_batches.select())).all()
                rows = (
                    await conn.execute(usage_ledger.select().where(usage_ledger.c.batch_id.is_not(None)))
                ).all()
        finally:
            await engine.dispose()
        return (
            {int(b.batch_id): dict(b._mapping) for b in batches},
            {str(r.tx_hash): dict(r._mapping) for r in rows},
        )

    return asyncio.run(read())


def test_settlement_batches_landed_after_the_backup_are_never_settled_again(
    tmp_path: Path, unpaused_localnet: Any, databases: tuple[str, str, list[str]]
) -> None:
    """Settlement running every second under a relay loop: the backup is taken, the old host settles at
    least one more batch with usage rows, stops; the restore's first start reads those batches from the
    contract before its settlement worker builds anything, marks what it can match and holds what it cannot.
    On the contract, every usage row is settled once (the old host's batches and the restored host's are
    disjoint, each batch's count and RU are its rows'), the numbering goes on after the old host's last
    batch, and `gasless admin restore-report` says what was found."""
    localnet = unpaused_localnet
    old_url, new_url, target = databases
    if old_url.startswith("sqlite"):
        (tmp_path / "old").mkdir()
    settling = {
        "GASLESS_OWNER_KEY_FILE": str(localnet.net.genesis.owner.path),
        "GASLESS_SETTLEMENT_INTERVAL_MS": "1000",
    }
    keys = [key_in_shard(shard) for shard in (0, 1, 2)]
    for key in keys:
        grant(localnet, key)
    load = Load(keys)
    host = start_host(localnet, old_url, tmp_path, "old", extra=settling)
    try:
        load.start(host.base)
        wait_until(
            lambda: (
                load.count() >= 15 and any(b["row_count"] for b in contract_settlements(localnet).values())
            ),
            "relays settled before the backup",
        )
        manifest = last_json(
            gasless("admin", "backup", "--to", str(tmp_path / "backup"), "--database-url", old_url)
        )
        last_at_backup = int(manifest["settlement"]["lastBatch"])
        assert last_at_backup >= 1, manifest
        # At least one batch with usage rows lands after the snapshot, settled by the old host.
        wait_until(
            lambda: (
                any(b > last_at_backup and s["row_count"] for b, s in contract_settlements(localnet).items())
                or load.errors
            ),
            "a batch with usage rows settled after the backup",
        )
        load.halt()
        assert not load.errors, load.errors
        acks = list(load.acks)
        final_states(host, [ack.tx_hash for ack in acks])
    finally:
        load.halt()
        host.stop()
    # What the old host sent lands within a few rounds: the contract's batches once stable.
    settled_before: dict[int, dict[str, Any]] = {}

    def stable() -> bool:
        nonlocal settled_before
        now = contract_settlements(localnet)
        same, settled_before = now == settled_before, now
        time.sleep(0.5)
        return same

    wait_until(stable, "the old host's batches landed")
    old_batches, old_rows = batch_rows(old_url)
    beyond = sorted(b for b in settled_before if b > last_at_backup)
    assert beyond, settled_before

    marker = last_json(gasless("admin", "restore", "--from", str(tmp_path / "backup"), *target))
    assert marker["lastBatchAtBackup"] == last_at_backup, marker
    restored = start_host(localnet, new_url, tmp_path, "restored", extra=settling)
    try:
        load.start(restored.base)
        wait_until(lambda: len(load.acks) >= len(acks) + 2 * len(keys) or load.errors, "relays after restore")
        load.halt()
        assert not load.errors, load.errors
        fresh = [ack.tx_hash for ack in load.acks[len(acks) :]]
        final_states(restored, fresh)

        def fresh_settled() -> bool:
            _, rows = batch_rows(new_url)
            on_chain = contract_settlements(localnet)
            return all(h in rows and int(rows[h]["batch_id"]) in on_chain for h in fresh)

        wait_until(fresh_settled, "the restored host's relays settled on chain")
        report = last_json(gasless("admin", "restore-report", "--database-url", new_url))
    finally:
        load.halt()
        restored.stop()

    # The report names every batch the old host settled after the backup, matched or held.
    section = report["restore"]["settlement"]
    assert section["lastBatchAtBackup"] == last_at_backup
    assert [b["batchId"] for b in section["onChain"]] == beyond, section
    assert sorted(section["matched"] + section["unmatched"]) == beyond, section
    if section["unmatched"]:
        assert section["hold"]["batches"] == section["unmatched"], section
        # Every row held at reconciliation is still held (intents in flight at the backup may add more).
        assert len(report["held"]) >= section["heldRowsAtReconciliation"], (report["held"], section)
    else:
        assert section["hold"] is None and report["held"] == []
    # The restored host numbered its batches after the old host's, and none was refused or failed.
    new_batches, new_rows = batch_rows(new_url)
    assert {b for b, batch in new_batches.items() if batch["state"] == "failed"} == set(), new_batches
    restored_built = sorted(b for b in new_batches if b > max(beyond))
    assert restored_built and restored_built[0] == max(beyond) + 1, (beyond, sorted(new_batches))
    # Every usage row settled once: the old host's batches (as its database built them) and the restored
    # host's (as the restored database built them) hold no row in common.
    chain = contract_settlements(localnet)
    settled_by: dict[str, list[int]] = {}
    rows_of: dict[int, list[dict[str, Any]]] = {}
    for tx_hash, row in old_rows.items():
        if int(row["batch_id"]) in settled_before:
            settled_by.setdefault(tx_hash, []).append(int(row["batch_id"]))
            rows_of.setdefault(int(row["batch_id"]), []).append(row)
    for tx_hash, row in new_rows.items():
        if int(row["batch_id"]) > max(beyond):
            settled_by.setdefault(tx_hash, []).append(int(row["batch_id"]))
            rows_of.setdefault(int(row["batch_id"]), []).append(row)
        elif int(row["batch_id"]) in section["matched"]:  # marked by the reconciliation: the old host's
            assert settled_by.get(tx_hash) == [int(row["batch_id"])], (tx_hash, row["batch_id"])
    assert {h: ids for h, ids in settled_by.items() if len(ids) > 1} == {}
    assert not set(report_held := {row["tx_hash"] for row in report["held"]}) & {
        h for h, row in new_rows.items() if int(row["batch_id"]) > max(beyond)
    }, report_held
    # Totals: each batch on chain counts exactly its rows, and its RU is theirs.
    for batch_id, batch in chain.items():
        if batch_id in old_batches and batch_id <= max(beyond) or batch_id in restored_built:
            rows = rows_of.get(batch_id, [])
            assert (batch["row_count"], batch["total_ru"]) == (
                len(rows),
                sum(int(r["ru"] or 0) for r in rows),
            ), (batch_id, batch)
    assert sum(b["row_count"] for b in chain.values() if b["batch_id"] in rows_of) == len(settled_by)
