"""Real `gasless` processes for CLI tests: free ports, output to a file (not a terminal), conditions polled
with a deadline, and every process reaped whatever happens (killed when it outlives its test)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import requests

T = TypeVar("T")

# How `gasless up &` starts from a script: a background job of a non-interactive shell inherits SIGINT
# ignored. The command must take SIGINT anyway, so the tests start it that way.
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'gasless.cli', *sys.argv[1:]])"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_pair(*other_pairs: int) -> int:
    """A port p with p and p + 1 both free (`gasless up --hosts 2` takes both, for its API and its metrics),
    apart from `other_pairs` (pairs drawn before, not bound yet).

    Taken below the kernel's ephemeral range: a port the kernel hands out (an outgoing connection of any
    process, or another test's bind to port 0) can land on p + 1 between this check and the bind, and did.
    Only another pair drawn here can, and the draw is random over several thousand ports."""
    ephemeral_low = _ephemeral_range()[0]
    low = max(1024, ephemeral_low - 12_000)
    generator = random.SystemRandom()
    for _ in range(200):
        port = generator.randrange(low, ephemeral_low - 1)
        if any(abs(port - other) <= 1 for other in other_pairs):
            continue
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def wait_until(
    check: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    *,
    proc: subprocess.Popen[Any] | None = None,
    log: Path | None = None,
    interval: float = 0.05,
    errors: tuple[type[Exception], ...] = (requests.RequestException,),
) -> T:
    """Poll `check` until it is truthy; a request that fails (or any of `errors`) counts as not yet. Fails at
    once when `proc` has ended first, with the end of `log` where given."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except errors as exc:
            last = exc
        else:
            if last:
                return last
        if proc is not None and proc.poll() is not None:
            tail = f"\n{log.read_text(errors='replace')[-3000:]}" if log is not None else ""
            raise AssertionError(f"{what}: the process exited ({proc.returncode}); last: {last!r}{tail}")
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def answers(url: str, status: int = 200) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == status
    except requests.RequestException:
        return False


OFF_BY_THE_TEST_RUN = ("GASLESS_STATUS_PORT", "GASLESS_MAIL_PORT")


def piped_env(**extra: str) -> dict[str, str]:
    """The test's environment as a pipe sees it: no terminal width hint, no colour."""
    # No GASLESS_* setting of the test run leaks into the command (a database URL, a config file), but for
    # the ports tests/conftest.py turns off: `gasless up`'s status site and mail catcher default to fixed
    # ports (8090, 1025), which a concurrent test run may hold.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("COLUMNS", "LINES") and (not k.startswith("GASLESS_") or k in OFF_BY_THE_TEST_RUN)
    }
    return {**env, "NO_COLOR": "1", **extra}


class Spawned:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, check: Callable[[], T], what: str, timeout: float = 60.0) -> T:
        """Poll `check` until it is truthy; fail at once if the process ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"exited ({self.proc.returncode}) before {what}:\n{self.output()}")
            time.sleep(0.02)
        raise AssertionError(f"{what}: not within {timeout} s:\n{self.output()}")

    def catches(self, signum: int) -> bool:
        """The process has a handler for `signum` (Linux: the SigCgt mask of /proc/<pid>/status)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        for line in status.splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
        return False

    def stopped_within(self, signum: int, timeout: float) -> int:
        """Send `signum`; the exit status, once the process ended within `timeout` s."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout} s after {signum}:\n{self.output()}") from None


@contextlib.contextmanager
def spawn(
    *args: str, log: Path, env: dict[str, str] | None = None, sigint_ignored: bool = True
) -> Iterator[Spawned]:
    """`gasless *args` with stdout and stderr to `log`; killed and reaped on the way out if still alive."""
    command = (
        [sys.executable, "-c", _SIGINT_IGNORED, *args]
        if sigint_ignored
        else [sys.executable, "-m", "gasless.cli", *args]
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env or piped_env(), start_new_session=True
        )
    try:
        yield Spawned(proc, log)
    finally:
        reap(proc)


def reap(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: anything it started goes too
        proc.wait(30)


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """`gasless *args` to completion, output captured (not a terminal); killed if it outlives `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "gasless.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or piped_env(),
        check=False,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (stdout and stderr together), or an assertion error."""
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, (
        f"{len(lines)} lines (status {result.returncode}):\n{result.stdout}{result.stderr}"
    )
    return lines[0]
