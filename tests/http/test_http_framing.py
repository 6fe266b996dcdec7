"""Answers framed as HTTP/1.1 requires, on a real socket (uvicorn):

- an unexpected failure is still a complete answer, a 500 problem document; Starlette sends the handler's
  answer and then re-raises the exception to the server, which closes the connection, so the answer says so
  (`Connection: close`) and a client never sends its next request on a connection about to close;
- HEAD answers the GET's headers (its `Content-Length` included) without a body, and the connection stays
  usable for the next request.
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


def _read_answer(conn: socket.socket, *, body: bool = True) -> tuple[str, dict[str, str], bytes]:
    """One answer on a kept-alive connection: the status line, the headers and (unless HEAD) the body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65_536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0")) if body else 0
    while len(rest) < length:
        rest += conn.recv(65_536)
    assert len(rest) == length, (lines[0], rest)  # nothing beyond the answer (HEAD: no body at all)
    return lines[0], headers, rest


def test_head_answers_the_get_headers_without_a_body_and_keeps_the_connection(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, head_headers, _ = _read_answer(conn, body=False)
        assert status == "HTTP/1.1 200 OK", status
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")  # same connection
        status, get_headers, body = _read_answer(conn)
    assert status == "HTTP/1.1 200 OK"
    assert head_headers["content-length"] == get_headers["content-length"] == str(len(body))
    assert head_headers["content-type"] == get_headers["content-type"] == "application/json"
    assert json.loads(body)["status"] == "ok"
