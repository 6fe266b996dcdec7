"""The error-coverage guard: every catalogue code is answered by the service through HTTP in some test.

Every host the suite starts, in process or as a subprocess, appends each problem code it renders to one file
(`GASLESS_PROBLEM_RECORD_FILE`, set by `tests/conftest.py` for the whole run and inherited by subprocesses;
`gasless.http.problems.ProblemRecorder`). At the end of a full run the guard compares what the service
really answered with the catalogue. `NOT_YET_ANSWERED` lists the codes of capabilities not built yet, by
capability; a code must leave it as soon as the service answers it, so the list is the honest remainder.
"""

from __future__ import annotations

from pathlib import Path

from gasless.errors import CATALOGUE

RECORD_ENV = "GASLESS_PROBLEM_RECORD_FILE"

NOT_YET_ANSWERED: dict[str, str] = {}  # every catalogue code is answered by some test


def answered(record_file: Path) -> set[str]:
    if not record_file.exists():
        return set()
    return {line.strip() for line in record_file.read_text(encoding="ascii").splitlines() if line.strip()}


def findings(record_file: Path) -> list[str]:
    """What is wrong with the run's answers, as lines to print; empty when the guard holds."""
    seen = answered(record_file)
    lines = []
    unknown = sorted(seen - set(CATALOGUE))
    if unknown:
        lines.append(f"codes answered that the catalogue does not have: {unknown}")
    missing = sorted(set(CATALOGUE) - seen - set(NOT_YET_ANSWERED))
    if missing:
        lines.append(f"catalogue codes the service never answered in this run: {missing}")
    stale = sorted(set(NOT_YET_ANSWERED) & seen)
    if stale:
        lines.append(f"answered now, remove from NOT_YET_ANSWERED (tests/error_coverage.py): {stale}")
    return lines
