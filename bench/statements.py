"""The PostgreSQL server's work per relay, by statement (issue 17, target 5).

Runs `bench/relay.py`'s run (one host, max then paced) on a PostgreSQL cluster of its own (initdb in a
temporary directory, loopback, no TLS) with `pg_stat_statements` preloaded, a server no one else uses, so the
shared server's settings are untouched. Once the service has stopped, before the run database is dropped, it
reads back for that database:

- every statement's calls per relay, server time per relay and rows per call, the most expensive first (the
  time is execution's: `pg_stat_statements.track_planning` is off, its default, so planning reads zero);
- the database's transactions per relay (`pg_stat_database`): in autocommit every statement alone is one, so
  the difference to the statements counted is what `pg_stat_statements` leaves out (the pool's pings are
  empty queries) and utility statements.

Relays counted are those of both phases (the other work of the run, granting plans and assigning, is a few
statements per sender). Redis is the one given (a database number of its own):

    .venv/bin/python bench/statements.py --senders 32 --per-sender 24 --redis-url redis://127.0.0.1:6379/13
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg
from rich.table import Table
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos  # noqa: E402  (the sibling benchmarks, as bench/instructions.py imports them)
import relay  # noqa: E402

from gasless.cli.output import CliConsole  # noqa: E402

console = CliConsole()  # never cut when not a terminal


STATEMENTS = """
SELECT s.query, s.calls, s.total_plan_time + s.total_exec_time AS ms, s.rows
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1
ORDER BY ms DESC
"""
DATABASE = "SELECT xact_commit, xact_rollback, sessions FROM pg_stat_database WHERE datname = $1"


def _dsn(sqlalchemy_url: str) -> str:
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def read_statements(admin_url: str, run_url: str) -> dict[str, Any]:
    """The run database's statements and transactions, read through the admin database (whose extension
    object shows every database's statements)."""
    name = make_url(run_url).database
    conn = await asyncpg.connect(_dsn(admin_url))
    try:
        rows = await conn.fetch(STATEMENTS, name)
        database = await conn.fetchrow(DATABASE, name)
    finally:
        await conn.close()
    return {
        "statements": [
            {"query": " ".join(r["query"].split()), "calls": r["calls"], "ms": r["ms"], "rows": r["rows"]}
            for r in rows
        ],
        "xact_commit": database["xact_commit"],
        "xact_rollback": database["xact_rollback"],
        "sessions": database["sessions"],
    }


def report(read: dict[str, Any], relays: int, top: int) -> dict[str, Any]:
    statements = read["statements"]
    calls = sum(s["calls"] for s in statements)
    server_ms = sum(s["ms"] for s in statements)
    table = Table(
        title=f"PostgreSQL statements per relay ({relays} relays; the {top} dearest of {len(statements)})"
    )
    for col in ("calls / relay", "server ms / relay", "share", "rows / call", "statement"):
        table.add_column(col)
    for s in statements[:top]:
        table.add_row(
            f"{s['calls'] / relays:.2f}",
            f"{s['ms'] / relays:.4f}",
            f"{s['ms'] / server_ms:.1%}" if server_ms else "-",
            f"{s['rows'] / max(1, s['calls']):.1f}",
            s["query"][:160],
        )
    console.print(table)
    summary = {
        "relays": relays,
        "statements_per_relay": calls / relays,
        "server_ms_per_relay": server_ms / relays,
        "transactions_per_relay": (read["xact_commit"] + read["xact_rollback"]) / relays,
        "rollbacks_per_relay": read["xact_rollback"] / relays,
        "sessions": read["sessions"],
    }
    console.print(
        f"per relay: {summary['statements_per_relay']:.1f} statements counted, "
        f"{summary['server_ms_per_relay']:.3f} ms of execution in them, "
        f"{summary['transactions_per_relay']:.1f} transactions ({summary['rollbacks_per_relay']:.2f} rolled "
        f"back); {summary['sessions']} sessions opened"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--per-sender", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--round-ms", type=int, default=600)
    parser.add_argument("--paced-share", type=float, default=0.5)
    parser.add_argument(
        "--redis-url", required=True, help="Redis for the host (redis://...), a database of its own"
    )
    parser.add_argument("--top", type=int, default=25, help="statements shown, the dearest first")
    parser.add_argument("--profile-api", default="", help="write a cProfile of the API process to this file")
    args = parser.parse_args()
    bin_dir = chaos.postgres_bin()
    if bin_dir is None:
        parser.error("needs PostgreSQL's server binaries (it runs a cluster of its own)")
    server = chaos.PostgresServer(
        bin_dir, settings={"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "5000"}
    ).init()
    read: dict[str, Any] = {}

    async def before_drop(run_url: str) -> None:
        read.update(await read_statements(server.url, run_url))

    try:
        asyncio.run(_create_extension(server.url))
        run_args = argparse.Namespace(
            **vars(args),
            database_url=server.url,
            hosts=1,
            paced_rate=0.0,
            floor_count=500,
            idle_s=1.0,
            profile_localnet="",
        )
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(relay.run(run_args, Path(tmp), before_drop=before_drop))
    finally:
        server.remove()
    relays = result["max"]["ok"] + result["paced"]["ok"]
    summary = report(read, relays, args.top)
    print(json.dumps({"statements": summary, "max": result["max"], "paced": result["paced"]}, default=str))
    return 0


async def _create_extension(admin_url: str) -> None:
    conn = await asyncpg.connect(_dsn(admin_url))
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()


if __name__ == "__main__":
    raise SystemExit(main())
