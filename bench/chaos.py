"""Faults beyond kill -9 (issue 18, docs/reliability.md): hosts `a` and `b` (two `gasless serve` processes)
on PostgreSQL and a Redis of their own, one `gasless localnet`, load from many senders, a fault injected
on a schedule, then the delivery invariants checked against the chain and the database.

Every host reaches PostgreSQL and Redis through a fault proxy of its own (`FaultProxy`), so a fault can cut
one host off while its clients still reach it. The load is a client's: each relay is assigned, signed once,
and posted; after an error answer or no answer the same bytes go to the other host (honouring
`Retry-After`), as a client behind two addresses would. Then, per scenario:
1. every relay answered 200/202 executed on chain;
2. no transaction executed twice, no nonce executed two different transactions;
3. bytes that only ever got error answers left nothing on chain;
4. exactly one billed usage row per executed transaction, no reservation left `reserved`, every billed
   row in a committed settlement batch;
5. after the heal, both hosts are ready again (the time it took is printed) and read a sample of the
   executed relays back as FINALIZED; every 429/503 carried Retry-After.
One line per scenario: faults, relays acknowledged, lost, doubled, sent after an error, double-billed,
time to ready after the heal, client-visible errors by code.

    .venv/bin/python bench/chaos.py                                    # every scenario, the long version
    .venv/bin/python bench/chaos.py --short --scenario redis-restart   # one, the test suite's shape

PostgreSQL is a cluster of the run's own (initdb of Debian's server binaries, as the postgres user when run
as root), so the `postgres-restart` scenario can crash and restart it.

The test suite (`tests/chaos`) runs every scenario with `--short`'s figures; this command runs the long
version (more senders, longer faults) and prints the figures docs/reliability.md records.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from multiversx_sdk import Transaction, TransactionComputer, UserPEM, UserSecretKey
from rich.table import Table

from gasless.chain.addresses import address_of, parse_address
from gasless.chain.codec import signing_bytes
from gasless.cli.output import CliConsole
from gasless.relay.checks import presence_message


def _bench_module(name: str) -> Any:
    """A sibling benchmark module by path (bench/ is not a package)."""
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


grant_plans = _bench_module("relay").grant_plans

SECRET = "chaos-master-secret-0123456789abcdef0123456789"
computer = TransactionComputer()
console = CliConsole()  # never cut when not a terminal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The fault proxy ---------------------------------------------------------------------------------------
class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of one backend, for one host. Modes:
    - `pass`: bytes flow;
    - `pause`: a partition: nothing flows either way, open connections stay open and new ones hang; on
      heal the held bytes flow on, as TCP recovers after a short partition (the clients' own timeouts
      decide what a long one breaks);
    - `reset`: every open connection is dropped (RST) and new ones are refused: a server restart.
    It runs on its own event loop in a thread, so the load generator and the checks never slow it."""

    def __init__(self, target_port: int, name: str) -> None:
        self.target_port, self.name = target_port, name
        self.mode = "pass"
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._open: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{name}", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def set(self, mode: str) -> None:
        asyncio.run_coroutine_threadsafe(self._set(mode), self._loop).result(10)

    def close(self) -> None:
        self.set("reset")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _serve(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _set(self, mode: str) -> None:
        self.mode = mode
        if mode == "pass":
            self._flowing.set()
            return
        self._flowing.clear()
        if mode == "reset":
            for writer in list(self._open):
                _abort(writer)
            self._open.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            _abort(writer)
            return
        await self._flowing.wait()  # a partition: the connection hangs, as a SYN to a cut host would
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _abort(writer)
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        self._open.discard(writer)
        self._open.discard(up_writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                if self.mode == "reset" or writer.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            _abort(writer)


def _seconds(retry_after: str | None) -> float:
    try:
        return float(retry_after or 0)
    except ValueError:  # an HTTP date: this service sends seconds, anything else waits a second
        return 1.0


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()


# PostgreSQL: a server of the run's own, so it can be restarted -----------------------------------------
def postgres_bin() -> Path | None:
    """Debian's PostgreSQL server binaries (`/usr/lib/postgresql/<version>/bin`), newest first."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


class PostgresServer:
    """A PostgreSQL cluster made for the run (initdb in a temporary directory, a free port, loopback only),
    so `restart` can crash it for real (`pg_ctl stop -m immediate`: every connection dropped, whatever each
    transaction was doing, WAL recovery on the next start) without touching a server anyone else uses."""

    def __init__(self, bin_dir: Path, settings: dict[str, str] | None = None) -> None:
        self.bin_dir = bin_dir
        self.settings = settings or {}  # server settings for `-c` (bench/statements.py preloads a library)
        self.root = Path(tempfile.mkdtemp(prefix="gasless-chaos-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
            shutil.chown(self.root, "postgres")

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def init(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self.start()
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", options, "start")

    def crash(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        try:
            self.crash()
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)


# The stack ---------------------------------------------------------------------------------------------
@dataclass
class Host:
    host_id: str
    base: str
    proc: subprocess.Popen[bytes]
    postgres: FaultProxy
    redis: FaultProxy
    log_path: Path


@dataclass
class Stack:
    tmp: Path
    admin_url: str  # PostgreSQL, for CREATE/DROP DATABASE and pg_terminate_backend
    database: str = ""
    gateway: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    redis_port: int = 0
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_proc: subprocess.Popen[bytes] | None = None
    relayer_keys: dict[str, UserSecretKey] = field(default_factory=dict)
    senders: list[UserSecretKey] = field(default_factory=list)  # granted a plan, not used yet
    killed: list[str] = field(default_factory=list)  # hosts a scenario SIGKILLed, restarted at its heal
    pg_port: int = 0
    postgres: PostgresServer | None = None  # the run's own server, when the stack made one

    @property
    def pg_dsn(self) -> str:
        """The plain DSN of the run's database (asyncpg), for the checks."""
        return f"{self.admin_url.replace('+asyncpg', '').rsplit('/', 1)[0]}/{self.database}"

    # Redis: a server of the run's own, without persistence (a restart forgets every bucket and lease) --
    def start_redis(self) -> None:
        self.redis_port = self.redis_port or free_port()
        self.redis_proc = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: _connects(self.redis_port), "redis-server")

    def kill_redis(self) -> None:
        if self.redis_proc is not None:
            self.redis_proc.kill()
            self.redis_proc.wait(10)
            self.redis_proc = None

    async def start(self, senders: int, host_ids: tuple[str, ...] = ("a", "b")) -> None:
        """Localnet, Redis, the database, `senders` plans granted, then the hosts. The plans come first:
        the hosts settle usage with the owner's key, and two writers of the owner's nonce would collide."""
        self.database = f"gasless_chaos_{uuid.uuid4().hex[:10]}"
        await _pg(self.admin_url, f'CREATE DATABASE "{self.database}"')
        self.start_redis()
        gateway_port = free_port()
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "gasless.cli", "localnet", "--port", str(gateway_port),
                 "--data-dir", str(self.tmp), "--round-ms", "200"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        self.gateway = f"http://127.0.0.1:{gateway_port}"
        self.info = await _wait_json(f"{self.gateway}/localnet/info")
        from gasless.localnet.genesis import load_or_create_wallet
        from gasless.localnet.owner import unpause

        owner = load_or_create_wallet(Path(self.info["ownerPem"]).parent, "owner")
        await unpause(self.gateway, owner, self.info["contract"])
        for entry in self.info["relayers"]:
            self.relayer_keys[entry["address"]] = UserPEM.from_file(Path(entry["pem"])).secret_key
        self.senders = [UserSecretKey.generate() for _ in range(senders)]
        async with aiohttp.ClientSession() as session:
            await grant_plans(session, self.gateway, self.info, self.senders)
        self.pg_port = int(self.admin_url.rsplit(":", 1)[1].split("/", 1)[0])
        for host_id in host_ids:  # one after the other: the first migrates the database
            self.hosts[host_id] = await self._spawn(host_id)

    def take_senders(self, count: int) -> list[UserSecretKey]:
        if len(self.senders) < count:
            raise RuntimeError("the stack was started with too few senders for the scenarios")
        taken, self.senders = self.senders[:count], self.senders[count:]
        return taken

    async def kill_host(self, host_id: str) -> None:
        """SIGKILL: no shutdown, no release of a lease or a role."""
        host = self.hosts[host_id]
        host.proc.kill()
        host.proc.wait(10)

    async def restart_host(self, host_id: str, *, clock_offset_s: int = 0) -> Host:
        """Host `host_id` again (after SIGTERM if it still runs), on fresh proxies; with `clock_offset_s`
        its process clock runs that far ahead (libfaketime) and it is returned once it serves."""
        old = self.hosts[host_id]
        if old.proc.poll() is None:
            old.proc.send_signal(signal.SIGTERM)
            try:
                old.proc.wait(30)
            except subprocess.TimeoutExpired:
                old.proc.kill()
                old.proc.wait(10)
        old.postgres.close()
        old.redis.close()
        self.hosts[host_id] = await self._spawn(host_id, clock_offset_s=clock_offset_s)
        return self.hosts[host_id]

    async def readiness(self, host_id: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.hosts[host_id].base}/readyz") as resp:
                return dict(await resp.json())

    async def leader(self, role: str) -> str:
        """The host leading `role` now (waits for one)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for host_id, host in self.hosts.items():
                if host.proc.poll() is None:
                    try:
                        if (await self.readiness(host_id)).get("singletons", {}).get(role) == "leader":
                            return host_id
                    except (aiohttp.ClientError, TimeoutError):
                        pass
            await asyncio.sleep(0.1)
        raise TimeoutError(f"no host leads {role}")

    async def _spawn(self, host_id: str, *, clock_offset_s: int = 0) -> Host:
        postgres = FaultProxy(self.pg_port, f"{host_id}-postgres").start()
        redis = FaultProxy(self.redis_port, f"{host_id}-redis").start()
        port = free_port()
        base = self.admin_url.replace("+asyncpg", "+asyncpg").rsplit("@", 1)[0]
        database_url = f"{base}@127.0.0.1:{postgres.port}/{self.database}"
        log_path = self.tmp / f"host-{host_id}.log"
        env = {
            **os.environ,
            "GASLESS_PROFILE": "localnet",
            "GASLESS_HOST_ID": host_id,
            "GASLESS_MASTER_SECRET": SECRET,
            "GASLESS_GATEWAY_URLS": json.dumps([self.gateway]),
            "GASLESS_DATABASE_URL": database_url,
            "GASLESS_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "GASLESS_DATA_DIR": str(self.tmp / f"data-{host_id}"),
            "GASLESS_CONTRACT_ADDRESS": self.info["contract"],
            "GASLESS_PAIR_ADDRESS": self.info["pair"],
            "GASLESS_WRAPPER_ADDRESS": self.info["wrapper"],
            "GASLESS_RELAYER_KEY_FILES": json.dumps([r["pem"] for r in self.info["relayers"]]),
            "GASLESS_API_BASE_URL": f"http://127.0.0.1:{port}",
            "GASLESS_METRICS_PORT": str(free_port()),
            # Settlement runs throughout (every 2 s), so every fault also meets batches being built and sent.
            "GASLESS_OWNER_KEY_FILE": self.info["ownerPem"],
            "GASLESS_SETTLEMENT_INTERVAL_MS": "2000",
        }
        env.pop("GASLESS_CONFIG", None)
        if clock_offset_s:
            env |= {
                "LD_PRELOAD": faketime_library(),
                "FAKETIME": f"{clock_offset_s:+d}s",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # only the wall clock is off, as with a bad NTP
            }
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        self.procs.append(proc)
        host = Host(host_id, f"http://127.0.0.1:{port}", proc, postgres, redis, log_path)
        if clock_offset_s:
            await wait_serving(host, timeout=90)
        else:
            await wait_ready([host], timeout=90)
        return host

    async def stop(self) -> None:
        for host in self.hosts.values():
            host.postgres.set("pass")  # a host stopping mid-partition still shuts down cleanly
            host.redis.set("pass")
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.kill_redis()
        for host in self.hosts.values():
            host.postgres.close()
            host.redis.close()
        if self.postgres is not None:
            self.postgres.remove()
        elif self.database:
            await _pg(self.admin_url, f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    async def terminate_backends(self) -> int:
        """Every PostgreSQL backend of the run's database ends now, mid-transaction or mid-commit."""
        conn = await asyncpg.connect(self.admin_url.replace("+asyncpg", ""))
        try:
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                self.database,
            )
        finally:
            await conn.close()
        return len(rows)

    def relayer_signature(self, tx: Transaction) -> bytes:
        # Ed25519 is deterministic: the signature the host made, so the full hash is known to the client.
        return bytes(self.relayer_keys[tx.relayer.to_bech32()].sign(signing_bytes(tx)))

    def tx_hash(self, tx: Transaction) -> str:
        """The hash the co-signed transaction will have."""
        tx.relayer_signature = self.relayer_signature(tx)
        try:
            return computer.compute_transaction_hash(tx).hex()
        finally:
            tx.relayer_signature = b""


