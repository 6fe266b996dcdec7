"""The served OpenAPI document against the running API (schemathesis, in-process, on a real localnet).

Every implemented operation is driven with generated requests (valid and invalid, fixed seed, bounded
example count) and every answer must: not be a 5xx, have a documented status, content type, headers and
body schema, and, when it is an error, be a problem document whose `code` is in the catalogue. A second
test drives the operations with real data (a real assignment, a real signed relay, its status reads and
its event stream) so the success schemas are checked on real answers too, which random input never
reaches.

Requests go through the `env` fixture's TestClient (a requests adapter forwards them), so they run on the
app's own event loop, next to the lifespan that holds the database, the gateway session and the workers.
"""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
import urllib3
from hypothesis import HealthCheck, seed, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gasless.client.actions import action_headers
from gasless.client.keys import UserKey
from gasless.errors import CATALOGUE, PROBLEM_MEDIA_TYPE

BASE_URL = "http://testserver"
SEED = 20_261_109
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


class ViaTestClient(requests.adapters.HTTPAdapter):
    """Sends a `requests` request through a Starlette TestClient (the app's own portal and event loop).

    An event stream is read up to its first complete event: the test checks its status, content type
    and first event, and a stream that is not final would otherwise stay open for its whole lifetime.
    """

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        parts = urlsplit(str(request.url))
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        body = request.body.encode() if isinstance(request.body, str) else (request.body or b"")
        with self.client.stream(
            request.method, target, headers=dict(request.headers), content=body
        ) as answer:
            if answer.headers.get("content-type", "").startswith("text/event-stream"):
                content = b""
                for chunk in answer.iter_bytes():
                    content += chunk
                    if b"\r\n\r\n" in content or b"\n\n" in content:
                        break
            else:
                content = answer.read()
            headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() != "content-length"]
            raw = urllib3.HTTPResponse(
                body=io.BytesIO(content),
                headers=headers,
                status=answer.status_code,
                reason=answer.reason_phrase,
                version=11,
                preload_content=False,
                decode_content=False,
            )
        return self.build_response(request, raw)


def session_for(client: Any) -> requests.Session:
    session = requests.Session()
    adapter = ViaTestClient(client)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def assert_problem_when_error(response: Any) -> None:
    """An error answer is a problem document of the catalogue, with the request id as its instance."""
    if response.status_code < 400:
        return
    assert response.headers["content-type"][0].startswith(PROBLEM_MEDIA_TYPE), response.headers
    body = json.loads(response.content)
    assert body["code"] in CATALOGUE, body
    assert body["status"] == response.status_code == CATALOGUE[body["code"]].status, body
    assert body["instance"] == response.headers["relay-request-id"][0], body


@pytest.fixture
def contract_schema(env: Any) -> Any:
    document = env.client.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    return schema


@pytest.fixture
def contract_session(env: Any) -> requests.Session:
    return session_for(env.client)


