"""The fault suite's short version (bench/chaos.py --short, docs/reliability.md): hosts a and b on a
PostgreSQL server and a Redis of their own (so both can crash), load from several senders retrying the same
bytes on the other host, and each fault injected under load: host b cut from PostgreSQL, host a cut from
Redis, Redis restarted empty, PostgreSQL's connections dropped, PostgreSQL crashed and restarted, a gateway
that acknowledges nothing, a slow gateway, a gateway answering out of order, host b's clock 30 s ahead, the
settlement leader SIGKILLed with a batch in flight, the mirror's leaders SIGKILLed in turn. After each: no
acknowledged relay lost, nothing executed twice, nothing sent after an error answer, one billed row per
execution, no reservation left, every billed row in a committed settlement batch, every 429/503 with
Retry-After, both hosts ready again."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.postgres]

_path = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
_spec = importlib.util.spec_from_file_location("bench_chaos", _path)
if _spec is None or _spec.loader is None:
    raise ImportError(f"cannot load {_path}")
chaos: Any = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = chaos  # its dataclasses look their module up there
_spec.loader.exec_module(chaos)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    bin_dir = chaos.postgres_bin()
    if bin_dir is None:
        pytest.skip("fault suite skipped: needs PostgreSQL's server binaries (it runs a server of its own)")
    if shutil.which("redis-server") is None:
        pytest.skip("fault suite skipped: needs the redis-server binary (it runs a Redis of its own)")
    server = chaos.PostgresServer(bin_dir).init()
    stack = chaos.Stack(tmp_path_factory.mktemp("chaos"), server.url, postgres=server)
    try:
        asyncio.run(stack.start(senders=chaos.SHORT.senders * len(chaos.SCENARIOS)))
        yield stack
    finally:
        asyncio.run(stack.stop())


@pytest.mark.parametrize("name", list(chaos.SCENARIOS))
def test_the_delivery_invariants_hold_under_the_fault(stack: Any, name: str) -> None:
    if name == "b-clock-offset":
        try:
            chaos.faketime_library()
        except FileNotFoundError:
            pytest.skip("clock scenario skipped: needs libfaketime (./dev test installs it where apt can)")
    verdict = asyncio.run(chaos.run_scenario(stack, chaos.SCENARIOS[name], chaos.SHORT))
    print(verdict)
    assert verdict.acked > 0, verdict
    assert verdict.executed >= verdict.acked, verdict
    assert verdict.violations == 0, verdict.details
