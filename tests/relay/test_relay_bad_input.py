"""Bad input on the relay routes: every refusal is a problem document with the right code, never a 500.

Covers malformed JSON, wrong types for every transaction member, oversize bodies (with and without
Content-Length), bad bech32, malformed hashes and nonces in paths, relayer signatures, variant sets, unknown
members and idempotency keys; `POST /v1/validate` answering what relay would answer; `POST /v1/quote`'s
decimal strings.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from multiversx_sdk import Address, Transaction, TransactionComputer, UserSecretKey

from gasless.chain.addresses import address_of, parse_address, shard_of_pubkey
from gasless.chain.codec import tx_hash

_computer = TransactionComputer()
MAX_BODY = 131_072
JSON = {"Content-Type": "application/json"}


# Helpers ----------------------------------------------------------------------------------------------
def key_in(shard: int) -> UserSecretKey:
    while True:
        key = UserSecretKey.generate()
        if shard_of_pubkey(key.generate_public_key().buffer) == shard:
            return key


def bech32(key: UserSecretKey) -> str:
    return address_of(key.generate_public_key().buffer).to_bech32()


def our_relayer(env: Any, shard: int = 1) -> str:
    return sorted(w.address.to_bech32() for w in env.localnet.net.genesis.relayers if w.shard == shard)[0]


def signed_tx(env: Any, key: UserSecretKey, *, relayer: str | None = None, **fields: Any) -> Transaction:
    values: dict[str, Any] = {
        "sender": parse_address(bech32(key)),
        "receiver": parse_address(bech32(key_in(1))),
        "gas_limit": 100_000,
        "chain_id": env.settings.network.chain_id,
        "nonce": 0,
        "gas_price": 1_000_000_000,
        "version": 2,
        "relayer": parse_address(relayer or our_relayer(env)),
    }
    values.update(fields)
    tx = Transaction(**values)
    tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
    return tx


def wire(env: Any, key: UserSecretKey | None = None, **fields: Any) -> dict[str, Any]:
    return signed_tx(env, key or key_in(1), **fields).to_dictionary()


def post(env: Any, path: str, body: Any, **kwargs: Any) -> Any:
    if isinstance(body, bytes | bytearray) or hasattr(body, "__next__"):
        return env.client.post(path, content=body, headers={**JSON, **kwargs.pop("headers", {})}, **kwargs)
    return env.client.post(path, json=body, **kwargs)


def gateway(env: Any, path: str) -> Any:
    with urllib.request.urlopen(f"{env.localnet.url}{path}", timeout=5) as answer:
        return json.loads(answer.read())["data"]


def assert_untouched(env: Any, address: str) -> None:
    """Nothing reached the network for `address`: nonce 0 and an empty pool on the localnet gateway."""
    env.localnet.wait_rounds(3)  # anything sent would have reached the pool or executed by then
    assert int(gateway(env, f"/address/{address}/nonce")["nonce"]) == 0
    assert gateway(env, f"/transaction/pool?by-sender={address}&fields=hash")["txPool"]["transactions"] == []


def other_hrp(address: str) -> str:
    return Address(parse_address(address).get_public_key(), "drt").to_bech32()


def bad_checksum(address: str) -> str:
    return address[:-1] + ("q" if address[-1] != "q" else "p")


def mixed_case(address: str) -> str:
    return address[:10] + address[10:20].upper() + address[20:]


def lenient(env: Any) -> Any:
    """Answer an unexpected exception with its 500 problem instead of re-raising it in the test."""
    env.client._transport.raise_server_exceptions = False
    return env


def relay_accepted(env: Any, tx: Any, lease: str) -> dict[str, Any]:
    """Relay and expect 200/202; a SIGNER_TIMEOUT on a loaded machine is retried with the same bytes."""
    for _ in range(10):
        response = env.relay(tx, lease)
        if response.status_code != 503 or response.json()["code"] != "SIGNER_TIMEOUT":
            break
        time.sleep(0.1)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


# Malformed bodies -----------------------------------------------------------------------------------
MALFORMED_BODIES = [b"", b"{", b"not json", b"\xff\xfe\x00", b"[]", b"null", b'"tx"', b"1", b"{'tx': 1}"]


def test_malformed_json_bodies(env: Any, problem: Any, subtests: Any) -> None:
    for raw in MALFORMED_BODIES:
        with subtests.test(body=raw):
            body = problem(post(env, "/v1/relay", raw), "MALFORMED_REQUEST")
            assert body["details"]["field"] == "body"


def test_deeply_nested_json_is_malformed_not_internal(env: Any, problem: Any) -> None:
    lenient(env)
    for path in ("/v1/relay", "/v1/validate"):
        body = problem(post(env, path, b"[" * 100_000), "MALFORMED_REQUEST")
        assert body["details"]["field"] == "body"


def _tx_cases(env: Any, key: UserSecretKey) -> Iterator[tuple[str, Any]]:
    good = bech32(key_in(1))
    yield from [
        ("nonce", "0"),
        ("nonce", -1),
        ("nonce", 1.5),
        ("nonce", True),
        ("nonce", 2**64),
        ("value", 5),
        ("value", "-1"),
        ("value", "01"),
        ("value", "1e3"),
        ("value", "abc"),
        ("receiver", 5),
        ("receiver", ""),
        ("receiver", "erd1notanaddress"),
        ("receiver", bad_checksum(good)),
        ("receiver", mixed_case(good)),
        ("receiver", other_hrp(good)),
        ("sender", None),
        ("sender", 5),
        ("sender", bad_checksum(bech32(key))),
        ("gasPrice", "1000000000"),
        ("gasPrice", -1),
        ("gasPrice", None),
        ("gasLimit", "100000"),
        ("gasLimit", 1.5),
        ("gasLimit", None),
        ("data", 5),
        ("data", "!!not base64!!"),
        ("chainID", 1),
        ("chainID", ""),
        ("chainID", None),
        ("version", "2"),
        ("version", -1),
        ("version", None),
        ("options", "0"),
        ("options", -1),
        ("options", 2**32),
        ("signature", 5),
        ("signature", "zz" * 64),
        ("signature", "ab"),
        ("guardian", 5),
        ("guardian", bad_checksum(good)),
        ("guardianSignature", 5),
        ("guardianSignature", "xyz"),
        ("relayer", 5),
        ("relayer", bad_checksum(our_relayer(env))),
        ("relayer", other_hrp(our_relayer(env))),
        ("senderUsername", 5),
        ("senderUsername", "%%%"),
        ("receiverUsername", 7),
    ]


def test_wrong_types_for_every_tx_member(env: Any, problem: Any, subtests: Any) -> None:
    key = key_in(1)
    for member, value in _tx_cases(env, key):
        with subtests.test(member=member, value=value):
            tx = wire(env, key)
            if value is None:
                del tx[member]
            else:
                tx[member] = value
            body = problem(post(env, "/v1/relay", {"tx": tx, "lease": "x.y"}), "MALFORMED_REQUEST")
            assert body["details"]["field"] == f"tx.{member}", body
    assert_untouched(env, bech32(key))


def test_tx_that_is_not_an_object(env: Any, problem: Any, subtests: Any) -> None:
    for body in (
        {"tx": [], "lease": "x"},
        {"tx": "abc", "lease": "x"},
        {"tx": 5},
        {"tx": None},
        {"lease": "x"},
    ):
        with subtests.test(body=body):
            assert problem(post(env, "/v1/relay", body), "MALFORMED_REQUEST")["details"]["field"] == "tx"


def test_unknown_members(env: Any, problem: Any, subtests: Any) -> None:
    key = key_in(1)
    cases = [
        ({"extra": 1}, "extra"),
        ({"Lease": "x"}, "Lease"),
        ({"tx": {**wire(env, key), "gasPriceX": 1}}, "tx.gasPriceX"),
        ({"tx": {**wire(env, key), "relayedVersion": 3}}, "tx.relayedVersion"),
    ]
    for extra, field in cases:
        with subtests.test(field=field):
            body = {"tx": wire(env, key), "lease": "x.y", **extra}
            assert problem(post(env, "/v1/relay", body), "MALFORMED_REQUEST")["details"]["field"] == field
    assert_untouched(env, bech32(key))


def test_fee_relevant_fields_the_schedule_does_not_price(env: Any, problem: Any, subtests: Any) -> None:
    """UNSUPPORTED_TX_FIELD: well formed, but RU schedule v1 prices the gas limit alone (docs/relay.md)."""
    key = key_in(1)
    for name, value in (("maxFeePerGas", "1"), ("tip", 5), ("innerTransactions", [])):
        with subtests.test(field=name):
            body = {"tx": {**wire(env, key), name: value}, "lease": "x.y"}
            for route, sent in (("/v1/relay", body), ("/v1/quote", {"tx": body["tx"]})):
                refused = problem(post(env, route, sent), "UNSUPPORTED_TX_FIELD")
                assert refused["details"] == {"field": f"tx.{name}", "ruScheduleVersion": "ru-v1"}
            listed = post(env, "/v1/validate", body).json()
            assert listed["ok"] is False and listed["problems"][0]["code"] == "UNSUPPORTED_TX_FIELD"
    assert_untouched(env, bech32(key))


def test_variant_sets(env: Any, problem: Any, subtests: Any) -> None:
    key = key_in(1)
    for member in ("variants", "transactions", "alternates"):
        with subtests.test(member=member):
            body = {"tx": wire(env, key), "lease": "x.y", member: [wire(env, key, gas_price=1_500_000_000)]}
            problem(post(env, "/v1/relay", body), "VARIANTS_NOT_SUPPORTED")
    # Variants win over any other refusal of the body.
    problem(post(env, "/v1/relay", {"variants": [], "unknown": 1}), "VARIANTS_NOT_SUPPORTED")
    assert_untouched(env, bech32(key))


def test_relayer_signature_present(env: Any, problem: Any) -> None:
    key = key_in(1)
    tx = wire(env, key)
    tx["relayerSignature"] = "ab" * 64
    problem(post(env, "/v1/relay", {"tx": tx, "lease": "x.y"}), "RELAYER_SIGNATURE_PRESENT")
    assert_untouched(env, bech32(key))


@pytest.mark.parametrize("code", ["RELAYER_SIGNATURE_PRESENT", "VARIANTS_NOT_SUPPORTED"])
def test_parse_stage_refusals_of_an_identifiable_tx_read_rejected(env: Any, problem: Any, code: str) -> None:
    key = key_in(1)
    tx = signed_tx(env, key)
    body: dict[str, Any] = {"tx": tx.to_dictionary(), "lease": "x.y"}
    if code == "RELAYER_SIGNATURE_PRESENT":
        body["tx"]["relayerSignature"] = "ab" * 64
    else:
        body["variants"] = [body["tx"]]
    problem(post(env, "/v1/relay", body), code)
    # Recorded after the answer, off its path: the slot shows it once written.
    slot = env.wait_state(f"{bech32(key)}:0", ("REJECTED",))
    assert slot["rejection"]["code"] == code, slot


def test_nonce_beyond_int64_is_malformed(env: Any, problem: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=2**63)
    body = problem(env.relay(tx, assignment["lease"]), "MALFORMED_REQUEST")
    assert body["details"]["field"] == "tx.nonce"


# Integer ranges: every integer member has a documented range, refused the same way on every route -----------
# 2^512 overflows the SDK's transaction encoder; 10^78 is one digit past the 78 a value may have; 5 000 digits
# pass Python's int-parsing limit (4 300 digits).
OUT_OF_RANGE_VALUES = [str(2**512), str(10**78), "1" * 5_000]
BEYOND_2_53 = 2**53


def never_cosigned(env: Any, address: str, nonce: int = 0) -> None:
    """Nothing for `address` reached the network and nothing will: no co-signed intent holds the slot (an
    error answer comes before the commit point), its account nonce is 0 and its pool is empty."""
    slot = env.client.get(f"/v1/relay/{address}:{nonce}")
    assert slot.status_code == 404 or slot.json()["state"] == "REJECTED", slot.text
    assert int(gateway(env, f"/address/{address}/nonce")["nonce"]) == 0
    assert gateway(env, f"/transaction/pool?by-sender={address}&fields=hash")["txPool"]["transactions"] == []


def test_out_of_range_transaction_integers_are_refused_alike_on_every_route(
    env: Any, problem: Any, subtests: Any
) -> None:
    lenient(env)  # an INTERNAL answer is asserted on, not re-raised in the test
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    lease = assignment["lease"]
    cases: list[tuple[str, dict[str, Any]]] = []
    for value in OUT_OF_RANGE_VALUES:
        if len(value) < 4_000:  # signed as it is sent
            cases.append(("tx.value", env.build(sender, assignment, value=int(value)).to_dictionary()))
        else:  # the SDK cannot even print it: a signed transaction whose value is replaced
            cases.append(("tx.value", {**env.build(sender, assignment).to_dictionary(), "value": value}))
    cases += [
        ("tx.nonce", env.build(sender, assignment, nonce=2**63).to_dictionary()),
        ("tx.gasLimit", env.build(sender, assignment, gas_limit=BEYOND_2_53).to_dictionary()),
        ("tx.gasPrice", env.build(sender, assignment, gas_price=BEYOND_2_53).to_dictionary()),
    ]
    # An integer above the wire's range is malformed, except a gas limit or price: an integer, just above the
    # catalogue's ceiling (GAS_LIMIT_TOO_HIGH, GAS_PRICE_OUT_OF_RANGE), on every route alike.
    codes = {"tx.gasLimit": "GAS_LIMIT_TOO_HIGH", "tx.gasPrice": "GAS_PRICE_OUT_OF_RANGE"}
    for field, tx in cases:
        label = f"{field}={str(tx[field[3:]])[:12]}..."
        code = codes.get(field, "MALFORMED_REQUEST")

        def names(body: dict[str, Any], member: str, code: str = code) -> bool:
            # MALFORMED_REQUEST names the member; the ceilings give what they are about instead.
            return code != "MALFORMED_REQUEST" or body["details"]["field"] == member

        with subtests.test(route="relay", case=label):
            refused = problem(post(env, "/v1/relay", {"tx": tx, "lease": lease}), code)
            assert names(refused, field), refused
        with subtests.test(route="validate", case=label):
            answer = post(env, "/v1/validate", {"tx": tx, "lease": lease})
            assert answer.status_code == 200, answer.text
            verdict = answer.json()
            assert verdict["ok"] is False and verdict["txHash"] is None, verdict
            assert verdict["problems"][0]["code"] == code, verdict
            assert names(verdict["problems"][0], field), verdict
        with subtests.test(route="quote", case=label):
            refused = problem(post(env, "/v1/quote", {"tx": tx}), code)
            assert names(refused, field), refused
        with subtests.test(route="assign renewFor", case=label):
            body = {"sender": sender.address, "proof": env.proof(sender), "renewFor": tx}
            refused = problem(post(env, "/v1/relay/assign", body), code)
            assert names(refused, "renewFor." + field[3:]), refused
    never_cosigned(env, sender.address)


def test_out_of_range_nonces_outside_a_transaction_are_malformed(
    env: Any, problem: Any, subtests: Any
) -> None:
    lenient(env)
    sender = env.new_sender(1)
    for nonce in (2**63, 2**64, 2**512):
        with subtests.test(member="cancel", nonce=nonce):
            body = {"sender": sender.address, "proof": env.proof(sender), "cancel": nonce}
            assert problem(post(env, "/v1/relay/assign", body), "MALFORMED_REQUEST")["details"] == {
                "field": "cancel"
            }
        for path, field in (
            (f"/v1/intents/{sender.address}/{nonce}", "nonce"),
            (f"/v1/relay/{sender.address}:{nonce}", "id"),
            (f"/v1/relay/{sender.address}:{nonce}/events", "id"),
        ):
            with subtests.test(path=path):
                assert problem(env.client.get(path), "MALFORMED_REQUEST")["details"]["field"] == field
    for proof_time in (-1, 2**53, 2**512):
        with subtests.test(member="proof.serverTimeMs", value=proof_time):
            body = {"sender": sender.address, "proof": {**env.proof(sender), "serverTimeMs": proof_time}}
            refused = problem(post(env, "/v1/relay/assign", body), "MALFORMED_REQUEST")
            assert refused["details"]["field"] == "proof.serverTimeMs", refused
    # In range, the largest nonce is an ordinary cancel request: nothing holds it.
    body = {"sender": sender.address, "proof": env.proof(sender), "cancel": 2**63 - 1}
    problem(post(env, "/v1/relay/assign", body), "NOTHING_TO_CANCEL")


def test_stray_guardian_on_an_unguarded_tx_is_refused(env: Any, problem: Any) -> None:
    """The node refuses a guardian on a transaction without the guarded option: it must never be co-signed.

    The interface contract names no code for it; any 4xx problem of the catalogue is accepted.
    """
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, guardian=parse_address(bech32(key_in(1))), sign=False)
    tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
    response = env.relay(tx, assignment["lease"])
    assert 400 <= response.status_code < 500, response.text
    problem(response, response.json()["code"])
    assert_untouched(env, sender.address)


# Body size ------------------------------------------------------------------------------------------
def _chunks(total: int, size: int = 16_384) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        part = min(size, total - sent)
        sent += part
        yield b" " * part


def test_payload_too_large_with_and_without_content_length(env: Any, problem: Any, subtests: Any) -> None:
    for path in ("/v1/relay", "/v1/validate"):
        with subtests.test(path=path, framing="content-length"):
            problem(post(env, path, b" " * (MAX_BODY + 1)), "PAYLOAD_TOO_LARGE")
        with subtests.test(path=path, framing="chunked"):
            response = env.client.post(path, content=_chunks(MAX_BODY + 1), headers=JSON)
            assert response.request.headers.get("transfer-encoding") == "chunked"
            assert "content-length" not in response.request.headers
            problem(response, "PAYLOAD_TOO_LARGE")
    # Exactly the limit is read and parsed: the answer is about the body's content, not its size.
    key = key_in(1)
    document = json.dumps({"tx": wire(env, key)}).encode()
    padded = document + b" " * (MAX_BODY - len(document))
    assert len(padded) == MAX_BODY
    problem(post(env, "/v1/relay", padded), "LEASE_MISSING")


# Paths: hashes, ids, nonces, addresses -------------------------------------------------------------
def test_malformed_paths(env: Any, problem: Any, subtests: Any) -> None:
    sender = bech32(key_in(1))
    cases = [
        ("/v1/tx/" + "a" * 63, "hash"),
        ("/v1/tx/" + "a" * 65, "hash"),
        ("/v1/tx/" + "g" * 64, "hash"),
        ("/v1/relay/" + "a" * 63, "id"),
        ("/v1/relay/" + "a" * 65, "id"),
        ("/v1/relay/" + "a" * 63 + "/events", "id"),
        (f"/v1/relay/{sender}:-1", "id"),
        (f"/v1/relay/{sender}:x", "id"),
        (f"/v1/relay/{bad_checksum(sender)}:0", "sender"),  # the id's shape is right, its sender is not
        (f"/v1/relay/{mixed_case(sender)}:0", "id"),  # not the IntentId pattern (lower case, erd1)
        (f"/v1/relay/{other_hrp(sender)}:0", "id"),
        (f"/v1/relay/{sender}:007", "id"),  # a nonce has no leading zeros
        (f"/v1/tx/{'a' * 63}G", "hash"),
        (f"/v1/intents/{sender}/-1", "nonce"),
        (f"/v1/intents/{sender}/abc", "nonce"),
        (f"/v1/intents/{sender}/{2**63}", "nonce"),
        (f"/v1/intents/{bad_checksum(sender)}/0", "sender"),
        (f"/v1/intents/{mixed_case(sender)}/0", "sender"),
        (f"/v1/intents/{other_hrp(sender)}/0", "sender"),
    ]
    for path, field in cases:
        with subtests.test(path=path):
            body = problem(env.client.get(path), "MALFORMED_REQUEST")
            assert body["details"]["field"] == field, body


def test_not_found(env: Any, problem: Any, subtests: Any) -> None:
    sender = bech32(key_in(1))
    unknown = "ab" * 32
    for path in (
        f"/v1/tx/{unknown}",
        f"/v1/tx/{unknown.upper()}",
        f"/v1/relay/{unknown}",
        f"/v1/relay/{unknown}/events",
        f"/v1/relay/{sender}:0",
        f"/v1/relay/{sender}:0/events",
        f"/v1/intents/{sender}/0",
        "/v1/no-such-route",
    ):
        with subtests.test(path=path):
            problem(env.client.get(path), "NOT_FOUND")
    problem(env.client.delete("/v1/relay"), "NOT_FOUND")


# Idempotency keys --------------------------------------------------------------------------------------
def test_idempotency_key_shapes(env: Any, problem: Any, subtests: Any) -> None:
    key = key_in(1)
    bad_headers: list[Any] = [
        "k" * 15,
        "k" * 129,
        "key with spaces!",
        "tab\there-0123456789",
        "del\x7fkey-0123456789",
    ]
    bad_headers.append(b"\xe9" * 20)  # not ASCII (Latin-1 on the wire)
    for value in bad_headers:
        with subtests.test(header=value):
            response = env.client.post(
                "/v1/relay", json={"tx": wire(env, key), "lease": "x.y"}, headers={"Idempotency-Key": value}
            )
            assert problem(response, "MALFORMED_REQUEST")["details"]["field"] == "Idempotency-Key"
    for value in ["k" * 15, "k" * 129, "key with spaces!", "é" * 20, 12345678901234567, ["k" * 20]]:
        with subtests.test(intentKey=value):
            body = {"tx": wire(env, key), "lease": "x.y", "intentKey": value}
            assert (
                problem(post(env, "/v1/relay", body), "MALFORMED_REQUEST")["details"]["field"] == "intentKey"
            )
    # 16 and 128 visible characters are keys: the refusal is about the missing lease, a later stage.
    for value in ["k" * 16, "~" * 128]:
        with subtests.test(valid=len(value)):
            headers = {"Idempotency-Key": value}
            problem(post(env, "/v1/relay", {"tx": wire(env, key)}, headers=headers), "LEASE_MISSING")
            problem(post(env, "/v1/relay", {"tx": wire(env, key), "intentKey": value}), "LEASE_MISSING")
    assert_untouched(env, bech32(key))


def test_a_lease_of_the_wrong_json_type_is_a_client_error(env: Any, problem: Any, subtests: Any) -> None:
    key = key_in(1)
    for lease in (5, ["a.b"], {"a": "b"}, True):
        with subtests.test(lease=lease):
            response = post(env, "/v1/relay", {"tx": wire(env, key), "lease": lease})
            code = response.json()["code"]
            assert code in ("MALFORMED_REQUEST", "LEASE_INVALID"), response.text
            problem(response, code)


# Validate and quote ---------------------------------------------------------------------------------
def test_validate_answers_what_relay_answers(env: Any, problem: Any, subtests: Any) -> None:
    planned = env.new_sender(1)
    assignment = env.assign(planned)
    lease = assignment["lease"]
    unplanned_key = key_in(1)
    unplanned = env.assign(_as_sender(unplanned_key))
    no_plan_tx = signed_tx(env, unplanned_key, relayer=unplanned["relayer"]).to_dictionary()
    wrong_signer = env.build(planned, assignment, sign=False)
    wrong_signer.signature = key_in(1).sign(_computer.compute_bytes_for_signing(wrong_signer))

    def tx_of(**fields: Any) -> dict[str, Any]:
        return env.build(planned, assignment, **fields).to_dictionary()

    cases: list[tuple[str, dict[str, Any]]] = [
        ("MALFORMED_REQUEST", {"tx": tx_of(), "lease": lease, "extra": 1}),
        ("VARIANTS_NOT_SUPPORTED", {"tx": tx_of(), "lease": lease, "variants": []}),
        ("RELAYER_SIGNATURE_PRESENT", {"tx": {**tx_of(), "relayerSignature": "ab" * 64}, "lease": lease}),
        ("CHAIN_ID_MISMATCH", {"tx": _resigned(planned.key, env.build(planned, assignment), chain_id="D")}),
        ("GAS_PRICE_OUT_OF_RANGE", {"tx": tx_of(gas_price=999_999_999), "lease": lease}),
        ("LEASE_MISSING", {"tx": tx_of()}),
        ("LEASE_INVALID", {"tx": tx_of(), "lease": "x.y"}),
        ("SENDER_SIGNATURE_INVALID", {"tx": wrong_signer.to_dictionary(), "lease": lease}),
        ("NONCE_GAP", {"tx": tx_of(nonce=5), "lease": lease}),
        ("NO_ENTITLEMENT", {"tx": no_plan_tx, "lease": unplanned["lease"]}),
    ]
    for code, body in cases:
        with subtests.test(code=code):
            answer = post(env, "/v1/validate", body)
            assert answer.status_code == 200, answer.text
            verdict = answer.json()
            assert verdict["ok"] is False and verdict["problems"][0]["code"] == code, verdict
            first = verdict["problems"][0]
            assert first["type"].endswith("/errors/" + code.lower().replace("_", "-"))
            assert first["status"] == problem(post(env, "/v1/relay", body), code)["status"]
    # Independent checks of one stage are all listed, the relay answer first.
    both = {
        "tx": _resigned(planned.key, env.build(planned, assignment, gas_price=1), chain_id="D"),
        "lease": lease,
    }
    codes = [p["code"] for p in post(env, "/v1/validate", both).json()["problems"]]
    assert codes[:2] == ["CHAIN_ID_MISMATCH", "GAS_PRICE_OUT_OF_RANGE"]
    assert_untouched(env, planned.address)


def test_validate_refuses_a_body_that_is_not_its_schema(env: Any, problem: Any, subtests: Any) -> None:
    """ValidateRequest is an object with an object `tx`: anything else is 400 MALFORMED_REQUEST, as the
    document says; a `tx` relay would refuse is the 200 verdict listing relay's answer."""
    cases: list[tuple[Any, str]] = [
        ({}, "tx"),
        ({"lease": "x.y"}, "tx"),
        ({"variants": []}, "tx"),
        ({"tx": None}, "tx"),
        ({"tx": 5}, "tx"),
        ({"tx": [wire(env)]}, "tx"),
        ([None, None], "body"),
        ("tx", "body"),
    ]
    for body, field in cases:
        with subtests.test(body=str(body)[:40]):
            assert problem(post(env, "/v1/validate", body), "MALFORMED_REQUEST")["details"] == {
                "field": field
            }
    verdict = post(env, "/v1/validate", {"tx": {}})
    assert verdict.status_code == 200 and verdict.json()["ok"] is False, verdict.text
    assert verdict.json()["problems"][0]["code"] == "MALFORMED_REQUEST"