async def _pg(admin_url: str, statement: str) -> None:
    conn = await asyncpg.connect(admin_url.replace("+asyncpg", ""))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def faketime_library() -> str:
    """libfaketime (Debian's `libfaketime`), for a host whose clock is off."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise FileNotFoundError("libfaketime is not installed (apt-get install libfaketime)")
    return str(found[0])


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout:.0f} s")
        time.sleep(0.05)
    return value


async def _wait_json(url: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        body = await resp.json()
                        return dict(body.get("data", body))
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer")
            await asyncio.sleep(0.1)


async def _wait_answer(
    session: aiohttp.ClientSession, host: Host, path: str, deadline: float, what: str
) -> None:
    """Until `host` answers `path` with 200; raises if its process exits or past `deadline` (monotonic)."""
    while True:
        if host.proc.poll() is not None:
            raise RuntimeError(f"host {host.host_id} exited ({host.log_path})")
        try:
            async with session.get(f"{host.base}{path}", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"host {host.host_id} not {what} in time")
        await asyncio.sleep(0.1)


async def wait_serving(host: Host, timeout: float) -> None:
    """Until the host answers /healthz (ready or not)."""
    async with aiohttp.ClientSession() as session:
        await _wait_answer(session, host, "/healthz", time.monotonic() + timeout, "serving")


async def wait_ready(hosts: list[Host], timeout: float) -> float:
    """Seconds until every host answers /readyz 200 (raises past `timeout`)."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for host in hosts:
            await _wait_answer(session, host, "/readyz", start + timeout, "ready")
    return time.monotonic() - start


