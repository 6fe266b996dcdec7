"""`GET /mcp` on a real served host: the streamable HTTP transport's server-to-client event stream, bounded
like the service's other streams (it needs `Accept: text/event-stream`, at most 20 per IP, a lifetime)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gasless.mcp import mount

EVENTS = {"Accept": "text/event-stream"}


def open_stream(url: str) -> requests.Response:
    """A GET /mcp on a connection of its own, its headers read (not its body)."""
    return requests.get(f"{url}/mcp", headers=EVENTS, stream=True, timeout=10)


@contextlib.contextmanager
def streams(url: str, count: int) -> Iterator[list[requests.Response]]:
    opened: list[requests.Response] = []
    try:
        for _ in range(count):
            opened.append(open_stream(url))
        yield opened
    finally:
        for response in opened:
            response.close()


def test_without_accept_event_stream_it_is_a_problem_not_a_stream(api: Any, problem: Any) -> None:
    served, _ = api
    for accept in (None, "*/*", "application/json", "text/event-stream;q=0"):
        headers = {"Accept": accept} if accept is not None else {"Accept": ""}
        response = requests.get(f"{served.url}/mcp", headers=headers, timeout=10)
        body = problem(response, "MALFORMED_REQUEST")
        assert body["details"] == {"field": "Accept"}, accept
        assert body["instance"] == response.headers["Relay-Request-Id"]


def test_the_stream_opens_and_says_so_at_once(api: Any) -> None:
    served, _ = api
    with streams(served.url, 1) as (response,):
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["RateLimit-Limit"] == str(mount.MCP_STREAMS_PER_IP)
        assert next(response.iter_lines()) == b": open"


def test_at_most_20_streams_per_ip(api: Any, problem: Any) -> None:
    served, _ = api
    with streams(served.url, mount.MCP_STREAMS_PER_IP) as opened:
        assert [response.status_code for response in opened] == [200] * mount.MCP_STREAMS_PER_IP
        refused = open_stream(served.url)
        body = problem(refused, "RATE_LIMITED")
        assert body["details"]["scope"] == "ip" and refused.headers["Retry-After"] == "1"
        assert refused.headers["RateLimit-Remaining"] == "0"
        # One stream closed frees its slot (once the host has seen the client go).
        opened.pop().close()
        deadline = time.monotonic() + 10
        while (again := open_stream(served.url)).status_code == 429 and time.monotonic() < deadline:
            again.close()
            time.sleep(0.05)
        opened.append(again)
        assert again.status_code == 200


def test_a_stream_ends_when_its_lifetime_does(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    served, _ = api
    monkeypatch.setattr(mount, "STREAM_LIFETIME_S", 0.3)
    with streams(served.url, 1) as (response,):
        started = time.monotonic()
        body = b"".join(response.iter_content(chunk_size=None))  # returns when the server ends the stream
        assert body.startswith(b": open")
        assert time.monotonic() - started < 10
