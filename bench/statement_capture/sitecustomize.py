"""Records every distinct SQL statement a process runs, for bench/seed.py's query plans.

Python imports `sitecustomize` at start-up from its path: bench/seed.py starts a `gasless serve` with this
folder on PYTHONPATH and GASLESS_BENCH_CAPTURE naming a JSON-lines file. SQLite statements are taken from
each connection's trace callback (every statement of every connection, with its values inlined, whichever
thread or cursor runs it); PostgreSQL statements from SQLAlchemy's cursor events, with their parameters.
A statement is written once per shape (its literals left out of the key). Never loaded by the service
itself: only the benchmark's capture run sets the path.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading

_PATH = os.environ.get("GASLESS_BENCH_CAPTURE")
_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b|\$\d+|\?")
_seen: set[str] = set()
_lock = threading.Lock()


def _record(entry: dict[str, object]) -> None:
    shape = _LITERALS.sub("?", str(entry["sql"]))
    shape = re.sub(r"\(\s*\?(?:\s*,\s*\?)*\s*\)", "(?)", shape)  # IN lists of any length
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