# The load: a client's behaviour ------------------------------------------------------------------------
@dataclass
class Attempt:
    host: str
    status: int  # 0: no answer (connection error or timeout)
    code: str | None
    seconds: float  # until the answer (or the client's timeout)


@dataclass
class Signed:
    """One signed transaction (bytes) and every answer it got."""

    sender: str
    nonce: int
    tx_hash: str
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def acked(self) -> bool:
        return any(a.status in (200, 202) or a.code == "INTENT_ALREADY_SUBMITTED" for a in self.attempts)


# The same bytes again, on the other host; any other code ends the bytes (a new signature if the nonce is
# still free). LEASE_EXPIRED and the re-sign codes need a new assignment, then new bytes.
SAME_BYTES = {
    "UPSTREAM_UNAVAILABLE",
    "SIGNER_UNAVAILABLE",
    "SIGNER_FENCED",
    "SIGNER_TIMEOUT",
    "NO_RELAYER_AVAILABLE",
    "INTERNAL",
    "RATE_LIMITED",
    "NONCE_IN_FLIGHT",
    "TOO_MANY_IN_FLIGHT",
}
NONCE_USED = {"NONCE_TOO_LOW", "INTENT_ALREADY_EXECUTED"}


@dataclass
class Load:
    stack: Stack
    senders: int
    gap_s: float  # each sender's pause between two relays
    stop_at: float  # monotonic: no new relay starts after it
    give_up_s: float  # a relay still unanswered after this long counts as abandoned by the client
    signed: list[Signed] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    keys: list[UserSecretKey] = field(default_factory=list)
    missing_retry_after: int = 0

    async def run(self, session: aiohttp.ClientSession) -> None:
        self.keys = self.stack.take_senders(self.senders)
        await asyncio.gather(*(self._stream(session, key, i) for i, key in enumerate(self.keys)))

    def _host(self, turn: int) -> Host:
        # Looked up at each request: a scenario may replace a host's process meanwhile.
        hosts = [self.stack.hosts[host_id] for host_id in sorted(self.stack.hosts)]
        return hosts[turn % len(hosts)]

    async def _post(
        self, session: aiohttp.ClientSession, host: Host, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], float]:
        try:
            async with session.post(
                f"{host.base}{path}", json=body, timeout=aiohttp.ClientTimeout(total=15)
            ) as resp:
                answer = await resp.json(content_type=None)
                retry = _seconds(resp.headers.get("Retry-After"))
                if resp.status in (429, 503) and "Retry-After" not in resp.headers:
                    self.missing_retry_after += 1  # a retryable refusal must say when to come back
                return resp.status, answer if isinstance(answer, dict) else {}, retry
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            return 0, {}, 0.0

    async def _assign(
        self, session: aiohttp.ClientSession, key: UserSecretKey, sender: str, turn: int
    ) -> dict[str, Any]:
        for attempt in range(10_000):
            host = self._host(turn + attempt)
            now = int(time.time() * 1000)
            proof = {
                "kind": "key",
                "serverTimeMs": now,
                "signature": key.sign(presence_message("localnet", sender, now)).hex(),
            }
            status, answer, retry = await self._post(
                session, host, "/v1/relay/assign", {"sender": sender, "proof": proof}
            )
            if status == 200:
                return answer
            self.errors[f"assign:{answer.get('code') or status or 'no answer'}"] += 1
            await asyncio.sleep(max(retry, 0.2 + random.random() * 0.3))
        raise RuntimeError("never assigned")

    async def _stream(self, session: aiohttp.ClientSession, key: UserSecretKey, i: int) -> None:
        sender_address = address_of(key.generate_public_key().buffer)
        sender = sender_address.to_bech32()
        receiver = address_of(UserSecretKey.generate().generate_public_key().buffer)
        nonce, turn = 0, i
        assignment = await self._assign(session, key, sender, turn)
        while time.monotonic() < self.stop_at:
            await asyncio.sleep(self.gap_s * (0.5 + random.random()))
            tx = Transaction(
                sender=sender_address,
                receiver=receiver,
                gas_limit=100_000,
                chain_id="localnet",
                nonce=nonce,
                version=2,
                relayer=parse_address(assignment["relayer"]),
            )
            tx.signature = key.sign(computer.compute_bytes_for_signing(tx))
            record = Signed(sender, nonce, self.stack.tx_hash(tx))
            self.signed.append(record)
            body = {"tx": tx.to_dictionary(), "lease": assignment["lease"]}
            started = time.monotonic()
            outcome = "give-up"
            while time.monotonic() - started < self.give_up_s:
                host = self._host(turn)
                posted = time.monotonic()
                status, answer, retry = await self._post(session, host, "/v1/relay", body)
                code = answer.get("code") if status not in (200, 202) else None
                record.attempts.append(Attempt(host.host_id, status, code, time.monotonic() - posted))
                if status in (200, 202) or code == "INTENT_ALREADY_SUBMITTED":
                    outcome = "acked"
                    break
                self.errors[str(code or status or "no answer")] += 1
                if code in NONCE_USED:
                    outcome = "used"  # an earlier answer was lost; the chain has this nonce
                    break
                if code not in SAME_BYTES and status != 0 and status < 500:
                    outcome = "new-bytes"
                    break
                turn += 1  # the other host, after the advised wait
                await asyncio.sleep(max(retry, 0.1 + random.random() * 0.2))
            if outcome in ("acked", "used"):
                nonce += 1
            elif outcome == "new-bytes":
                assignment = await self._assign(session, key, sender, turn)
            else:
                # The client gives up on these bytes; they may still execute (an answer was lost), so
                # the next bytes use a fresh assignment at whichever nonce the chain is at.
                assignment = await self._assign(session, key, sender, turn)
                nonce = await self._chain_nonce(session, sender)

    async def _chain_nonce(self, session: aiohttp.ClientSession, sender: str) -> int:
        async with session.get(f"{self.stack.gateway}/address/{sender}/nonce") as resp:
            return int((await resp.json())["data"]["nonce"])


