"""SIGINT / SIGTERM stop `gasless up`, `serve` and `localnet` at any moment of their start-up: a real process
each time, started the way `gasless up &` starts from a script (SIGINT inherited ignored), on free ports.
The process must exit within a bound with 128 + the signal's number, and nothing may listen any more."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from process_kit import Spawned, answers, free_ports, listening, piped_env, spawn

# A clean stop (API hosts, SQLite, localnet) takes about a second; the bound allows for a busy machine.
STOP_BOUND_S = 20.0
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


def up_args(tmp_path: Path, api: int, gateway: int, metrics: int) -> list[str]:
    return [
        "up",
        "--data-dir", str(tmp_path / "var"),
        "--port", str(api),
        "--localnet-port", str(gateway),
        "--metrics-port", str(metrics),
        "--round-ms", "600",  # the default: unpausing the contract takes a few rounds, a window to hit
    ]  # fmt: skip


def started_nothing_yet(process: Spawned, *ports: int) -> bool:
    """The command holds its handlers (SIGTERM is caught only by gasless's own) and no port listens."""
    if not process.catches(signal.SIGTERM):
        return False
    assert not any(listening(port) for port in ports), "the handlers came after the start-up"
    return True


def assert_stopped(process: Spawned, signum: int, expected: int, ports: list[int]) -> None:
    code = process.stopped_within(signum, STOP_BOUND_S)
    assert code == expected, process.output()
    assert [port for port in ports if listening(port)] == [], process.output()
    assert "Traceback" not in process.output()


@pytest.mark.parametrize("moment", ["importing", "first line printed", "localnet answers", "API answers"])
def test_sigint_during_up_start_up_stops_everything(moment: str, tmp_path: Path) -> None:
    api, gateway, metrics = ports = free_ports(3)
    with spawn(*up_args(tmp_path, api, gateway, metrics), log=tmp_path / "up.log") as up:
        if moment == "importing":
            up.wait_for(lambda: started_nothing_yet(up, *ports), "the signal handlers")
        elif moment == "first line printed":
            up.wait_for(lambda: up.output().strip(), "a first line")
        elif moment == "localnet answers":
            up.wait_for(lambda: answers(f"http://127.0.0.1:{gateway}/localnet/info"), "localnet")
            assert "Press Ctrl-C to stop." not in up.output(), "too late: the API listens already"
        else:
            up.wait_for(lambda: answers(f"http://127.0.0.1:{api}/healthz"), "the API")
        assert_stopped(up, signal.SIGINT, EXIT_SIGINT, ports)


def test_sigterm_once_up_is_ready_stops_everything(tmp_path: Path) -> None:
    api, gateway, metrics = ports = free_ports(3)
    with spawn(*up_args(tmp_path, api, gateway, metrics), log=tmp_path / "up.log") as up:
        up.wait_for(lambda: answers(f"http://127.0.0.1:{api}/readyz"), "ready", timeout=90)
        assert answers(f"http://127.0.0.1:{metrics}/metrics")
        assert "Press Ctrl-C to stop." in up.output()
        assert_stopped(up, signal.SIGTERM, EXIT_SIGTERM, ports)
    assert up.output().rstrip().endswith("stopped (SIGTERM)")


@pytest.mark.parametrize("moment", ["importing", "listening"])
def test_signals_stop_localnet_at_any_moment(moment: str, tmp_path: Path) -> None:
    (gateway,) = free_ports(1)
    args = ["localnet", "--port", str(gateway), "--data-dir", str(tmp_path), "--round-ms", "100"]
    with spawn(*args, log=tmp_path / "localnet.log") as net:
        if moment == "importing":
            net.wait_for(lambda: started_nothing_yet(net, gateway), "the signal handlers")
        else:
            net.wait_for(lambda: answers(f"http://127.0.0.1:{gateway}/localnet/info"), "localnet")
        assert_stopped(net, signal.SIGINT, EXIT_SIGINT, [gateway])


@pytest.mark.parametrize("moment", ["importing", "listening"])
def test_signals_stop_serve_at_any_moment(moment: str, tmp_path: Path, localnet: Any) -> None:
    api, metrics = ports = free_ports(2)
    env = piped_env(
        GASLESS_PROFILE="localnet",
        GASLESS_MASTER_SECRET="s" * 40,
        GASLESS_GATEWAY_URLS=json.dumps(localnet.urls),
        GASLESS_DATA_DIR=str(tmp_path),
        GASLESS_CONTRACT_ADDRESS=localnet.net.info["contract"],
        GASLESS_RELAYER_KEY_FILES=json.dumps([str(w.path) for w in localnet.net.genesis.relayers]),
        GASLESS_METRICS_PORT=str(metrics),
    )
    with spawn("serve", "--port", str(api), log=tmp_path / "serve.log", env=env) as serve:
        if moment == "importing":
            serve.wait_for(lambda: started_nothing_yet(serve, *ports), "the signal handlers")
        else:
            serve.wait_for(lambda: answers(f"http://127.0.0.1:{api}/healthz"), "the API")
        assert_stopped(serve, signal.SIGTERM, EXIT_SIGTERM, ports)


# What CPython 3.11 did once in the suite: SIGTERM arrived inside the import machinery while ssl.py ran
# `from _ssl import RAND_egd` (expected to fail, and caught), and the interrupt came out of the import as
# "TypeError: expected a message argument", so the command exited 1 with a traceback.
INTERRUPTED_IMPORT = """
import os, signal, sys, time
from gasless.cli import main, signals

class SignalInsideTheImport:
    def find_spec(self, name, path=None, target=None):
        if name != "gasless.cli.main":
            return None
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises first
        except signals.StopRequested:
            raise TypeError("expected a message argument") from None
        raise AssertionError("the signal handler did not run")

sys.meta_path.insert(0, SignalInsideTheImport())
main()
"""


def test_a_signal_that_surfaces_from_an_import_as_another_error_still_stops_with_its_status() -> None:
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_SIGTERM, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
