"""An unexpected failure is still a complete HTTP answer: a 500 problem document, on a real socket.

Starlette sends the handler's answer and then re-raises the exception to the server, which closes the
connection; the answer must say so (`Connection: close`) so that a client never sends its next request on a
connection that is about to close.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from gasless.app import create_app
from gasless.settings import Settings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    # No network: the relay core never starts, which is irrelevant here.
    app = create_app(Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{_closed_port()}"]))

    @app.get("/v1/test-fails")  # a route that fails in a way no handler foresees
    async def fails() -> None:
        raise RuntimeError("an unforeseen failure")

    return app


@pytest.fixture
def port(app: FastAPI) -> Iterator[int]:
    """The app on a real socket (uvicorn in a thread, port chosen by the OS)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(20)
    sock.close()


def _read_until_closed(conn: socket.socket) -> bytes:
    answer = b""
    while chunk := conn.recv(65_536):
        answer += chunk
    return answer


def test_an_unexpected_failure_answers_a_complete_500_and_says_the_connection_closes(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        # HTTP/1.1 keeps the connection alive unless a side says otherwise.
        conn.sendall(b"GET /v1/test-fails HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = _read_until_closed(conn)  # the server closes after its answer
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "HTTP/1.1 500 Internal Server Error", lines
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    assert headers["connection"] == "close", headers
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["content-length"]) == len(body)  # the whole document arrived
    problem = json.loads(body)
    assert problem["code"] == "INTERNAL" and problem["status"] == 500
    assert problem["instance"] == headers["relay-request-id"]
    assert "unforeseen" not in body.decode()  # the exception's text stays in the logs
