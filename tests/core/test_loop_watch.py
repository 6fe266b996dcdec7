"""The event loop's watch: a callback that holds the loop is logged with how long and where; every beat's
delay reaches the host's histogram; 0 turns the watch off."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from relay_kit import start_env  # type: ignore[import-not-found]
from structlog.dev import ConsoleRenderer
from structlog.testing import capture_logs

from gasless.core.loop_watch import LoopWatch, Stall, log_stall, thread_stack
from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from tests.core.test_metrics import free_port, samples


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # the stall under test: a callback that never awaits


def test_another_threads_stack_is_read_whole_while_it_runs() -> None:
    """Read while the thread enters and leaves frames all the time (walking its frames from Python crashed
    the process once), and while it waits in a known place."""
    stop = threading.Event()

    def churn(depth: int) -> int:
        return 0 if depth == 0 else churn(depth - 1) + 1

    def busy() -> None:
        while not stop.is_set():
            churn(40)

    def blocked_here() -> None:
        stop.wait(60)

    threads = [threading.Thread(target=busy), threading.Thread(target=blocked_here)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(300):
            stack = thread_stack(threads[0].ident or 0)
            assert "threading.py:" in stack[0] and stack[0].endswith(" _bootstrap"), stack
            assert any(frame.endswith((" busy", " churn")) for frame in stack), stack
        waiting = thread_stack(threads[1].ident or 0)
        assert any(
            frame.startswith("core/test_loop_watch.py:") and frame.endswith(" blocked_here")
            for frame in waiting
        )
        assert "threading.py:" in waiting[-1], waiting  # innermost last: the Event's wait
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert thread_stack(threads[0].ident or 0) == ()  # gone


async def test_a_callback_holding_the_loop_is_logged_with_its_stack() -> None:
    stalls: list[Stall] = []
    held = asyncio.Event()
    lags: list[float] = []

    def on_stall(stall: Stall) -> None:
        log_stall(stall)
        stalls.append(stall)
        if any("hold_the_loop" in frame for frame in stall.stack):
            held.set()

    watch = LoopWatch(
        0.05, observe=lags.append, on_stall=on_stall, observe_gc=lambda _generation, _took: None
    )
    watch.start()
    try:
        with capture_logs() as logs:
            asyncio.get_running_loop().call_soon(hold_the_loop, 0.3)
            await asyncio.wait_for(held.wait(), timeout=30)
    finally:
        watch.stop()
    stall = next(s for s in stalls if any("hold_the_loop" in frame for frame in s.stack))
    assert stall.late_s >= 0.2
    # the innermost frame: the sleep's line
    assert stall.stack[-1].startswith("core/test_loop_watch.py:")  # the last two parts of the path
    assert stall.stack[-1].endswith(" hold_the_loop")
    assert max(lags) >= 0.2
    line = next(entry for entry in logs if entry["frames"] and "hold_the_loop" in entry["frames"][-1])
    assert line["event"] == "event loop blocked"
    assert line["log_level"] == "warning"
    assert line["blocked_ms"] >= 200
    assert line["gc_ms"] < line["blocked_ms"] / 2  # a sleep, not the collector


def hold_the_loop_collecting(rounds: int) -> None:
    for _ in range(rounds):
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        gc.collect()


async def test_a_stall_counts_the_garbage_collectors_time_apart() -> None:
    """A full collection stops every thread and is in no stack: the stall names its share."""
    stalls: list[Stall] = []
    seen = asyncio.Event()

    def on_stall(stall: Stall) -> None:
        stalls.append(stall)
        if stall.gc_generation == 2:
            seen.set()

    pauses: list[tuple[int, float]] = []
    watch = LoopWatch(
        0.05, on_stall=on_stall, observe_gc=lambda generation, took: pauses.append((generation, took))
    )
    watch.start()
    try:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        loop.call_soon(hold_the_loop_collecting, 1)
        await asyncio.sleep(0)
        one_collection = time.perf_counter() - started
        # Enough full collections in one callback to hold the loop for about 0.3 s.
        loop.call_soon(hold_the_loop_collecting, max(2, int(0.3 / max(one_collection, 1e-4))))
        await asyncio.wait_for(seen.wait(), timeout=60)
    finally:
        watch.stop()
    stall = next(s for s in stalls if s.gc_generation == 2)
    assert stall.gc_s is not None and stall.gc_s >= stall.late_s / 2
    assert any(generation == 2 for generation, _ in pauses)


async def test_the_collector_is_timed_only_when_asked() -> None:
    """Its callback runs Python inside any allocation (gasless.core.loop_watch): not registered unless wanted."""
    watch = LoopWatch(0.05)
    watch.start()
    try:
        assert watch._collecting not in gc.callbacks
    finally:
        watch.stop()


def test_a_stall_renders_on_the_console() -> None:
    """`gasless up` logs to a console: the stall's frames are a member the console renderer prints, not
    structlog's `stack` (a traceback string there)."""
    with capture_logs() as logs:
        log_stall(
            Stall(0.25, ("gasless/relay/core.py:10 relay", "tests/core/test_loop_watch.py:20 hold"), 0.01, 2)
        )
    (entry,) = logs
    rendered = ConsoleRenderer(colors=False)(None, "warning", dict(entry))
    assert "event loop blocked" in rendered and "gasless/relay/core.py:10 relay" in rendered
    assert entry["frames"][-1] == "tests/core/test_loop_watch.py:20 hold" and entry["gc_ms"] == 10.0