# The invariants ----------------------------------------------------------------------------------------
@dataclass
class Verdict:
    scenario: str
    faults: str
    acked: int = 0
    executed: int = 0
    lost: int = 0
    doubled: int = 0
    sent_after_error: int = 0
    double_billed: int = 0
    unbilled: int = 0
    reservations_left: int = 0
    unsettled: int = 0  # billed rows not in a committed settlement batch
    failed_batches: int = 0
    missing_retry_after: int = 0
    wrong_reads: int = 0  # sampled executed relays a host does not read as FINALIZED
    ready_after_heal_s: float = 0.0
    slowest_answer_s: float = 0.0  # how the fault was felt when no answer was an error
    errors: dict[str, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            self.lost
            + self.doubled
            + self.sent_after_error
            + self.double_billed
            + self.unbilled
            + self.reservations_left
            + self.unsettled
            + self.failed_batches
            + self.missing_retry_after
            + self.wrong_reads
        )


async def chain_status(session: aiohttp.ClientSession, gateway: str, tx_hash: str) -> str:
    async with session.get(f"{gateway}/transaction/{tx_hash}/status") as resp:
        if resp.status != 200:
            return "unknown"
        return str((await resp.json())["data"]["status"])


async def check(stack: Stack, load: Load, verdict: Verdict, settle_s: float, read_sample: int) -> None:
    """The five invariants, after every acknowledged relay had `settle_s` to execute and finalize."""
    by_hash = {s.tx_hash: s for s in load.signed}
    statuses: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + settle_s
        pending = set(by_hash)
        while pending:
            for tx_hash in list(pending):
                status = await chain_status(session, stack.gateway, tx_hash)
                statuses[tx_hash] = status
                final = status in ("success", "fail", "invalid")
                # Bytes nobody acknowledged need not execute: look at them once more at the end only.
                if final or not by_hash[tx_hash].acked:
                    pending.discard(tx_hash)
            if not pending or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        for tx_hash, record in by_hash.items():  # the unacknowledged bytes, finally
            if not record.acked:
                statuses[tx_hash] = await chain_status(session, stack.gateway, tx_hash)
    executed = {h for h, s in statuses.items() if s == "success"}
    verdict.acked = sum(1 for s in load.signed if s.acked)
    verdict.executed = len(executed)
    for record in load.signed:
        if record.acked and record.tx_hash not in executed:
            verdict.lost += 1
            verdict.details.append(
                f"lost: {record.sender}:{record.nonce} {record.tx_hash} ({statuses[record.tx_hash]})"
            )
        only_errors = (
            record.attempts and not record.acked and all(a.status not in (0,) for a in record.attempts)
        )
        if only_errors and record.tx_hash in executed:
            verdict.sent_after_error += 1
            verdict.details.append(f"sent after an error: {record.tx_hash} {record.attempts}")
    per_nonce = Counter((by_hash[h].sender, by_hash[h].nonce) for h in executed)
    verdict.doubled = sum(n - 1 for n in per_nonce.values() if n > 1)
    senders = sorted({s.sender for s in load.signed})
    # The usage rows are written when the service sees each execution final: wait for them too.
    conn = await asyncpg.connect(stack.pg_dsn)
    try:
        while True:
            rows = await conn.fetch(
                "SELECT tx_hash, billed FROM usage_ledger WHERE sender = ANY($1::text[])", senders
            )
            reserved = await conn.fetchval(
                "SELECT count(*) FROM reservations r JOIN intents i ON i.pk = r.intent_pk"
                " WHERE i.sender = ANY($1::text[]) AND r.state = 'reserved'",
                senders,
            )
            billed = Counter(r["tx_hash"] for r in rows if r["billed"])
            unbilled = sum(1 for h in executed if h not in billed)
            # Settled exactly once: each billed row in a batch (one batch_id column) that committed.
            unsettled = await conn.fetchval(
                "SELECT count(*) FROM usage_ledger u LEFT JOIN settlement_batches b ON b.batch_id = u.batch_id"
                " WHERE u.sender = ANY($1::text[]) AND u.billed AND (b.state IS NULL OR b.state <> 'committed')",
                senders,
            )
            failed = await conn.fetchval("SELECT count(*) FROM settlement_batches WHERE state = 'failed'")
            settled = unsettled == 0 and failed == 0
            if (unbilled == 0 and reserved == 0 and settled) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    verdict.double_billed = sum(n - 1 for n in billed.values() if n > 1) + sum(
        1 for h in billed if h not in executed
    )
    verdict.unbilled = unbilled
    verdict.reservations_left = int(reserved)
    verdict.unsettled = int(unsettled)
    verdict.failed_batches = int(failed)
    verdict.missing_retry_after = load.missing_retry_after
    for h in executed:
        if h not in billed:
            verdict.details.append(f"executed, never billed: {h}")
    verdict.errors = dict(load.errors)
    verdict.slowest_answer_s = max((a.seconds for s in load.signed for a in s.attempts), default=0.0)
    await check_reads(stack, sorted(h for h in executed if by_hash[h].acked), verdict, deadline, read_sample)


