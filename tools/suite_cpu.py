"""Where the test suite's CPU goes: a pytest plugin that records each test's CPU, and its report.

The suite runs on two cores with three workers, so its time is its CPU: this tells which tests spend it,
in the worker itself (the in-process hosts, localnets and clients) or in the processes they start.

    PYTHONPATH=tools ./dev test -p suite_cpu          # record (one file per worker under the directory below)
    .venv/bin/python tools/suite_cpu.py [--top 30]    # report, and forget the records with --clear

A test's own CPU is the worker process's (every thread) while it ran; its children's is what the processes
it started and reaped used (`RUSAGE_CHILDREN`: a process still running at the test's end is counted by
the test that reaps it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RECORDS = Path(os.environ.get("GASLESS_SUITE_CPU_DIR", "var/suite-cpu"))


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _Recorder:
    def __init__(self) -> None:
        self.out: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self.out is None:
            RECORDS.mkdir(parents=True, exist_ok=True)
            self.out = (RECORDS / f"tests-{os.getpid()}.jsonl").open("a", encoding="utf-8")
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()


_recorder = _Recorder()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    own, children, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    _recorder.write(
        {
            "test": item.nodeid,
            "wall": round(time.monotonic() - wall, 3),
            "own": round(_cpu(resource.RUSAGE_SELF) - own, 3),
            "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--top", type=int, default=25, help="how many tests and files to list")
    parser.add_argument("--clear", action="store_true", help="delete the records after the report")
    args = parser.parse_args()
    files = sorted(RECORDS.glob("tests-*.jsonl"))
    rows = [json.loads(line) for path in files for line in path.read_text(encoding="utf-8").splitlines()]
    if not rows:
        raise SystemExit(f"no records under {RECORDS}: run PYTHONPATH=tools ./dev test -p suite_cpu first")
    own, children = sum(r["own"] for r in rows), sum(r["children"] for r in rows)
    print(
        f"{len(rows)} tests in {len(files)} workers: CPU {own:.0f} s in the workers, {children:.0f} s in the"
    )
    print(
        f"processes they started ({own + children:.0f} s in all); summed test time {sum(r['wall'] for r in rows):.0f} s"
    )
    print(f"\nThe {args.top} tests that spent the most CPU (own, children, wall, in s):")
    for r in sorted(rows, key=lambda r: -(r["own"] + r["children"]))[: args.top]:
        print(f"{r['own']:8.1f} {r['children']:8.1f} {r['wall']:8.1f}  {r['test']}")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r in rows:
        entry = by_file[r["test"].split("::")[0]]
        entry[0] += 1
        entry[1] += r["own"]
        entry[2] += r["children"]
        entry[3] += r["wall"]
    print(f"\nThe {args.top} files that spent the most CPU (tests, own, children, wall, in s):")
    for name, (count, file_own, file_children, file_wall) in sorted(
        by_file.items(), key=lambda kv: -(kv[1][1] + kv[1][2])
    )[: args.top]:
        print(f"{int(count):5d} {file_own:8.1f} {file_children:8.1f} {file_wall:8.1f}  {name}")
    if args.clear:
        for path in files:
            path.unlink()


if __name__ == "__main__":
    main()
