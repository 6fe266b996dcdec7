"""How late the event loop runs what is due, and where it was when it ran late.

Everything a host does shares one event loop: a callback that holds it (a large JSON document, a
collection, a read that does not await) delays every request and round due meanwhile, and shows only as
a tail in someone else's latency. A heartbeat scheduled on the loop measures that delay; a watchdog
thread looks at the loop thread's stack once the heartbeat is later than the threshold, which is where the
loop was while it kept the heartbeat waiting. The cyclic garbage collector stops every thread and shows
in no stack, so the time it ran between two beats is counted apart. Every beat's delay goes to the
histogram `gasless_event_loop_lag_seconds`; a delay past the threshold is logged once as `event loop
blocked`, with how long, that stack as `frames` (code locations only: no values, so nothing secret) and
the collector's share. Each collection's own time goes to `observe_gc(generation, seconds)` (the histogram
`gasless_gc_pause_seconds`), handed over at the next beat.

The collector is timed only when `observe_gc` is given: its callback is Python code run inside whatever
allocation triggered a collection, and on Python 3.11 a thread switch there can corrupt another thread's
`ast.parse` (the AST builder's recursion counter is shared: "AST constructor recursion depth mismatch").
A process that only serves parses nothing at run time; a test process (pytest rewriting asserts at import
beside a host's thread) does, so only serving processes ask for it (`create_app(dedicated_process=True)`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("gasless.loop")

STACK_FRAMES = 16  # the innermost frames kept: enough to name the caller of whatever held the loop


@dataclass(frozen=True, slots=True)
class Stall:
    """One heartbeat the loop ran later than the threshold: by how much, the loop thread's stack the
    watchdog found (innermost last; empty when it could not look in time, e.g. C code held the GIL), and
    the garbage collector's time since the beat before (any thread's collections: each stops them all;
    None when the collector is not timed) with the oldest generation it collected (-1: none)."""

    late_s: float
    stack: tuple[str, ...]
    gc_s: float | None = 0.0
    gc_generation: int = -1


class LoopWatch:
    """The heartbeat and the watchdog of one event loop. `observe(late_s)` is called with every beat's
    delay; `on_stall` with each beat later than `threshold_s`; `observe_gc(generation, seconds)`, when
    given, with every collection's time. The beat is due every `threshold_s / 4` (at most every 25 ms) so a
    stall is seen within a quarter of its threshold."""

    def __init__(
        self,
        threshold_s: float,
        *,
        observe: Callable[[float], None] = lambda _late_s: None,
        on_stall: Callable[[Stall], None] | None = None,
        observe_gc: Callable[[int, float], None] | None = None,
    ) -> None:
        if threshold_s <= 0:
            raise ValueError("threshold_s must be positive")
        self.threshold_s = threshold_s
        self.period_s = min(threshold_s / 4, 0.025)
        self._observe = observe
        self._on_stall = on_stall if on_stall is not None else log_stall
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._due = 0.0  # when the pending beat is due (monotonic seconds)
        self._sampled: tuple[float, tuple[str, ...]] | None = None  # (the beat's due time, its stack)
        self._handle: asyncio.TimerHandle | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._gc_started = 0.0
        self._gc_s = 0.0  # the collector's time since the last beat
        self._gc_generation = -1
        self._observe_gc = observe_gc
        # Each collection's (generation, seconds), observed at the next beat: the collector's callback
        # may run in any thread, in the middle of anything, even of the metric's own update.
        self._gc_pauses: list[tuple[int, float]] = []

    def start(self) -> None:
        """Start watching the running loop (call from it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._schedule(time.monotonic())
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()
        if self._observe_gc is not None:
            gc.callbacks.append(self._collecting)

    def stop(self) -> None:
        if self._collecting in gc.callbacks:
            gc.callbacks.remove(self._collecting)
        if self._handle is not None:
            self._handle.cancel()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.period_s
        self._handle = self._loop.call_at(self._loop.time() + self.period_s, self._beat)

    def _collecting(self, phase: str, info: dict[str, int]) -> None:
        # Called by the collector itself, in whichever thread triggered it (under the GIL).
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            self._gc_s += took
            self._gc_generation = max(self._gc_generation, info["generation"])
            self._gc_pauses.append((info["generation"], took))

    def _beat(self) -> None:
        now = time.monotonic()
        late = max(0.0, now - self._due)
        sampled = self._sampled
        gc_s, gc_generation = self._gc_s, self._gc_generation
        self._gc_s, self._gc_generation = 0.0, -1
        pauses, self._gc_pauses = self._gc_pauses, []
        try:
            if self._observe_gc is not None:
                for generation, took in pauses:
                    self._observe_gc(generation, took)
            self._observe(late)
            if late > self.threshold_s:
                stack = sampled[1] if sampled is not None and sampled[0] == self._due else ()
                gc_timed = self._observe_gc is not None
                self._on_stall(Stall(late, stack, gc_s if gc_timed else None, gc_generation))
        finally:
            self._schedule(now)  # whatever a callback raised, the watch goes on

    def _watch(self) -> None:
        while not self._stopping.wait(self.period_s / 2):
            due = self._due
            if time.monotonic() - due <= self.threshold_s:
                continue
            if self._sampled is not None and self._sampled[0] == due:
                continue  # this stall is sampled already
            stack = thread_stack(self._loop_thread)
            if stack:
                self._sampled = (due, stack[-STACK_FRAMES:])


# A thread's block in faulthandler's dump: `Thread 0x00007f... (most recent call first):` (`Current thread`
# for the caller's own), then one `  File "<path>", line <n> in <name>` a frame, innermost first.
_FRAME_LINE = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')


def thread_stack(ident: int) -> tuple[str, ...]:
    """Another thread's stack now, outermost first, as `<module path>:<line> <function>` (empty when the
    thread has gone). Read by faulthandler, in C and without letting the thread run meanwhile: walking its
    frames from Python (`sys._current_frames()`, then `f_back`) races the thread, which can leave a frame
    while it is read; on Python 3.11 that crashed the process (a segmentation fault in `walk_stack`, seen
    under a loaded test suite) or answered a frame's `f_lineno` with AttributeError."""
    with tempfile.TemporaryFile() as dump:
        faulthandler.dump_traceback(dump, all_threads=True)
        dump.seek(0)
        text = dump.read().decode("utf-8", "replace")
    header = f"0x{ident:016x} (most recent call first):"
    frames: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if inside:
                break
            inside = line.endswith(header)
        elif inside:
            found = _FRAME_LINE.match(line)
            if found is not None:
                frames.append(f"{_module_path(found['file'])}:{found['line']} {found['name']}")
    return tuple(reversed(frames))


def settle_heap() -> None:
    """Put what the process holds now out of the cyclic collector's reach (`gc.freeze`). For a service
    process only (a frozen object is never collected), at two moments: before it starts serving (the
    imported modules' objects, about 250 000: functions, classes, tables, schemas) and once its host is
    ready (`create_app(dedicated_process=True)`: the app, its routes and schemas, the engine, the
    signer, the relay core's state, about 30 000 more). Both live as long as the process. A full
    collection walks every object not frozen and stops every thread meanwhile: before the first, about
    200 ms a few times a minute under load; after both, 5-8 ms (docs/performance.md, target 2)."""
    gc.collect()  # what is garbage already goes now, not frozen for good
    gc.freeze()


def _module_path(filename: str) -> str:
    """A frame's file as the import system sees it (`gasless/relay/core.py`, `asyncio/events.py`), not
    where this machine installed it."""
    for marker in ("/site-packages/", "/src/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    parts = filename.rsplit("/", 2)
    return "/".join(parts[-2:])


def log_stall(stall: Stall) -> None:
    log.warning(
        "event loop blocked",
        blocked_ms=round(stall.late_s * 1000, 1),
        # Not `stack`: structlog's console renderer takes that key for a traceback string.
        frames=list(stall.stack) or None,
        gc_ms=round(stall.gc_s * 1000, 1) if stall.gc_s is not None else None,
        gc_generation=stall.gc_generation if stall.gc_generation >= 0 else None,
    )