async def check_reads(
    stack: Stack, executed: list[str], verdict: Verdict, deadline: float, read_sample: int
) -> None:
    """After the heal both hosts serve correct reads: a sample of the executed relays reads `FINALIZED`
    with its own hash on each host (`GET /v1/relay/{txHash}`), waiting for it until the deadline."""
    sample = random.Random(len(executed)).sample(executed, min(read_sample, len(executed)))
    read_deadline = max(deadline, time.monotonic() + 30)
    async with aiohttp.ClientSession() as session:
        for host in stack.hosts.values():
            for tx_hash in sample:
                while True:
                    async with session.get(f"{host.base}/v1/relay/{tx_hash}") as resp:
                        status, body = resp.status, await resp.json(content_type=None)
                        retry = _seconds(resp.headers.get("Retry-After"))
                    if status == 200 and body.get("state") == "FINALIZED" and body.get("txHash") == tx_hash:
                        break
                    if time.monotonic() > read_deadline:
                        verdict.wrong_reads += 1
                        verdict.details.append(f"host {host.host_id} reads {tx_hash}: {status} {body}")
                        break
                    await asyncio.sleep(max(retry, 0.2))


# Scenarios ---------------------------------------------------------------------------------------------
@dataclass
class Scenario:
    name: str
    what: str
    inject: Callable[[Stack, float], Awaitable[str]]  # starts the fault, returns its description
    heal: Callable[[Stack], Awaitable[None]]


