"""HEAD wherever GET is served: every GET route of the app, enumerated from its routes, answers HEAD with the
GET's status and headers and no body; an event stream answers its headers and stops; the OpenAPI document
gains no HEAD operations."""

from __future__ import annotations

import re
from typing import Any

import anyio
from fastapi.routing import iter_route_contexts

from gasless.client.native_auth import make_native_auth_token

# Headers that differ between two requests by nature (a new request id, a bucket that refilled).
VOLATILE = {"relay-request-id", "ratelimit-remaining", "ratelimit-reset", "date"}
# Documents that change from one request to the next (a new block every round, quota in chain time, the
# relayers' balances and spend rates in the readiness report).
CHANGING = {
    "/readyz": {"etag", "content-length"},
    "/v1/network": {"etag", "content-length"},
    "/v1/account/{erd}/quota": {"etag", "content-length"},
}


def get_paths(app: Any) -> list[str]:
    """Every route template of the app that serves GET (included routers flattened, as FastAPI routes)."""
    paths = [str(route.path) for route in iter_route_contexts(app.routes) if "GET" in (route.methods or ())]
    assert len(paths) >= 20, paths
    return sorted(set(paths))


def fill(template: str, values: dict[str, str]) -> str:
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: values[m.group(1)], template)


def test_every_get_route_answers_head_as_get_without_a_body(env: Any, subtests: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    relayed = env.relay(tx, assignment["lease"])
    assert relayed.status_code in (200, 202), relayed.text
    tx_hash = relayed.json()["txHash"]
    env.wait_state(tx_hash, ("FINALIZED",))  # a final intent: its event stream ends after one event
    values = {
        "id": tx_hash,
        "hash": tx_hash,
        "txHash": tx_hash,
        "sender": sender.address,
        "nonce": "0",
        "erd": sender.address,
        "keyId": "k" * 16,
        "webhookId": "wh_unknown",
        "incidentId": "inc_" + "0" * 20,
        "path": "anything",
        "rest": "anything",
        "userAddress": sender.address,
        "address": sender.address,
        "paymentId": "pay_unknown_0123456789",
    }
    answered = {}
    for template in get_paths(env.client.app):
        path = fill(template, values)
        with subtests.test(route=template):
            head = env.client.head(path)
            get = env.client.get(path)
            answered[template] = get.status_code
            assert head.status_code == get.status_code, (path, head.status_code, head.text, get.text)
            assert head.content == b""
            ignored = VOLATILE | CHANGING.get(template, set())
            assert set(head.headers) == set(get.headers), path
            assert {k: v for k, v in head.headers.items() if k not in ignored} == {
                k: v for k, v in get.headers.items() if k not in ignored
            }, path
            if get.status_code == 200 and "content-length" in get.headers and template not in CHANGING:
                assert int(head.headers["content-length"]) == len(get.content), path
    # The public reads answered 200 (HEAD was compared with real answers, not only with refusals).
    ok = {template for template, status in answered.items() if status == 200}
    assert {
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/v1/network",
        "/v1/relay/{id}",
        "/v1/relay/{id}/events",
        "/v1/intents/{sender}/{nonce}",
        "/v1/tx/{hash}",
        "/v1/account/{erd}/quota",
        "/v1/account/{erd}/senders",
        "/v1/incidents",
    } <= ok, answered


def test_head_on_a_cached_read_revalidates_like_get(env: Any) -> None:
    answer = env.client.get("/v1/incidents")
    etag = answer.headers["ETag"]
    head = env.client.head("/v1/incidents", headers={"If-None-Match": etag})
    assert head.status_code == 304 and head.headers["ETag"] == etag and head.content == b""


def test_head_on_an_open_event_stream_answers_its_headers_and_stops(env: Any) -> None:
    """The account stream never ends by itself (it follows the account until the token expires): HEAD
    answers its headers and the app call ends, within a bound, with no body."""
    owner = env.new_sender(1)
    env.wait_mirror()  # the account exists in the mirror: the owner may read its stream
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(owner.key, origin=env.settings.network.app_origin, block_hash=block)
    headers = [(b"authorization", f"Bearer {token}".encode())]
    status, response_headers, body = env.client.portal.call(
        asgi_call, env.client.app, "HEAD", "/v1/stream", f"account={owner.address}", headers
    )
    assert status == 200, body
    assert response_headers[b"content-type"].startswith(b"text/event-stream")
    assert body == b""
    # The same stream by GET is open (it would run until the token expires): HEAD did not just fail fast.
    get_status, get_headers, _ = env.client.portal.call(
        asgi_call, env.client.app, "GET", "/v1/stream", f"account={owner.address}", headers, True
    )
    assert get_status == 200 and get_headers[b"content-type"].startswith(b"text/event-stream")


async def asgi_call(
    app: Any,
    method: str,
    path: str,
    query: str,
    headers: list[tuple[bytes, bytes]],
    leave_after_headers: bool = False,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through ASGI on the app's loop, which must end within 10 s (a stream that does not stop
    fails the test instead of hanging it). `leave_after_headers`: the client disconnects once the headers
    arrived (how a GET stream is left)."""
    status = 0
    response_headers: dict[bytes, bytes] = {}
    body = b""
    started = anyio.Event()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if leave_after_headers:
            await started.wait()
        else:
            await anyio.sleep_forever()  # a HEAD client stays connected: the app must end by itself
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, body
        if message["type"] == "http.response.start":
            status = message["status"]
            response_headers.update(message["headers"])
            started.set()
        elif message["type"] == "http.response.body":
            body += message.get("body", b"")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": {},
    }
    with anyio.fail_after(10):
        await app(scope, receive, send)
    return status, response_headers, body


def test_the_document_has_no_head_operations(env: Any) -> None:
    document = env.client.get("/openapi.json").json()
    for path, item in document["paths"].items():
        assert "head" not in item, path
    head = env.client.head("/openapi.json")
    assert head.status_code == 200 and head.content == b""
