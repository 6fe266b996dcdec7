"""Instructions per relay of the API process at its maximum, against the bare endpoint's (issue 17, target 4),
counted by callgrind: for machines without a hardware instruction counter (`perf stat -e instructions` says
`<not supported>` on a VM without a PMU).

Both servers run under `valgrind --tool=callgrind` in one invocation, one after the other, against one
`gasless localnet`; each gets a warm-up, then its counters are zeroed, a closed loop of relays is posted at
`--concurrency`, and the counters are dumped. Under callgrind a server is always at its maximum: it is the
bottleneck of the closed loop. What it executes in the window is what is counted, all threads (the API's
SQLite writer thread too).

Callgrind runs a process many times slower (about 20 times for the API on a 2-core VM), but the clock does
not slow with it. The API's timed work (the network poll twice a round, the tracker's rounds, the outbox and
the other jobs: about 40 ms of CPU a second when idle) would run at its usual pace in real time and weigh
that many times more per relay than it does at the real maximum. So the API and localnet run on one slowed
clock (libfaketime, Debian's `faketime` package, `--slowdown` times slower than real time, both anchored to
one instant so that the API's view of the chain's clock stays synchronised). Choose `--slowdown` so that
the relays per second of the service's clock, which the run prints, match `bench/relay.py`'s maximum on the
same machine: the service then sees the relays per round and per poll it sees at its real maximum. The
run also prints the API's idle instructions per second of its clock.

With `--database-url` and `--redis-url` the API runs on PostgreSQL + Redis. Those servers answer on the real
clock, so the service's blocking reads and timeouts there return too often on the slowed one: the count
overstates the per-relay cost, but compares two builds run the same way.

The bare endpoint (`bench/stack_floor.py --serve`) has no timed work and runs on the real clock.

    .venv/bin/python bench/instructions.py --senders 32 --per-sender 24 --warmup-per-sender 2 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from multiversx_sdk import UserPEM, UserSecretKey
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relay import (  # noqa: E402  (the sibling benchmarks)
    create_bench_database,
    drop_bench_database,
    free_port,
    grant_plans,
    post_all,
    prepare,
    ready_localnet,
    service_env,
    stop_processes,
    wait_ok,
)
from stack_floor import post_streams, presigned, sender_keys  # noqa: E402

from gasless.cli.output import CliConsole  # noqa: E402

console = CliConsole()  # never cut when not a terminal
FAKETIME_LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
)
STACK_FLOOR = Path(__file__).resolve().parent / "stack_floor.py"


class SlowClock:
    """One clock, `slowdown` times slower than real time, for every process started under it: a process's
    clock is anchored to the instant this object was made, so two processes started minutes apart agree
    (libfaketime's `@<start> x<rate>` starts a process's clock at <start> when the process first reads it;
    an unknown start-up delay d then shifts it by only d / slowdown)."""

    def __init__(self, slowdown: float, library: str) -> None:
        self.slowdown = slowdown
        self.library = library
        self.anchor = time.time()

    def now(self) -> float:
        """The slowed clock's reading now."""
        return self.anchor + (time.time() - self.anchor) / self.slowdown

    def env(self) -> dict[str, str]:
        start = datetime.fromtimestamp(self.now(), UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME": f"@{start} x{1 / self.slowdown:.6f}",
            "TZ": "UTC",  # libfaketime reads the start as local time
        }


class Callgrind:
    """A process under callgrind with instrumentation off until `instrument()` (start-up at valgrind's
    lighter pace), counted between `zero()` and `dump()` through `callgrind_control`."""

    def __init__(self, out_dir: Path, name: str) -> None:
        self.out_dir = out_dir
        self.name = name
        self.pid = 0
        self.last_dump: Path | None = None

    def command(self, argv: list[str]) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out_dir / self.name}.%p",
            *argv,
        ]

    def _control(self, *flags: str) -> None:
        subprocess.run(
            ["callgrind_control", *flags, str(self.pid)], check=True, capture_output=True, timeout=600
        )

    def instrument(self) -> None:
        self._control("--instr=on")

    def zero(self) -> None:
        self._control("--zero")

    def dump(self) -> int:
        """Dumps the counters and returns the instructions counted since the last zero."""
        before = set(self.out_dir.glob(f"{self.name}.{self.pid}*"))
        self._control("--dump")
        (dump,) = set(self.out_dir.glob(f"{self.name}.{self.pid}*")) - before
        self.last_dump = dump
        match = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no totals in {dump}")
        return int(match.group(1))


