"""SIGINT and SIGTERM stop a `gasless` command at any moment, start-up included.

`install()` runs first thing in the entry point, before the slow imports, and takes both signals even when
the parent left SIGINT ignored (a background job `gasless up &` of a non-interactive shell inherits it
ignored): a stop that was asked for is never lost.

- Before a command runs its event loop, a signal raises `StopRequested` (a KeyboardInterrupt, so no
  `except Exception` swallows it) where the program is: nothing needing a clean stop has started yet.
- While `run_until_stopped` runs the command's coroutine, the first signal cancels it; the coroutine stops
  what it started so far (localnet, API hosts, listeners) on its way out. A second signal exits at once.
- The exit status is 128 + the signal's number (130 SIGINT, 143 SIGTERM) whatever the phase.

This module imports only the standard library: it must be cheap to load before everything else.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    return 128 + signum


class StopRequested(KeyboardInterrupt):
    """A signal asked the command to stop (asyncio and uvloop re-raise KeyboardInterrupt, never log it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class Stopper:
    """The process's one record of the stop signal; see the module docstring."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._installed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def install(self) -> None:
        try:
            for sig in SIGNALS:
                signal.signal(sig, self._raise)
        except ValueError:  # not the main thread (an in-process caller): its signals are its own
            return
        self._installed = True

    def _raise(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        if frame is not None and _exceptions_ignored_in(frame):
            # Interrupting here would be swallowed ("Exception ignored in ..." with a traceback): deliver
            # the same signal again a moment later, once the callback has returned.
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
            return
        raise StopRequested(self.signum)

    def attach(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """From now on a signal cancels `task` (the loop runs the handler between callbacks)."""
        if self.signum is not None:
            raise StopRequested(self.signum)
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._cancel, sig)
        self._loop, self._task = loop, task

    def detach(self) -> None:
        if self._loop is None:
            return
        for sig in SIGNALS:
            self._loop.remove_signal_handler(sig)  # resets the signal to its default...
        self._loop = self._task = None
        if self._installed:
            self.install()  # ...so take it again: the loop's closing moments are interruptible too

    def _cancel(self, signum: int) -> None:
        if self.signum is not None:
            # The clean stop is under way and the user insists: the OS releases everything.
            name = signal.Signals(signum).name
            os.write(2, f"gasless: second signal ({name}): exiting without a clean stop\n".encode())
            os._exit(exit_code(signum))
        self.signum = signum
        if self._task is not None:
            self._task.cancel()


def _exceptions_ignored_in(frame: FrameType) -> bool:
    """Whether Python would swallow an exception raised in `frame`: an import lock's weakref callback."""
    code = frame.f_code
    return code.co_filename.startswith("<frozen importlib") and code.co_name == "cb"


STOPPER = Stopper()


def install() -> None:
    STOPPER.install()


def run_until_stopped(
    main: Callable[[], Coroutine[Any, Any, None]], run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """`run(coroutine)` (asyncio.run, uvloop.run) `main()` until it returns or a signal stops it; raises
    StopRequested after a signal, once `main` has stopped what it started."""
    import asyncio

    async def guarded() -> None:
        STOPPER.attach(asyncio.get_running_loop(), asyncio.current_task())  # type: ignore[arg-type]
        try:
            await main()
        except asyncio.CancelledError:
            if STOPPER.signum is None:
                raise
        finally:
            STOPPER.detach()
        if STOPPER.signum is not None:
            raise StopRequested(STOPPER.signum)

    run(guarded())


def stop_exit_code() -> int | None:
    """The exit status a signal asked for, or None when no signal came."""
    return None if STOPPER.signum is None else exit_code(STOPPER.signum)
