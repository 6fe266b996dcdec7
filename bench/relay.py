"""Relay throughput and latency: N relays from M senders through the real API against localnet.

Starts `gasless localnet` and `gasless serve` (SQLite, the embedded default's storage) as separate
processes, grants a plan to M fresh senders, assigns once per sender and pre-signs every transaction (the
client's work is not measured), then:

1. max: posts all of them at a high concurrency and reports relays/s;
2. paced: posts a second set open-loop at 50% of the measured maximum (`--paced-share`) and reports the
   latency figures the service stamps on each intent (acceptToCosignMs, addedMs) at p50/p95/p99.

For both it also reports the CPU time the API process(es) used per relay (from /proc).

In the same run it measures the floor: the bare cost of the same per-relay work in a tight loop in one
process (verify the sender signature, co-sign, hash, one durable insert), once before and once after the
runs (the ratio uses their mean: this shared VM's speed drifts by up to 2x within minutes).

With `--database-url` (PostgreSQL) the service runs on a fresh database made for the run, and the floor's
insert is a durable single-row PostgreSQL transaction too; `--hosts 2 --redis-url ...` starts hosts `a`
and `b` as two processes sharing it, each sender sticking to one host. `--workers N` serves the one host
as `gasless serve --workers N` (N API processes on one port; their CPU is counted with the parent's), and
`--scaling` runs the same host with 1 worker, then with N, in one invocation, and prints the ratio of their
maxima (issue 17, target 5: at least 1.6x with 2 workers when localnet and the load generator run on other
cores: `--api-cpus` and `--other-cpus` pin them, and every run prints the cores each process may use).

    .venv/bin/python bench/relay.py --senders 40 --per-sender 30 --concurrency 40
    .venv/bin/python bench/relay.py --hosts 2 --database-url postgresql+asyncpg://postgres@127.0.0.1/postgres \
        --redis-url redis://127.0.0.1:6379/14
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from multiversx_sdk import Transaction, TransactionComputer, UserPEM, UserSecretKey
from rich.table import Table

from gasless.chain.abi import load_billing_abi
from gasless.chain.addresses import address_of, parse_address, shard_of
from gasless.chain.calls import contract_call
from gasless.chain.codec import signing_bytes, tx_hash, verify_ed25519
from gasless.cli.output import CliConsole
from gasless.relay.checks import presence_message

ROOT = Path(__file__).resolve().parent.parent
HOST_IDS = ("a", "b")
SECRET = "bench-master-secret-0123456789abcdef0123456789"
computer = TransactionComputer()
console = CliConsole()  # never cut when not a terminal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


async def wait_ok(session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


async def wait_workers_ready(
    session: aiohttp.ClientSession, api: str, workers: int, timeout: float = 120
) -> None:
    """Until `workers` distinct boot epochs answered /readyz 200 (each on a fresh connection)."""
    deadline = time.monotonic() + timeout
    ready: set[int] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"{api}/readyz", headers={"Connection": "close"}) as resp:
                if resp.status == 200:
                    ready.add(int((await resp.json())["bootEpochMs"]))
        if len(ready) >= workers:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{api}: {len(ready)} of {workers} workers ready")


async def grant_plans(
    session: aiohttp.ClientSession, gateway: str, info: dict[str, Any], senders: list[Any]
) -> None:
    """The owner grants a plan to every sender: consecutive nonces, sent in batches (the pool holds a bounded
    number of one sender's transactions), each batch awaited."""
    owner = UserPEM.from_file(Path(info["ownerPem"])).secret_key
    owner_address = address_of(owner.generate_public_key().buffer)
    async with session.get(f"{gateway}/address/{owner_address.to_bech32()}/nonce") as resp:
        nonce = (await resp.json())["data"]["nonce"]
    abi = load_billing_abi()
    for first in range(0, len(senders), 50):
        hashes = []
        for i, key in enumerate(senders[first : first + 50], start=first):
            tx = contract_call(
                abi=abi,
                chain_id="localnet",
                sender=owner_address,
                contract=parse_address(info["contract"]),
                function="grant",
                arguments=[address_of(key.generate_public_key().buffer), 5, 1],
                gas_limit=20_000_000,
                nonce=nonce + i,
            )
            tx.signature = owner.sign(computer.compute_bytes_for_signing(tx))
            async with session.post(f"{gateway}/transaction/send", json=tx.to_dictionary()) as resp:
                answer = await resp.json()
            if not (answer.get("data") or {}).get("txHash"):
                raise RuntimeError(f"grant refused: {answer}")
            hashes.append(answer["data"]["txHash"])
        for h in hashes:
            while True:
                async with session.get(f"{gateway}/transaction/{h}/status") as resp:
                    status = (await resp.json())["data"]["status"]
                if status == "success":
                    break
                if status in ("fail", "invalid"):
                    raise RuntimeError(f"grant failed: {status}")
                await asyncio.sleep(0.1)


def same_shard_receiver(sender: Any) -> Any:
    """A fresh receiver in the sender's shard: issue 17's target 3 (inclusion in the next block) is about
    same-shard transfers; a cross-shard one completes a round later by the protocol's design."""
    while True:
        receiver = address_of(UserSecretKey.generate().generate_public_key().buffer)
        if shard_of(receiver) == shard_of(sender):
            return receiver


async def assign(session: aiohttp.ClientSession, api: str, key: UserSecretKey) -> dict[str, Any]:
    """An assignment for `key`'s address, proven by a presence signature; a 429 waits as told."""
    sender = address_of(key.generate_public_key().buffer).to_bech32()
    server_time_ms: int | None = None
    while True:  # assignments are limited to 10/s per IP: honour Retry-After
        now = server_time_ms or int(time.time() * 1000)
        proof = {
            "kind": "key",
            "serverTimeMs": now,
            "signature": key.sign(presence_message("localnet", sender, now)).hex(),
        }
        async with session.post(f"{api}/v1/relay/assign", json={"sender": sender, "proof": proof}) as resp:
            assignment = await resp.json()
        if resp.status == 429:
            await asyncio.sleep(assignment["details"]["retryAfterMs"] / 1000)
            continue
        if assignment.get("code") == "ASSIGN_PROOF_INVALID" and server_time_ms is None:
            # A server on another clock (bench/instructions.py slows it): sign its own time, as a
            # client does with the serverTimeMs the refusal carries.
            server_time_ms = assignment["details"]["serverTimeMs"]
            continue
        if resp.status != 200:
            raise RuntimeError(f"assign failed: {assignment}")
        return assignment


async def prepare(
    session: aiohttp.ClientSession,
    apis: list[str],
    senders: list[UserSecretKey],
    per_sender: int,
    start_nonce: int,
) -> list[tuple[str, dict[str, Any]]]:
    """Pre-signed bodies, each with the host it goes to: a sender sticks to one host (as a load balancer
    with sender affinity would route it), senders spread over the hosts in turn."""
    bodies = []
    for index, key in enumerate(senders):
        api = apis[index % len(apis)]
        sender = address_of(key.generate_public_key().buffer)
        assignment = await assign(session, api, key)
        receiver = same_shard_receiver(sender)
        for n in range(start_nonce, start_nonce + per_sender):
            tx = Transaction(
                sender=sender,
                receiver=receiver,
                gas_limit=100_000,
                chain_id="localnet",
                nonce=n,
                version=2,
                relayer=parse_address(assignment["relayer"]),
            )
            tx.signature = key.sign(computer.compute_bytes_for_signing(tx))
            bodies.append((api, {"tx": tx.to_dictionary(), "lease": assignment["lease"]}))
    # Interleave senders so consecutive requests come from different senders, as real traffic does.
    return [bodies[s * per_sender + i] for i in range(per_sender) for s in range(len(senders))]


async def post_all(
    session: aiohttp.ClientSession,
    bodies: list[tuple[str, dict[str, Any]]],
    concurrency: int,
    rate: float | None,
    path: str = "/v1/relay",
    arrivals: str = "periodic",
) -> tuple[float, list[dict[str, Any]]]:
    """One stream per sender (a wallet sends its nonces in order); `concurrency` senders at a time.

    With `rate`, request i is due at start + its offset in `arrival_offsets` (open loop); a stream waits
    for its request's slot.
    """
    due = arrival_offsets(len(bodies), rate, arrivals) if rate is not None else []
    streams: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
    for index, (api, body) in enumerate(bodies):
        streams.setdefault(body.get("tx", body)["sender"], []).append((index, api, body))
    queue: asyncio.Queue[list[tuple[int, str, dict[str, Any]]]] = asyncio.Queue()
    for stream in streams.values():
        queue.put_nowait(stream)
    results: list[dict[str, Any]] = []
    start = time.monotonic()

    async def worker() -> None:
        while True:
            try:
                stream = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            for index, api, body in stream:
                if rate is not None:
                    delay = start + due[index] - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                sent_at_ms, sent = int(time.time() * 1000), time.monotonic()
                async with session.post(f"{api}{path}", json=body) as resp:
                    answer = await resp.json()
                    answered_ms = (time.monotonic() - sent) * 1000
                    results.append(
                        {"status": resp.status, "sentAtMs": sent_at_ms, "answeredMs": answered_ms, **answer}
                    )

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - start, results


ARRIVALS_SEED = 39  # the same Poisson schedule in every run and for the chain's floor


def arrival_offsets(count: int, rate: float, arrivals: str) -> list[float]:
    """When each of `count` requests is due, in seconds from the start, at `rate` a second on average.

    "periodic": every 1 / rate. At 110/s with 600 ms rounds that is exactly 66 a round, each round's
    arrivals at the same offsets from its start: whether one of them falls in the few milliseconds before
    the round's block closes (and waits a second round) is decided by the run's starting phase, for every
    round of the run alike. "poisson": independent arrivals, as users arrive, each relay's place in its
    round uniform and bursts queueing as they would: a Poisson process given its count over the run's span
    (count / rate), which is that many uniform instants in order (a fixed seed: the same in every run)."""
    if arrivals == "periodic":
        return [index / rate for index in range(count)]
    draw = random.Random(ARRIVALS_SEED)
    return sorted(draw.uniform(0, count / rate) for _ in range(count))


def floor_transactions(count: int, relayer: UserSecretKey) -> tuple[UserSecretKey, Any, list[Transaction]]:
    """`count` sender-signed transactions for the floor's loop (built before the clock starts)."""
    key = UserSecretKey.generate()
    sender = address_of(key.generate_public_key().buffer)
    relayer_address = address_of(relayer.generate_public_key().buffer)
    txs = []
    for n in range(count):
        tx = Transaction(
            sender=sender,
            receiver=sender,
            gas_limit=100_000,
            chain_id="localnet",
            nonce=n,
            version=2,
            relayer=relayer_address,
        )
        tx.signature = key.sign(computer.compute_bytes_for_signing(tx))
        txs.append(tx)
    return key, sender, txs


def cosign_for_floor(tx: Transaction, relayer: UserSecretKey, pubkey: bytes) -> tuple[str, str]:
    """The floor's work before its insert: verify the sender's signature, co-sign, hash. Returns the hash
    and the wire JSON to store."""
    message = signing_bytes(tx)
    assert verify_ed25519(pubkey, message, tx.signature)
    tx.relayer_signature = relayer.sign(message)
    return tx_hash(tx), json.dumps(tx.to_dictionary())


def floor(count: int, relayer: UserSecretKey, counter: InstructionCount | None = None) -> float:
    """Verify the sender signature, co-sign, hash, one durable insert: per relay, in a tight loop. With a
    `counter` (of this process), the instructions of the loop alone are counted."""
    key, sender, txs = floor_transactions(count, relayer)
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "floor.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE intents (tx_hash TEXT PRIMARY KEY, sender TEXT, nonce INTEGER, tx TEXT)")
        pubkey = sender.get_public_key()
        if counter is not None:
            counter.start()
        start = time.perf_counter()
        for tx in txs:
            h, wire = cosign_for_floor(tx, relayer, pubkey)
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO intents VALUES (?, ?, ?, ?)", (h, sender.to_bech32(), tx.nonce, wire))
            db.execute("COMMIT")
        elapsed = time.perf_counter() - start
        if counter is not None:
            counter.total = counter.stop()
        db.close()
    return count / elapsed


