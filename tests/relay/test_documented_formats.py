"""The document says exactly what the service accepts: each value below is judged twice, by the schema the
served /openapi.json publishes and by the running service over HTTP, and the two verdicts agree (a value
the schema refuses is 400, a value it accepts is never refused as malformed).

Only the checks a schema cannot express are left out of that comparison (a bech32 checksum: the values there
are all real addresses, or all fail the pattern already); the checksum, which the Address component's
description says is verified, has its own test below.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from relay_kit import load_conftest

auth = load_conftest("auth").auth

INT64_MAX = 2**63 - 1


@pytest.fixture
def document(env: Any) -> dict[str, Any]:
    return env.client.get("/openapi.json").json()  # type: ignore[no-any-return]


def validator(document: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A validator of `schema` whose `#/components/...` references resolve in the document."""
    return jsonschema.Draft202012Validator({**schema, "components": document["components"]})


def parameter(document: dict[str, Any], path: str, method: str, name: str) -> jsonschema.Draft202012Validator:
    for candidate in document["paths"][path][method].get("parameters", []):
        if candidate["name"] == name:
            return validator(document, candidate["schema"])
    raise AssertionError(f"{method} {path} has no parameter {name}")


def refused_as_malformed(response: Any, field: str) -> bool:
    if response.status_code != 400:
        return False
    body = response.json()
    return bool(body["code"] == "MALFORMED_REQUEST" and body["details"]["field"] == field)


def test_intent_ids_and_hashes(env: Any, document: dict[str, Any], subtests: Any) -> None:
    address = env.new_sender(1, plan=False).address
    schema = parameter(document, "/v1/relay/{id}", "get", "id")
    hashes = parameter(document, "/v1/tx/{hash}", "get", "hash")
    values = [
        f"{address}:0",
        f"{address}:{INT64_MAX}",
        f"{address}:{INT64_MAX + 1}",
        f"{address}:{10**19}",
        f"{address}:007",
        f"{address}:-1",
        f"{address}:",
        f"{address}:1:2",
        f"{address.upper()}:0",
        "ab" * 32,
        "AB" * 32,
        "ab" * 32 + "a",
        "ab" * 31,
        "g" * 64,
    ]
    for value in values:
        with subtests.test(id=value):
            answer = env.client.get(f"/v1/relay/{value}")
            assert refused_as_malformed(answer, "id") is not schema.is_valid(value), answer.text
            if schema.is_valid(value):
                assert answer.status_code == 404, answer.text  # well formed, unknown
        if ":" not in value:
            with subtests.test(hash=value):
                answer = env.client.get(f"/v1/tx/{value}")
                assert refused_as_malformed(answer, "hash") is not hashes.is_valid(value), answer.text


def test_purchase_kinds(env: Any, document: dict[str, Any], subtests: Any) -> None:
    address = env.new_sender(1, plan=False).address
    path = "/v1/account/{erd}/purchases"
    schema = parameter(document, path, "get", "kind")
    for kind in (
        "deposit",
        "deposit,grant",
        "grant,grant",
        "",
        ",",
        "deposit,",
        " deposit",
        "deposit, grant",
        "refund",
    ):
        with subtests.test(kind=kind):
            answer = env.client.get(f"/v1/account/{address}/purchases", params={"kind": kind})
            assert refused_as_malformed(answer, "kind") is not schema.is_valid(kind), answer.text


def test_usage_filters(env: Any, document: dict[str, Any], auth: Any, subtests: Any) -> None:
    owner = auth.account()
    headers = auth.bearer(owner)
    cases = {
        "status": ["success", "success,dead", "failed,failed", "", "success,", "Success", "success, dead"],
        "state": ["COSIGNED", "REJECTED,DEAD", "cosigned", "", "DEAD,,FINALIZED"],
        "shard": ["0", "1,2", "4294967295", "4294967296", "00", "-1", "1, 2", "", "1,"],
    }
    for name, values in cases.items():
        schema = parameter(document, "/v1/usage", "get", name)
        for value in values:
            with subtests.test(parameter=name, value=value):
                params = {"account": owner.address, name: value, "includeInFlight": "true"}
                answer = env.client.get("/v1/usage", params=params, headers=headers)
                assert refused_as_malformed(answer, name) is not schema.is_valid(value), answer.text
                if schema.is_valid(value):
                    assert answer.status_code == 200, answer.text


def test_stream_topics(env: Any, document: dict[str, Any], auth: Any, subtests: Any) -> None:
    owner = auth.account()
    schema = parameter(document, "/v1/stream", "get", "topics")
    for topics in ("intents", "quota,pricing", "", "intents,", "weather", "intents, quota"):
        with subtests.test(topics=topics):
            # HEAD: the headers of the stream a GET would open, without following it.
            params = {"account": owner.address, "topics": topics}
            answer = env.client.head("/v1/stream", params=params, headers=auth.bearer(owner))
            assert (answer.status_code == 400) is not schema.is_valid(topics), answer.status_code


