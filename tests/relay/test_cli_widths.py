"""The CLI on a narrow terminal (60 and 80 columns): every identifier and number it prints appears whole, once
the lines a table folded are put back together; nothing is cut or ellipsised. Real `gasless` processes that
take their output for a terminal of that width (rich's `TTY_COMPATIBLE=1` with `COLUMNS`), against the API
served by uvicorn on localnet."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from test_cli_relay import write_pem
from test_client_flow import Served, key_in_shard, start_served

from gasless.client import RelayClient

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CELL_BORDERS = re.compile("[│┃]")


@pytest.fixture
def served(make_env: Callable[..., Any], tmp_path: Path, unpaused_localnet: Any) -> Iterator[Served]:
    running = start_served(make_env.__globals__, tmp_path, unpaused_localnet)
    yield running
    running.server.stop()


def on_terminal(columns: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`gasless *args` drawing for a terminal `columns` wide (no colour)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LINES", "GASLESS_GATEWAY_URL")}
    env |= {"COLUMNS": str(columns), "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gasless.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def reassembled(output: str, columns: int) -> str:
    """The output with folded values put back together: each table column's cells joined in order (a value
    folded over several lines continues in the next line's cell), and the lines outside tables joined (a
    word folded at the edge continues on the next line). Also checks that no line is wider than the
    terminal and that nothing was ellipsised."""
    text = ANSI.sub("", output)
    assert "…" not in text, text
    cells: dict[int, list[str]] = defaultdict(list)
    plain: list[str] = []
    for line in text.splitlines():
        assert len(line.rstrip()) <= columns, f"{len(line)} > {columns}: {line!r}"
        if CELL_BORDERS.search(line):
            for index, cell in enumerate(CELL_BORDERS.split(line)[1:-1]):
                cells[index].append(cell.strip())
        else:
            plain.append(line.strip())
    return "\n".join(["".join(plain), *("".join(column) for column in cells.values())])


def whole(values: list[Any], output: str, columns: int) -> None:
    joined = reassembled(output, columns)
    missing = [value for value in values if str(value) not in joined]
    assert not missing, f"not whole at {columns} columns: {missing}\n{output}"


def numbers_and_ids(node: Any) -> list[Any]:
    """Every integer and identifier-like string (an address, a hash, an intent id) of a JSON document."""
    found: list[Any] = []
    if isinstance(node, dict):
        for value in node.values():
            found += numbers_and_ids(value)
    elif isinstance(node, list):
        for value in node:
            found += numbers_and_ids(value)
    elif isinstance(node, int) and not isinstance(node, bool):
        found.append(node)
    elif isinstance(node, str) and (node.startswith("erd1") or re.fullmatch("[0-9a-f]{64}", node)):
        found.append(node)
    return found


@pytest.mark.parametrize("columns", [60, 80])
async def test_identifiers_and_numbers_are_never_cut(served: Served, tmp_path: Path, columns: int) -> None:
    key = await served.new_sender(1)
    pem = write_pem(key, tmp_path / "sender.pem")
    receiver = key_in_shard(2).address
    api = ["--api", served.url]

    sent = on_terminal(columns, "relay", "send", "--pem", str(pem), "--to", receiver, "--no-follow", *api)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    tx_hash = re.search("txHash=([0-9a-f]{64})", reassembled(sent.stdout, columns))
    assert tx_hash is not None, sent.stdout
    answer = requests.get(f"{served.url}/v1/relay/{tx_hash[1]}", timeout=10).json()
    whole([key.address, answer["relayer"], answer["id"], tx_hash[1]], sent.stdout, columns)

    # The intent once final: every hash, address, time and latency figure of its table.
    states = []
    async with RelayClient(served.url) as client:
        states = [intent async for intent in client.follow(tx_hash[1], timeout_s=60)]
    final = states[-1]
    assert final["state"] == "FINALIZED", final
    status = on_terminal(columns, "relay", "status", tx_hash[1], *api)
    assert status.returncode == 0, status.stdout + status.stderr
    shown = {k: v for k, v in final.items() if k not in ("sender", "nonce", "billing", "failure")}
    whole(numbers_and_ids(shown), status.stdout, columns)
    assert {"txHash", "relayer", "receiver"} <= set(re.findall(r"[│┃] (\w+) ", status.stdout))

    # The pricing table: each tier's figures (150000 RU, not "1500…").
    pricing = requests.get(f"{served.url}/v1/pricing", timeout=10).json()
    prices = on_terminal(columns, "pricing", *api)
    assert prices.returncode == 0, prices.stdout + prices.stderr
    figures = [t["includedRu"] for t in pricing["tiers"]] + [t["name"] for t in pricing["tiers"]]
    whole([str(f) for f in figures], prices.stdout, columns)
