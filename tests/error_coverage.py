"""The error-coverage guard: every catalogue code is answered by the service through HTTP in some test.

Every host the suite starts, in process or as a subprocess, appends each error response its problem renderer
sends, code and HTTP status, to one file (`GASLESS_PROBLEM_RECORD_FILE`, set by `tests/conftest.py` for the
whole run and inherited by subprocesses; `gasless.http.problems.ProblemRecorder`). At the end of a full run
the guard compares what the service really answered with the catalogue: every code answered as an error
response with the catalogue's status, and never with another. `NOT_YET_ANSWERED` lists the codes of capabilities not built yet, by
capability; a code must leave it as soon as the service answers it, so the list is the honest remainder.
"""

from __future__ import annotations

from pathlib import Path

from gasless.core.errors import CATALOGUE

RECORD_ENV = "GASLESS_PROBLEM_RECORD_FILE"

NOT_YET_ANSWERED: dict[str, str] = {}  # every catalogue code is answered by some test


def _lines(record_file: Path) -> list[list[str]]:
    if not record_file.exists():
        return []
    return [line.split() for line in record_file.read_text(encoding="ascii").splitlines() if line.strip()]


def answered(record_file: Path) -> dict[str, set[int]]:
    """Code -> the HTTP statuses it was answered with, as error responses the problem renderer sent. MCP
    tool errors (`CODE - mcp`: a problem inside a 200) and problems listed in a 200 body do not count."""
    seen: dict[str, set[int]] = {}
    for parts in _lines(record_file):
        if len(parts) == 2 and parts[1].isdigit():
            seen.setdefault(parts[0], set()).add(int(parts[1]))
    return seen


def findings(record_file: Path) -> list[str]:
    """What is wrong with the run's answers, as lines to print; empty when the guard holds."""
    seen = answered(record_file)
    lines = []
    unknown = sorted(set(seen) - set(CATALOGUE))
    if unknown:
        lines.append(f"codes answered that the catalogue does not have: {unknown}")
    wrong = sorted(
        f"{code} answered {sorted(statuses - {CATALOGUE[code].status})}, the catalogue says "
        f"{CATALOGUE[code].status}"
        for code, statuses in seen.items()
        if code in CATALOGUE and statuses - {CATALOGUE[code].status}
    )
    if wrong:
        lines.append(f"codes answered with another status than the catalogue's: {wrong}")
    properly = {
        code for code, statuses in seen.items() if code in CATALOGUE and CATALOGUE[code].status in statuses
    }
    missing = sorted(set(CATALOGUE) - properly - set(NOT_YET_ANSWERED))
    if missing:
        lines.append(
            f"catalogue codes the service never answered as an error response in this run: {missing}"
        )
    stale = sorted(set(NOT_YET_ANSWERED) & properly)
    if stale:
        lines.append(f"answered now, remove from NOT_YET_ANSWERED (tests/error_coverage.py): {stale}")
    return lines
