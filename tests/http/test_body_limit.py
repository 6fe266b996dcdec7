"""The request-body limit (131 072 bytes) on every route, checked before any route code reads the body."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from gasless.core.settings import Settings
from gasless.hosting.app import create_app

LIMIT = 131_072
JSON = {"Content-Type": "application/json"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_for(tmp_path: Path) -> Settings:
    # No network: the relay core never starts, which is irrelevant to the body limit.
    return Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{_closed_port()}"])


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(tmp_path))) as test_client:
        yield test_client


def assert_too_large(response: Any) -> None:
    assert response.status_code == 413, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == "PAYLOAD_TOO_LARGE" and body["status"] == 413
    assert body["type"] == "https://docs.gasless.example/errors/payload-too-large"
    assert body["instance"] == response.headers["Relay-Request-Id"]
    assert str(LIMIT) in body["detail"]
    assert response.headers["Connection"] == "close"


def _chunks(total: int, size: int = 10_000) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        part = min(size, total - sent)
        sent += part
        yield b" " * part


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/relay/assign"), ("POST", "/v1/quote"), ("GET", "/healthz"), ("POST", "/no/such/route")],
)
def test_every_route_refuses_a_declared_oversize_body(client: TestClient, method: str, path: str) -> None:
    assert_too_large(client.request(method, path, content=b" " * (LIMIT + 1), headers=JSON))


def test_a_chunked_body_is_counted_as_it_arrives(client: TestClient) -> None:
    response = client.post("/v1/relay/assign", content=_chunks(LIMIT + 1), headers=JSON)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert_too_large(response)


def test_exactly_the_limit_reaches_the_route(client: TestClient) -> None:
    # A body of exactly 131 072 bytes is parsed by the route, which judges its content.
    document = b'{"sender": 5}'
    padded = document + b" " * (LIMIT - len(document))
    assert len(padded) == LIMIT
    response = client.post("/v1/relay/assign", content=padded, headers=JSON)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "MALFORMED_REQUEST" and response.json()["details"]["field"] == "sender"
    chunked = client.post("/v1/quote", content=_chunks(LIMIT), headers=JSON)
    assert chunked.status_code == 400 and chunked.json()["code"] == "MALFORMED_REQUEST"  # blank JSON


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    """The app on a real socket (uvicorn in a thread)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings_for(tmp_path)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(20)
    sock.close()


def _answer(conn: socket.socket) -> tuple[bytes, bytes]:
    answer = b""
    while chunk := conn.recv(65_536):  # the server closes the connection after its answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


HEAD = b"POST /v1/relay HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


def test_refused_on_the_declared_length_without_reading_the_body(port: int) -> None:
    """The 413 arrives although not one byte of the declared body was sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(HEAD + b"Content-Length: 10000000\r\n\r\n")
        head, body = _answer(conn)
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b"connection: close" in head.lower()
    assert b'"code":"PAYLOAD_TOO_LARGE"' in body


def test_refused_as_soon_as_a_chunked_body_passes_the_limit(port: int) -> None:
    """The 413 arrives while the upload is still open: the server stopped reading at the limit."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        for part in _chunks(LIMIT + 1):
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        # No terminating zero-length chunk: the body never ends from the server's point of view.
        head, body = _answer(conn)
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b'"code":"PAYLOAD_TOO_LARGE"' in body
