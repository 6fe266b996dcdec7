"""Regressions for the failures the OpenAPI contract work found in the relay routes (each was a 500)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gasless.core.settings import Settings
from gasless.hosting.app import create_app


def test_intent_reads_on_a_host_still_starting_answer_503(tmp_path: Path, problem: Any) -> None:
    # Nothing answers on the gateway port, so the relay core never finishes starting.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(Settings(data_dir=tmp_path, gateway_urls=[f"http://127.0.0.1:{port}"]))
    with TestClient(app) as client:
        sender = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
        for path in (
            f"/v1/relay/{sender}:0",
            "/v1/relay/" + "ab" * 32,
            f"/v1/relay/{sender}:0/events",
            f"/v1/intents/{sender}/0",
            "/v1/tx/" + "ab" * 32,
        ):
            body = problem(client.get(path), "UPSTREAM_UNAVAILABLE")
            assert body["details"] == {"retryAfterMs": 1_000}, path


def test_intent_id_with_a_non_ascii_digit_is_malformed(env: Any, problem: Any) -> None:
    sender = env.new_sender(1, plan=False)
    for nonce in ("²", "٣", "1²"):  # str.isdigit() accepts them; int() does not
        body = problem(env.client.get(f"/v1/relay/{sender.address}:{nonce}"), "MALFORMED_REQUEST")
        assert body["details"] == {"field": "id"}


def raw_request(
    client: TestClient, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> tuple[int, bytes]:
    """A request through ASGI with raw header bytes, on the app's own event loop (a server such as uvicorn
    hands the app header bytes as received; the TestClient would re-encode them as UTF-8)."""
    status = 0
    chunks: list[bytes] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": {},
    }

    sent_request = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays connected until the response ends
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    client.portal.call(client.app, scope, receive, send)  # type: ignore[union-attr]
    return status, b"".join(chunks)


def test_non_ascii_last_event_id_is_ignored(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    relayed = env.relay(env.build(sender, assignment), assignment["lease"])
    assert relayed.status_code in (200, 202), relayed.text
    tx_hash = relayed.json()["txHash"]
    env.wait_state(tx_hash, ("FINALIZED",))
    # The byte 0xB2 reads as "²" (ASGI header bytes are latin-1), which str.isdigit() accepts.
    status, body = raw_request(
        env.client, "GET", f"/v1/relay/{tx_hash}/events", [(b"last-event-id", b"\xb2")]
    )
    assert status == 200, body
    # Treated as no Last-Event-ID: the current (final) state is sent once, then the stream closes.
    assert body.count(b"event: intent") == 1 and b'"state":"FINALIZED"' in body


def test_non_ascii_content_length_is_not_a_500(env: Any) -> None:
    # A Content-Length that only str.isdigit() accepts is not a size: the body is counted as it streams.
    body = b'{"tx": {}}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"\xb2")]
    status, answer = raw_request(env.client, "POST", "/v1/validate", headers, body)
    assert status == 200, answer
    assert json.loads(answer)["ok"] is False
