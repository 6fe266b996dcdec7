"""What a commit point's inserts cost as a SQLite database grows: a seeded database against a small copy.

A commit point inserts an intent and later its usage row; both tables carry indexes on random keys (the
transaction hash, the bytes' SHA-256), so each insert lands on a leaf page no earlier insert touched, and
the WAL checkpoint then writes those leaves back to scattered places in the file. On a small database the
same leaves are touched again and again. This benchmark measures that one effect, apart from the rest of
the service: on a database seeded by `bench/seed.py --keep` and on a copy of its schema holding its newest
10 000 intents and their usage rows (the baseline, made in the same run), it times transactions of one
intent and its usage row (`BEGIN IMMEDIATE`, two INSERTs cloned from the newest row with fresh random
keys, `COMMIT`), on a connection set up as the service's own (WAL, synchronous=NORMAL), alternating:

- the database (seeded, small copy);
- SQLite's page cache: the default 2 MiB, and 64 MiB (whether keeping more pages of the indexes helps);
- WAL checkpoints: automatic (every 1 000 pages, as the service runs) or none (the leaves alone).

The rows inserted are deleted again at the end, so the seeded database can be measured again.

    .venv/bin/python bench/seed.py --storage sqlite --sizes 10000000 --keep --work-dir <dir>
    .venv/bin/python bench/sqlite_growth.py <dir>/gasless-seed-*/sqlite/10_000_000/gasless.db
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gasless.db.engine import _sqlite_on_connect  # the service's own connection set-up

console = Console(width=150)  # the table whole, in a terminal or a file
SMALL_INTENTS = 10_000


def connect(path: Path, cache_kib: int, checkpoint: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=5)
    _sqlite_on_connect(conn, None)
    conn.execute(f"PRAGMA cache_size=-{cache_kib}")
    conn.execute(f"PRAGMA wal_autocheckpoint={1000 if checkpoint else 0}")
    return conn


def small_copy(seeded: Path, into: Path) -> None:
    """The seeded database's schema with its newest intents, their usage rows and the service's metadata."""
    conn = sqlite3.connect(into, isolation_level=None)
    conn.execute("ATTACH ? AS seeded", (f"file:{seeded}?mode=ro",))
    schema = conn.execute(
        "SELECT sql FROM seeded.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
        "ORDER BY type = 'index'"
    ).fetchall()
    for (sql,) in schema:
        conn.execute(sql)
    conn.execute("BEGIN")
    conn.execute(f"INSERT INTO intents SELECT * FROM seeded.intents ORDER BY pk DESC LIMIT {SMALL_INTENTS}")
    conn.execute(
        "INSERT INTO usage_ledger SELECT * FROM seeded.usage_ledger WHERE intent_pk IN (SELECT pk FROM intents)"
    )
    conn.execute("COMMIT")
    conn.execute("DETACH seeded")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


def intents_in(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM intents").fetchone()[0])


class Inserter:
    """Transactions of one intent and its usage row, cloned from the newest of each with fresh keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        probe = sqlite3.connect(path)
        self.intent_columns, self.intent = self._newest(probe, "intents", "pk")
        self.usage_columns, self.usage = self._newest(probe, "usage_ledger", "intent_pk")
        self.next_pk = int(probe.execute("SELECT max(pk) FROM intents").fetchone()[0]) + 1
        self.next_nonce = int(probe.execute("SELECT max(nonce) FROM intents").fetchone()[0]) + 1
        probe.close()
        self.first_pk = self.next_pk

    @staticmethod
    def _newest(conn: sqlite3.Connection, table: str, order: str) -> tuple[list[str], dict[str, Any]]:
        cursor = conn.execute(f"SELECT * FROM {table} ORDER BY {order} DESC LIMIT 1")
        columns = [d[0] for d in cursor.description]
        return columns, dict(zip(columns, cursor.fetchone(), strict=True))

    @staticmethod
    def _fresh(value: Any) -> Any:
        return os.urandom(len(value)) if isinstance(value, bytes) else os.urandom(len(value) // 2).hex()

    def one(self, conn: sqlite3.Connection) -> float:
        intent = {**self.intent, "pk": self.next_pk, "nonce": self.next_nonce}
        intent["tx_hash"] = self._fresh(intent["tx_hash"])
        intent["bytes_sha256"] = self._fresh(intent["bytes_sha256"])
        usage = {
            **self.usage,
            "tx_hash": intent["tx_hash"],
            "intent_pk": intent["pk"],
            "nonce": intent["nonce"],
            "batch_id": None,  # not settled yet, as a new usage row is
        }
        self.next_pk += 1
        self.next_nonce += 1
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(self._insert("intents", self.intent_columns), [intent[c] for c in self.intent_columns])
        conn.execute(self._insert("usage_ledger", self.usage_columns), [usage[c] for c in self.usage_columns])
        conn.execute("COMMIT")
        return (time.perf_counter() - started) * 1000

    @staticmethod
    def _insert(table: str, columns: list[str]) -> str:
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def undo(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM usage_ledger WHERE intent_pk >= ?", (self.first_pk,))
        conn.execute("DELETE FROM intents WHERE pk >= ?", (self.first_pk,))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()


def figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("database", type=Path, help="a SQLite database seeded by bench/seed.py --keep")
    parser.add_argument("--transactions", type=int, default=600, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gasless-sqlite-growth-") as tmp:
        small = Path(tmp) / "small.db"
        small_copy(args.database, small)
        sizes = {
            "seeded": (
                args.database,
                intents_in(args.database),
            ),
            "small": (small, SMALL_INTENTS),
        }
        inserters = {name: Inserter(path) for name, (path, _) in sizes.items()}
        configs = [(cache, checkpoint) for checkpoint in (True, False) for cache in (2_000, 65_536)]
        times: dict[tuple[str, int, bool], list[float]] = {}
        try:
            with console.status("") as status:
                for round_ in range(args.rounds):
                    for cache, checkpoint in configs:
                        for name in ("small", "seeded"):  # the baseline first in every pair
                            status.update(
                                f"round {round_ + 1} of {args.rounds}: {name}, cache {cache} KiB, "
                                f"checkpoints {'on' if checkpoint else 'off'}"
                            )
                            conn = connect(sizes[name][0], cache, checkpoint)
                            took = times.setdefault((name, cache, checkpoint), [])
                            took.extend(inserters[name].one(conn) for _ in range(args.transactions))
                            if not checkpoint:
                                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # not timed
                            conn.close()
        finally:
            for inserter in inserters.values():
                inserter.undo()

    table = Table(
        title=f"one intent and its usage row per transaction (ms), {args.rounds} x {args.transactions} each"
    )
    table.add_column("page cache")
    table.add_column("checkpoints")
    for name, (_, intents) in sorted(sizes.items(), key=lambda kv: kv[1][1]):
        table.add_column(f"{name} ({intents:,} intents): mean / p50 / p99", justify="right")
    table.add_column("seeded / small", justify="right")
    for cache, checkpoint in configs:
        small_figures = figures(times[("small", cache, checkpoint)])
        seeded_figures = figures(times[("seeded", cache, checkpoint)])
        table.add_row(
            f"{cache:,} KiB",
            "automatic" if checkpoint else "none",
            " / ".join(f"{small_figures[k]:.3f}" for k in ("mean", "p50", "p99")),
            " / ".join(f"{seeded_figures[k]:.3f}" for k in ("mean", "p50", "p99")),
            " / ".join(f"{seeded_figures[k] / small_figures[k]:.2f}x" for k in ("mean", "p50", "p99")),
        )
    console.print(table)


if __name__ == "__main__":
    main()