def _as_sender(key: UserSecretKey) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(key=key, address=bech32(key))


def _resigned(key: UserSecretKey, tx: Transaction, **changes: Any) -> dict[str, Any]:
    for name, value in changes.items():
        setattr(tx, name, value)
    tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
    return tx.to_dictionary()


def test_validate_ok_for_a_valid_tx_signs_and_sends_nothing(env: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    verdict = post(env, "/v1/validate", {"tx": tx.to_dictionary(), "lease": assignment["lease"]}).json()
    assert verdict == {"ok": True, "problems": [], "txHash": tx_hash(tx)}
    assert_untouched(env, sender.address)
    assert env.client.get(f"/v1/relay/{sender.address}:0").status_code == 404
    assert relay_accepted(env, tx, assignment["lease"])["id"] == f"{sender.address}:0"


def test_quote_answers_decimal_strings(env: Any, problem: Any) -> None:
    key = key_in(1)
    unsigned = signed_tx(env, key).to_dictionary()
    unsigned.pop("signature")
    quote = post(env, "/v1/quote", {"tx": unsigned})
    assert quote.status_code == 200, quote.text
    body = quote.json()
    for member in ("ru", "priceMicroUsdc", "gasLimit", "movementGas", "maxFeeAtto"):
        assert isinstance(body[member], str) and body[member].isdigit(), (member, body)
    assert body["gasLimit"] == "100000" and body["movementGas"] == "100000"
    assert isinstance(body["ruScheduleVersion"], str) and body["free"] is False
    deposit = wire(env, key, receiver=parse_address(env.contract), data=b"deposit", gas_limit=10_000_000)
    free = post(env, "/v1/quote", {"tx": deposit}).json()
    assert free["free"] is True and free["priceMicroUsdc"] == "0"
    # Bad input on quote is a problem document too.
    problem(post(env, "/v1/quote", {"tx": unsigned, "lease": "x"}), "MALFORMED_REQUEST")
    problem(post(env, "/v1/quote", {"tx": "abc"}), "MALFORMED_REQUEST")
    assert (
        problem(post(env, "/v1/quote", {"tx": {**unsigned, "nonce": -1}}), "MALFORMED_REQUEST")["details"][
            "field"
        ]
        == "tx.nonce"
    )
    problem(post(env, "/v1/quote", {"tx": {**unsigned, "chainID": "D"}}), "CHAIN_ID_MISMATCH")
    problem(post(env, "/v1/quote", {"tx": {**unsigned, "gasLimit": 1}}), "GAS_LIMIT_TOO_LOW")
    assert_untouched(env, bech32(key))
