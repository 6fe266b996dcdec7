"""The served OpenAPI document against the running API (schemathesis, in-process, on a real localnet).

Every implemented operation is driven with generated requests (valid and invalid, fixed seed, bounded
example count) and every answer must: not be a 5xx, have a documented status, content type, headers and
body schema, and, when it is an error, be a problem document whose `code` is in the catalogue. The data
checks hold the request schemas to what the service does: a request the schema accepts is not refused as
malformed (`positive_data_acceptance`), and one it refuses is refused (`negative_data_rejection`). A second
test drives the operations with real data (a real assignment, a real signed relay, its status reads and
its event stream) so the success schemas are checked on real answers too, which random input never
reaches.

Requests go through the `env` fixture's TestClient (a requests adapter forwards them), so they run on the
app's own event loop, next to the lifespan that holds the database, the gateway session and the workers.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
import urllib3
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from multiversx_sdk import Address
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gasless.client.actions import action_headers
from gasless.client.keys import UserKey
from gasless.core.errors import CATALOGUE, PROBLEM_MEDIA_TYPE

BASE_URL = "http://testserver"
SEED = 20_261_109
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    negative_data_rejection,
]

# The formats a pattern cannot express (the bech32 checksum), generated as real values: a random string of
# the Address pattern is refused for its checksum, as the component's description says.
ADDRESSES = st.binary(min_size=32, max_size=32).map(lambda pubkey: Address(pubkey, "erd").to_bech32())
schemathesis.openapi.format("erd-address", ADDRESSES)
schemathesis.openapi.format(
    "intent-id", st.tuples(ADDRESSES, st.integers(0, 2**63 - 1)).map(lambda pair: f"{pair[0]}:{pair[1]}")
)

# A well-formed request the service refuses for a reason no schema holds is not "valid data rejected". The
# check already expects 2xx, 3xx, 401 and 403 (no credential of ours can be generated), 404 (a generated id
# names nothing), 409 (state conflicts) and 429; the operations below also refuse well-formed requests on
# the network's or the contract's state, with the interface contract's codes (docs/openapi.md, "schemathesis"):
#   402 NO_ENTITLEMENT (the generated sender has no plan), 410 RELAYER_RETIRED, and 422 for what the
#   network decides: the sender signature (a generated one never verifies), the gas price and gas limit
#   against the network's figures, an unknown relayer, the balance. The purchase builders refuse on the
#   contract's state: 402 INSUFFICIENT_CREDITS and 422 for a tier not for sale, a deposit outside the
#   contract's bounds, or a payment the generated payer cannot cover.
BUSINESS_REFUSALS = {
    "relayTransaction": ["402", "410", "422"],
    "quoteRelay": ["422"],
    "assignRelayer": ["410", "422"],
    "prepareSubscribe": ["402", "422"],
    "prepareDeposit": ["422"],
    "prepareFlags": ["402", "409"],  # NO_ENTITLEMENT (no account), RENEW_NOT_APPLICABLE
    # NO_ENTITLEMENT, INSUFFICIENT_CREDITS; 400 when `remove` names an address that is not a sender of the
    # account (the contract would revert the call: nothing is built)
    "prepareSenders": ["400", "402"],
    # Unpaid: the 402 challenge (or its refusals on the contract's state); a schema-valid payment header
    # that is no payment: PAYMENT_INVALID.
    "x402Topup": ["402", "422"],
    "x402Purchase": ["402", "422"],
    "getX402Payment": ["402"],
    # The frozen facade answers every validation failure of the kit's transaction with 400 (docs/compat.md);
    # its schema is the kit's free-form plain object.
    "compatRelay": ["400"],
}
DEFAULT_POSITIVE = ["2xx", "3xx", "401", "403", "404", "409", "429"]
CONFIG = {
    "operations": [
        {
            "include-operation-id": operation_id,
            "checks": {"positive_data_acceptance": {"expected-statuses": [*DEFAULT_POSITIVE, *statuses]}},
        }
        for operation_id, statuses in BUSINESS_REFUSALS.items()
    ],
}


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
    schema = schemathesis.openapi.from_dict(document, config=SchemathesisConfig.from_dict(CONFIG))

    @schema.hook("map_case")
    def as_a_client_would_send_it(context: Any, case: Any) -> Any:
        # A cursor is minted by the service and MAC'd: a generated one, however well formed, is forged and
        # 400 CURSOR_INVALID (the interface contract's code). Listings are paged with real cursors in their own tests.
        if isinstance(case.query, dict):
            case.query.pop("cursor", None)
            # The one rule across parameters, `from` at most `to` (docs/api-conventions.md), which OpenAPI
            # cannot state: a generated window is put in order (tests/http/test_pages.py tests the rule).
            start, end = case.query.get("from"), case.query.get("to")
            if (
                as_number(start) is not None
                and as_number(end) is not None
                and as_number(start) > as_number(end)
            ):
                case.query["from"], case.query["to"] = end, start
        # A generated string of the Address shape gets a real bech32 checksum (the `erd-address` format
        # says it has one; no pattern can). A value of another shape, as negative cases make, is unchanged.
        if isinstance(case.path_parameters, dict):
            # Path parameters are kept percent-encoded, and schemathesis judges a value a hook changed as
            # it is stored: an IntentId's `%3A` would read as a pattern failure (a negative case).
            case.path_parameters = {
                name: value.replace("%3A", ":")
                if isinstance(value, str) and ADDRESS_SHAPE.search(value)
                else value
                for name, value in case.path_parameters.items()
            }
        for part in ("path_parameters", "query", "body"):
            value = getattr(case, part)
            if isinstance(value, dict | list | str):
                setattr(case, part, with_real_addresses(value))
        return case

    return schema


def as_number(value: Any) -> int | None:
    """A query value as the server reads it (generated as an int or as its text), or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


ADDRESS_SHAPE = re.compile(r"erd1[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{58}")


def with_real_addresses(value: Any) -> Any:
    """`value` with every string of the Address shape replaced by a real address (derived from it)."""
    if isinstance(value, str):
        return ADDRESS_SHAPE.sub(
            lambda m: Address(hashlib.sha256(m.group().encode()).digest(), "erd").to_bech32(), value
        )
    if isinstance(value, dict):
        return {key: with_real_addresses(item) for key, item in value.items()}
    if isinstance(value, list):
        return [with_real_addresses(item) for item in value]
    return value


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
    env.wait_mirror()  # the account (its granted plan) is read from the mirror of finalised events
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