async def _partition_b_from_postgres(stack: Stack, seconds: float) -> str:
    stack.hosts["b"].postgres.set("pause")
    return f"b cut from PostgreSQL {seconds:.0f} s"


async def _heal_b_postgres(stack: Stack) -> None:
    stack.hosts["b"].postgres.set("pass")


async def _partition_a_from_redis(stack: Stack, seconds: float) -> str:
    stack.hosts["a"].redis.set("pause")
    return f"a cut from Redis {seconds:.0f} s"


async def _heal_a_redis(stack: Stack) -> None:
    stack.hosts["a"].redis.set("pass")


async def _restart_redis(stack: Stack, seconds: float) -> str:
    stack.kill_redis()  # SIGKILL: every bucket, lease and stream in it is gone
    return f"Redis killed, restarted empty after {seconds:.0f} s"


async def _heal_redis(stack: Stack) -> None:
    stack.start_redis()


async def _crash_postgres(stack: Stack, seconds: float) -> str:
    assert stack.postgres is not None
    stack.postgres.crash()  # immediate: no checkpoint, every connection dropped mid-whatever, WAL recovery
    return f"PostgreSQL crashed (pg_ctl stop -m immediate), started again after {seconds:.0f} s"


async def _start_postgres(stack: Stack) -> None:
    assert stack.postgres is not None
    stack.postgres.start()


async def _drop_postgres_connections(stack: Stack, seconds: float) -> str:
    ended = await stack.terminate_backends()  # mid-transaction, mid-commit: whatever each was doing
    for host in stack.hosts.values():
        host.postgres.set("reset")
    return f"PostgreSQL backends terminated ({ended}), connections refused {seconds:.0f} s"


async def _heal_postgres(stack: Stack) -> None:
    for host in stack.hosts.values():
        host.postgres.set("pass")


async def _gateway_silent(stack: Stack, seconds: float) -> str:
    async with aiohttp.ClientSession() as session:
        body = {"gateway": {"dropAcks": -1, "ackHangMs": 60_000}}
        async with session.post(f"{stack.gateway}/localnet/faults", json=body) as resp:
            resp.raise_for_status()
    return f"gateway accepts sends, answers none, {seconds:.0f} s"