def test_the_host_observes_its_loop_lag_unless_turned_off(tmp_path: Path) -> None:
    gateway = [f"http://127.0.0.1:{free_port()}"]
    # A dedicated process's host (never ready here: no gateway, so nothing is frozen) times the collector.
    watched = create_app(
        Settings(data_dir=tmp_path / "a", gateway_urls=gateway, loop_stall_ms=40), dedicated_process=True
    )
    with TestClient(watched) as client:
        registry = watched.state.host.metrics.registry
        deadline = time.monotonic() + 30
        # The condition waited for: beats observed (one every 10 ms); each request lets the loop run.
        while samples(registry, "gasless_event_loop_lag_seconds_count") in ([], [({}, 0.0)]):
            assert time.monotonic() < deadline
            client.get("/healthz")
        # Every collection's time, by generation: a full one made here is there once a beat has run.
        gc.collect()
        while not any(
            labels == {"generation": "2"} and count > 0
            for labels, count in samples(registry, "gasless_gc_pause_seconds_count")
        ):
            assert time.monotonic() < deadline
            client.get("/healthz")
    unwatched = create_app(Settings(data_dir=tmp_path / "b", gateway_urls=gateway, loop_stall_ms=0))
    with TestClient(unwatched) as client:
        for _ in range(20):
            client.get("/healthz")
        assert samples(unwatched.state.host.metrics.registry, "gasless_event_loop_lag_seconds_count") == [
            ({}, 0.0)
        ]
        gc.collect()
        client.get("/healthz")
        assert samples(unwatched.state.host.metrics.registry, "gasless_gc_pause_seconds_count") == []


def test_a_host_that_only_serves_settles_its_heap_once_ready(tmp_path: Path, localnet: Any) -> None:
    """`dedicated_process`: what the ready host holds leaves the cyclic collector's reach (a full
    collection walks only what came after); without it (a host sharing its process: tests) nothing is
    frozen."""
    gc.collect()
    gc.unfreeze()
    try:
        envs = start_env(tmp_path / "plain", localnet)
        next(envs)
        assert gc.get_freeze_count() == 0
        with pytest.raises(StopIteration):
            next(envs)
        envs = start_env(tmp_path / "settled", localnet, app_kwargs={"dedicated_process": True})
        env = next(envs)
        deadline = time.monotonic() + 30
        while gc.get_freeze_count() == 0:  # settled once its start-up has ended, just after /readyz said so
            assert time.monotonic() < deadline, "the ready host's heap was not settled"
            env.client.get("/healthz")
        assert gc.is_tracked(env.client.app.state.host) and env.client.app.state.host.restored
        # What the ready host holds is among the frozen: a full collection no longer walks it.
        assert not any(obj is env.client.app.state.host for obj in gc.get_objects())
        with pytest.raises(StopIteration):
            next(envs)
    finally:
        gc.unfreeze()  # the test process's collector as it was: the stopped hosts can go
