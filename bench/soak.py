"""A soak: the service at a steady offered load for an hour, watched for what grows.

Starts `gasless localnet` and the service as separate processes: one host on SQLite (`gasless serve`, what
`gasless up` runs beside localnet), or with `--hosts 2 --database-url ... --redis-url ...` hosts `a` and `b`
on a fresh PostgreSQL database and Redis. Localnet runs apart because it keeps the whole chain's history in
memory, as an archive node keeps it on disk: inside the measured process it would hide the service's own
memory under the chain's. Fresh senders (a plan granted to each) send same-shard transfers, each sender one
ordered stream (a wallet sends its nonces in order), open loop at `--rate` relays/s in all, each request due
at its slot whatever the answers before it; a sender's lease is renewed before it expires.

Every `--sample-s` seconds it records, for the service's processes: resident memory (VmRSS, the processes and
their children), open file descriptors, database connections (SQLite: descriptors open on the database
files; PostgreSQL: backends of the run's database in `pg_stat_activity`), the database's size (SQLite: the
files with their WAL; PostgreSQL: `pg_database_size`), and over the window the relays answered, their
client-observed p99 and the service-stamped `acceptToCosignMs` / `addedMs` p99. At the end every intent is
read back from the database (how many reached FINALIZED), the figures are checked against the targets
(after the first 5 minutes: memory +10% at most, descriptors and connections flat; the last 5 minutes'
p99 within 1.5x of the first 5 minutes'), and a PNG plot of memory, p99, relays/s, descriptors and connections is written. On a
PostgreSQL server with autovacuum off, the run does autovacuum's work itself (`autovacuum_stand_in`).

    .venv/bin/python bench/soak.py --minutes 60 --rate 100 --plot docs/images/soak-sqlite.png
    .venv/bin/python bench/soak.py --minutes 60 --rate 100 --hosts 2 --plot docs/images/soak-postgresql.png \
        --database-url postgresql+asyncpg://<user>@<host>:5432/<db> --redis-url redis://<host>:6379/<n>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from multiversx_sdk import Transaction, UserSecretKey

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relay import (  # noqa: E402  (the sibling benchmark)
    HOST_IDS,
    assign,
    computer,
    console,
    create_bench_database,
    drop_bench_database,
    free_port,
    grant_plans,
    percentile,
    ready_localnet,
    same_shard_receiver,
    service_env,
    stop_processes,
    wait_ok,
)

from gasless.chain.addresses import address_of, parse_address  # noqa: E402
from gasless.chain.gateway import LatestFirstConnector  # noqa: E402

WARMUP_S = 300  # the first 5 minutes: growth is judged after them, the first p99 over them
RENEW_BEFORE_MS = 60_000  # a lease is renewed this long before it expires


@dataclass
class Window:
    """What was answered in one sampling window."""

    client_ms: list[float] = field(default_factory=list)
    accept_ms: list[float] = field(default_factory=list)
    added_ms: list[float] = field(default_factory=list)
    ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)


class Soak:
    def __init__(self, args: argparse.Namespace, apis: list[str], gateway: str, info: dict[str, Any]) -> None:
        self.args, self.apis, self.gateway, self.info = args, apis, gateway, info
        self.window = Window()
        self.answered: list[str] = []
        self.renewals = 0

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

    async def stream(
        self, session: aiohttp.ClientSession, index: int, key: UserSecretKey, start: float, end: float
    ) -> None:
        """Sender `index` of S: its j-th relay is due at start + (j * S + index) / rate."""
        senders, rate = self.args.senders, self.args.rate
        api = self.apis[index % len(self.apis)]
        sender = address_of(key.generate_public_key().buffer)
        receiver = same_shard_receiver(sender)
        assignment = await assign(session, api, key)
        nonce = 0
        while True:
            due = start + (nonce * senders + index) / rate
            if due >= end:
                return
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if assignment["expiresAtMs"] - time.time() * 1000 < RENEW_BEFORE_MS:
                assignment = await assign(session, api, key)
                self.renewals += 1
            tx = Transaction(
                sender=sender,
                receiver=receiver,
                gas_limit=100_000,
                chain_id="localnet",
                nonce=nonce,
                version=2,
                relayer=parse_address(assignment["relayer"]),
            )
            tx.signature = key.sign(computer.compute_bytes_for_signing(tx))
            sent = time.monotonic()
            async with session.post(
                f"{api}/v1/relay", json={"tx": tx.to_dictionary(), "lease": assignment["lease"]}
            ) as resp:
                answer = await resp.json()
            window = self.window
            if resp.status in (200, 202):
                window.client_ms.append(1000 * (time.monotonic() - sent))
                latency = answer["intent"]["latency"]
                window.accept_ms.append(latency["acceptToCosignMs"])
                if latency["addedMs"] is not None:
                    window.added_ms.append(latency["addedMs"])
                window.ok += 1
                self.answered.append(answer["txHash"])
                nonce += 1
            else:
                code = answer.get("code", str(resp.status))
                window.refused[code] = window.refused.get(code, 0) + 1
                if code in ("LEASE_EXPIRED", "RESIGN_REQUIRED"):
                    assignment = await assign(session, api, key)
                    self.renewals += 1
                else:
                    await asyncio.sleep(0.2)  # the same nonce again at the next chance


def descendants(pids: list[int]) -> list[int]:
    found, queue = [], list(pids)
    while queue:
        pid = queue.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                queue += [int(c) for c in (task / "children").read_text().split()]
    return sorted(set(found))


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def open_fds(pids: list[int], suffixes: tuple[str, ...] = ()) -> int:
    """Open descriptors of the processes (only those open on a path ending with one of `suffixes`)."""
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if not suffixes:
                    count += 1
                    continue
                with contextlib.suppress(OSError):
                    if os.readlink(fd).endswith(suffixes):
                        count += 1
    return count


async def postgres_figures(database_url: str) -> tuple[int, int]:
    """(backends connected to the run's database, its size in bytes)."""
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    conn = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        backends = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() "
            "AND application_name <> $2",
            url.database,
            VACUUM_APP,
        )
        size = await conn.fetchval("SELECT pg_database_size($1)", url.database)
    finally:
        await conn.close()
    return int(backends), int(size)


