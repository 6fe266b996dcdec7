"""A host's API worker processes: `gasless serve --workers N` (issue 17, target 5).

One API process is held to one core by the GIL. `--workers N` runs N `gasless serve` processes of one host
on one API port. Each worker listens on it with its own socket (SO_REUSEPORT), and the kernel spreads new
connections evenly over the listening sockets by address hash. A worker's socket is bound at its start but
listens only once its start-up is done (uvicorn listens after the lifespan's start-up), so a worker that is
not ready is not in the group and gets nothing. (One socket shared by all workers spread connections
unevenly, 60/40 and worse: whichever worker woke first took every connection waiting, and kept connections
stayed there. The price of a socket each: the connections waiting in a worker's own queue when it dies
are reset unread; nothing in them was processed, and a client resends the same bytes.)

This parent reserves the port (bound, never listening: no other program can take it, and it gets no
connection), binds the admin ports (worker k's metrics on the metrics port + k, passed down), and starts
the workers.

Everything the workers share lives in PostgreSQL and Redis, exactly as for two hosts. Each worker is an
instance of its own (`Settings.instance_id`, `<hostId>.<k>`) to the signer fence, to intent ownership and
to singleton presence: a worker that dies is to the others what a dead host is, and the intent-recovery
leader adopts and finishes its in-flight intents. Clients see the host: `hostId` is the host's, and each
worker's boot epoch is distinct (gasless.hosting.host.boot_epoch_ms), so stream event ids never collide.

The parent only supervises:
- A worker that exits on its own is started again after a back-off (1 s, doubling to 30 s; back to 1 s
  after a minute up). The new one serves only once its relay core is ready and its signer claim is held
  (its predecessor's claim has to lapse first): its socket listens only then, so the kernel never hands
  it a connection it would refuse for that.
- A worker that exits with status 2 (its settings or its chain refused) stops the host with that status:
  every worker would refuse the same way.
- SIGINT or SIGTERM stop every worker cleanly (one SIGTERM each), then the parent.

Workers run in their own session, so a terminal's Ctrl-C reaches only the parent, which forwards one
SIGTERM (a second signal would make a worker exit without a clean stop). Each holds the read end of a pipe
whose write end only the parent holds: if the parent dies, even by SIGKILL, the pipe reads end-of-file and
every worker stops itself cleanly (`watch_parent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("gasless.cli.api_workers")

# A worker refused its settings or its chain (the CLI's exit status for both): so would every other.
EXIT_REFUSED = 2
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A worker up this long has shown it can run: its next restart starts from the first back-off again.
STEADY_S = 60.0
# A restarted worker holds off serving until it is ready, at most this long (then /readyz says why not).
READY_WAIT_S = 120.0
# A worker's clean stop: uvicorn's graceful stop plus the relay core's; then SIGKILL.
STOP_TIMEOUT_S = 40.0


@dataclass
class Worker:
    index: int
    metrics: socket.socket | None
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    backoff_s: float = FIRST_BACKOFF_S


@dataclass
class WorkerSupervisor:
    """Starts a worker per entry of `metrics` (its admin socket, or None) running `command` (the `gasless
    serve` command line, without the worker options), and keeps them running until cancelled; see the
    module docstring.
    `run` returns the exit status the host should end with when a worker refused."""

    command: Sequence[str]
    metrics: Sequence[socket.socket | None]
    ready_wait_s: float = READY_WAIT_S
    workers: list[Worker] = field(default_factory=list)

    async def run(self) -> int:
        parent_read, parent_write = os.pipe()
        self.workers = [Worker(index, sock) for index, sock in enumerate(self.metrics)]
        try:
            for worker in self.workers:
                await self._start(worker, parent_read, ready_wait_s=0.0)
            while True:
                exited = await self._next_exit()
                status = exited.process.returncode if exited.process is not None else None
                lived = time.monotonic() - exited.started_at
                log.warning("API worker exited", worker=exited.index, status=status, lived_s=round(lived, 1))
                if status == EXIT_REFUSED:
                    log.error("API worker refused to start: stopping the host", worker=exited.index)
                    return EXIT_REFUSED
                exited.backoff_s = FIRST_BACKOFF_S if lived >= STEADY_S else exited.backoff_s
                log.info("API worker restarting", worker=exited.index, in_s=exited.backoff_s)
                await asyncio.sleep(exited.backoff_s)
                exited.backoff_s = min(exited.backoff_s * 2, MAX_BACKOFF_S)
                # The others serve meanwhile: the new one listens only once it is ready.
                await self._start(exited, parent_read, ready_wait_s=self.ready_wait_s)
        finally:
            await self._stop_all()
            os.close(parent_write)  # any worker still alive reads end-of-file and stops itself
            os.close(parent_read)

    async def _start(self, worker: Worker, parent_read: int, *, ready_wait_s: float) -> None:
        fds = [parent_read]
        options = [
            "--worker", str(worker.index),
            "--reuse-port",
            "--parent-fd", str(parent_read),
            "--ready-wait-s", str(ready_wait_s),
        ]  # fmt: skip
        if worker.metrics is not None:
            fds.append(worker.metrics.fileno())
            options += ["--metrics-fd", str(worker.metrics.fileno())]
            options += ["--metrics-port", str(worker.metrics.getsockname()[1])]
        worker.process = await asyncio.create_subprocess_exec(
            *self.command, *options, pass_fds=fds, start_new_session=True
        )
        worker.started_at = time.monotonic()
        log.info("API worker started", worker=worker.index, pid=worker.process.pid)

    async def _next_exit(self) -> Worker:
        waits = {
            asyncio.ensure_future(worker.process.wait()): worker
            for worker in self.workers
            if worker.process is not None
        }
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        return waits[next(iter(done))]

    async def _stop_all(self) -> None:
        alive = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
        for process in alive:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if not alive:
            return
        waits = [asyncio.ensure_future(process.wait()) for process in alive]
        # Not gather: a cancelled gather would leave the workers unreaped.
        _, pending = await asyncio.wait(waits, timeout=STOP_TIMEOUT_S)
        if pending:
            for process in alive:
                if process.returncode is None:
                    log.error("API worker did not stop in time: killed", pid=process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.wait(waits)


def worker_command(host_id: str | None, port: int, config: str | None) -> list[str]:
    """The `gasless serve` command line every worker runs (the worker options are added per worker)."""
    command = [sys.executable, "-m", "gasless.cli", "serve", "--port", str(port)]
    if host_id is not None:
        command += ["--host-id", host_id]
    if config is not None:
        command += ["--config", config]
    return command


def _bound_reusable(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT (not listening); OSError when the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def reserve_port(host: str, port: int) -> socket.socket:
    """The parent's hold on the API port: bound with SO_REUSEPORT, never listening. OSError when another
    program has the port (bound without SO_REUSEPORT), or listens on it (a stale gasless with SO_REUSEPORT
    of the same user could otherwise share it silently)."""
    sock = _bound_reusable(host, port)
    try:
        probe = socket.create_connection(sock.getsockname()[:2], timeout=1)
    except OSError:
        return sock  # nobody listens: the port is ours
    probe.close()
    sock.close()
    raise OSError(errno.EADDRINUSE, "another program listens on it")


def worker_socket(host: str, port: int) -> socket.socket:
    """A worker's API socket: bound with SO_REUSEPORT, not listening yet (the server listens once its
    start-up is done, and only then does the kernel hand it connections)."""
    sock = _bound_reusable(host, port)
    sock.setblocking(False)
    return sock


def adopt_socket(fd: int) -> socket.socket:
    """The listening socket the parent passed down as `fd`."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def watch_parent(fd: int) -> None:
    """On the running loop: when the parent's pipe reads end-of-file (the parent is gone, however it
    died), stop this worker as SIGTERM would (gasless.cli.signals)."""
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(fd)
            log.warning("the parent process is gone: stopping this worker")
            os.kill(os.getpid(), signal.SIGTERM)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