async def ready_localnet(session: aiohttp.ClientSession, gateway: str, data_dir: Path) -> dict[str, Any]:
    """Waits for `gasless localnet`, unpauses its billing contract and returns its info (with `ownerPem`)."""
    from gasless.localnet.genesis import load_or_create_wallet
    from gasless.localnet.owner import unpause

    await wait_ok(session, f"{gateway}/localnet/info", timeout=120)
    async with session.get(f"{gateway}/localnet/info") as resp:
        info = await resp.json()
    info = info.get("data", info)
    wallets = data_dir / "localnet" / "wallets"
    info.setdefault("ownerPem", str(wallets / "owner.pem"))
    await unpause(gateway, load_or_create_wallet(wallets, "owner"), info["contract"])
    return info


def service_env(
    data_dir: Path, gateway: str, info: dict[str, Any], database_url: str = "", redis_url: str = ""
) -> dict[str, str]:
    """The environment of a benchmarked `gasless serve` against localnet, with every relayer key."""
    pems = sorted(str(p) for p in (data_dir / "localnet" / "wallets").glob("relayer-s*.pem"))
    env = {
        **os.environ,
        "GASLESS_PROFILE": "localnet",
        "GASLESS_MASTER_SECRET": SECRET,
        "GASLESS_GATEWAY_URLS": gateway,
        "GASLESS_DATA_DIR": str(data_dir),
        "GASLESS_CONTRACT_ADDRESS": info["contract"],
        "GASLESS_RELAYER_KEY_FILES": json.dumps(pems),
    }
    if database_url:
        env["GASLESS_DATABASE_URL"] = database_url
    if redis_url:
        env["GASLESS_REDIS_URL"] = redis_url
    return env