def by_library(dump: Path) -> Counter[str]:
    """The instructions of a callgrind dump by the shared object that executed them (self cost: a call's
    inclusive cost, the line after `calls=`, is not added again)."""
    names: dict[str, str] = {}
    costs: Counter[str] = Counter()
    library, inclusive = "?", False
    for line in dump.read_text().splitlines():
        if line.startswith("ob="):
            ref, _, name = line[3:].partition(" ")
            if name:
                names[ref] = name.rsplit("/", 1)[-1]
            library = names.get(ref, ref)
        elif line.startswith("cob="):
            ref, _, name = line[4:].partition(" ")
            if name:
                names[ref] = name.rsplit("/", 1)[-1]
        elif line.startswith("calls="):
            inclusive = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            fields = line.split()
            if inclusive:
                inclusive = False
            elif len(fields) > 1:
                costs[library] += int(fields[1])
    return costs


async def bare_endpoint(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    gateway: str,
    relayer_pem: Path,
    data_dir: Path,
) -> dict[str, Any]:
    """The stack's bare relay endpoint under callgrind: instructions per relay at its maximum."""
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    counter = Callgrind(data_dir, "bare")
    argv = [sys.executable, str(STACK_FLOOR), "--serve", "--port", str(port), "--gateway", gateway]
    argv += ["--database", str(data_dir / "bare.db"), "--relayer-pem", str(relayer_pem)]
    proc = subprocess.Popen(counter.command(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counter.pid = proc.pid
    try:
        with console.status("bare endpoint: starting under valgrind"):
            await wait_ok(session, f"{api}/docs", timeout=600)
        relayer = UserPEM.from_file(relayer_pem).secret_key
        keys = sender_keys(relayer, args.senders)
        warm = presigned(relayer, keys, 0, args.warmup_per_sender)
        bodies = presigned(relayer, keys, args.warmup_per_sender, args.per_sender)
        counter.instrument()
        with console.status(f"bare endpoint: warm-up, {len(warm)} relays"):
            await post_streams(session, f"{api}/relay", warm, args.concurrency)
        counter.zero()
        with console.status(f"bare endpoint: {len(bodies)} relays at concurrency {args.concurrency}"):
            elapsed, latencies = await post_streams(session, f"{api}/relay", bodies, args.concurrency)
        instructions = counter.dump()
    finally:
        stop_processes([proc])
    ok = len(latencies)
    libraries = by_library(counter.last_dump) if counter.last_dump else Counter()
    return {
        "ok": ok,
        "relays": len(bodies),
        "seconds": elapsed,
        "instructions": instructions,
        "libraries": dict(libraries),
    }


async def service(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    gateway: str,
    info: dict[str, Any],
    clock: SlowClock,
    data_dir: Path,
) -> dict[str, Any]:
    """`gasless serve` (SQLite, or PostgreSQL + Redis with `--database-url`) under callgrind on the slowed
    clock: instructions per relay at its maximum, and per second of its clock when idle. Only the API
    process is counted: the database and Redis servers run on the real clock, outside callgrind."""
    database_url = await create_bench_database(args.database_url) if args.database_url else ""
    try:
        env = service_env(data_dir, gateway, info, database_url, args.redis_url)
        return await _service(args, session, gateway, info, clock, data_dir, env)
    finally:
        if database_url:
            await drop_bench_database(args.database_url, database_url)


async def _service(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    gateway: str,
    info: dict[str, Any],
    clock: SlowClock,
    data_dir: Path,
    served: dict[str, str],
) -> dict[str, Any]:
    port, metrics_port = free_port(), free_port()
    api = f"http://127.0.0.1:{port}"
    env = {**served, **clock.env(), "GASLESS_HOST_ID": "a", "GASLESS_METRICS_PORT": str(metrics_port)}
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    counter = Callgrind(data_dir, "api")
    argv = [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        counter.command(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    counter.pid = proc.pid
    try:
        with console.status("API: starting under valgrind on the slowed clock"):
            await wait_ok(session, f"{api}/readyz", timeout=900)
        with console.status("granting plans to senders (the chain's rounds are slowed too)"):
            senders = [UserSecretKey.generate() for _ in range(args.senders)]
            await grant_plans(session, gateway, info, senders)
        with console.status("assigning and pre-signing"):
            warm = await prepare(session, [api], senders, args.warmup_per_sender, 0)
            bodies = await prepare(session, [api], senders, args.per_sender, args.warmup_per_sender)
        counter.instrument()
        # Idle: the timed work alone, per second of the service's clock.
        idle_real_s = args.idle_s * clock.slowdown
        with console.status(f"API: idle for {args.idle_s:g} s of its clock ({idle_real_s:.0f} s)"):
            counter.zero()
            idle_from = clock.now()
            await asyncio.sleep(idle_real_s)
            idle_instructions = counter.dump()
            idle_s = clock.now() - idle_from
        with console.status(f"API: warm-up, {len(warm)} relays, until final"):
            await post_all(session, warm, args.concurrency, None)
            finalized = await wait_finalized(session, metrics, len(warm), 0)
        counter.zero()
        with console.status(f"API: {len(bodies)} relays at concurrency {args.concurrency}"):
            started = clock.now()
            elapsed, results = await post_all(session, bodies, args.concurrency, None)
            posted = clock.now()
        # What a relay costs does not end with its answer: tracking to finality, settlement and the
        # acknowledgements follow. They are counted until every relay is final; the idle cost of the time
        # after the last answer is taken off (at the maximum, relays keep the service busy through it).
        ok = sum(1 for r in results if r["status"] in (200, 202))
        with console.status("API: until every relay is final"):
            await wait_finalized(session, metrics, ok, finalized)
            ended = clock.now()
        instructions = counter.dump()
    finally:
        stop_processes([proc])
    errors = [r.get("code", r["status"]) for r in results if r["status"] not in (200, 202)]
    idle_per_s = idle_instructions / idle_s
    return {
        "ok": ok,
        "relays": len(bodies),
        "errors": errors,
        "seconds": elapsed,
        "service_seconds": posted - started,
        "tail_service_seconds": ended - posted,
        "instructions": instructions,
        "idle_instructions_per_s": idle_per_s,
        "counted_instructions": instructions - idle_per_s * (ended - posted),
        "libraries": dict(by_library(counter.last_dump)) if counter.last_dump else {},
    }


async def wait_finalized(session: aiohttp.ClientSession, metrics: str, count: int, since: int) -> int:
    """Waits until the service has finalized `count` intents more than `since` (its transition counter) and
    returns the counter. Read every few seconds: each read is counted too, and costs little."""
    pattern = re.compile(r'^gasless_intent_transitions_total\{state="FINALIZED"\} ([0-9.e+]+)$', re.MULTILINE)
    while True:
        async with session.get(metrics) as resp:
            match = pattern.search(await resp.text())
        finalized = int(float(match.group(1))) if match else 0
        if finalized >= since + count:
            return finalized
        await asyncio.sleep(5)


async def run(args: argparse.Namespace, data_dir: Path, library: str) -> dict[str, Any]:
    clock = SlowClock(args.slowdown, library)
    gw_port = free_port()
    gateway = f"http://127.0.0.1:{gw_port}"
    localnet_argv = [sys.executable, "-m", "gasless.cli", "localnet", "--port", str(gw_port)]
    localnet_argv += ["--data-dir", str(data_dir), "--round-ms", str(args.round_ms)]
    localnet = subprocess.Popen(
        localnet_argv, env={**os.environ, **clock.env()}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            with console.status("localnet: starting, and unpausing its contract (its rounds are slowed)"):
                info = await ready_localnet(session, gateway, data_dir)
            relayer_pem = sorted((data_dir / "localnet" / "wallets").glob("relayer-s*.pem"))[0]
            bare = await bare_endpoint(args, session, gateway, relayer_pem, data_dir)
            api = await service(args, session, gateway, info, clock, data_dir)
    finally:
        stop_processes([localnet])
    return {"bare": bare, "api": api}


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    bare, api = figures["bare"], figures["api"]
    bare_per_relay = bare["instructions"] / max(1, bare["ok"])
    api_per_relay = api["counted_instructions"] / max(1, api["ok"])
    table = Table(title=f"bench/instructions.py: callgrind, closed loop at concurrency {args.concurrency}")
    for col in ("server", "relays ok", "M instructions / relay", "relays/s (real)", "relays/s (its clock)"):
        table.add_column(col)
    table.add_row(
        "bare endpoint (bench/stack_floor.py)",
        f"{bare['ok']} / {bare['relays']}",
        f"{bare_per_relay / 1e6:.2f}",
        f"{bare['ok'] / bare['seconds']:.1f}",
        "-",
    )
    table.add_row(
        f"gasless serve ({'PostgreSQL + Redis' if args.database_url else 'SQLite'}), clock slowed "
        f"{args.slowdown:g}x",
        f"{api['ok']} / {api['relays']}",
        f"{api_per_relay / 1e6:.2f}",
        f"{api['ok'] / api['seconds']:.1f}",
        f"{api['ok'] / api['service_seconds']:.0f}",
    )
    console.print(table)
    # Where the difference is executed: the interpreter (the code of both and of their libraries), or a
    # library's compiled code (libsodium, SQLite, the JSON codec...). Whole-window counts, per relay.
    libraries = Table(title="M instructions per relay, by the shared object executing them (self cost)")
    for col in ("object", "bare endpoint", "gasless serve", "difference"):
        libraries.add_column(col)
    shown = sorted(
        set(bare["libraries"]) | set(api["libraries"]),
        key=lambda name: -(api["libraries"].get(name, 0) / max(1, api["ok"])),
    )
    for name in shown[:12]:
        b = bare["libraries"].get(name, 0) / max(1, bare["ok"]) / 1e6
        a = api["libraries"].get(name, 0) / max(1, api["ok"]) / 1e6
        libraries.add_row(name, f"{b:.3f}", f"{a:.3f}", f"{a - b:+.3f}")
    console.print(libraries)
    if api["errors"]:
        console.print(f"[red]API errors[/red]: {api['errors'][:10]}")
    console.print(
        f"API idle: {api['idle_instructions_per_s'] / 1e6:.1f} M instructions per second of its clock "
        f"(the timed work alone); relays answered in {api['service_seconds']:.2f} s of its clock, final "
        f"{api['tail_service_seconds']:.2f} s later: {api['instructions'] / 1e6:.0f} M counted, less "
        f"{(api['instructions'] - api['counted_instructions']) / 1e6:.0f} M of idle cost after the last "
        "answer"
    )
    console.print(
        f"API / bare endpoint = {api_per_relay / bare_per_relay:.2f}x the instructions per relay "
        "(issue 17, target 4: at most 2x)"
    )
    print(
        json.dumps(
            {
                **figures,
                "slowdown": args.slowdown,
                "bare_instructions_per_relay": bare_per_relay,
                "api_instructions_per_relay": api_per_relay,
                "ratio": api_per_relay / bare_per_relay,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--per-sender", type=int, default=24, help="counted relays per sender")
    parser.add_argument("--warmup-per-sender", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--round-ms", type=int, default=600, help="localnet's round, on the slowed clock")
    parser.add_argument(
        "--slowdown",
        type=float,
        default=20.0,
        help="how many times slower than real time the API's and localnet's clock runs (near callgrind's "
        "own slowdown of the API)",
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="serve the API on PostgreSQL (postgresql+asyncpg://...; a fresh database is made for the run) "
        "and --redis-url",
    )
    parser.add_argument("--redis-url", default="", help="Redis, with --database-url")
    parser.add_argument(
        "--keep", default="", help="copy the callgrind dumps here (for callgrind_annotate) before cleaning up"
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=2.0,
        help="seconds of the service's clock its idle cost is counted for",
    )
    args = parser.parse_args()
    if bool(args.database_url) != bool(args.redis_url):
        parser.error("--database-url and --redis-url go together (the service's shared state)")
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    library = next((path for path in FAKETIME_LIBRARIES if Path(path).exists()), None)
    if missing or library is None:
        parser.error(
            f"needs valgrind and libfaketime (Debian packages valgrind and faketime); missing: "
            f"{', '.join(missing + ([] if library else ['libfaketimeMT.so.1']))}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            report(args, asyncio.run(run(args, Path(tmp), library)))
        finally:
            if args.keep:
                Path(args.keep).mkdir(parents=True, exist_ok=True)
                for dump in Path(tmp).glob("*.[0-9]*"):
                    if dump.name.startswith(("bare.", "api.")):
                        shutil.copy(dump, args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