VACUUM_APP = "gasless-soak-autovacuum"  # the stand-in's connection, left out of the backends counted


async def autovacuum_stand_in(
    database_url: str, stop: asyncio.Event, log: list[dict[str, Any]], naptime_s: float = 60
) -> None:
    """What PostgreSQL's autovacuum would do, for a server that has it off (`autovacuum = off`, as on the
    machines this was measured on); nothing when it is on. A production server vacuums: without it every
    update leaves a dead row behind (an intent is updated three or four times, a latency rollup on every
    round), reads walk them and the tables bloat, and an hour's soak measures that instead of the service.
    Every `autovacuum_naptime` (1 min), each table past autovacuum's default thresholds (dead rows over
    50 + 20% of the table, rows inserted since the last vacuum over 1 000 + 20%, changes since the last
    analyze over 50 + 10%) is vacuumed and analyzed (only analyzed when past the last one alone), throttled
    as autovacuum is (cost delay 2 ms, limit 200). Each pass is logged with its tables and seconds."""
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(url, server_settings={"application_name": VACUUM_APP})
    try:
        if await conn.fetchval("SHOW autovacuum") == "on":
            return
        await conn.execute("SET vacuum_cost_delay = '2ms'")
        await conn.execute("SET vacuum_cost_limit = 200")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), naptime_s)
            if stop.is_set():
                return
            started = time.monotonic()
            due = await conn.fetch(
                """SELECT s.relname,
                          s.n_dead_tup > 50 + 0.2 * greatest(c.reltuples, 0)
                          OR s.n_ins_since_vacuum > 1000 + 0.2 * greatest(c.reltuples, 0) AS vacuum,
                          s.n_mod_since_analyze > 50 + 0.1 * greatest(c.reltuples, 0) AS analyze
                   FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"""
            )
            # Past the analyze threshold alone, autovacuum analyzes and does not vacuum.
            tables = []
            for row in due:
                if row["vacuum"] or row["analyze"]:
                    verb = "VACUUM (ANALYZE)" if row["vacuum"] else "ANALYZE"
                    await conn.execute(f'{verb} "{row["relname"]}"')
                    tables.append(f"{row['relname']}{'' if row['vacuum'] else ' (analyze)'}")
            log.append({"tables": tables, "seconds": round(time.monotonic() - started, 2)})
    finally:
        await conn.close()