async def create_bench_database(admin_url: str) -> str:
    """A fresh PostgreSQL database for one run (the service migrates it); returns its SQLAlchemy URL."""
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(admin_url)
    name = f"gasless_bench_{os.getpid()}_{int(time.time())}"
    conn = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return url.set(database=name).render_as_string(hide_password=False)


async def drop_bench_database(admin_url: str, bench_url: str) -> None:
    import asyncpg
    from sqlalchemy.engine import make_url

    name = make_url(bench_url).database
    conn = await asyncpg.connect(make_url(admin_url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def floor_postgres(count: int, relayer: UserSecretKey, database_url: str) -> float:
    """The floor on PostgreSQL: the same work, the insert a durable single-row transaction (autocommit,
    the server's default `synchronous_commit=on`) over one connection."""
    import asyncpg
    from sqlalchemy.engine import make_url

    key, sender, txs = floor_transactions(count, relayer)
    conn = await asyncpg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(
            "CREATE TABLE floor_intents (tx_hash TEXT PRIMARY KEY, sender TEXT, nonce BIGINT, tx JSONB)"
        )
        insert = await conn.prepare("INSERT INTO floor_intents VALUES ($1, $2, $3, $4)")
        pubkey = sender.get_public_key()
        start = time.perf_counter()
        for tx in txs:
            h, wire = cosign_for_floor(tx, relayer, pubkey)
            await insert.fetch(h, sender.to_bech32(), tx.nonce, wire)
        elapsed = time.perf_counter() - start
        await conn.execute("DROP TABLE floor_intents")
    finally:
        await conn.close()
    return count / elapsed


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first: utime is [11], stime [12])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def with_children(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """The processes' pids and their children's (the workers of `gasless serve --workers N`)."""
    pids = []
    for proc in procs:
        pids.append(proc.pid)
        with contextlib.suppress(OSError):
            pids += [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    return pids


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU time the processes and their children used so far (Linux /proc), in seconds."""
    ticks = 0
    for pid in with_children(procs):
        try:
            fields = _proc_stat(pid)
        except OSError:
            return float("nan")
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_by_process(procs: list[subprocess.Popen[bytes]]) -> dict[int, float]:
    """{pid: CPU seconds so far} of the processes and their children."""
    found = {}
    for pid in with_children(procs):
        with contextlib.suppress(OSError):
            fields = _proc_stat(pid)
            found[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def cpus_of(pids: list[int]) -> str:
    """The cores the processes may run on, e.g. `0-1` (what `--api-cpus` / `--other-cpus` set)."""
    sets = {",".join(str(c) for c in sorted(os.sched_getaffinity(pid))) for pid in pids}
    return " | ".join(sorted(sets))


class StorageCpu:
    """CPU seconds the shared storage spent: the whole PostgreSQL server (every process of the postmaster's:
    the backends, and the WAL writer and checkpointer our writes keep busy; the server runs on this machine,
    so /proc has their times, and a backend that exits hands its time to the postmaster's children's times)
    and the Redis server (`INFO cpu`). Both servers may serve others too: run it on a quiet machine."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = database_url
        self.redis_url = redis_url
        self._postmaster = 0

    async def seconds(self) -> dict[str, float]:
        if not self._postmaster:
            import asyncpg
            from sqlalchemy.engine import make_url

            url = make_url(self.database_url).set(drivername="postgresql")
            conn = await asyncpg.connect(url.render_as_string(hide_password=False))
            try:  # a backend's parent is the postmaster (read while the backend lives)
                self._postmaster = int(_proc_stat(await conn.fetchval("SELECT pg_backend_pid()"))[1])
            finally:
                await conn.close()
        stat = _proc_stat(self._postmaster)
        ticks = sum(int(field) for field in stat[11:15])  # its own and its ended children's times
        for child in Path(f"/proc/{self._postmaster}/task/{self._postmaster}/children").read_text().split():
            try:
                ticks += sum(int(field) for field in _proc_stat(int(child))[11:13])
            except OSError:
                pass  # ended since the listing: its time is in the postmaster's children's times now
        redis = 0.0
        if self.redis_url:
            from redis.asyncio import Redis

            client = Redis.from_url(self.redis_url)
            try:
                info = await client.info("cpu")
            finally:
                await client.aclose()
            redis = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return {"postgresql": ticks / os.sysconf("SC_CLK_TCK"), "redis": redis}


class InstructionCount:
    """Instructions the processes execute between start() and stop(), counted by `perf stat` (Linux
    perf_event): unlike CPU time, the count does not move with the VM's speed or with other load, so it
    compares builds run at different times. Unavailable (None) where perf is missing or not allowed."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.total: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        if shutil.which("perf") is None:
            return
        self._proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", "instructions", "-p", ",".join(map(str, self.pids))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.2)  # perf attaches asynchronously

    def stop(self) -> int | None:
        if self._proc is None:
            return None
        self._proc.send_signal(signal.SIGINT)
        _, err = self._proc.communicate(timeout=10)
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith("instructions") and fields[0].isdigit():
                return int(fields[0])
        return None


def stop_processes(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGINT to all (a clean exit, and a profile if one is written), then wait; kill what does not end."""
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def measured_phase(
    procs: list[subprocess.Popen[bytes]],
    phase: Coroutine[Any, Any, tuple[float, list[dict[str, Any]]]],
    storage: StorageCpu | None = None,
    sample_to: str = "",
) -> tuple[float, list[dict[str, Any]], float, int | None, dict[str, float]]:
    """Runs one phase of posts; returns its (seconds, results) with the CPU seconds and the instructions
    (None without perf) the processes spent meanwhile, and the CPU seconds of the shared storage (PostgreSQL
    backends, Redis) with `storage`. With `sample_to`, py-spy samples the first API process over the phase
    alone and writes its collapsed stacks there."""
    counter = InstructionCount(with_children(procs))
    storage_before = await storage.seconds() if storage else {}
    sampler = PhaseSampler(procs[0].pid, sample_to) if sample_to else None
    counter.start()
    cpu_before = cpu_seconds(procs)
    elapsed, results = await phase
    cpu_used = cpu_seconds(procs) - cpu_before
    instructions = counter.stop()
    if sampler:
        sampler.stop()
    storage_after = await storage.seconds() if storage else {}
    storage_used = {name: storage_after[name] - storage_before[name] for name in storage_after}
    return elapsed, results, cpu_used, instructions, storage_used


def sample_path(args: argparse.Namespace, phase: str, unbilled: bool) -> str:
    """Where `--sample-api PHASE:FILE` wants this run's phase sampled (FILE.<storage>[-unbilled]), or ""."""
    wanted, _, path = (args.sample_api or "").partition(":")
    if wanted != phase or not path:
        return ""
    workers = f".{args.workers}-workers" if args.workers > 1 else ""
    return (
        f"{path}.{'postgresql' if args.database_url else 'sqlite'}{'-unbilled' if unbilled else ''}{workers}"
    )


class PhaseSampler:
    """py-spy (on PATH, not a project dependency) recording one process's stacks until stopped: 250 Hz, every
    thread, collapsed stacks (`-f raw`) to aggregate with any flame-graph tool. Only samples of the thread
    holding the GIL (`--gil`): the Python work. On some VMs py-spy cannot tell an idle thread
    (a worker waiting on its queue) from a running one, so without it every waiting thread counts as busy;
    C work that releases the GIL (SQLite's statements, the signature checks) is left out."""

    def __init__(self, pid: int, path: str) -> None:
        spy = shutil.which("py-spy") or "py-spy"  # checked when the arguments were parsed
        self.proc = subprocess.Popen(
            [spy, "record", "-f", "raw", "-r", "250", "--threads", "--gil", "-p", str(pid), "-o", path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        self.proc.wait(timeout=60)


def add_costs(
    row: dict[str, Any], cpu_used: float, instructions: int | None, storage_used: dict[str, float]
) -> None:
    row["api_cpu_ms_per_relay"] = 1000 * cpu_used / max(1, row["ok"])
    row["api_instructions_per_relay"] = instructions / max(1, row["ok"]) if instructions else None
    row["storage_cpu_ms_per_relay"] = {
        name: 1000 * seconds / max(1, row["ok"]) for name, seconds in storage_used.items()
    }
    row["service_cpu_ms_per_relay"] = row["api_cpu_ms_per_relay"] + sum(
        row["storage_cpu_ms_per_relay"].values()
    )


def summarize(label: str, elapsed: float, results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if r["status"] in (200, 202)]
    accept = [r["intent"]["latency"]["acceptToCosignMs"] for r in ok]
    added = [r["intent"]["latency"]["addedMs"] for r in ok if r["intent"]["latency"]["addedMs"] is not None]
    errors: dict[str, int] = {}
    for r in results:
        if r["status"] not in (200, 202):
            errors[r.get("code", str(r["status"]))] = errors.get(r.get("code", str(r["status"])), 0) + 1
    return {
        "label": label,
        "relays": len(results),
        "ok": len(ok),
        "status202": sum(1 for r in ok if r["status"] == 202),
        "errors": errors,
        "relays_per_s": len(ok) / elapsed,
        "accept_p50": percentile(accept, 50),
        "accept_p95": percentile(accept, 95),
        "accept_p99": percentile(accept, 99),
        "added_p50": percentile(added, 50),
        "added_p95": percentile(added, 95),
        "added_p99": percentile(added, 99),
    }


def by_rounds(rounds: list[int]) -> dict[str, int]:
    """How many relays took each number of rounds, fewest rounds first."""
    return {str(value): count for value, count in sorted(Counter(rounds).items())}


async def inclusion_rounds(
    database_url: str, round_ms: int, results: list[dict[str, Any]], timeout: float = 120
) -> dict[str, Any]:
    """Issue 17's target 3: roundsToInclusion of every relay of a phase (and finalityMs), once each one is
    final.

    Read from the service's database with the service's own formula (`gasless.relay.intents.latency`, what
    `GET /v1/intents/{sender}/{nonce}` renders): that route is limited to 20 reads/s per IP, a minute and
    a half for one phase."""
    from sqlalchemy import select

    from gasless.db import create_engine, intents
    from gasless.relay.intents import TERMINAL, intent_from_row

    wanted = {(r["intent"]["sender"], r["intent"]["nonce"]) for r in results if r["status"] in (200, 202)}
    senders = sorted({sender for sender, _ in wanted})
    engine = create_engine(database_url)
    rows: dict[tuple[str, int], Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                found = await conn.execute(select(intents).where(intents.c.sender.in_(senders)))
                rows = {
                    (row.sender, int(row.nonce)): row
                    for row in found
                    if (row.sender, int(row.nonce)) in wanted
                }
            if all(row.state in TERMINAL for row in rows.values()):
                break
            await asyncio.sleep(0.5)  # the next block; bounded by the deadline
    finally:
        await engine.dispose()
    figures = [intent_from_row(row, round_ms).latency for row in rows.values()]
    rounds = [f.roundsToInclusion for f in figures if f.roundsToInclusion is not None]
    inclusion = [f.inclusionMs for f in figures if f.inclusionMs is not None]
    finality = [f.finalityMs for f in figures if f.finalityMs is not None]
    return {
        "included": len(rounds),
        "not_included": len(wanted) - len(rounds),
        "rounds_p50": percentile(rounds, 50),
        "rounds_p99": percentile(rounds, 99),
        "rounds_max": max(rounds, default=float("nan")),
        "rounds_histogram": by_rounds(rounds),
        "inclusion_p50": percentile(inclusion, 50),
        "inclusion_p99": percentile(inclusion, 99),
        # finalizedAtMs is when this host saw finality: it includes the tracker's detection delay.
        "finality_p50": percentile(finality, 50),
        "finality_p99": percentile(finality, 99),
    }


async def chain_floor_rounds(
    session: aiohttp.ClientSession,
    gateway: str,
    bodies: list[tuple[str, dict[str, Any]]],
    relayers: dict[str, UserSecretKey],
    concurrency: int,
    rate: float,
    round_ms: int,
    arrivals: str,
    timeout: float = 120,
) -> dict[str, Any]:
    """The chain's own floor for target 3, in the same run: the same kind of transactions (same senders,
    relayers and shards, the next nonces), co-signed here and sent straight to the gateway at the paced
    rate, rounds counted from the moment each send started to its block's timestamp."""
    direct = []
    for _, body in bodies:
        tx = Transaction.new_from_dictionary(body["tx"])
        tx.relayer_signature = relayers[tx.relayer.to_bech32()].sign(computer.compute_bytes_for_signing(tx))
        direct.append((gateway, tx.to_dictionary()))
    _, sent = await post_all(session, direct, concurrency, rate, path="/transaction/send", arrivals=arrivals)
    pending = {r["data"]["txHash"]: r["sentAtMs"] for r in sent if r["status"] == 200}
    # How long the gateway took to answer each send, as this process saw it: a floor under the relay's
    # `addedMs`, which holds one such send (and this process's own waits, which `addedMs` does not).
    answered = [r["answeredMs"] for r in sent if r["status"] == 200]
    rounds: list[int] = []
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for sent_hash, sent_at_ms in list(pending.items()):
            async with session.get(f"{gateway}/transaction/{sent_hash}") as resp:
                chain_tx = (await resp.json())["data"]["transaction"]
            if chain_tx["status"] in ("success", "fail", "invalid"):
                if chain_tx["timestampMs"]:
                    rounds.append(max(0, math.ceil((chain_tx["timestampMs"] - sent_at_ms) / round_ms)))
                del pending[sent_hash]
        if pending:
            await asyncio.sleep(0.5)  # the next block; bounded by the deadline
    return {
        "sent": len(sent),
        "included": len(rounds),
        "rounds_p99": percentile(rounds, 99),
        "rounds_histogram": by_rounds(rounds),
        "send_p50": percentile(answered, 50),
        "send_p95": percentile(answered, 95),
        "send_p99": percentile(answered, 99),
    }


async def gateway_requests(session: aiohttp.ClientSession, gateway: str) -> dict[str, int] | None:
    """The requests localnet's gateway has received, by route (None from a build without the count)."""
    async with session.get(f"{gateway}/localnet/requests") as resp:
        if resp.status != 200:
            return None
        return dict((await resp.json())["data"]["requests"])


def requests_per_relay(
    before: dict[str, int] | None, after: dict[str, int] | None, relays: int
) -> dict[str, float] | None:
    if before is None or after is None or not relays:
        return None
    spent = {route: count - before.get(route, 0) for route, count in after.items()}
    return {route: round(count / relays, 3) for route, count in sorted(spent.items()) if count}


async def gc_totals(session: aiohttp.ClientSession, metrics_urls: list[str]) -> dict[str, list[float]]:
    """The API processes' cyclic collections so far, by generation: [collections, seconds] (their
    `gasless_gc_pause_seconds` histograms, summed over the hosts; empty from a build without it)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, list[float]] = {}
    for url in metrics_urls:
        async with session.get(url) as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            if family.name != "gasless_gc_pause_seconds":
                continue
            for sample in family.samples:
                pair = totals.setdefault(sample.labels["generation"], [0.0, 0.0])
                if sample.name.endswith("_count"):
                    pair[0] += sample.value
                elif sample.name.endswith("_sum"):
                    pair[1] += sample.value
    return totals


def gc_per_relay(
    before: dict[str, list[float]], after: dict[str, list[float]], relays: int
) -> dict[str, Any]:
    """A phase's collections by generation: how many, and their time (every thread waited meanwhile) in
    all and per relay."""
    phase: dict[str, Any] = {}
    for generation, (count, seconds) in sorted(after.items()):
        count_before, seconds_before = before.get(generation, [0.0, 0.0])
        ms = 1000 * (seconds - seconds_before)
        phase[generation] = {
            "collections": int(count - count_before),
            "ms": ms,
            "ms_per_relay": ms / max(1, relays),
        }
    return phase


def print_gc(label: str, per_generation: dict[str, Any]) -> None:
    if not per_generation:
        console.print(f"{label}: garbage collections not counted by this build")
        return
    parts = ", ".join(
        f"generation {generation} {row['collections']} in {row['ms']:.1f} ms ({row['ms_per_relay']:.3f} ms a relay)"
        for generation, row in per_generation.items()
    )
    console.print(f"{label}: the API's garbage collections: {parts}")


def print_requests(label: str, per_relay: dict[str, float] | None) -> None:
    if per_relay is None:
        console.print(f"{label}: gateway requests not counted by this build's localnet")
        return
    parts = ", ".join(f"{route} {count:.2f}" for route, count in per_relay.items())
    console.print(f"{label}: gateway requests per relay {sum(per_relay.values()):.2f} ({parts})")


async def run(
    args: argparse.Namespace,
    data_dir: Path,
    *,
    unbilled: bool = False,
    rollups: bool = True,
    sqlite: bool = False,
    before_drop: Callable[[str], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """One full run (max, then paced at `--paced-share` of it); `unbilled` serves the API with billing off
    (bench_unbilled); `sqlite` serves one host on SQLite whatever `--database-url` says; `before_drop` gets
    the run database's URL once the service has stopped, before the database is dropped."""
    if sqlite:
        args = argparse.Namespace(**{**vars(args), "database_url": "", "redis_url": "", "hosts": 1})
    gw_port = free_port()
    api_ports = [free_port() for _ in range(args.hosts)]
    gateway = f"http://127.0.0.1:{gw_port}"
    apis = [f"http://127.0.0.1:{port}" for port in api_ports]
    metrics_ports = [free_port() for _ in range(args.hosts)]
    metrics_urls = [f"http://127.0.0.1:{port}/metrics" for port in metrics_ports]
    py = sys.executable
    localnet_profile = ["-m", "cProfile", "-o", args.profile_localnet] if args.profile_localnet else []
    database_url = await create_bench_database(args.database_url) if args.database_url else ""
    storage_cpu = StorageCpu(database_url, args.redis_url) if database_url else None
    localnet = subprocess.Popen(
        [
            *(["taskset", "-c", args.other_cpus] if args.other_cpus else []),
            py,
            *localnet_profile,
            "-m",
            "gasless.cli",
            "localnet",
            "--port",
            str(gw_port),
            "--data-dir",
            str(data_dir),
            "--round-ms",
            str(args.round_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api_procs: list[subprocess.Popen[bytes]] = []
    stall_ms, _, stall_log = (args.loop_stalls or "").partition(":")
    api_stderr: Any = open(stall_log, "ab") if stall_log else subprocess.DEVNULL  # noqa: SIM115
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            info = await ready_localnet(session, gateway, data_dir)
            relayer_pems = sorted(str(p) for p in (data_dir / "localnet" / "wallets").glob("relayer-s*.pem"))
            env = {
                **service_env(data_dir, gateway, info, database_url, args.redis_url),
                "GASLESS_BENCH_UNBILLED": "true" if unbilled else "false",
                "GASLESS_LATENCY_ROLLUP_ENABLED": "true" if rollups else "false",
            }
            if stall_log:
                env["GASLESS_LOOP_STALL_MS"] = stall_ms
            # One process per host; the first migrates the database before the next starts.
            for index, (port, api) in enumerate(zip(api_ports, apis, strict=True)):
                profile = ["-m", "cProfile", "-o", f"{args.profile_api}.{index}"] if args.profile_api else []
                workers = ["--workers", str(args.workers)] if args.workers > 1 else []
                pin = ["taskset", "-c", args.api_cpus] if args.api_cpus else []
                api_procs.append(
                    subprocess.Popen(
                        [*pin, py, *profile, "-m", "gasless.cli", "serve", "--port", str(port), *workers],
                        env={
                            **env,
                            "GASLESS_HOST_ID": HOST_IDS[index],
                            "GASLESS_METRICS_PORT": str(metrics_ports[index]),
                        },
                        stdout=subprocess.DEVNULL,
                        stderr=api_stderr,
                    )
                )
                await wait_ok(session, f"{api}/readyz")
                if args.workers > 1:  # every worker ready (each connection goes to any of them)
                    await wait_workers_ready(session, api, args.workers)
            console.print(
                f"cores: API {cpus_of(with_children(api_procs))}; localnet {cpus_of([localnet.pid])}; "
                f"load generator {cpus_of([os.getpid()])}"
            )
            with console.status("granting plans to senders"):
                senders = [UserSecretKey.generate() for _ in range(args.senders)]
                await grant_plans(session, gateway, info, senders)
            with console.status("assigning and pre-signing"):
                first = await prepare(session, apis, senders, args.per_sender, 0)
            # What the service costs with no traffic (its polls and background jobs), per second.
            with console.status(f"idle for {args.idle_s:g} s"):
                cpu_before = cpu_seconds(api_procs)
                await asyncio.sleep(args.idle_s)  # the measured window itself
                idle_cpu_ms_per_s = (
                    1000 * (cpu_seconds(api_procs) - cpu_before) / args.idle_s / len(api_procs)
                )
            # The floor once now (the service idle) and once at the end: this VM's speed drifts by up to
            # 2x within minutes, so the ratio uses the mean of the two measurements around the runs.
            relayer = UserPEM.from_file(Path(relayer_pems[0])).secret_key
            with console.status("floor (before the runs)"):
                floor_counter = InstructionCount([os.getpid()])
                floor_before = floor(args.floor_count, relayer, floor_counter)
            floor_instructions = floor_counter.total / args.floor_count if floor_counter.total else None
            # Warm-up, then the maximum: closed loop at high concurrency.
            with console.status(f"max throughput: {len(first)} relays at concurrency {args.concurrency}"):
                counted = await gateway_requests(session, gateway)
                collected = await gc_totals(session, metrics_urls)
                by_process = cpu_by_process(api_procs)
                elapsed, results, cpu_used, instructions, storage_used = await measured_phase(
                    api_procs,
                    post_all(session, first, args.concurrency, None),
                    storage_cpu,
                    sample_to=sample_path(args, "max", unbilled),
                )
                if args.workers > 1:  # how evenly the kernel spread the connections over the workers
                    after = cpu_by_process(api_procs)
                    shares = [after[pid] - by_process.get(pid, 0.0) for pid in after]
                    console.print(
                        "max: CPU seconds by API process (parent first): "
                        + ", ".join(f"{seconds:.2f}" for seconds in shares)
                    )
                requests_max = requests_per_relay(
                    counted, await gateway_requests(session, gateway), len(first)
                )
                gc_max = gc_per_relay(collected, await gc_totals(session, metrics_urls), len(first))
            top = summarize("max (closed loop)", elapsed, results)
            add_costs(top, cpu_used, instructions, storage_used)
            top["gateway_requests_per_relay"] = requests_max
            top["gc"] = gc_max
            await asyncio.sleep(max(2.0, 4 * args.round_ms / 1000))  # let the first set settle
            with console.status("pre-signing the paced run"):
                second = await prepare(session, apis, senders, args.per_sender, args.per_sender)
            # A fixed rate (--paced-rate) compares builds at the same offered load; a share of each run's
            # maximum follows that run's own (noisy) maximum.
            rate = args.paced_rate or top["relays_per_s"] * args.paced_share
            share = rate / top["relays_per_s"]
            with console.status(f"paced at {rate:.0f}/s ({share:.0%} of max)"):
                counted = await gateway_requests(session, gateway)
                collected = await gc_totals(session, metrics_urls)
                paced_window = [time.time(), 0.0]
                elapsed, results, cpu_used, instructions, storage_used = await measured_phase(
                    api_procs,
                    post_all(session, second, args.concurrency, rate, arrivals=args.arrivals),
                    storage_cpu,
                    sample_to=sample_path(args, "paced", unbilled),
                )
                paced_window[1] = time.time()
                requests_paced = requests_per_relay(
                    counted, await gateway_requests(session, gateway), len(second)
                )
                gc_paced = gc_per_relay(collected, await gc_totals(session, metrics_urls), len(second))
            paced = summarize(f"paced at {share:.0%} of max ({args.arrivals})", elapsed, results)
            add_costs(paced, cpu_used, instructions, storage_used)
            paced["gateway_requests_per_relay"] = requests_paced
            paced["gc"] = gc_paced
            with console.status("reading the paced relays' roundsToInclusion back"):
                paced["inclusion"] = await inclusion_rounds(
                    database_url or f"sqlite+aiosqlite:///{(data_dir / 'gasless.db').as_posix()}",
                    args.round_ms,
                    results,
                )
            with console.status("the chain's own floor: the same transactions straight to the gateway"):
                third = await prepare(session, apis, senders, args.per_sender, 2 * args.per_sender)
                relayers = {
                    address_of(key.generate_public_key().buffer).to_bech32(): key
                    for key in (UserPEM.from_file(Path(pem)).secret_key for pem in relayer_pems)
                }
                paced["chain_floor"] = await chain_floor_rounds(
                    session, gateway, third, relayers, args.concurrency, rate, args.round_ms, args.arrivals
                )
    finally:
        stop_processes([*api_procs, localnet])
        if stall_log:
            api_stderr.close()
    floor_after = floor(args.floor_count, relayer)
    floors = {"sqlite": (floor_before + floor_after) / 2}
    if database_url:
        if before_drop is not None:  # before the floor's inserts, which are not the service's work
            await before_drop(database_url)
        floors["postgresql"] = await floor_postgres(args.floor_count, relayer, database_url)
        await drop_bench_database(args.database_url, database_url)
    # The ratio is taken against the floor of the storage the service ran on: the same durable insert.
    storage = "postgresql" if database_url else "sqlite"
    floor_rate = floors[storage]

    mode = "unbilled" if unbilled else "billed"
    table = Table(
        title=f"bench/relay.py ({mode}, {args.hosts} host(s) x {args.workers} API process(es), {storage}): "
        f"{args.senders} senders x "
        f"{args.per_sender} relays, concurrency {args.concurrency}"
    )
    for col in (
        "run",
        "ok/sent",
        "202",
        "relays/s",
        "acceptToCosign p50/p95/p99 ms",
        "added p50/p95/p99 ms",
        "API CPU ms/relay",
        "errors",
    ):
        table.add_column(col)
    for row in (top, paced):
        table.add_row(
            row["label"],
            f"{row['ok']}/{row['relays']}",
            str(row["status202"]),
            f"{row['relays_per_s']:.0f}",
            f"{row['accept_p50']:.1f} / {row['accept_p95']:.1f} / {row['accept_p99']:.1f}",
            f"{row['added_p50']:.1f} / {row['added_p95']:.1f} / {row['added_p99']:.1f}",
            f"{row['api_cpu_ms_per_relay']:.1f}",
            json.dumps(row["errors"]) if row["errors"] else "-",
        )
    for name, rate in floors.items():
        table.add_row(
            f"floor, {name} insert (tight loop, 1 core)",
            "-",
            "-",
            f"{rate:.0f}",
            "-",
            "-",
            f"{1000 / rate:.2f}",
            "-",
        )
    console.print(table)
    top_ins, paced_ins = top["api_instructions_per_relay"], paced["api_instructions_per_relay"]
    if floor_instructions and top_ins and paced_ins:
        console.print(
            f"instructions per relay (perf stat; steady whatever the VM's speed): API max {top_ins / 1e6:.1f} M, "
            f"paced {paced_ins / 1e6:.1f} M; floor (sqlite) {floor_instructions / 1e6:.2f} M: the API executes "
            f"{top_ins / floor_instructions:.1f}x / {paced_ins / floor_instructions:.1f}x the floor's instructions"
        )
    console.print(
        f"sqlite floor before / after the runs: {floor_before:.0f} / {floor_after:.0f} per s; API CPU per "
        f"relay in floor units (relays of the floor's work one core does meanwhile): max "
        f"{top['api_cpu_ms_per_relay'] * floor_rate / 1000:.1f}, paced "
        f"{paced['api_cpu_ms_per_relay'] * floor_rate / 1000:.1f}"
    )
    console.print(
        f"service / floor ({storage}) = {top['relays_per_s'] / floor_rate:.1%} (target >= 25%); "
        f"at {share:.0%} load: acceptToCosign p99 = {paced['accept_p99']:.1f} ms, addedMs p99 = "
        f"{paced['added_p99']:.1f} ms (targets at 50%: <= 10 / <= 25 ms; at 80%: <= 50 ms)"
    )
    included, chain_floor = paced["inclusion"], paced["chain_floor"]
    console.print(
        f"at {share:.0%} load (same-shard transfers, {args.round_ms} ms rounds): roundsToInclusion "
        f"p50 {included['rounds_p50']}, p99 {included['rounds_p99']}, max {included['rounds_max']} (target p99 = 1); "
        f"relays by rounds {included['rounds_histogram']}; inclusionMs p50/p99 {included['inclusion_p50']} / "
        f"{included['inclusion_p99']}; finalityMs p50/p99 {included['finality_p50']} / {included['finality_p99']}; never "
        f"included {included['not_included']}"
    )
    console.print(
        f"the chain's own floor (the same transactions co-signed here and sent straight to the gateway at the "
        f"same rate): roundsToInclusion p99 {chain_floor['rounds_p99']}; by rounds {chain_floor['rounds_histogram']}; "
        f"the gateway's answer to a send p50/p95/p99 {chain_floor['send_p50']:.1f} / {chain_floor['send_p95']:.1f} / "
        f"{chain_floor['send_p99']:.1f} ms (what addedMs holds of the chain; seen from this process)"
    )
    console.print(
        f"idle API process: {idle_cpu_ms_per_s:.0f} ms of CPU per s (its polls and background jobs)"
    )
    if database_url:
        for row in (top, paced):
            parts = ", ".join(f"{name} {ms:.2f}" for name, ms in row["storage_cpu_ms_per_relay"].items())
            console.print(
                f"{row['label']}: the service's processes {row['service_cpu_ms_per_relay']:.2f} ms of CPU per "
                f"relay (API {row['api_cpu_ms_per_relay']:.2f}, {parts})"
            )
    # Counted over each phase's window: the API's own requests (checks, sends, tracking, polls).
    print_requests("max", top["gateway_requests_per_relay"])
    print_requests("paced", paced["gateway_requests_per_relay"])
    print_gc("max", top["gc"])
    print_gc("paced", paced["gc"])
    result = {
        "idle_cpu_ms_per_s": idle_cpu_ms_per_s,
        "mode": mode,
        "arrivals": args.arrivals,
        "hosts": args.hosts,
        "workers": args.workers,
        "storage": storage,
        "max": top,
        "paced": paced,
        "floor_per_s": floor_rate,
        "floors_per_s": floors,
        "sqlite_floor_before_after": [floor_before, floor_after],
        "floor_instructions_per_relay": floor_instructions,
    }
    if stall_log:
        result["paced"]["loop_stalls"] = print_loop_stalls(Path(stall_log), *paced_window)
    print(json.dumps(result))
    return result


def print_loop_stalls(log_file: Path, start: float, end: float) -> list[dict[str, Any]]:
    """The API's `event loop blocked` lines (`--loop-stalls`) logged within [start, end] (wall clock),
    grouped by the innermost frame of the service's own code in their stack (or the garbage collector, when
    it ran for half the stall or more): what held the loop while the paced relays' tail waited."""
    groups: dict[str, list[float]] = {}
    with log_file.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if '"event loop blocked"' not in line:
                continue
            entry = json.loads(line)
            at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
            if not start <= at <= end:
                continue
            stack = entry.get("frames") or []
            own = [frame for frame in stack if frame.startswith("gasless/")]
            where = (own or stack or ["(not sampled)"])[-1]
            if entry.get("gc_ms", 0) >= entry["blocked_ms"] / 2:  # the collector: in no stack
                where = f"garbage collection (generation {entry['gc_generation']})"
            groups.setdefault(where, []).append(float(entry["blocked_ms"]))
    rows = sorted(
        ({"where": k, "stalls": len(v), "blocked_ms": sum(v), "max_ms": max(v)} for k, v in groups.items()),
        key=lambda row: -row["blocked_ms"],
    )
    table = Table(title=f"event loop stalls in the paced phase ({log_file})")
    for col in ("innermost frame of gasless/", "stalls", "blocked ms", "longest ms"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["where"], str(row["stalls"]), f"{row['blocked_ms']:.1f}", f"{row['max_ms']:.1f}")
    console.print(table)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=40)
    parser.add_argument(
        "--per-sender", type=int, default=30, help="at most 32: two runs must fit in 64 in flight"
    )
    parser.add_argument("--concurrency", type=int, default=40, help="senders relaying at once")
    parser.add_argument("--round-ms", type=int, default=600)
    parser.add_argument(
        "--paced-share",
        type=float,
        default=0.5,
        help="the paced run's rate as a share of the measured maximum (issue 17's tail targets: 0.5 and 0.8)",
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=0.0,
        help="the paced run's rate in relays/s (instead of --paced-share of the measured maximum)",
    )
    parser.add_argument(
        "--arrivals",
        choices=("periodic", "poisson"),
        default="periodic",
        help="the paced run's arrivals (and the chain's floor's): evenly spaced, or Poisson at the same "
        "average rate (bench/relay.py arrival_offsets)",
    )
    parser.add_argument(
        "--hosts", type=int, default=1, choices=(1, 2), help="API processes (two need --database-url)"
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="PostgreSQL server to run on (postgresql+asyncpg://...); a fresh database is made per run",
    )
    parser.add_argument("--redis-url", default="", help="Redis for two hosts (redis://...)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="API worker processes of the one host (`gasless serve --workers N`; needs --database-url and "
        "--redis-url)",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="run with 1 worker, then with --workers N, and print the ratio of their maxima (target 5: >= 1.6x "
        "with 2 workers, localnet and the load generator on other cores)",
    )
    parser.add_argument("--api-cpus", default="", help="cores of the API processes (taskset -c list)")
    parser.add_argument(
        "--other-cpus", default="", help="cores of localnet and of this load generator (taskset -c list)"
    )
    parser.add_argument("--floor-count", type=int, default=3000)
    parser.add_argument(
        "--idle-s",
        type=float,
        default=5.0,
        help="seconds the idle API's CPU is measured for, before the runs",
    )
    parser.add_argument("--profile-api", default="", help="write a cProfile of the API process to this file")
    parser.add_argument("--profile-localnet", default="", help="write a cProfile of the localnet process")
    parser.add_argument(
        "--sample-api",
        default="",
        metavar="PHASE:FILE",
        help="py-spy (on PATH) samples the API over one phase (max or paced) and writes collapsed stacks to "
        "FILE.<storage>[-unbilled][.<N>-workers]",
    )
    parser.add_argument(
        "--loop-stalls",
        default="",
        metavar="MS:FILE",
        help="serve the API with GASLESS_LOOP_STALL_MS=MS, append its log to FILE and print the paced phase's "
        "event loop stalls grouped by where the loop was",
    )
    parser.add_argument(
        "--rollups",
        action="store_true",
        help="also run with the latency rollups off (GASLESS_LATENCY_ROLLUP_ENABLED=false) and print the p50 "
        "acceptToCosign difference: the rollups work off the relay's path",
    )
    parser.add_argument(
        "--storage-ratio",
        action="store_true",
        help="first run one host on SQLite, then the run asked for on --database-url and --redis-url, and "
        "print the CPU per relay of the service's processes (API, PostgreSQL backends, Redis) against "
        "SQLite's (issue 17, target 5: at most 1.5x)",
    )
    parser.add_argument(
        "--unbilled",
        action="store_true",
        help="also run with billing off (setting bench_unbilled) and print the p50 acceptToCosign difference",
    )
    args = parser.parse_args()
    if args.hosts > 1 and not (args.database_url and args.redis_url):
        parser.error("--hosts 2 needs --database-url (PostgreSQL) and --redis-url: hosts share both")
    if not 0 < args.paced_share <= 1:
        parser.error("--paced-share is a share of the maximum: more than 0, at most 1")
    if args.sample_api:
        phase, _, path = args.sample_api.partition(":")
        if phase not in ("max", "paced") or not path:
            parser.error("--sample-api is PHASE:FILE with PHASE max or paced")
        if shutil.which("py-spy") is None:
            parser.error("--sample-api needs py-spy on PATH (pip install py-spy into any environment)")
    if args.loop_stalls:
        ms, _, path = args.loop_stalls.partition(":")
        if not (ms.isdigit() and int(ms) > 0 and path):
            parser.error("--loop-stalls is MS:FILE with MS a positive number of milliseconds")
    if args.storage_ratio and not (args.database_url and args.redis_url):
        parser.error("--storage-ratio needs --database-url (PostgreSQL) and --redis-url")
    if (args.workers > 1 or args.scaling) and not (args.database_url and args.redis_url and args.hosts == 1):
        parser.error("--workers and --scaling need --database-url (PostgreSQL), --redis-url and one host")
    if args.scaling and args.workers < 2:
        parser.error("--scaling compares 1 worker with --workers N: give --workers 2 or more")
    if args.other_cpus:
        os.sched_setaffinity(0, {int(c) for c in _cpu_list(args.other_cpus)})
    if args.scaling:
        with tempfile.TemporaryDirectory() as tmp:
            one = asyncio.run(run(argparse.Namespace(**{**vars(args), "workers": 1}), Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            many = asyncio.run(run(args, Path(tmp)))
        compare_workers(one, many)
        return 0
    if args.storage_ratio:
        with tempfile.TemporaryDirectory() as tmp:
            on_sqlite = asyncio.run(run(args, Path(tmp), sqlite=True))
    with tempfile.TemporaryDirectory() as tmp:
        billed = asyncio.run(run(args, Path(tmp)))
    if args.storage_ratio:
        compare_storage(on_sqlite, billed)
    if args.unbilled:
        with tempfile.TemporaryDirectory() as tmp:
            unbilled = asyncio.run(run(args, Path(tmp), unbilled=True))
        compare_billing(billed, unbilled)
    if args.rollups:
        with tempfile.TemporaryDirectory() as tmp:
            without = asyncio.run(run(args, Path(tmp), rollups=False))
        compare_rollups(billed, without)
    return 0


def _cpu_list(text: str) -> list[int]:
    """`0,2-3` -> [0, 2, 3] (taskset's list format)."""
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores += list(range(int(first), int(last or first) + 1))
    return cores


def compare_workers(one: dict[str, Any], many: dict[str, Any]) -> None:
    """N workers against 1, measured in one invocation: the maxima, and the CPU per relay of all the service's
    processes at the paced load (the same for both with --paced-rate)."""
    for phase in ("max", "paced"):
        a, b = one[phase], many[phase]
        console.print(
            f"{phase}: {many['workers']} workers {b['relays_per_s']:.0f} relays/s "
            f"({b['service_cpu_ms_per_relay']:.2f} ms of service CPU per relay) against 1 worker "
            f"{a['relays_per_s']:.0f} relays/s ({a['service_cpu_ms_per_relay']:.2f} ms)"
            + (
                f": {b['relays_per_s'] / a['relays_per_s']:.2f}x the relays/s, "
                f"{b['service_cpu_ms_per_relay'] / a['service_cpu_ms_per_relay']:.2f}x the CPU per relay"
                if phase == "max"
                else f": {b['service_cpu_ms_per_relay'] / a['service_cpu_ms_per_relay']:.2f}x the CPU per relay "
                "(issue 39, target 3: at most 1.1x at the same offered load, --paced-rate)"
            )
        )


def compare_storage(on_sqlite: dict[str, Any], shared: dict[str, Any]) -> None:
    """The CPU per relay of the service's processes on PostgreSQL + Redis against one host on SQLite."""
    for phase in ("max", "paced"):
        lite, pg = on_sqlite[phase], shared[phase]
        console.print(
            f"{phase}: {shared['hosts']} host(s) on PostgreSQL + Redis {pg['service_cpu_ms_per_relay']:.2f} ms of "
            f"CPU per relay ({pg['relays_per_s']:.0f} relays/s) against one host on SQLite "
            f"{lite['service_cpu_ms_per_relay']:.2f} ({lite['relays_per_s']:.0f} relays/s): "
            f"{pg['service_cpu_ms_per_relay'] / lite['service_cpu_ms_per_relay']:.2f}x "
            "(issue 17, target 5: at most 1.5x)"
        )


def compare_rollups(with_rollups: dict[str, Any], without: dict[str, Any]) -> None:
    """What the latency rollups add to acceptToCosign p50 (they run in a singleton, off the relay's path)."""
    table = Table(title="latency rollups: acceptToCosign p50 ms (same run, same machine)")
    for col in ("run", "rollups on", "rollups off", "difference"):
        table.add_column(col)
    for run_name in ("max", "paced"):
        on, off = with_rollups[run_name]["accept_p50"], without[run_name]["accept_p50"]
        table.add_row(run_name, f"{on:.2f}", f"{off:.2f}", f"{on - off:+.2f}")
    console.print(table)


def compare_billing(billed: dict[str, Any], unbilled: dict[str, Any]) -> None:
    """What billing adds to acceptToCosign p50 (target <= 1 ms), at max load and at the paced load."""
    table = Table(title="billing cost: acceptToCosign p50 ms")
    for col in ("run", "billed", "unbilled", "billing adds"):
        table.add_column(col)
    added = {}
    for run_name in ("max", "paced"):
        with_billing, without = billed[run_name]["accept_p50"], unbilled[run_name]["accept_p50"]
        added[run_name] = with_billing - without
        table.add_row(run_name, f"{with_billing:.2f}", f"{without:.2f}", f"{added[run_name]:+.2f}")
    console.print(table)
    console.print(
        f"billing adds {added['paced']:+.2f} ms to acceptToCosign p50 at the paced load (target <= 1 ms)"
    )
    print(json.dumps({"billingAddsP50Ms": added}))


if __name__ == "__main__":
    raise SystemExit(main())
