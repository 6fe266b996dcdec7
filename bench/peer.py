"""The peer relayer side by side: this service and the OpenClaw relayer on one localnet, one load generator.

The relayer our users would otherwise pick is the open-source TypeScript relayer the starter kit talks to
(https://github.com/sergiuosvat/multiversx-openclaw-relayer: Express, one simulate and one send per relay, a
SQLite quota row). Its source is not part of this repository: clone it into DIR (`git clone
https://github.com/sergiuosvat/multiversx-openclaw-relayer DIR`), and this benchmark builds it in DIR with its
own `npm ci && npm run build` when `DIR/dist/index.js` is missing.

One `gasless localnet` (600 ms rounds) serves both. Each run starts one relayer alone (this service on
SQLite, one process, `gasless serve`; or the peer, `node dist/index.js`, with one wallet per shard taken from
localnet's funded relayers, no registry and a quota it never reaches), posts relays and stops it. Every run
has fresh senders (this service's are granted a plan first); every sender is one ordered stream (a wallet
sends its nonces in order) on its own loopback source address, so per-IP limits see distinct clients, as
they would in production. Client work (signing) is done before the clock starts.

1. max: closed loop at `--concurrency`, the builds alternated (gasless, peer; then peer, gasless; ...);
2. paced: open loop at 50% of the peer's mean maximum, the same offered load for both, alternated again.

Each run prints relays answered 200 / sent, relays/s, the client-observed latency p50 / p99 (request sent to
answer read), the server process's CPU ms per relay (/proc) and, where `perf` is allowed, its instructions
per relay. At the end every answered transaction is looked up on localnet (executed or not), and each pair's
ratios are printed against the targets (relays/s >= 2x the peer's, CPU per relay <= half, p99 at the same
offered load below the peer's).

    .venv/bin/python bench/peer.py --peer-dir DIR --relays 2000 --senders 32 --concurrency 32 --pairs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from multiversx_sdk import Transaction, UserSecretKey
from rich.table import Table

from gasless.chain.addresses import address_of, parse_address
from gasless.cli.output import CliConsole

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relay import (  # noqa: E402  (the sibling benchmark)
    SECRET,
    InstructionCount,
    computer,
    cpu_seconds,
    free_port,
    grant_plans,
    percentile,
    prepare,
    stop_processes,
    wait_ok,
)

console = CliConsole()  # never cut when not a terminal
GASLESS, PEER = "gasless", "peer"

# Loaded into the peer with `node --require`: its server listens on IPv4 only, as on an IPv4-only host. On a
# dual-stack listener every IPv4 client is an IPv4-mapped IPv6 address, which its rate limiter
# (express-rate-limit 8, 100 requests per 15 minutes) folds into one /56 key: all clients together would get
# 100 relays. Listening on IPv4 gives each client address its own key, as each agent has in production.
IPV4_LISTEN = """
const net = require('net');
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' && (args.length === 1 || typeof args[1] === 'function')) {
    args.splice(1, 0, '0.0.0.0');
  }
  return listen.apply(this, args);
};
"""


@dataclass
class RunResult:
    service: str
    phase: str
    pair: int
    sent: int
    ok: int
    elapsed_s: float
    latencies_ms: list[float]
    cpu_s: float
    instructions: int | None
    errors: dict[str, int] = field(default_factory=dict)
    hashes: list[str] = field(default_factory=list)
    executed: int | None = None

    @property
    def relays_per_s(self) -> float:
        return self.ok / self.elapsed_s

    @property
    def cpu_ms_per_relay(self) -> float:
        return 1000 * self.cpu_s / max(1, self.ok)

    @property
    def instructions_per_relay(self) -> float | None:
        return self.instructions / max(1, self.ok) if self.instructions else None


def ensure_peer_build(peer_dir: Path) -> Path:
    """The peer's entry point, built with its own scripts when missing."""
    entry = peer_dir / "dist" / "index.js"
    if entry.exists():
        return entry
    if not (peer_dir / "package.json").exists():
        raise SystemExit(f"{peer_dir} has no package.json: put the peer relayer's source there (see --help)")
    if shutil.which("npm") is None:
        raise SystemExit(
            "npm is not installed: the peer relayer is built with its own `npm ci && npm run build`"
        )
    for step in (["npm", "ci", "--no-audit", "--no-fund"], ["npm", "run", "build"]):
        with console.status(f"building the peer: {' '.join(step)}"):
            done = subprocess.run(step, cwd=peer_dir, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stdout.write(done.stdout + done.stderr)
            raise SystemExit(f"`{' '.join(step)}` failed in {peer_dir}")
    return entry


class LocalAddresses:
    """Distinct loopback source addresses (127.1.x.y), one per client stream."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> str:
        self._next += 1
        return f"127.1.{self._next // 250}.{self._next % 250 + 1}"


async def post_streams(
    bodies: list[tuple[str, dict[str, Any]]],
    tx_member: str,
    concurrency: int,
    rate: float | None,
    addresses: LocalAddresses,
) -> tuple[float, list[tuple[int, float, dict[str, Any]]]]:
    """One ordered stream per sender on its own source address, `concurrency` streams at a time; with `rate`,
    request i is due at start + i / rate (open loop). Returns (seconds, [(status, latency ms, answer)])."""
    streams: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
    for index, (url, body) in enumerate(bodies):
        streams.setdefault(str(body[tx_member]["sender"]), []).append((index, url, body))
    sessions = {
        sender: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, local_addr=(addresses.take(), 0)),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        for sender in streams
    }
    queue: asyncio.Queue[tuple[str, list[tuple[int, str, dict[str, Any]]]]] = asyncio.Queue()
    for item in streams.items():
        queue.put_nowait(item)
    results: list[tuple[int, float, dict[str, Any]]] = []

    async def worker() -> None:
        while not queue.empty():
            sender, stream = queue.get_nowait()
            session = sessions[sender]
            for index, url, body in stream:
                if rate is not None:
                    delay = start + index / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                sent = time.perf_counter()
                try:
                    async with session.post(url, json=body) as resp:
                        text = await resp.text()
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status, text = 0, json.dumps({"error": type(exc).__name__})
                latency = 1000 * (time.perf_counter() - sent)
                try:
                    answer = json.loads(text)
                except ValueError:
                    answer = {"error": text[:200]}
                results.append((status, latency, answer if isinstance(answer, dict) else {"answer": answer}))

    try:
        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - start
    finally:
        await asyncio.gather(*(s.close() for s in sessions.values()))
    return elapsed, results


class Bench:
    """One localnet and the two relayers, each started alone for its run."""

    def __init__(self, args: argparse.Namespace, data_dir: Path, peer_entry: Path) -> None:
        self.args = args
        self.data_dir = data_dir
        self.peer_entry = peer_entry
        self.gateway = ""
        self.info: dict[str, Any] = {}
        self.addresses = LocalAddresses()
        self.localnet: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None

    @property
    def wallets(self) -> Path:
        return self.data_dir / "localnet" / "wallets"

    async def start_localnet(self) -> None:
        port = free_port()
        self.gateway = f"http://127.0.0.1:{port}"
        self.localnet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gasless.cli",
                "localnet",
                "--port",
                str(port),
                "--data-dir",
                str(self.data_dir),
                "--round-ms",
                str(self.args.round_ms),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        await wait_ok(self.session, f"{self.gateway}/localnet/info")
        async with self.session.get(f"{self.gateway}/localnet/info") as resp:
            info = await resp.json()
        self.info = info.get("data", info)
        self.info.setdefault("ownerPem", str(self.wallets / "owner.pem"))
        from gasless.localnet.genesis import load_or_create_wallet
        from gasless.localnet.owner import unpause

        owner = load_or_create_wallet(self.wallets, "owner")
        await unpause(self.gateway, owner, self.info["contract"])
        # The peer keeps one wallet per shard (the last it loads wins): give it the first funded one of each.
        (self.data_dir / "ipv4-listen.cjs").write_text(IPV4_LISTEN)
        peer_wallets = self.data_dir / "peer-wallets"
        peer_wallets.mkdir()
        for shard in range(3):
            shutil.copy(
                sorted(self.wallets.glob(f"relayer-s{shard}-*.pem"))[0], peer_wallets / f"s{shard}.pem"
            )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.localnet is not None:
            stop_processes([self.localnet])

    async def start_gasless(self) -> tuple[subprocess.Popen[bytes], str]:
        assert self.session is not None
        port = free_port()
        env = {
            **os.environ,
            "GASLESS_PROFILE": "localnet",
            "GASLESS_MASTER_SECRET": SECRET,
            "GASLESS_GATEWAY_URLS": self.gateway,
            "GASLESS_DATA_DIR": str(self.data_dir / "gasless"),
            "GASLESS_CONTRACT_ADDRESS": self.info["contract"],
            "GASLESS_RELAYER_KEY_FILES": json.dumps(
                sorted(str(p) for p in self.wallets.glob("relayer-s*.pem"))
            ),
        }
        return await self._start(
            [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)], env, port, "/readyz"
        )

    async def _start(
        self, command: list[str], env: dict[str, str], port: int, ready_path: str, cwd: Path | None = None
    ) -> tuple[subprocess.Popen[bytes], str]:
        """One relayer process, its output in a log file, awaited until `ready_path` answers 200; stopped,
        with the log's end in the error, when it never does."""
        assert self.session is not None
        log_path = self.data_dir / f"{Path(command[-1]).stem}-{port}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ok(self.session, f"{url}{ready_path}")
        except RuntimeError as exc:
            stop_processes([proc])
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{exc} (exit code {proc.returncode}); its log ends:\n{tail}") from exc
        return proc, url

    async def start_peer(self, run: str) -> tuple[subprocess.Popen[bytes], str]:
        assert self.session is not None
        port = free_port()
        env = {
            **os.environ,
            "NETWORK_PROVIDER": self.gateway,
            "RELAYER_WALLETS_DIR": str(self.data_dir / "peer-wallets"),
            "DB_PATH": str(self.data_dir / f"peer-{run}.db"),
            "QUOTA_LIMIT": "1000000000",
            "PORT": str(port),
            "NODE_OPTIONS": f"--require {self.data_dir / 'ipv4-listen.cjs'}",
        }
        return await self._start(
            ["node", str(self.peer_entry)], env, port, "/health", self.peer_entry.parent.parent
        )

    async def peer_bodies(
        self, url: str, senders: list[UserSecretKey], per_sender: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """The peer's relay bodies: each sender's transactions name the peer's relayer for its shard."""
        assert self.session is not None
        streams = []
        for key in senders:
            sender = address_of(key.generate_public_key().buffer)
            async with self.session.get(f"{url}/relayer/address/{sender.to_bech32()}") as resp:
                relayer = parse_address((await resp.json())["relayerAddress"])
            receiver = address_of(UserSecretKey.generate().generate_public_key().buffer)
            stream = []
            for nonce in range(per_sender):
                tx = Transaction(
                    sender=sender,
                    receiver=receiver,
                    gas_limit=100_000,
                    chain_id="localnet",
                    nonce=nonce,
                    version=2,
                    relayer=relayer,
                )
                tx.signature = key.sign(computer.compute_bytes_for_signing(tx))
                stream.append((f"{url}/relay", {"transaction": tx.to_dictionary()}))
            streams.append(stream)
        return [streams[s][i] for i in range(per_sender) for s in range(len(senders))]

    async def run_one(
        self, service: str, phase: str, pair: int, senders: list[UserSecretKey], rate: float | None
    ) -> RunResult:
        assert self.session is not None
        per_sender = self.args.relays // self.args.senders
        starter = self.start_gasless() if service == GASLESS else self.start_peer(f"{phase}-{pair}")
        proc, url = await starter
        try:
            if service == GASLESS:
                bodies = await prepare(self.session, [url], senders, per_sender, 0)
                bodies = [(f"{api}/v1/relay", body) for api, body in bodies]
            else:
                bodies = await self.peer_bodies(url, senders, per_sender)
            tx_member = (
                "tx" if service == GASLESS else "transaction"
            )  # where each body carries its transaction

            label = f"{phase} {service} (pair {pair + 1})" + (f" at {rate:.0f}/s" if rate else "")
            with console.status(f"{label}: {len(bodies)} relays, concurrency {self.args.concurrency}"):
                counter = InstructionCount([proc.pid])
                counter.start()
                cpu_before = cpu_seconds([proc])
                elapsed, answers = await post_streams(
                    bodies, tx_member, self.args.concurrency, rate, self.addresses
                )
                cpu_used = cpu_seconds([proc]) - cpu_before
                instructions = counter.stop()
        finally:
            stop_processes([proc])
        result = RunResult(service, phase, pair, len(bodies), 0, elapsed, [], cpu_used, instructions)
        for status, latency, answer in answers:
            if status in (200, 202):
                result.ok += 1
                result.latencies_ms.append(latency)
                result.hashes.append(answer["intent"]["txHash"] if service == GASLESS else answer["txHash"])
            else:
                code = str(answer.get("code") or answer.get("error") or status)[:60]
                result.errors[code] = result.errors.get(code, 0) + 1
        console.print(row_text(result))
        return result

    async def executed(self, hashes: list[str]) -> int:
        """How many of `hashes` localnet executed successfully (waiting a few rounds for the last ones)."""
        session = self.session
        assert session is not None
        semaphore = asyncio.Semaphore(32)

        async def look(h: str) -> str:
            async with semaphore, session.get(f"{self.gateway}/transaction/{h}/status") as resp:
                return str((await resp.json()).get("data", {}).get("status", "unknown"))

        pending = list(hashes)
        done = 0
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            statuses = await asyncio.gather(*(look(h) for h in pending))
            done += sum(1 for s in statuses if s == "success")
            pending = [
                h for h, s in zip(pending, statuses, strict=True) if s in ("pending", "received", "unknown")
            ]
            if pending:
                await asyncio.sleep(self.args.round_ms / 1000)
        return done


def row_text(r: RunResult) -> str:
    ins = f", {r.instructions_per_relay / 1e6:.1f} M instructions/relay" if r.instructions_per_relay else ""
    errors = f", errors {json.dumps(r.errors)}" if r.errors else ""
    return (
        f"{r.phase:>6} {r.service:<7} pair {r.pair + 1}: {r.ok}/{r.sent} ok, {r.relays_per_s:.0f} relays/s, "
        f"p50 {percentile(r.latencies_ms, 50):.0f} ms, p99 {percentile(r.latencies_ms, 99):.0f} ms, "
        f"{r.cpu_ms_per_relay:.2f} CPU ms/relay{ins}{errors}"
    )


def order(pair: int) -> tuple[str, str]:
    return (GASLESS, PEER) if pair % 2 == 0 else (PEER, GASLESS)


async def main_async(args: argparse.Namespace, peer_entry: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, Path(tmp), peer_entry)
        try:
            await bench.start_localnet()
            assert bench.session is not None
            runs_per_service = 2 * args.pairs
            gasless_senders = [
                [UserSecretKey.generate() for _ in range(args.senders)] for _ in range(runs_per_service)
            ]
            with console.status(
                f"granting plans to {runs_per_service * args.senders} senders of this service"
            ):
                await grant_plans(
                    bench.session, bench.gateway, bench.info, [k for ks in gasless_senders for k in ks]
                )
            peer_senders = [
                [UserSecretKey.generate() for _ in range(args.senders)] for _ in range(runs_per_service)
            ]
            pools = {GASLESS: iter(gasless_senders), PEER: iter(peer_senders)}
            results: list[RunResult] = []
            for pair in range(args.pairs):
                for service in order(pair):
                    results.append(await bench.run_one(service, "max", pair, next(pools[service]), None))
            peer_max = [r.relays_per_s for r in results if r.service == PEER]
            rate = 0.5 * sum(peer_max) / len(peer_max)
            for pair in range(args.pairs):
                for service in order(pair):
                    results.append(await bench.run_one(service, "paced", pair, next(pools[service]), rate))
            with console.status("looking up every answered transaction on localnet"):
                for r in results:
                    r.executed = await bench.executed(r.hashes)
        finally:
            await bench.close()
    return report(args, results, rate)


def report(args: argparse.Namespace, results: list[RunResult], rate: float) -> dict[str, Any]:
    table = Table(
        title=f"bench/peer.py: {args.relays // args.senders * args.senders} relays a run, {args.senders} senders, "
        f"concurrency {args.concurrency}, paced runs at {rate:.0f}/s (50% of the peer's mean max)"
    )
    for col in (
        "run",
        "service",
        "pair",
        "ok/sent",
        "executed",
        "relays/s",
        "p50 / p99 ms",
        "CPU ms/relay",
        "M instr/relay",
        "errors",
    ):
        table.add_column(col)
    for r in results:
        table.add_row(
            r.phase,
            r.service,
            str(r.pair + 1),
            f"{r.ok}/{r.sent}",
            str(r.executed),
            f"{r.relays_per_s:.0f}",
            f"{percentile(r.latencies_ms, 50):.0f} / {percentile(r.latencies_ms, 99):.0f}",
            f"{r.cpu_ms_per_relay:.2f}",
            f"{r.instructions_per_relay / 1e6:.1f}" if r.instructions_per_relay else "-",
            json.dumps(r.errors) if r.errors else "-",
        )
    console.print(table)
    ratios = []
    by_key = {(r.service, r.phase, r.pair): r for r in results}
    for pair in range(args.pairs):
        g_max, p_max = by_key[(GASLESS, "max", pair)], by_key[(PEER, "max", pair)]
        g_paced, p_paced = by_key[(GASLESS, "paced", pair)], by_key[(PEER, "paced", pair)]
        ratio = {
            "pair": pair + 1,
            "throughput_ratio": g_max.relays_per_s / p_max.relays_per_s,
            "cpu_ratio": g_max.cpu_ms_per_relay / p_max.cpu_ms_per_relay,
            "paced_p99_ms": [percentile(g_paced.latencies_ms, 99), percentile(p_paced.latencies_ms, 99)],
        }
        ratios.append(ratio)
        console.print(
            f"pair {pair + 1}: relays/s gasless / peer = {ratio['throughput_ratio']:.2f}x (target >= 2); CPU per "
            f"relay gasless / peer = {ratio['cpu_ratio']:.2f} (target <= 0.5); p99 at {rate:.0f}/s: gasless "
            f"{ratio['paced_p99_ms'][0]:.0f} ms, peer {ratio['paced_p99_ms'][1]:.0f} ms (target: lower)"
        )
    summary = {
        "paced_rate": rate,
        "runs": [
            {
                "service": r.service,
                "phase": r.phase,
                "pair": r.pair + 1,
                "ok": r.ok,
                "sent": r.sent,
                "executed": r.executed,
                "relays_per_s": r.relays_per_s,
                "p50_ms": percentile(r.latencies_ms, 50),
                "p99_ms": percentile(r.latencies_ms, 99),
                "cpu_ms_per_relay": r.cpu_ms_per_relay,
                "instructions_per_relay": r.instructions_per_relay,
                "errors": r.errors,
            }
            for r in results
        ],
        "pairs": ratios,
    }
    print(json.dumps(summary))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peer-dir", type=Path, required=True, help="the peer relayer's source (built if needed)"
    )
    parser.add_argument("--relays", type=int, default=2000, help="relays per run")
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32, help="sender streams at once")
    parser.add_argument("--pairs", type=int, default=2, help="A/B pairs (the order alternates)")
    parser.add_argument("--round-ms", type=int, default=600)
    args = parser.parse_args()
    if args.relays // args.senders > 64:
        parser.error("at most 64 relays per sender (the service's in-flight limit per sender)")
    if shutil.which("node") is None:
        parser.error("node is not installed: the peer relayer runs on Node.js")
    peer_entry = ensure_peer_build(args.peer_dir.resolve())
    asyncio.run(main_async(args, peer_entry))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
