"""The ports `gasless up` / `serve` / `localnet` listen on: the metrics port from GASLESS_METRICS_PORT, and a
port already in use refused with one line and status 2 before anything starts (real processes, free ports)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from process_kit import answers, free_ports, listening, piped_env, spawn

EXIT_CONFIG = 2


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def test_up_takes_the_metrics_port_from_the_environment(tmp_path: Path) -> None:
    api, gateway, metrics = ports = free_ports(3)
    args = ["up", "--data-dir", str(tmp_path), "--port", str(api), "--localnet-port", str(gateway)]
    env = piped_env(GASLESS_METRICS_PORT=str(metrics))
    with spawn(*args, "--round-ms", "100", log=tmp_path / "up.log", env=env) as up:
        up.wait_for(lambda: "Press Ctrl-C to stop." in up.output(), "the table")
        assert answers(f"http://127.0.0.1:{metrics}/metrics"), up.output()
        assert f"http://127.0.0.1:{metrics}/metrics" in up.output()
        assert up.stopped_within(signal.SIGINT, 20) == 130
    assert [port for port in ports if listening(port)] == []


def one_line_refusal(output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("cannot start:") and all(n in lines[0] for n in needles), output


@pytest.mark.parametrize("which", ["api", "metrics", "localnet"])
def test_up_refuses_a_port_in_use_before_starting_anything(
    which: str, tmp_path: Path, taken_port: int
) -> None:
    api, gateway, metrics = free_ports(3)
    port = {"api": api, "metrics": metrics, "localnet": gateway}
    port[which] = taken_port
    args = [
        "up",
        "--data-dir", str(tmp_path),
        "--port", str(port["api"]),
        "--localnet-port", str(port["localnet"]),
        "--metrics-port", str(port["metrics"]),
    ]  # fmt: skip
    with spawn(*args, log=tmp_path / "up.log") as up:
        assert up.proc.wait(60) == EXIT_CONFIG, up.output()
    option = {"api": "--port", "metrics": "--metrics-port", "localnet": "--localnet-port"}[which]
    one_line_refusal(up.output(), f"127.0.0.1:{taken_port}", option)
    assert [p for p in port.values() if p != taken_port and listening(p)] == []


def test_serve_refuses_an_api_port_in_use(tmp_path: Path, taken_port: int) -> None:
    env = piped_env(GASLESS_DATA_DIR=str(tmp_path), GASLESS_METRICS_PORT="0")
    with spawn("serve", "--port", str(taken_port), log=tmp_path / "serve.log", env=env) as serve:
        assert serve.proc.wait(60) == EXIT_CONFIG, serve.output()
    one_line_refusal(serve.output(), f"127.0.0.1:{taken_port}", "--port")


def test_localnet_refuses_a_port_in_use(tmp_path: Path, taken_port: int) -> None:
    args = ["localnet", "--port", str(taken_port), "--data-dir", str(tmp_path)]
    with spawn(*args, log=tmp_path / "localnet.log") as net:
        assert net.proc.wait(60) == EXIT_CONFIG, net.output()
    one_line_refusal(net.output(), f"127.0.0.1:{taken_port}", "--port")
