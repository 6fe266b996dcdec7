"""`gasless serve` hosts as real processes against a localnet, for the suites that run several of them (two
hosts, API workers, a rolling upgrade): the PostgreSQL and Redis they share (a database of the suite's own),
a host's environment, its start (with the Python of any installed release) until it answers, and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from process_kit import reap, wait_until  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families
from relay_kit import MASTER_SECRET  # type: ignore[import-not-found]


def servers(suite: str) -> tuple[str, str]:
    """The PostgreSQL server and the Redis the suite runs on; skipped, loudly, without them."""
    server_url = os.environ.get("GASLESS_TEST_POSTGRES_URL")
    redis_url = os.environ.get("GASLESS_TEST_REDIS_URL")
    if not server_url or not redis_url:
        pytest.skip(f"{suite} skipped: needs GASLESS_TEST_POSTGRES_URL and GASLESS_TEST_REDIS_URL")
    return server_url, redis_url


async def pg_execute(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new database on the server (`prefix` and a random tail), dropped on the way out."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(pg_execute(server_url, f'CREATE DATABASE "{name}"'))
    try:
        yield f"{server_url.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(pg_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def serve_env(
    info: Mapping[str, Any],
    gateways: Sequence[str],
    *,
    host_id: str,
    port: int,
    data_dir: Path,
    database_url: str,
    redis_url: str,
    metrics_port: int = 0,
    fence_ttl_ms: int = 1000,
    base: Mapping[str, str] | None = None,
    **extra: str,
) -> dict[str, str]:
    """The environment of a `gasless serve` of localnet `info` (its `/localnet/info`, as
    `RunningLocalnet.net.info` holds it too) through `gateways`: `base` (the test run's environment by default)
    without a config file, then the host's settings, then `extra`."""
    env = dict(os.environ if base is None else base)
    env.pop("GASLESS_CONFIG", None)
    env.update(
        {
            "GASLESS_PROFILE": "localnet",
            "GASLESS_HOST_ID": host_id,
            "GASLESS_MASTER_SECRET": MASTER_SECRET,
            "GASLESS_GATEWAY_URLS": json.dumps(list(gateways)),
            "GASLESS_DATABASE_URL": database_url,
            "GASLESS_REDIS_URL": redis_url,
            "GASLESS_DATA_DIR": str(data_dir),
            "GASLESS_CONTRACT_ADDRESS": info["contract"],
            "GASLESS_PAIR_ADDRESS": info["pair"],
            "GASLESS_WRAPPER_ADDRESS": info["wrapper"],
            "GASLESS_RELAYER_KEY_FILES": json.dumps([str(r["pem"]) for r in info["relayers"]]),
            "GASLESS_API_BASE_URL": f"http://127.0.0.1:{port}",
            "GASLESS_METRICS_PORT": str(metrics_port),
            "GASLESS_SIGNER_FENCE_TTL_MS": str(fence_ttl_ms),
            "GASLESS_RELAYER_REFRESH_MS": "500",
            **extra,
        }
    )
    return env


@dataclass
class Host:
    host_id: str
    base: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics: str = ""  # its admin port's base URL, where it has one

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(f"{self.base}{path}", timeout=10, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> requests.Response:
        return requests.post(f"{self.base}{path}", json=body, timeout=10, **kwargs)

    def scrape(self) -> dict[str, Any]:
        """{sample name: [(labels, value)]} from the admin port."""
        text = requests.get(f"{self.metrics}/metrics", timeout=5).text
        samples: dict[str, Any] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
        return samples


def spawn_serve(
    env: Mapping[str, str],
    port: int,
    log_path: Path,
    *,
    python: Path | str = sys.executable,
    args: Sequence[str] = (),
    cwd: Path | None = None,
    append: bool = False,
) -> subprocess.Popen[bytes]:
    """`gasless serve --port <port> *args` of the release installed for `python`, its log lines (stderr) to
    `log_path`, in a session of its own (`reap` takes whatever it started)."""
    with log_path.open("ab" if append else "wb") as out:
        return subprocess.Popen(
            [str(python), "-m", "gasless.cli", "serve", *args, "--port", str(port)],
            env=dict(env), cwd=cwd, stdout=subprocess.DEVNULL, stderr=out, start_new_session=True,
        )  # fmt: skip


def start_host(
    env: Mapping[str, str],
    host_id: str,
    port: int,
    log_path: Path,
    *,
    python: Path | str = sys.executable,
    cwd: Path | None = None,
    metrics: str = "",
    until: str = "/readyz",
    timeout: float = 30.0,
) -> Host:
    """A host started (`spawn_serve`) and answering 200 on `until` (`/healthz` for one that cannot finish
    starting); stopped at once if it does not within `timeout` s."""
    proc = spawn_serve(env, port, log_path, python=python, cwd=cwd)
    host = Host(host_id, f"http://127.0.0.1:{port}", proc, log_path, metrics)
    try:
        wait_until(
            lambda: host.get(until).status_code == 200,
            f"host {host_id} {until}",
            timeout,
            proc=proc,
            log=log_path,
        )
    except BaseException:
        stop(proc)
        raise
    return host


def stop(proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """SIGTERM, and what is still running `timeout` s later is killed with what it started (`reap`)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    reap(proc)