async def _gateway_slow(stack: Stack, seconds: float) -> str:
    async with aiohttp.ClientSession() as session:
        body = {"gateway": {"latencyMs": {"*": 2_000}}}
        async with session.post(f"{stack.gateway}/localnet/faults", json=body) as resp:
            resp.raise_for_status()
    return f"gateway 2 s slow on every call, {seconds:.0f} s"


async def _gateway_reordering(stack: Stack, seconds: float) -> str:
    async with aiohttp.ClientSession() as session:
        body = {"gateway": {"jitterMs": 1_500}}
        async with session.post(f"{stack.gateway}/localnet/faults", json=body) as resp:
            resp.raise_for_status()
    return f"gateway answers each call after a random 0-1.5 s (out of order), {seconds:.0f} s"


async def _heal_gateway(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"gateway": {"dropAcks": 0, "latencyMs": {}, "jitterMs": 0}}
        async with session.post(f"{stack.gateway}/localnet/faults", json=body) as resp:
            resp.raise_for_status()


async def _offset_b_clock(stack: Stack, seconds: float) -> str:
    await stack.restart_host("b", clock_offset_s=30)
    deadline = time.monotonic() + 60
    while (clock := (await stack.readiness("b")).get("checks", {}).get("clock")) in (None, "ok"):
        if time.monotonic() > deadline:
            raise AssertionError(f"host b with its clock 30 s ahead never said so (clock: {clock})")
        await asyncio.sleep(0.1)
    # No lease is minted there: an assignment is refused, retryable, with Retry-After.
    key = UserSecretKey.generate()
    sender = address_of(key.generate_public_key().buffer).to_bech32()
    now = int(time.time() * 1000)
    proof = {
        "kind": "key",
        "serverTimeMs": now,
        "signature": key.sign(presence_message("localnet", sender, now)).hex(),
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{stack.hosts['b'].base}/v1/relay/assign", json={"sender": sender, "proof": proof}
        ) as resp:
            code = (await resp.json()).get("code")
            if resp.status != 503 or code != "UPSTREAM_UNAVAILABLE" or "Retry-After" not in resp.headers:
                raise AssertionError(f"host b with its clock off assigned: {resp.status} {code}")
    return (
        f"b restarted with its clock 30 s ahead (readyz clock: {clock}; assign: 503 {code}), {seconds:.0f} s"
    )


async def _heal_b_clock(stack: Stack) -> None:
    await stack.restart_host("b")


async def _batch_in_flight(stack: Stack, timeout: float = 60) -> str:
    """Waits for a settlement batch built or submitted and not committed yet; its state."""
    conn = await asyncpg.connect(stack.pg_dsn)
    try:
        deadline = time.monotonic() + timeout
        while True:
            state = await conn.fetchval(
                "SELECT state FROM settlement_batches WHERE state IN ('built', 'submitted') LIMIT 1"
            )
            if state is not None:
                return str(state)
            if time.monotonic() > deadline:
                raise TimeoutError("no settlement batch in flight")
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def _kill_settlement_leader(stack: Stack, seconds: float) -> str:
    leader = await stack.leader("settlement")
    state = await _batch_in_flight(stack)
    await stack.kill_host(leader)
    stack.killed = [leader]
    return f"{leader} (settlement leader) SIGKILLed with a batch {state}, back after {seconds:.0f} s"


async def _kill_mirror_leaders(stack: Stack, seconds: float) -> str:
    """The mirror's leader is killed; the survivor takes the role over and catches up, and is killed in
    its catch-up while the first comes back, which catches up again."""
    first = await stack.leader("mirror")
    await stack.kill_host(first)
    second = await stack.leader("mirror")  # the role moved once the dead leader's lease lapsed
    await stack.kill_host(second)
    await stack.restart_host(first)
    stack.killed = [second]
    return (
        f"mirror leader {first} SIGKILLed, then {second} in its catch-up; {second} back after {seconds:.0f} s"
    )


async def _restart_killed(stack: Stack) -> None:
    for host_id in stack.killed:
        await stack.restart_host(host_id)
    stack.killed = []


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "b-postgres-partition", "host b cut from PostgreSQL", _partition_b_from_postgres, _heal_b_postgres
        ),
        Scenario("a-redis-partition", "host a cut from Redis", _partition_a_from_redis, _heal_a_redis),
        Scenario("redis-restart", "Redis restarted, state lost", _restart_redis, _heal_redis),
        Scenario(
            "postgres-connections-dropped",
            "PostgreSQL backends terminated",
            _drop_postgres_connections,
            _heal_postgres,
        ),
        Scenario("postgres-restart", "PostgreSQL crashed and restarted", _crash_postgres, _start_postgres),
        Scenario("gateway-silent", "gateway acknowledges nothing", _gateway_silent, _heal_gateway),
        Scenario("gateway-slow", "gateway 2 s slow", _gateway_slow, _heal_gateway),
        Scenario("gateway-reordering", "gateway answers out of order", _gateway_reordering, _heal_gateway),
        Scenario("b-clock-offset", "host b's clock 30 s ahead", _offset_b_clock, _heal_b_clock),
        Scenario(
            "settlement-leader-killed", "SIGKILL mid-settlement", _kill_settlement_leader, _restart_killed
        ),
        Scenario("mirror-leaders-killed", "SIGKILL mid-catch-up", _kill_mirror_leaders, _restart_killed),
    )
}