async def final_states(database_url: str, sqlite_path: Path) -> dict[str, int]:
    query = "SELECT state, count(*) FROM intents GROUP BY state"
    if not database_url:
        with contextlib.closing(sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)) as conn:
            return dict(conn.execute(query).fetchall())
    import asyncpg
    from sqlalchemy.engine import make_url

    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(url)
    try:
        return {row[0]: int(row[1]) for row in await conn.fetch(query)}
    finally:
        await conn.close()


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    axes[0].plot(minutes, [s["rss_mib"] for s in samples], color="tab:blue")
    axes[0].set_ylabel("service RSS (MiB)")
    axes[0].set_ylim(bottom=0)
    axes[1].plot(minutes, [s["client_p99_ms"] for s in samples], label="client-observed", color="tab:red")
    axes[1].plot(minutes, [s["added_p99_ms"] for s in samples], label="addedMs", color="tab:orange")
    axes[1].plot(minutes, [s["accept_p99_ms"] for s in samples], label="acceptToCosignMs", color="tab:green")
    axes[1].set_ylabel("p99 per window (ms)")
    axes[1].set_ylim(bottom=0)
    axes[1].legend(loc="upper right", fontsize="small")
    axes[2].plot(minutes, [s["relays_per_s"] for s in samples], color="tab:purple")
    axes[2].set_ylabel("relays/s")
    axes[2].set_ylim(bottom=0)
    # Connections and descriptors: flat, or back to their level after each slow spell.
    axes[3].plot(minutes, [s["fds"] for s in samples], label="open descriptors", color="tab:brown")
    axes[3].plot(
        minutes, [s["db_connections"] for s in samples], label="database connections", color="tab:cyan"
    )
    axes[3].set_ylabel("count (all hosts)")
    axes[3].set_ylim(bottom=0)
    axes[3].legend(loc="upper left", fontsize="small")
    axes[3].set_xlabel("minutes")
    for axis in axes:
        axis.axvline(WARMUP_S / 60, color="grey", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def verdict(samples: list[dict[str, Any]], window_s: float) -> dict[str, Any]:
    """The targets, judged on the samples after the first 5 minutes."""
    settled = [s for s in samples if s["t_s"] > WARMUP_S]
    if not settled:
        return {"judged": False, "why": f"the run was shorter than {WARMUP_S} s"}
    base = settled[0]
    last_t = samples[-1]["t_s"]

    def p99_over(chosen: list[dict[str, Any]], key: str) -> float:
        return percentile([v for s in chosen for v in s[key]], 99)

    first = [s for s in samples if s["t_s"] <= WARMUP_S]
    last = [s for s in samples if s["t_s"] > last_t - WARMUP_S]
    result: dict[str, Any] = {"judged": True}
    result["rss_growth"] = max(s["rss_mib"] for s in settled) / base["rss_mib"] - 1
    # Descriptors and connections: pools open more under a burst and keep them (a high-water mark, bounded
    # by the pool's limit); a leak keeps growing. So: the range after the first 5 minutes, and whether the
    # second half of that time went above the first half's highest.
    half = len(settled) // 2
    flat = {}
    for name in ("fds", "db_connections"):
        values = [s[name] for s in settled]
        result[f"{name}_range"] = [min(values), max(values)]
        result[f"{name}_max_halves"] = [max(values[: half or 1]), max(values[half:] or values)]
        flat[name] = result[f"{name}_max_halves"][1] <= result[f"{name}_max_halves"][0]
    if "_client" in first[0]:  # the latencies themselves (not kept in the JSON file)
        for key in ("client", "accept", "added"):
            first_p99, last_p99 = p99_over(first, f"_{key}"), p99_over(last, f"_{key}")
            result[f"{key}_p99_first_last"] = [first_p99, last_p99]
    result["db_bytes_per_relay_first_last"] = _growth_per_relay(first, last)
    result["met"] = {
        "rss_growth <= 10%": result["rss_growth"] <= 0.10,
        "fds: no growth in the second half": flat["fds"],
        "db connections: no growth in the second half": flat["db_connections"],
    }
    if "client_p99_first_last" in result:
        client_first, client_last = result["client_p99_first_last"]
        added_first, added_last = result["added_p99_first_last"]
        result["met"]["client p99 last <= 1.5x first"] = client_last <= 1.5 * client_first
        result["met"]["addedMs p99 last <= 1.5x first"] = added_last <= 1.5 * added_first
    return result


def _growth_per_relay(first: list[dict[str, Any]], last: list[dict[str, Any]]) -> list[float | None]:
    """The database's growth per relay answered, over the first and over the last 5 minutes."""
    out: list[float | None] = []
    for chosen in (first, last):
        relays = sum(s["ok"] for s in chosen[1:])
        grown = chosen[-1]["db_bytes"] - chosen[0]["db_bytes"]
        out.append(grown / relays if relays else None)
    return out


async def soak(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    gw_port = free_port()
    gateway = f"http://127.0.0.1:{gw_port}"
    ports = [free_port() for _ in range(args.hosts)]
    apis = [f"http://127.0.0.1:{port}" for port in ports]
    database_url = await create_bench_database(args.database_url) if args.database_url else ""
    sqlite_path = data_dir / "gasless.db"
    py = sys.executable
    localnet = subprocess.Popen(
        [py, "-m", "gasless.cli", "localnet", "--port", str(gw_port), "--data-dir", str(data_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hosts: list[subprocess.Popen[bytes]] = []
    samples: list[dict[str, Any]] = []
    vacuum_stop = asyncio.Event()
    vacuums: list[dict[str, Any]] = []
    vacuum: asyncio.Task[None] | None = None
    finished = False
    try:
        # Latest first, as the service's clients take their connections: Node's agent (the starter kit's;
        # 'lifo' since Node 16) and urllib3's pool (the Python SDK's). aiohttp's own first-returned-first
        # rotates through every connection a slow spell opened and keeps them all open on the hosts.
        async with aiohttp.ClientSession(connector=LatestFirstConnector(limit=0)) as session:
            info = await ready_localnet(session, gateway, data_dir)
            env = {
                **service_env(data_dir, gateway, info, database_url, args.redis_url),
                "GASLESS_METRICS_PORT": "0",
            }
            for index, (port, api) in enumerate(zip(ports, apis, strict=True)):
                hosts.append(
                    subprocess.Popen(
                        [py, "-m", "gasless.cli", "serve", "--port", str(port)],
                        env={**env, "GASLESS_HOST_ID": HOST_IDS[index]},
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                await wait_ok(session, f"{api}/readyz", timeout=120)
            with console.status(f"granting plans to {args.senders} senders"):
                keys = [UserSecretKey.generate() for _ in range(args.senders)]
                await grant_plans(session, gateway, info, keys)
            if database_url:
                vacuum = asyncio.create_task(autovacuum_stand_in(database_url, vacuum_stop, vacuums))
            run = Soak(args, apis, gateway, info)
            start = time.monotonic()
            end = start + 60 * args.minutes
            streams = [
                asyncio.create_task(run.stream(session, i, key, start, end)) for i, key in enumerate(keys)
            ]
            total = 0
            next_sample = start + args.sample_s
            previous = start
            while not all(task.done() for task in streams):
                await asyncio.sleep(max(0.0, next_sample - time.monotonic()))
                now = time.monotonic()
                window = run.take_window()
                pids = descendants([p.pid for p in hosts])
                wal_bytes = 0  # SQLite's write-ahead log alone: it grows while readers keep checkpoints out
                if database_url:
                    connections, db_bytes = await postgres_figures(database_url)
                else:
                    connections = open_fds(pids, (str(sqlite_path), f"{sqlite_path}-wal"))
                    db_bytes = sum(p.stat().st_size for p in data_dir.glob("gasless.db*"))
                    wal = Path(f"{sqlite_path}-wal")
                    wal_bytes = wal.stat().st_size if wal.exists() else 0
                total += window.ok
                sample = {
                    "t_s": round(now - start, 1),
                    "ok": window.ok,
                    "refused": window.refused,
                    "relays_per_s": window.ok / (now - previous),
                    "client_p99_ms": percentile(window.client_ms, 99) if window.client_ms else 0.0,
                    "accept_p99_ms": percentile(window.accept_ms, 99) if window.accept_ms else 0.0,
                    "added_p99_ms": percentile(window.added_ms, 99) if window.added_ms else 0.0,
                    "rss_mib": rss_mib(pids),
                    "localnet_rss_mib": rss_mib([localnet.pid]),
                    "fds": open_fds(pids),
                    "db_connections": connections,
                    "db_bytes": db_bytes,
                    "wal_bytes": wal_bytes,
                    "_client": window.client_ms,
                    "_accept": window.accept_ms,
                    "_added": window.added_ms,
                }
                samples.append(sample)
                console.print(
                    f"{sample['t_s'] / 60:5.1f} min  {sample['relays_per_s']:5.1f} relays/s  "
                    f"p99 client {sample['client_p99_ms']:6.1f} / added {sample['added_p99_ms']:6.1f} / "
                    f"accept {sample['accept_p99_ms']:5.1f} ms  RSS {sample['rss_mib']:7.1f} MiB  "
                    f"fds {sample['fds']}  db conns {connections}  db {db_bytes / 2**20:8.1f} MiB  "
                    f"wal {wal_bytes / 2**20:6.1f} MiB  "
                    f"localnet RSS {sample['localnet_rss_mib']:7.1f} MiB"
                    + (f"  refused {json.dumps(window.refused)}" if window.refused else "")
                )
                next_sample += args.sample_s
                previous = now
            for task in streams:
                task.result()  # a stream that failed fails the run
            # Everything answered reaches a terminal state within a few rounds once the load stops.
            await asyncio.sleep(5)
        finished = True
    finally:
        vacuum_stop.set()
        stop_processes([*hosts, localnet])
        if database_url and not finished:  # a stopped run leaves no database behind either
            # Before awaiting the vacuum task: a stopped run's tasks are all cancelled, and awaiting a
            # cancelled task raises.
            await drop_bench_database(args.database_url, database_url)
        if vacuum is not None:
            await vacuum
    states = await final_states(database_url, sqlite_path)
    if database_url:
        await drop_bench_database(args.database_url, database_url)
    result = verdict(samples, args.sample_s)
    result.update(
        {
            "storage": "postgresql" if database_url else "sqlite",
            "hosts": args.hosts,
            "minutes": args.minutes,
            "offered_per_s": args.rate,
            "answered": len(run.answered),
            "lease_renewals": run.renewals,
            "vacuum_passes": vacuums,
            "intent_states": states,
            "samples": [{k: v for k, v in s.items() if not k.startswith("_")} for s in samples],
        }
    )
    if args.plot:
        storage = "PostgreSQL + Redis" if database_url else "SQLite"
        plot(
            samples,
            Path(args.plot),
            f"bench/soak.py: {args.hosts} host(s) on {storage}, {args.rate:g} relays/s offered, "
            f"{args.minutes:g} min",
        )
    return result


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=100, help="offered relays/s in all")
    parser.add_argument("--senders", type=int, default=40)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--hosts", type=int, default=1, choices=(1, 2))
    parser.add_argument(
        "--database-url", default="", help="PostgreSQL (a fresh database is made for the run)"
    )
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--plot", default="", help="write the PNG plot here")
    parser.add_argument("--json", default="", help="write every sample and the verdict here")
    parser.add_argument(
        "--judge", default="", help="judge and plot the samples of an earlier run's --json file (no run)"
    )
    args = parser.parse_args()
    if args.judge:
        earlier = json.loads(Path(args.judge).read_text())
        judged = verdict(earlier["samples"], args.sample_s)
        for key in ("client_p99_first_last", "accept_p99_first_last", "added_p99_first_last"):
            if key in earlier:  # measured on the latencies by the run itself
                judged[key] = earlier[key]
                judged["met"].update({k: v for k, v in earlier["met"].items() if "p99" in k})
        if args.plot:
            storage = "PostgreSQL + Redis" if earlier["storage"] == "postgresql" else "SQLite"
            plot(
                earlier["samples"],
                Path(args.plot),
                f"bench/soak.py: {earlier['hosts']} host(s) on {storage}, {earlier['offered_per_s']:g} relays/s "
                f"offered, {earlier['minutes']:g} min",
            )
        console.print_json(json.dumps(judged))
        return 0 if all(judged["met"].values()) else 1
    if args.hosts == 2 and not (args.database_url and args.redis_url):
        parser.error("--hosts 2 needs --database-url and --redis-url")
    # A run stopped by SIGTERM stops its localnet and hosts as on Ctrl-C (the run's `finally`), never leaving
    # them serving beside the next run.
    signal.signal(signal.SIGTERM, _interrupted)
    with tempfile.TemporaryDirectory(prefix="gasless-soak-") as tmp:
        result = asyncio.run(soak(args, Path(tmp)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    summary = {k: v for k, v in result.items() if k != "samples"}
    console.print_json(json.dumps(summary))
    return 0 if result.get("judged") and all(result["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