def _tx_cases(tx: dict[str, Any], relayer: str) -> list[tuple[str, Any]]:
    return [
        ("value", "0"),
        ("value", ""),
        ("value", None),
        ("value", "9" * 78),
        ("value", "1" + "0" * 78),
        ("value", "01"),
        ("value", "1e3"),
        ("value", 5),
        ("nonce", INT64_MAX),
        ("nonce", INT64_MAX + 1),
        ("nonce", None),
        ("nonce", -1),
        ("nonce", 0.0),  # JSON Schema's integer: a number with a zero fraction
        ("nonce", 1.5),
        ("gasLimit", 100_000.0),
        ("gasLimit", 2**53 - 1),
        ("gasLimit", 2**53),
        ("gasPrice", 2**53),
        ("version", 2**32),
        ("options", 2**32 - 1),
        ("options", 2**32),
        ("data", "QUJD"),
        ("data", "QUI="),
        ("data", "QUJD="),
        ("data", "QUI"),
        ("data", "QU=I"),
        ("data", ""),
        ("signature", "ab" * 64),
        ("signature", "ab " * 63 + "ab"),
        ("signature", "ab" * 63),
        ("signature", ""),
        ("guardian", ""),
        ("guardian", relayer),
        ("guardian", relayer.upper()),
        ("relayer", ""),
        ("relayer", None),
        ("relayerSignature", ""),
        ("relayerSignature", "ab" * 64),
        ("senderUsername", "QUJD"),
        ("senderUsername", "QUJD=="),
        ("chainID", tx["chainID"]),
        ("chainID", "X"),
        ("unknown", 1),
    ]


def test_transactions_on_quote_and_relay(env: Any, document: dict[str, Any], subtests: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment).to_dictionary()
    unsigned = validator(document, {"$ref": "#/components/schemas/Transaction"})
    signed = validator(document, {"$ref": "#/components/schemas/SignedTransaction"})
    assert unsigned.is_valid(tx) and signed.is_valid(tx)
    for member, value in _tx_cases(tx, assignment["relayer"]):
        changed = {**tx, member: value}
        with subtests.test(route="quote", member=member, value=str(value)[:20]):
            answer = env.client.post("/v1/quote", json={"tx": changed})
            assert (answer.status_code == 400) is not unsigned.is_valid(changed), answer.text
        with subtests.test(route="relay", member=member, value=str(value)[:20]):
            # Before any state is read, a transaction the schema accepts is refused for other reasons
            # (its signature no longer matches: 422), never as malformed.
            answer = env.client.post("/v1/relay", json={"tx": changed, "lease": assignment["lease"]})
            assert (answer.status_code == 400) is not signed.is_valid(changed), answer.text


def test_address_members_of_bodies(env: Any, document: dict[str, Any], subtests: Any) -> None:
    address = env.new_sender(1, plan=False).address
    schema = validator(document, {"$ref": "#/components/schemas/Address"})
    for value in (
        address,
        address.upper(),
        "drt" + address[3:],
        address[:-1],
        address + "q",
        "",
        " " + address,
    ):
        with subtests.test(value=value):
            answer = env.client.post("/v1/relay/assign", json={"sender": value})
            refused = refused_as_malformed(answer, "sender")
            assert refused is not schema.is_valid(value), answer.text
            if not refused:
                assert answer.json()["code"] == "ASSIGN_PROOF_REQUIRED"


def test_an_address_of_the_right_shape_with_a_bad_checksum_is_refused(
    env: Any, document: dict[str, Any]
) -> None:
    """The served Address component says its bech32 checksum is verified (no pattern can say it), and the
    service does: a string the pattern accepts but whose checksum fails is 400 MALFORMED_REQUEST naming the
    member or parameter, in a body and in a path alike."""
    component = document["components"]["schemas"]["Address"]
    assert "bech32 checksum is verified" in component["description"], component
    assert "400 MALFORMED_REQUEST" in component["description"], component
    schema = validator(document, {"$ref": "#/components/schemas/Address"})
    real = env.new_sender(1, plan=False).address
    flipped = real[:-1] + ("q" if real[-1] != "q" else "p")
    for value in ("erd1" + "q" * 58, flipped):
        assert schema.is_valid(value), value  # the shape is right: only the checksum is wrong
        assigned = env.client.post("/v1/relay/assign", json={"sender": value})
        assert refused_as_malformed(assigned, "sender"), assigned.text
        senders = env.client.get(f"/v1/account/{value}/senders")
        assert refused_as_malformed(senders, "erd"), senders.text
        assert senders.headers["content-type"].startswith("application/problem+json"), senders.headers
    # The real address, its checksum right, is not refused as malformed.
    assert env.client.get(f"/v1/account/{real}/senders").status_code != 400
