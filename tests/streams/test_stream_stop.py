"""A host stopping with streams open, served as `gasless up` and `gasless serve` serve it (`serve_api`).

uvicorn's stop waits for every open response, and a stream never ends on its own: before the host ended its
streams, one open account stream kept a stopping `gasless up` alive for good. Now each open stream ends
cleanly (its last chunk sent, no reset) and the stop completes, well before uvicorn's own backstop would
cancel what is left (a cancelled stream is cut off, which the clean end below tells apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from relay_kit import load_conftest

from gasless.hosting.embedded import Listeners, serve_api

relay_env = load_conftest("relay")
auth_env = load_conftest("auth")


class ServedHost:
    """`serve_api` on its own event loop in a thread, stopped as the CLI stops it: its task cancelled."""

    def __init__(self, settings: Any) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.listeners = Listeners(sock, None)
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[None] | None = None
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self.task = asyncio.create_task(serve_api(self.settings, self.listeners))
            self.started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

        try:
            self.loop.run_until_complete(main())
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self.error = error
        finally:
            self.loop.close()

    def start(self, client: httpx.Client) -> None:
        self.thread.start()
        assert self.started.wait(30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/readyz").status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError("the host did not become ready")

    def stop(self, timeout: float) -> bool:
        """Cancel the host (SIGINT's path); whether it stopped within `timeout` seconds."""
        if self.thread.is_alive() and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(timeout)
        return not self.thread.is_alive()


@pytest.fixture
def host(unpaused_localnet: Any, tmp_path: Path) -> Iterator[tuple[ServedHost, Any, Any]]:
    settings = relay_env.relay_settings(
        tmp_path,
        unpaused_localnet,
        database_url=f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}",
        stream_keepalive_ms=200,
    )
    served = ServedHost(settings)
    client = httpx.Client(base_url=served.url, timeout=10)
    env = relay_env.RelayEnv(client, unpaused_localnet, settings, unpaused_localnet.net.info["contract"])
    try:
        served.start(client)
        yield served, env, auth_env.AuthKit(env)
    finally:
        client.close()
        served.stop(60)


def _read_to_end(stream_lines: Iterator[str], lines: list[str], ended: list[BaseException | None]) -> None:
    try:
        for line in stream_lines:
            lines.append(line)
        ended.append(None)
    except BaseException as error:  # noqa: BLE001 - the test asserts there is none
        ended.append(error)


def test_open_streams_end_cleanly_when_the_host_stops(host: Any, sse: Any) -> None:
    served, env, auth = host
    account = auth.account()
    assignment = env.assign(account)
    env.faults(chain={"stalledShards": [account.shard]})  # the intent stays open: its stream too
    try:
        answer = env.relay(env.build(account, assignment), assignment["lease"])
        assert answer.status_code in (200, 202), answer.text
        intent = answer.json()
        assert intent["state"] not in ("FINALIZED", "FAILED", "REJECTED"), intent

        account_stream = sse(env.client, {"account": account.address}, auth.bearer(account))
        assert set(account_stream.frame()) == {"id"}  # open, at its first id
        with env.client.stream("GET", f"/v1/relay/{intent['id']}/events") as relay_stream:
            assert relay_stream.status_code == 200
            readers: list[tuple[list[str], list[BaseException | None]]] = []
            threads = []
            # The account stream's reader goes on from its first frame.
            for stream_lines in (account_stream._lines, relay_stream.iter_lines()):
                lines: list[str] = []
                ended: list[BaseException | None] = []
                readers.append((lines, ended))
                threads.append(
                    threading.Thread(target=_read_to_end, args=(stream_lines, lines, ended), daemon=True)
                )
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while not any(line.startswith("event: intent") for line in readers[1][0]):
                assert time.monotonic() < deadline, readers[1][0]
                time.sleep(0.05)

            # Both streams are open and would stay open: the intent cannot settle on a stalled shard, and an
            # account stream lasts as long as its token. The stop ends them both, cleanly.
            assert served.stop(60), "the host did not stop with streams open"
            for thread in threads:
                thread.join(10)
            for lines, ended in readers:
                assert ended == [None], (ended, lines[-5:])
        account_stream.close()
    finally:
        env.faults(chain={"stalledShards": []})
    assert served.error is None, served.error
