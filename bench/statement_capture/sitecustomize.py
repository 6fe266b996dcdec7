"""Records every distinct SQL statement a process runs, for bench/seed.py's query plans.

Python imports `sitecustomize` at start-up from its path: bench/seed.py starts a `gasless serve` with this
folder on PYTHONPATH and GASLESS_BENCH_CAPTURE naming a JSON-lines file. SQLite statements are taken from
each connection's trace callback (every statement of every connection, with its values inlined, whichever
thread or cursor runs it); PostgreSQL statements from SQLAlchemy's cursor events, with their parameters.
A statement is written once per shape (its literals left out of the key). Never loaded by the service
itself: only the benchmark's capture run sets the path.

With GASLESS_BENCH_TIMES naming a file, the process also times every statement by shape (wall time from
SQLAlchemy's before- to after-cursor-execute, which for SQLite includes stepping to the first row, where an
aggregate does all its work) and rewrites that file every 2 s as JSON: calls, total and worst milliseconds
per shape, the costliest first. bench/seed.py uses it to name the background statements whose cost follows
the data.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time

_PATH = os.environ.get("GASLESS_BENCH_CAPTURE")
_TIMES = os.environ.get("GASLESS_BENCH_TIMES")
_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b|\$\d+|\?")
_seen: set[str] = set()
_lock = threading.Lock()


def _shape(sql: str) -> str:
    shape = _LITERALS.sub("?", sql)
    return re.sub(r"\(\s*\?(?:\s*,\s*\?)*\s*\)", "(?)", shape)  # IN lists of any length


def _record(entry: dict[str, object]) -> None:
    shape = _shape(str(entry["sql"]))
    with _lock:
        if shape in _seen:
            return
        _seen.add(shape)
        with open(_PATH, "a", encoding="utf-8") as out:  # type: ignore[arg-type]
            out.write(json.dumps(entry, default=str) + "\n")


if _PATH:
    _connect = sqlite3.connect

    def _traced_connect(*args, **kwargs):  # type: ignore[no-untyped-def]
        conn = _connect(*args, **kwargs)
        conn.set_trace_callback(lambda sql: _record({"dialect": "sqlite", "sql": sql}))
        return conn

    sqlite3.connect = _traced_connect  # type: ignore[assignment]

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if conn.dialect.name == "postgresql" and not executemany:
            _record({"dialect": "postgresql", "sql": statement, "params": list(parameters or ())})


if _TIMES:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    _times: dict[str, list[float]] = {}  # shape -> [calls, total ms, worst ms]
    # Keyed by cursor, not by thread: on the async engines statements of several coroutines interleave on
    # the loop's thread between their before and after events.
    _started: dict[int, float] = {}

    @event.listens_for(Engine, "before_cursor_execute")
    def _time_before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        _started[id(cursor)] = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def _time_after(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        took = 1000 * (time.perf_counter() - _started.pop(id(cursor), time.perf_counter()))
        shape = _shape(statement)
        with _lock:
            entry = _times.setdefault(shape, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += took
            entry[2] = max(entry[2], took)

    def _dump() -> None:
        out = f"{_TIMES}.{os.getpid()}"
        while True:
            time.sleep(2)
            with _lock:
                rows = sorted(_times.items(), key=lambda kv: -kv[1][1])
            rows_json = [{"sql": sql, "calls": c, "total_ms": t, "worst_ms": w} for sql, (c, t, w) in rows]
            with open(out + ".tmp", "w", encoding="utf-8") as f:
                json.dump(rows_json, f, indent=1)
            os.replace(out + ".tmp", out)

    threading.Thread(target=_dump, name="bench-statement-times", daemon=True).start()
