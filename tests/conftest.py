"""Shared fixtures: real servers when the test command found them, loud skips when not."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

POSTGRES_ENV = "GASLESS_TEST_POSTGRES_URL"
REDIS_ENV = "GASLESS_TEST_REDIS_URL"


# The error-coverage guard (tests/error_coverage.py) -------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    from error_coverage import RECORD_ENV

    if not os.environ.get(RECORD_ENV):
        # One file for the run: every host (in process or a subprocess inheriting the environment) appends
        # the codes it renders.
        folder = Path(tempfile.mkdtemp(prefix="gasless-problems-"))
        os.environ[RECORD_ENV] = str(folder / "answered.txt")
    config.stash[_DESELECTED] = 0
    # `gasless up` spawned by a test starts no status site on the fixed default port (8090): a test that
    # wants the site passes `--status-port` with a free port.
    os.environ["GASLESS_STATUS_PORT"] = "0"
    os.environ["GASLESS_MAIL_PORT"] = "0"
    # Apps served in process log from their own threads at any moment, also while pytest swaps, reads and
    # truncates its capture of sys.stdout / sys.stderr between two phases of a test. One CI run died with a
    # segmentation fault in such a thread, inside `print` from structlog's default logger (the race is the
    # suspect; it did not reproduce in isolation). Log lines go to the process's own stderr object instead,
    # which pytest never touches: fd 2, still captured by pytest at the descriptor level.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__))
    last_resort = logging.StreamHandler(sys.__stderr__)
    last_resort.setLevel(logging.WARNING)
    logging.lastResort = last_resort


_DESELECTED = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After each test's fixtures are gone: let its hosts and localnets be collected (tests/library_caches.py)."""
    from library_caches import clear_library_caches

    clear_library_caches()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[_DESELECTED] = config.stash.get(_DESELECTED, 0) + len(items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """At the end of a full, green run with every suite enabled: every catalogue code was answered."""
    from error_coverage import RECORD_ENV, findings

    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    full = (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.option.markexpr
        and config.stash.get(_DESELECTED, 0) == 0
        and exitstatus == pytest.ExitCode.OK
    )
    if not full:
        return
    if not (os.environ.get(POSTGRES_ENV) and os.environ.get(REDIS_ENV)):
        # In CI every suite must run: a run that skipped one cannot vouch for the catalogue, so it fails.
        in_ci = bool(os.environ.get("CI"))
        if reporter is not None:
            reporter.write_line(
                "error coverage NOT CHECKED: the PostgreSQL or Redis suite was skipped"
                + (" (CI needs both: failing the run)" if in_ci else ""),
                yellow=not in_ci,
                red=in_ci,
                bold=True,
            )
        if in_ci:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    problems = findings(Path(os.environ[RECORD_ENV]))
    if reporter is not None:
        reporter.write("\n")  # the verdict on a line of its own, after the progress line
        for line in problems or ["every catalogue code was answered through HTTP"]:
            reporter.write_line(f"error coverage: {line}", red=bool(problems), green=not problems, bold=True)
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _admin_dsn(url: str) -> str:
    # asyncpg wants a plain postgresql:// DSN.
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _pg_exec(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_admin_dsn(url))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(
            f"PostgreSQL suite skipped: {POSTGRES_ENV} not set (no server answered on 127.0.0.1:5432)"
        )
    return url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"gasless_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_pg_exec(postgres_server_url, f'CREATE DATABASE "{name}"'))
    base = postgres_server_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_pg_exec(postgres_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get(REDIS_ENV)
    if not url:
        pytest.skip(f"Redis suite skipped: {REDIS_ENV} not set (no server answered on 127.0.0.1:6379)")
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{(tmp_path / 'gasless.db').as_posix()}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once on SQLite and once on PostgreSQL (skipped loudly when the server is absent)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")


class RunningLocalnet:
    """A localnet served from its own thread and event loop, so sync clients (the SDK) can call it."""

    def __init__(self, data_dir: Path, round_ms: int, gateways: int) -> None:
        import threading

        from gasless.core.settings import LOCALNET_PAYMENT_TOKEN
        from gasless.localnet.chain import ChainConfig
        from gasless.localnet.server import Localnet

        self.loop = asyncio.new_event_loop()
        self.closed = False
        self.net = Localnet(
            data_dir=data_dir, payment_token=LOCALNET_PAYMENT_TOKEN, config=ChainConfig(round_ms=round_ms)
        )
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.net.start("127.0.0.1", [0] * gateways))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, name="localnet", daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("localnet did not start")
        self.url = self.net.urls[0]
        self.urls = list(self.net.urls)

    def call(self, fn, *args):  # type: ignore[no-untyped-def]
        """Run `fn(*args)` on the localnet's loop (for direct state access without races)."""
        import concurrent.futures

        future: concurrent.futures.Future[object] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(10)

    def wait_rounds(self, rounds: int, timeout: float = 30.0) -> None:
        """Wait until the chain has produced `rounds` more rounds: a negative check ("nothing was sent")
        then holds whatever the machine's load, where a fixed sleep may end before the rounds did."""
        import time

        target = int(self.call(lambda: self.net.chain.round)) + rounds
        deadline = time.monotonic() + timeout
        while int(self.call(lambda: self.net.chain.round)) < target:
            assert time.monotonic() < deadline, f"the localnet produced no {rounds} rounds in {timeout} s"
            time.sleep(0.02)

    def requests_counted(self, *routes: str) -> int:
        """How many requests all the gateways received on these routes ("POST /transaction/send")."""
        import json
        import urllib.request

        total = 0
        for url in self.urls:
            with urllib.request.urlopen(f"{url}/localnet/requests", timeout=10) as answer:
                counted = json.load(answer)["data"]["requests"]
            total += sum(int(counted.get(route, 0)) for route in routes)
        return total

    def __enter__(self) -> RunningLocalnet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the gateways and the rounds, and save the chain (its data directory can be resumed)."""
        if self.closed:
            return
        self.closed = True
        try:
            asyncio.run_coroutine_threadsafe(self.net.stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def localnet(tmp_path: Path) -> Iterator[RunningLocalnet]:
    """A fresh localnet with 100 ms rounds and one gateway."""
    with RunningLocalnet(tmp_path / "localnet", round_ms=100, gateways=1) as net:
        yield net


@pytest.fixture
def run_localnet() -> Iterator[Callable[..., RunningLocalnet]]:
    """Start localnets on data directories of the test's choosing (a restart resumes the saved chain);
    whatever is still running at the end is stopped."""
    started: list[RunningLocalnet] = []

    def start(data_dir: Path, round_ms: int = 100, gateways: int = 1) -> RunningLocalnet:
        started.append(RunningLocalnet(data_dir, round_ms=round_ms, gateways=gateways))
        return started[-1]

    yield start
    for net in started:
        net.close()


@pytest.fixture
def localnet_two_gateways(tmp_path: Path) -> Iterator[RunningLocalnet]:
    with RunningLocalnet(tmp_path / "localnet", round_ms=100, gateways=2) as net:
        yield net
