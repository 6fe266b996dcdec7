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

from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.http.server import api_server_config


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
    # As the API is served (gasless.http.server), with a short header timeout for the slow-client test.
    server = uvicorn.Server(
        api_server_config(app, docs_url="https://docs.example/", header_timeout_s=1.0, log_level="critical")
    )
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


def test_a_client_coming_back_after_a_retry_hint_finds_its_connection_open(port: int) -> None:
    """An assignment refused while the signer or the clock is not ready says `retryAfterMs: 5000`; a client
    that waits that long on its kept connection must not meet the server closing it (uvicorn's own
    keep-alive is 5 s: the two raced, and the client's next request was reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_answer(conn)[0] == "HTTP/1.1 200 OK"
        conn.settimeout(5.5)  # the hint, and a margin past uvicorn's 5 s
        with pytest.raises(TimeoutError):
            conn.recv(1)  # an end of stream here is the server closing the idle connection
        conn.settimeout(10)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")  # the same connection
        assert _read_answer(conn)[0] == "HTTP/1.1 200 OK"


def test_a_header_the_http_parser_refuses_is_a_problem_document(port: int) -> None:
    """A control character (DEL) in `Idempotency-Key`: the HTTP parser refuses the request before the app
    sees it; the answer is still the catalogue's MALFORMED_REQUEST, not a text/plain 400."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/relay HTTP/1.1\r\nHost: localhost\r\nIdempotency-Key: abc\x7fdef\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        answer = _read_until_closed(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request", lines
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    assert headers["content-type"] == "application/problem+json" and headers["connection"] == "close"
    document = json.loads(body)
    assert document["code"] == "MALFORMED_REQUEST" and document["status"] == 400, document
    assert document["instance"] == headers["relay-request-id"] and document["details"] == {"field": "headers"}


def test_a_client_trickling_its_headers_is_closed(port: int) -> None:
    """Headers not complete within the header timeout (1 s here, 10 s in production): the connection is
    closed, however often the client sends another line (a connection that sends nothing is closed the
    same way). A client that sends its headers in time is served."""
    slow = socket.create_connection(("127.0.0.1", port), timeout=10)
    silent = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        closed = False
        for index in range(50):  # a line every 0.2 s: 10 s of trickle at most
            time.sleep(0.2)
            try:
                slow.sendall(f"X-Slow-{index}: yes\r\n".encode())
                slow.setblocking(False)
                try:
                    closed = slow.recv(1) == b""
                except BlockingIOError:
                    closed = False
                finally:
                    slow.setblocking(True)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed:
                break
        assert closed, "the trickling client was never closed"
        assert index < 25, f"closed only after {index} lines"  # ~1 s of lines, with room for a busy machine
        assert _read_until_closed(silent) == b""  # closed too, without a word
        with socket.create_connection(("127.0.0.1", port), timeout=10) as prompt:
            prompt.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert _read_until_closed(prompt).startswith(b"HTTP/1.1 200")
    finally:
        slow.close()
        silent.close()