@dataclass(frozen=True)
class Shape:
    senders: int
    gap_s: float  # each sender's mean pause between relays
    fault_after_s: float  # load before the fault
    fault_s: float  # the fault's length
    after_s: float  # load after the heal
    give_up_s: float = 60.0
    settle_s: float = 90.0
    ready_s: float = 60.0
    read_sample: int = 100  # executed relays read back from each host after the heal


SHORT = Shape(senders=6, gap_s=0.2, fault_after_s=2.0, fault_s=5.0, after_s=3.0, read_sample=30)
LONG = Shape(senders=24, gap_s=0.1, fault_after_s=5.0, fault_s=20.0, after_s=10.0)


async def run_scenario(stack: Stack, scenario: Scenario, shape: Shape) -> Verdict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        load = Load(stack, shape.senders, shape.gap_s, 0.0, shape.give_up_s)
        load.stop_at = time.monotonic() + shape.fault_after_s + shape.fault_s + shape.after_s
        running = asyncio.create_task(load.run(session))
        try:
            await asyncio.sleep(shape.fault_after_s)
            faults = await scenario.inject(stack, shape.fault_s)
            await asyncio.sleep(shape.fault_s)
            await scenario.heal(stack)
            verdict = Verdict(scenario.name, faults)
            verdict.ready_after_heal_s = await wait_ready(list(stack.hosts.values()), timeout=shape.ready_s)
            await running
        finally:
            if not running.done():  # a scenario that failed: stop its load before the session closes
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
    await check(stack, load, verdict, shape.settle_s, shape.read_sample)
    return verdict


def print_verdicts(verdicts: list[Verdict]) -> None:
    table = Table(title="bench/chaos.py: the delivery invariants under each fault")
    for column in ("scenario", "faults", "acked", "lost", "doubled", "sent after error", "double-billed",
                   "unbilled", "reserved left", "unsettled", "failed batches", "no Retry-After", "wrong reads",
                   "ready after heal s",
                   "slowest answer s", "client errors by code"):  # fmt: skip
        table.add_column(column)
    for v in verdicts:
        errors = ", ".join(f"{code} {n}" for code, n in sorted(v.errors.items())) or "-"
        table.add_row(
            v.scenario, v.faults, str(v.acked), str(v.lost), str(v.doubled), str(v.sent_after_error),
            str(v.double_billed), str(v.unbilled), str(v.reservations_left), str(v.unsettled),
            str(v.failed_batches), str(v.missing_retry_after), str(v.wrong_reads), f"{v.ready_after_heal_s:.1f}",
            f"{v.slowest_answer_s:.1f}", errors,
        )  # fmt: skip
    console.print(table)
    for v in verdicts:
        for line in v.details:
            console.print(f"{v.scenario}: {line}")


async def main_async(args: argparse.Namespace) -> int:
    shape = SHORT if args.short else LONG
    if args.fault_s:
        shape = Shape(**{**shape.__dict__, "fault_s": args.fault_s})
    names = args.scenario or list(SCENARIOS)
    if args.postgres_url and "postgres-restart" in names:
        if args.scenario:
            console.print("postgres-restart needs the run's own server: leave out --postgres-url")
            return 2
        names.remove("postgres-restart")
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="gasless-chaos-") as tmp:
        server = None
        if not args.postgres_url:
            bin_dir = postgres_bin()
            if bin_dir is None:
                console.print(
                    "no PostgreSQL server binaries: pass --postgres-url (postgres-restart needs them)"
                )
                return 2
            server = PostgresServer(bin_dir).init()
        stack = Stack(Path(tmp), args.postgres_url or server.url, postgres=server)  # type: ignore[union-attr]
        try:
            with console.status("starting localnet, Redis and hosts a and b"):
                await stack.start(senders=shape.senders * len(names))
            for name in names:
                with console.status(f"{name}: {shape.senders} senders, fault {shape.fault_s:.0f} s"):
                    verdicts.append(await run_scenario(stack, SCENARIOS[name], shape))
                console.print(json.dumps(verdicts[-1].__dict__ | {"details": verdicts[-1].details[:20]}))
        finally:
            await stack.stop()
    print_verdicts(verdicts)
    return 1 if any(v.violations for v in verdicts) else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres-url",
        default="",
        help="a PostgreSQL server to use instead of one of the run's own (the run makes and drops a database"
        " there; the postgres-restart scenario then cannot run)",
    )
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all"
    )
    parser.add_argument(
        "--short", action="store_true", help="the test suite's figures (fewer senders, 5 s faults)"
    )
    parser.add_argument("--fault-s", type=float, default=0.0, help="how long each fault lasts")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