@pytest.fixture(autouse=True)
def _schemathesis_node_id(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32.5's lazy (fixture) schemas read `node._nodeid`, which pytest 9 no longer sets.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("contract_schema")


@schema.parametrize()
@seed(SEED)
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_conforms_to_the_document(case: Any, contract_session: requests.Session) -> None:
    response = case.call_and_validate(session=contract_session, base_url=BASE_URL, checks=CHECKS)
    assert_problem_when_error(response)


def test_real_answers_conform_to_the_document(
    env: Any, contract_schema: Any, contract_session: requests.Session
) -> None:
    """The success (and some error) answers random input never reaches, on a real relayed transaction."""

    def call(path: str, method: str, status: tuple[int, ...], **parts: Any) -> Any:
        if "body" in parts:
            parts["media_type"] = "application/json"
        case = contract_schema[path][method].Case(**parts)
        response = case.call_and_validate(session=contract_session, base_url=BASE_URL, checks=CHECKS)
        assert response.status_code in status, response.content
        assert_problem_when_error(response)
        return response

    sender = env.new_sender(1)
    proof = env.proof(sender)
    assignment = call(
        "/v1/relay/assign", "POST", (200,), body={"sender": sender.address, "proof": proof}
    ).json()
    tx = env.build(sender, assignment)
    relay_body = {"tx": tx.to_dictionary(), "lease": assignment["lease"]}
    call("/v1/validate", "POST", (200,), body=relay_body)
    call("/v1/quote", "POST", (200,), body={"tx": tx.to_dictionary()})
    relayed = call("/v1/relay", "POST", (200, 202), body=relay_body).json()
    again = call("/v1/relay", "POST", (200, 202), body=relay_body).json()
    assert again["duplicate"] is True and again["txHash"] == relayed["txHash"]
    tx_hash, intent_id = relayed["txHash"], relayed["id"]
    env.wait_state(tx_hash, ("FINALIZED",))

    for ident in (tx_hash, intent_id):
        read = call("/v1/relay/{id}", "GET", (200,), path_parameters={"id": ident})
        assert read.json()["state"] == "FINALIZED"
        etag = read.headers["etag"][0]  # schemathesis: lower-case names, lists of values
        revalidated = call(
            "/v1/relay/{id}", "GET", (304,), path_parameters={"id": ident}, headers={"If-None-Match": etag}
        )
        assert revalidated.content == b"" and revalidated.headers["etag"] == [etag]
    call(
        "/v1/intents/{sender}/{nonce}", "GET", (200,), path_parameters={"sender": sender.address, "nonce": 0}
    )
    call("/v1/tx/{hash}", "GET", (200,), path_parameters={"hash": tx_hash})
    stream = call("/v1/relay/{id}/events", "GET", (200,), path_parameters={"id": tx_hash})
    assert b"event: intent" in stream.content and b'"state":"FINALIZED"' in stream.content
    for path in ("/healthz", "/readyz", "/openapi.json", "/v1/network"):
        call(path, "GET", (200,))
    call("/v1/account/{erd}/senders", "GET", (200,), path_parameters={"erd": sender.address})

    # Errors on real data: a lease of another sender, a stale proof, an unknown slot.
    other = env.new_sender(1)
    foreign = env.build(other, assignment)
    call("/v1/relay", "POST", (409,), body={"tx": foreign.to_dictionary(), "lease": assignment["lease"]})
    stale = {**proof, "serverTimeMs": proof["serverTimeMs"] - 120_000}
    call("/v1/relay/assign", "POST", (401,), body={"sender": sender.address, "proof": stale})
    call("/v1/intents/{sender}/{nonce}", "GET", (404,), path_parameters={"sender": other.address, "nonce": 7})


def test_identity_and_key_answers_conform_to_the_document(
    env: Any, contract_schema: Any, contract_session: requests.Session
) -> None:
    """GET /v1/me and the key routes with a real native-auth owner: successes, the secret once, refusals."""
    from gasless.client.native_auth import make_native_auth_token

    def call(path: str, method: str, status: int, **parts: Any) -> Any:
        if "body" in parts:
            parts["media_type"] = "application/json"
        case = contract_schema[path][method].Case(**parts)
        response = case.call_and_validate(session=contract_session, base_url=BASE_URL, checks=CHECKS)
        assert response.status_code == status, response.content
        assert_problem_when_error(response)
        return response

    owner = env.new_sender(1)
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(owner.key, origin=env.settings.network.app_origin, block_hash=block)
    auth = {"Authorization": f"Bearer {token}"}
    erd = {"erd": owner.address}

    assert call("/v1/me", "GET", 200, headers=auth).json()["accounts"][0]["role"] == "owner"
    call("/v1/me", "GET", 401)
    challenged = call(
        "/v1/account/{erd}/keys", "POST", 403, path_parameters=erd, headers=auth, body={"label": "ci"}
    )
    signed = action_headers(
        UserKey(owner.key), "createApiKey", b'{"label": "ci"}', challenged.json()["details"]
    )
    created = call(
        "/v1/account/{erd}/keys",
        "POST",
        201,
        path_parameters=erd,
        headers={**auth, **signed},
        body={"label": "ci"},
    )
    key_id = created.json()["keyId"]
    call("/v1/account/{erd}/keys", "GET", 200, path_parameters=erd, headers=auth)
    keyed = {**erd, "keyId": key_id}
    call(
        "/v1/account/{erd}/keys/{keyId}",
        "PATCH",
        200,
        path_parameters=keyed,
        headers=auth,
        body={"label": "x"},
    )
    call("/v1/account/{erd}/keys/{keyId}", "DELETE", 204, path_parameters=keyed, headers=auth)
    call("/v1/account/{erd}/keys/{keyId}", "DELETE", 404, path_parameters=keyed, headers=auth)
    stranger = {"erd": env.new_sender(1).address}
    call("/v1/account/{erd}/keys", "GET", 403, path_parameters=stranger, headers=auth)
