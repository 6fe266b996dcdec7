"""Micro-benchmarks of pieces of the relay path, in CPU time of this process (best of several repetitions).

Whole-service runs (`bench/relay.py`) move by 20-50% between two runs of one build on a busy shared machine;
these pieces run alone on one thread and repeat within a few percent, so a change to one of them is measured
here, build against build: run the same command with `PYTHONPATH=<worktree of the other build>/src`.

    .venv/bin/python bench/micro.py               # all
    .venv/bin/python bench/micro.py sign log      # some: sign, write, log, read, gateway

- sign: a relayer signature through the service's signer, and (the baseline, same run) through the SDK's
  `UserSecretKey.sign`;
- write: a write transaction on the SQLite writer's kept connection (empty, one INSERT) and a read on a
  pooled connection, both on this thread;
- read: one small read of a SQLite file by the three paths the service has, in one run (the first is the
  baseline): through aiosqlite (`engine.connect()`), inline on the loop (`run_read`), on a worker thread
  (`run_read_off_loop`); CPU of the whole process, every thread counted;
- log: one access-log line through the configured pipeline (redaction, JSON rendering) into /dev/null;
- gateway: client CPU of one gateway read (`GET /address/...`, `GET /transaction/pool`) against a real
  `gasless localnet` in another process.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

REPEATS = 5


def best_us(work: Callable[[], Any], count: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.process_time()
        for _ in range(count):
            work()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


async def best_us_async(work: Callable[[], Any], count: int) -> float:
    """`best_us` for a coroutine function, awaited `count` times a repetition."""
    best = float("inf")
    for _ in range(REPEATS):
        started = time.process_time()
        for _ in range(count):
            await work()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


def bench_sign() -> None:
    from multiversx_sdk import UserSecretKey

    from gasless.signer.pem import PemSigner

    key = UserSecretKey.generate()
    signer = PemSigner([key])
    relayer = signer.relayers()[0].address.to_bech32()
    message = os.urandom(300)
    assert asyncio.run(signer.sign(relayer, message)) == key.sign(message)  # the same bytes

    def service_sign() -> None:
        coroutine = signer.sign(relayer, message)
        try:
            coroutine.send(None)
        except StopIteration:
            pass

    print(f"sign: the SDK's UserSecretKey.sign {best_us(lambda: key.sign(message), 2000):.1f} us")
    print(f"sign: the service's relayer signer {best_us(service_sign, 2000):.1f} us")


def bench_write() -> None:
    from sqlalchemy import text

    from gasless.db.engine import _sync_read, _threads, create_engine, run_write

    async def main() -> None:
        folder = tempfile.mkdtemp()
        engine = create_engine(f"sqlite+aiosqlite:///{folder}/micro.db")
        await run_write(engine, lambda conn: conn.execute(text("CREATE TABLE t (a INTEGER)")))
        side = _threads(engine)
        sync = side.engine
        insert = text("INSERT INTO t VALUES (1)")
        select = text("SELECT 1")
        print(f"write: empty transaction {best_us(lambda: side.write(lambda c: None), 3000):.0f} us")
        print(f"write: one INSERT {best_us(lambda: side.write(lambda c: c.execute(insert)), 3000):.0f} us")
        print(
            "write: a read (SELECT 1) "
            f"{best_us(lambda: _sync_read(sync, lambda c: c.execute(select).all()), 3000):.0f} us"
        )
        await engine.dispose()

    asyncio.run(main())


def bench_read() -> None:
    from sqlalchemy import select

    from gasless.db.engine import create_engine, run_read, run_read_off_loop
    from gasless.db.migrate import upgrade
    from gasless.db.tables import service_meta

    query = select(service_meta.c.value).where(service_meta.c.key == "notices.usage")

    async def main() -> None:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/micro.db"
        await upgrade(url)
        engine = create_engine(url)

        async def through_aiosqlite() -> Any:
            async with engine.connect() as conn:
                return (await conn.execute(query)).scalar()

        paths = {
            "through aiosqlite (engine.connect)": through_aiosqlite,
            "inline on the loop (run_read)": lambda: run_read(engine, lambda c: c.execute(query).scalar()),
            "on a worker thread (run_read_off_loop)": lambda: run_read_off_loop(
                engine, lambda c: c.execute(query).scalar()
            ),
        }
        for name, read in paths.items():
            for _ in range(200):  # warm: connections made, statements compiled
                await read()
            print(f"read: {name} {await best_us_async(read, 1000):.0f} us")
        await engine.dispose()

    asyncio.run(main())


def bench_log() -> None:
    import structlog

    from gasless.core.logs import configure_logging

    with open(os.devnull, "w") as sink:
        configure_logging(json_lines=True, secrets=["micro-master-secret-0123456789abcdef"], stream=sink)
        structlog.contextvars.bind_contextvars(host_id="a", request_id="req_0123456789abcdef01234567")
        log = structlog.get_logger("gasless.core.metrics")
        fields = {
            "method": "POST",
            "route": "/v1/relay",
            "path": "/v1/relay",
            "status": 200,
            "duration_ms": 3.2,
        }
        print(f"log: one access-log line {best_us(lambda: log.info('request', **fields), 5000):.0f} us")
        structlog.contextvars.clear_contextvars()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_gateway() -> None:
    import aiohttp
    import uvloop

    from gasless.chain.gateway import GatewayClient

    port = _free_port()
    folder = tempfile.mkdtemp()
    localnet = subprocess.Popen(
        [sys.executable, "-m", "gasless.cli", "localnet", "--port", str(port), "--data-dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/localnet/info", timeout=2) as answer:
                    json.loads(answer.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        async def main() -> None:
            async with aiohttp.ClientSession() as session:
                gateway = GatewayClient(session, [url])
                address = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
                for label, call in (
                    ("GET /address/{address}", lambda: gateway.account(address)),
                    ("GET /transaction/pool", lambda: gateway.pool_for_sender(address)),
                ):
                    cost = await best_us_async(call, 400)
                    print(f"gateway: {label} {cost:.0f} us of client CPU a request")

        uvloop.run(main())
    finally:
        localnet.terminate()
        localnet.wait(10)


BENCHES = {
    "sign": bench_sign,
    "write": bench_write,
    "read": bench_read,
    "log": bench_log,
    "gateway": bench_gateway,
}


def main() -> int:
    names = sys.argv[1:] or list(BENCHES)
    unknown = [name for name in names if name not in BENCHES]
    if unknown:
        print(f"unknown: {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    for name in names:
        BENCHES[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
