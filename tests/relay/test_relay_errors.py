"""Every relay-group error of `POST /v1/relay`, reached through HTTP with real signatures on localnet.

Each test asserts the interface contract's problem document (status, code, retryable, resign, type, instance, details)
with the `problem` fixture, and that nothing was sent with the `nothing_sent` fixture: the submission reads
`REJECTED` with the code, the sender's nonce and pool on the localnet gateway are what the test itself put
there, and the transaction as our relayer would have co-signed it is unknown to the network.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from multiversx_sdk import Address, Transaction, TransactionComputer, UserSecretKey
from relay_kit import fund, key_in_shard, localnet_post, send_direct

from gasless.chain.addresses import address_of, parse_address, shard_of_pubkey
from gasless.core.crypto import PurposeKeys
from gasless.hosting.app import purpose_keys
from gasless.relay.leases import LeaseCodec
from gasless.signer import Signer, SignerUnavailable

_computer = TransactionComputer()
MIN_GAS_PRICE = 1_000_000_000
EGLD = 10**18


# Helpers ----------------------------------------------------------------------------------------------
def sign(key: UserSecretKey, tx: Transaction) -> Transaction:
    tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
    return tx


def other_address(shard: int = 1) -> Address:
    while True:
        key = UserSecretKey.generate()
        address = address_of(key.generate_public_key().buffer)
        if _shard(address) == shard:
            return address


def _shard(address: Address) -> int:
    return shard_of_pubkey(address.get_public_key())


def relayers_in(env: Any, shard: int) -> list[str]:
    return sorted(w.address.to_bech32() for w in env.localnet.net.genesis.relayers if w.shard == shard)


def lease_codec(env: Any) -> LeaseCodec:
    return LeaseCodec(purpose_keys(env.settings))


def mint(env: Any, sender: Any, relayer: str, *, codec: LeaseCodec | None = None, **kwargs: Any) -> str:
    kwargs.setdefault("kind", "std")
    kwargs.setdefault("now_ms", int(time.time() * 1000))
    token, _ = (codec or lease_codec(env)).mint(sender=sender.address, relayer=relayer, **kwargs)
    return token


def stall(env: Any, shard: int = 1) -> None:
    env.faults(chain={"stalledShards": [shard]})


def wait_chain_nonce(env: Any, address: str, nonce: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = _gateway(env, f"/address/{address}/nonce")
        if int(data["nonce"]) >= nonce:
            return
        time.sleep(0.05)
    raise AssertionError(f"{address} did not reach nonce {nonce}")


def _gateway(env: Any, path: str) -> Any:
    with urllib.request.urlopen(f"{env.localnet.url}{path}", timeout=5) as answer:
        return json.loads(answer.read())["data"]


def _gateway_pool(env: Any, address: str) -> set[str]:
    data = _gateway(env, f"/transaction/pool?by-sender={address}&fields=hash")
    return {entry["txFields"]["hash"] for entry in data["txPool"]["transactions"]}


def accepted(env: Any, tx: Transaction, lease: str, **extra: Any) -> dict[str, Any]:
    """Relay and expect 200 or 202.

    A SIGNER_TIMEOUT (a loaded test machine against the 250 ms deadline) is retried with the same bytes, as
    the interface contract's `SAME_BYTES` says; nothing was sent with it.
    """
    for _ in range(10):
        response = env.relay(tx, lease, **extra)
        if response.status_code != 503 or response.json()["code"] != "SIGNER_TIMEOUT":
            break
        time.sleep(0.1)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


def relay_one(env: Any, sender: Any, assignment: dict[str, Any], **build: Any) -> dict[str, Any]:
    """Relay a transfer at the sender's next nonce and expect it accepted."""
    body = accepted(env, env.build(sender, assignment, **build), assignment["lease"])
    sender.nonce += 1
    return body


def contract_call(env: Any, sender: Any, assignment: dict[str, Any], data: bytes, gas: int) -> Transaction:
    return env.build(sender, assignment, receiver=env.contract, data=data, gas_limit=gas)


class FaultySigner:
    """A `Signer` around the real one whose `sign` misbehaves: sleeps, is unreachable, or crashes."""

    def __init__(self, inner: Signer, mode: str) -> None:
        self.inner = inner
        self.mode = mode
        self.calls = 0

    def relayers(self) -> list[Any]:
        return self.inner.relayers()

    def check(self) -> None:
        self.inner.check()

    async def sign(self, relayer: str, message: bytes) -> bytes:
        self.calls += 1
        if self.mode == "slow":
            await asyncio.sleep(2.0)  # past signer_deadline_ms (250 ms)
        elif self.mode == "unavailable":
            raise SignerUnavailable("remote signer unreachable")
        elif self.mode == "crash":
            raise RuntimeError("signer bug")
        return await self.inner.sign(relayer, message)


def faulty(mode: str) -> Callable[[Signer], Signer]:
    return lambda inner: FaultySigner(inner, mode)  # type: ignore[return-value]


# Static stage -------------------------------------------------------------------------------------------
def _tx_chain(tx: Transaction, env: Any) -> None:
    tx.chain_id = "D"


def _tx_version(tx: Transaction, env: Any) -> None:
    tx.version = 1


def _tx_options(tx: Transaction, env: Any) -> None:
    tx.options = 4


def _relayer_unknown(tx: Transaction, env: Any) -> None:
    tx.relayer = other_address(1)


def _relayer_other_shard(tx: Transaction, env: Any) -> None:
    tx.relayer = parse_address(relayers_in(env, 0)[0])


def _price_low(tx: Transaction, env: Any) -> None:
    tx.gas_price = MIN_GAS_PRICE - 1


def _price_high(tx: Transaction, env: Any) -> None:
    tx.gas_price = 2 * MIN_GAS_PRICE + 1


def _gas_low(tx: Transaction, env: Any) -> None:
    tx.gas_limit = 99_999


def _gas_high(tx: Transaction, env: Any) -> None:
    tx.gas_limit = 600_000_001


def _gas_2_63(tx: Transaction, env: Any) -> None:
    tx.gas_limit = 2**63  # beyond the wire's integer range, but an integer: the ceiling applies


def _price_2_63(tx: Transaction, env: Any) -> None:
    tx.gas_price = 2**63


def _data_large(tx: Transaction, env: Any) -> None:
    tx.data = b"a" * 4_097
    tx.gas_limit = 100_000 + 1_500 * 4_097


def _guardian_is_relayer(tx: Transaction, env: Any) -> None:
    tx.options = 2
    tx.guardian = tx.relayer
    tx.guardian_signature = b"\x01" * 64
    tx.gas_limit = 150_000


STATIC_CASES = [
    ("CHAIN_ID_MISMATCH", _tx_chain, {}),
    ("TX_VERSION_UNSUPPORTED", _tx_version, {}),
    ("TX_OPTIONS_UNSUPPORTED", _tx_options, {}),
    ("RELAYER_UNKNOWN", _relayer_unknown, {}),
    ("RELAYER_SHARD_MISMATCH", _relayer_other_shard, {}),
    (
        "GAS_PRICE_OUT_OF_RANGE",
        _price_low,
        {"limit": MIN_GAS_PRICE, "actual": MIN_GAS_PRICE - 1, "bound": "min"},
    ),
    (
        "GAS_PRICE_OUT_OF_RANGE",
        _price_high,
        {"limit": 2 * MIN_GAS_PRICE, "actual": 2 * MIN_GAS_PRICE + 1, "bound": "max"},
    ),
    ("GAS_LIMIT_TOO_LOW", _gas_low, {"limit": 100_000, "actual": 99_999}),
    ("GAS_LIMIT_TOO_HIGH", _gas_high, {"limit": 600_000_000, "actual": 600_000_001}),
    ("DATA_TOO_LARGE", _data_large, {"limit": 4_096, "actual": 4_097}),
    ("GUARDIAN_IS_RELAYER", _guardian_is_relayer, {}),
]


BEYOND_THE_WIRE = [
    ("GAS_LIMIT_TOO_HIGH", _gas_2_63, {"limit": 600_000_000, "actual": 2**63}),
    ("GAS_PRICE_OUT_OF_RANGE", _price_2_63, {"limit": 2 * MIN_GAS_PRICE, "actual": 2**63, "bound": "max"}),
]


@pytest.mark.parametrize(("code", "mutate", "details"), BEYOND_THE_WIRE, ids=["gas-limit", "gas-price"])
def test_an_integer_beyond_the_wire_range_meets_the_catalogue_ceiling(
    env: Any,
    problem: Any,
    code: str,
    mutate: Callable[[Transaction, Any], None],
    details: dict[str, Any],
) -> None:
    """A re-signed gas limit (or price) of 2^63 is an integer above the ceiling, not a malformed body."""
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, sign=False)
    mutate(tx, env)
    sign(sender.key, tx)
    body = problem(env.relay(tx, assignment["lease"]), code)
    assert body["details"] == details, body
    # Recorded after the answer, off its path: the slot shows it once written.
    slot = env.wait_state(f"{sender.address}:{tx.nonce}", ("REJECTED",))
    assert slot["rejection"]["code"] == code, slot


@pytest.mark.parametrize(
    ("code", "mutate", "details"),
    STATIC_CASES,
    ids=[f"{code}-{mutate.__name__.strip('_')}" for code, mutate, _ in STATIC_CASES],
)
def test_static_refusals(
    env: Any,
    problem: Any,
    nothing_sent: Any,
    code: str,
    mutate: Callable[[Transaction, Any], None],
    details: dict[str, Any],
) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, sign=False)
    mutate(tx, env)
    sign(sender.key, tx)
    body = problem(env.relay(tx, assignment["lease"]), code)
    for name, value in details.items():
        assert body["details"][name] == value, body
    nothing_sent(env, tx, code)


@pytest.mark.parametrize("lease", [None, ""], ids=["absent", "empty"])
def test_lease_missing(env: Any, problem: Any, nothing_sent: Any, lease: str | None) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    problem(env.relay(tx, lease), "LEASE_MISSING")
    nothing_sent(env, tx, "LEASE_MISSING")


@pytest.mark.parametrize("how", ["other-key", "no-signature"])
def test_sender_signature_invalid(env: Any, problem: Any, nothing_sent: Any, how: str) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, sign=False)
    if how == "other-key":
        sign(UserSecretKey.generate(), tx)
    problem(env.relay(tx, assignment["lease"]), "SENDER_SIGNATURE_INVALID")
    nothing_sent(env, tx, "SENDER_SIGNATURE_INVALID")


# Lease stage --------------------------------------------------------------------------------------------
def _tampered(token: str) -> str:
    payload, mac = token.split(".")
    fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    fields["expiresAtMs"] += 3_600_000
    forged = base64.urlsafe_b64encode(json.dumps(fields, separators=(",", ":")).encode()).rstrip(b"=")
    return f"{forged.decode()}.{mac}"


def _flipped_mac(token: str) -> str:
    return token[:-1] + ("A" if token[-1] != "A" else "B")


@pytest.mark.parametrize(
    "variant",
    ["tampered-payload", "flipped-mac", "other-secret", "other-env", "other-chain", "garbage"],
)
def test_lease_invalid(env: Any, problem: Any, nothing_sent: Any, variant: str) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    relayer = assignment["relayer"]
    chain_id = env.settings.network.chain_id
    secret = env.settings.master_secret.get_secret_value().encode()
    other_env = "live" if env.settings.key_env != "live" else "test"
    lease: Any = {
        "tampered-payload": lambda: _tampered(assignment["lease"]),
        "flipped-mac": lambda: _flipped_mac(assignment["lease"]),
        "other-secret": lambda: mint(
            env, sender, relayer, codec=LeaseCodec(PurposeKeys(b"another-master-secret", "test", chain_id))
        ),
        "other-env": lambda: mint(
            env, sender, relayer, codec=LeaseCodec(PurposeKeys(secret, other_env, chain_id))
        ),
        "other-chain": lambda: mint(
            env, sender, relayer, codec=LeaseCodec(PurposeKeys(secret, env.settings.key_env, "D"))
        ),
        "garbage": lambda: "not-a-lease",
    }[variant]()
    tx = env.build(sender, assignment)
    problem(env.relay(tx, None, body={"lease": lease}), "LEASE_INVALID")
    nothing_sent(env, tx, "LEASE_INVALID")


@pytest.mark.parametrize("variant", ["other-sender", "other-relayer", "renewed-for-other-tx"])
def test_lease_mismatch(env: Any, problem: Any, nothing_sent: Any, variant: str) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    if variant == "other-sender":  # same relayer: only the sender binding differs
        lease = mint(env, env.new_sender(1, plan=False), assignment["relayer"])
    elif variant == "other-relayer":
        relayer = next(r for r in relayers_in(env, 1) if r != assignment["relayer"])
        lease = mint(env, sender, relayer)
    else:
        first = env.build(sender, assignment, value=0)
        lease = env.assign(sender, renewFor=first.to_dictionary())["lease"]
        tx = env.build(sender, assignment, receiver=other_address(1).to_bech32())
    problem(env.relay(tx, lease), "LEASE_MISMATCH")
    nothing_sent(env, tx, "LEASE_MISMATCH")


def test_lease_expired_is_renewable_and_renewal_relays_the_same_bytes(
    env: Any, problem: Any, nothing_sent: Any
) -> None:
    sender = env.new_sender(1)
    relayer = env.assign(sender)["relayer"]
    expired = mint(env, sender, relayer, now_ms=int(time.time() * 1000) - 600_001)
    tx = env.build(sender, {"relayer": relayer})
    body = problem(env.relay(tx, expired), "LEASE_EXPIRED")
    assert body["details"]["renewable"] is True
    nothing_sent(env, tx, "LEASE_EXPIRED")
    # SAME_BYTES: renew the lease for this transaction and resend the identical bytes.
    renewed = env.assign(sender, renewFor=tx.to_dictionary())
    assert renewed["relayer"] == relayer and renewed["pinNonce"] == tx.nonce
    assert accepted(env, tx, renewed["lease"])["id"] == f"{sender.address}:{tx.nonce}"


def test_nonce_pin_mismatch(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    relayer = env.assign(sender)["relayer"]
    lease = mint(env, sender, relayer, kind="cancel", pin_nonce=7)
    tx = env.build(sender, {"relayer": relayer}, nonce=0)
    problem(env.relay(tx, lease), "NONCE_PIN_MISMATCH")
    nothing_sent(env, tx, "NONCE_PIN_MISMATCH")


@pytest.mark.parametrize("state", ["retired", "draining"])
def test_resign_required_then_the_new_assignment_relays(
    env: Any, problem: Any, nothing_sent: Any, operator: Any, state: str
) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    operator.set_relayer_state(env, state, assignment["relayer"])
    body = problem(env.relay(tx, assignment["lease"]), "RESIGN_REQUIRED")
    new = body["details"]["assignment"]
    assert new["relayer"] != assignment["relayer"] and new["relayer"] in relayers_in(env, 1)
    assert new["pinNonce"] == tx.nonce and new["shard"] == 1 and new["lease"]
    nothing_sent(env, tx, "RESIGN_REQUIRED")
    # NEW_SIGNATURE_SAME_NONCE: the user signs the same nonce for the new relayer once.
    resigned = env.build(sender, new, nonce=tx.nonce)
    assert accepted(env, resigned, new["lease"])["relayer"] == new["relayer"]


def test_relayer_retired_when_no_relayer_of_the_shard_is_left(
    env: Any, problem: Any, nothing_sent: Any, operator: Any
) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    operator.set_relayer_state(env, "retired", *relayers_in(env, 1))
    problem(env.relay(tx, assignment["lease"]), "RELAYER_RETIRED")
    nothing_sent(env, tx, "RELAYER_RETIRED")
    # An expired lease of a retired relayer cannot be renewed.
    expired = mint(env, sender, assignment["relayer"], now_ms=int(time.time() * 1000) - 600_001)
    other = env.build(sender, assignment, value=0, data=b"x")
    body = problem(env.relay(other, expired), "LEASE_EXPIRED")
    assert body["details"]["renewable"] is False
    nothing_sent(env, other, "LEASE_EXPIRED")


# Chain state stage -------------------------------------------------------------------------------------
def _guard(env: Any, sender: Any) -> UserSecretKey:
    guardian = UserSecretKey.generate()
    guardian_address = address_of(guardian.generate_public_key().buffer).to_bech32()
    localnet_post(env, "/localnet/guardian", {"address": sender.address, "guardian": guardian_address})
    return guardian


def _guarded(env: Any, sender: Any, assignment: dict[str, Any], guardian: UserSecretKey, signer: Any) -> Any:
    tx = env.build(
        sender,
        assignment,
        gas_limit=150_000,
        options=2,
        guardian=address_of(guardian.generate_public_key().buffer),
        sign=False,
    )
    sign(sender.key, tx)
    tx.guardian_signature = signer.sign(_computer.compute_bytes_for_signing(tx))
    return tx


def test_guardian_required(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    _guard(env, sender)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    problem(env.relay(tx, assignment["lease"]), "GUARDIAN_REQUIRED")
    nothing_sent(env, tx, "GUARDIAN_REQUIRED")


def test_guardian_mismatch(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    _guard(env, sender)
    assignment = env.assign(sender)
    stranger = UserSecretKey.generate()
    tx = _guarded(env, sender, assignment, stranger, stranger)  # well signed, by the wrong guardian
    problem(env.relay(tx, assignment["lease"]), "GUARDIAN_MISMATCH")
    nothing_sent(env, tx, "GUARDIAN_MISMATCH")


def test_guardian_signature_invalid_and_a_well_guarded_tx_relays(
    env: Any, problem: Any, nothing_sent: Any
) -> None:
    sender = env.new_sender(1)
    guardian = _guard(env, sender)
    assignment = env.assign(sender)
    tx = _guarded(env, sender, assignment, guardian, UserSecretKey.generate())
    problem(env.relay(tx, assignment["lease"]), "GUARDIAN_SIGNATURE_INVALID")
    nothing_sent(env, tx, "GUARDIAN_SIGNATURE_INVALID")
    good = _guarded(env, sender, assignment, guardian, guardian)
    env.wait_state(accepted(env, good, assignment["lease"])["txHash"], ("FINALIZED",))


def test_insufficient_sender_balance(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, value=1)
    problem(env.relay(tx, assignment["lease"]), "INSUFFICIENT_SENDER_BALANCE")
    nothing_sent(env, tx, "INSUFFICIENT_SENDER_BALANCE")


def test_nonce_gap(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=3)
    problem(env.relay(tx, assignment["lease"]), "NONCE_GAP")
    nothing_sent(env, tx, "NONCE_GAP")


def test_nonce_too_low(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    fund(env, sender.address)
    send_direct(env, sender, nonce=0)
    wait_chain_nonce(env, sender.address, 1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=0)
    body = problem(env.relay(tx, assignment["lease"]), "NONCE_TOO_LOW")
    assert body["details"] == {"onchainNonce": 1, "poolLastNonce": None, "expectedNonce": 1}
    nothing_sent(env, tx, "NONCE_TOO_LOW", nonce=1)


def test_intent_already_executed(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    first = relay_one(env, sender, assignment)
    env.wait_state(first["txHash"], ("EXECUTED", "FINALIZED"))
    tx = env.build(sender, assignment, nonce=0, receiver=other_address(1).to_bech32())
    body = problem(env.relay(tx, assignment["lease"]), "INTENT_ALREADY_EXECUTED")
    assert body["details"]["intent"]["txHash"] == first["txHash"]
    nothing_sent(env, tx, "INTENT_ALREADY_EXECUTED", nonce=1, slot=False)
    assert env.client.get(f"/v1/relay/{sender.address}:0").json()["txHash"] == first["txHash"]


def test_nonce_in_flight(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    stall(env)
    first = relay_one(env, sender, assignment)
    tx = env.build(sender, assignment, nonce=0, receiver=other_address(1).to_bech32())
    body = problem(env.relay(tx, assignment["lease"]), "NONCE_IN_FLIGHT")
    assert body["details"]["pinnedNonce"] == 0
    assert body["details"]["occupiedBy"]["txHash"] == first["txHash"]
    nothing_sent(env, tx, "NONCE_IN_FLIGHT", pool={first["txHash"]}, slot=False)


def test_replacement_underpriced_with_a_cancel_lease(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    stall(env)
    first = relay_one(env, sender, assignment)
    cancel = env.assign(sender, cancel=0)
    assert cancel["kind"] == "cancel" and cancel["pinNonce"] == 0
    tx = env.build(sender, cancel, nonce=0, receiver=sender.address, gas_price=MIN_GAS_PRICE)
    body = problem(env.relay(tx, cancel["lease"]), "REPLACEMENT_UNDERPRICED")
    assert body["details"]["minGasPrice"] == MIN_GAS_PRICE + 1
    nothing_sent(env, tx, "REPLACEMENT_UNDERPRICED", pool={first["txHash"]}, slot=False)
    # The real cancel lease is pinned: another nonce is refused.
    pinned = env.build(sender, cancel, nonce=1, gas_price=MIN_GAS_PRICE + 1)
    problem(env.relay(pinned, cancel["lease"]), "NONCE_PIN_MISMATCH")
    nothing_sent(env, pinned, "NONCE_PIN_MISMATCH", pool={first["txHash"]})


def test_resign_same_nonce_for_a_foreign_pooled_tx(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    fund(env, sender.address)
    stall(env)
    foreign = send_direct(env, sender, nonce=0)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, nonce=0)
    body = problem(env.relay(tx, assignment["lease"]), "RESIGN_SAME_NONCE")
    assert body["details"]["minGasPrice"] == MIN_GAS_PRICE + 1
    new = body["details"]["assignment"]
    assert new["kind"] == "cancel" and new["pinNonce"] == 0 and new["relayer"] in relayers_in(env, 1)
    nothing_sent(env, tx, "RESIGN_SAME_NONCE", pool={foreign})
    # With the cancel assignment but the pooled price, the replacement does not displace the foreign tx.
    same_price = env.build(sender, new, nonce=0, gas_price=MIN_GAS_PRICE)
    body = problem(env.relay(same_price, new["lease"]), "REPLACEMENT_UNDERPRICED")
    assert body["details"]["minGasPrice"] == MIN_GAS_PRICE + 1
    nothing_sent(env, same_price, "REPLACEMENT_UNDERPRICED", pool={foreign})
    # At the minimum price it is accepted.
    replacement = accepted(env, env.build(sender, new, nonce=0, gas_price=MIN_GAS_PRICE + 1), new["lease"])
    assert _gateway_pool(env, sender.address) == {foreign, replacement["txHash"]}


def test_too_many_in_flight(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    stall(env)
    hashes = {relay_one(env, sender, assignment)["txHash"] for _ in range(64)}
    tx = env.build(sender, assignment)  # nonce 64, the next one
    problem(env.relay(tx, assignment["lease"]), "TOO_MANY_IN_FLIGHT")
    nothing_sent(env, tx, "TOO_MANY_IN_FLIGHT", pool=hashes)


# Idempotency -------------------------------------------------------------------------------------------
def test_intent_already_submitted(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    stall(env)
    key = "order-2024-0001-abcdef"
    first_tx = env.build(sender, assignment)
    first = accepted(env, first_tx, assignment["lease"], headers={"Idempotency-Key": key})
    # The same key and bytes are an ordinary replay.
    again = accepted(env, first_tx, assignment["lease"], headers={"Idempotency-Key": key})
    assert again["duplicate"] is True and again["txHash"] == first["txHash"]
    cases = [
        ({"headers": {"Idempotency-Key": key}}, 1),
        ({"body": {"intentKey": key}}, 2),
        ({"headers": {"Idempotency-Key": key}, "body": {"intentKey": "another-key-0123456789"}}, 3),
    ]
    for extra, nonce in cases:
        tx = env.build(sender, assignment, nonce=nonce)
        body = problem(env.relay(tx, assignment["lease"], **extra), "INTENT_ALREADY_SUBMITTED")
        intent = body["details"]["intent"]
        assert intent["txHash"] == first["txHash"] and intent["id"] == f"{sender.address}:0"
        nothing_sent(env, tx, "INTENT_ALREADY_SUBMITTED", pool={first["txHash"]})


# Entitlement and simulation ---------------------------------------------------------------------------
def test_no_entitlement_names_the_sender_in_payment_required(
    env: Any, problem: Any, nothing_sent: Any
) -> None:
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    response = env.relay(tx, assignment["lease"])
    body = problem(response, "NO_ENTITLEMENT")
    assert body["details"]["reason"] == "NO_ACCOUNT"
    document = json.loads(base64.b64decode(response.headers["PAYMENT-REQUIRED"]))
    assert sender.address in json.dumps(document)
    assert document["resource"]["url"].endswith("/v1/x402/topup")
    nothing_sent(env, tx, "NO_ENTITLEMENT")


def test_a_flag_call_needs_an_account_of_its_own(env: Any, problem: Any, nothing_sent: Any) -> None:
    """Flag calls are co-signed only for an address with an on-chain account (docs/billing.md, "Free flow")."""
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    tx = contract_call(env, sender, assignment, b"setAutoRenew@01", 5_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "NO_ENTITLEMENT")
    assert body["details"]["reason"] == "NO_ACCOUNT"
    nothing_sent(env, tx, "NO_ENTITLEMENT")


@pytest.mark.parametrize(("setter", "scope"), [("setPaused", "global"), ("setDepositsPaused", "deposits")])
def test_contract_paused_for_a_free_deposit(
    env: Any, problem: Any, nothing_sent: Any, setter: str, scope: str
) -> None:
    env.owner(setter, [True])
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    tx = contract_call(env, sender, assignment, b"deposit", 10_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "CONTRACT_PAUSED")
    assert body["details"]["scope"] == scope
    nothing_sent(env, tx, "CONTRACT_PAUSED")


@pytest.mark.parametrize("simulate", ["contract_calls", "never"])
def test_contract_paused_for_a_billed_contract_call(
    make_env: Any, problem: Any, nothing_sent: Any, simulate: str
) -> None:
    """A global pause stops every call to the contract before anything is co-signed, billed ones included
    (a paying account's addSenders): not SIMULATION_FAILED, and with simulation off not co-signed and paid."""
    env = make_env(simulate=simulate)
    env.owner("setPaused", [True])
    sender = env.new_sender(1)  # an account with a plan: the call is billed
    assignment = env.assign(sender)
    other = key_in_shard(1).generate_public_key().buffer
    data = b"addSenders@0f4240@" + other.hex().encode()  # at most 1 USDC of sender fee, one sender
    tx = contract_call(env, sender, assignment, data, 20_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "CONTRACT_PAUSED")
    assert body["details"]["scope"] == "global"
    nothing_sent(env, tx, "CONTRACT_PAUSED")


def test_ordinary_transfers_continue_while_the_contract_is_paused(
    env: Any, problem: Any, nothing_sent: Any
) -> None:
    """A global pause stops calls to the billing contract only (docs/billing.md, entitlement order 0): the
    contract call of an account with a plan is 503 CONTRACT_PAUSED, and then a plain transfer of the same
    account, at the very nonce the refused call left free, is relayed and billed on its plan."""
    env.owner("setPaused", [True])
    sender = env.new_sender(1)  # an account with a plan
    assignment = env.assign(sender)
    other = key_in_shard(1).generate_public_key().buffer
    call = contract_call(env, sender, assignment, b"addSenders@0f4240@" + other.hex().encode(), 20_000_000)
    body = problem(env.relay(call, assignment["lease"]), "CONTRACT_PAUSED")
    assert body["details"]["scope"] == "global"
    nothing_sent(env, call, "CONTRACT_PAUSED")
    assignment = env.assign(sender)
    transfer = env.build(sender, assignment)  # to an ordinary account of the shard, no data, no value
    assert transfer.receiver.to_bech32() != env.contract
    relayed = accepted(env, transfer, assignment["lease"])
    assert relayed["billing"]["billingClass"] == "plan" and relayed["billing"]["account"] == sender.address
    assert env.wait_state(relayed["id"], ("EXECUTED", "FINALIZED"))["outcome"] == "success"


def test_contract_paused_for_an_esdt_deposit(env: Any, problem: Any, nothing_sent: Any) -> None:
    env.owner("setPaused", [True])
    sender = env.new_sender(1, plan=False)
    assignment = env.assign(sender)
    token = env.localnet.net.genesis.payment_token.encode().hex()
    data = f"ESDTTransfer@{token}@0f4240@{b'deposit'.hex()}".encode()
    tx = contract_call(env, sender, assignment, data, 20_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "CONTRACT_PAUSED")
    assert body["details"]["scope"] == "global"
    nothing_sent(env, tx, "CONTRACT_PAUSED")


@pytest.mark.parametrize(
    ("plan", "data", "reason"),
    [
        # free (not a flag call, so no account needed), but the signer authorised nobody
        (False, b"removeSenders@" + b"00" * 32, "ERR_NOT_A_SENDER"),
        (True, b"noSuchEndpoint", "invalid function"),  # paid by the plan, refused by the VM
    ],
    ids=["free-call-reverts", "unknown-endpoint"],
)
def test_simulation_failed_for_a_reverting_contract_call(
    env: Any, problem: Any, nothing_sent: Any, plan: bool, data: bytes, reason: str
) -> None:
    sender = env.new_sender(1, plan=plan)
    assignment = env.assign(sender)
    tx = contract_call(env, sender, assignment, data, 5_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "SIMULATION_FAILED")
    assert reason in body["details"]["returnMessage"], body
    nothing_sent(env, tx, "SIMULATION_FAILED")


def test_gas_overprovisioned_and_a_fitting_limit_relays(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)  # has an account: setAutoRenew@01 succeeds on chain
    assignment = env.assign(sender)
    data = b"setAutoRenew@01"
    movement = 100_000 + 1_500 * len(data)
    tx = contract_call(env, sender, assignment, data, 100_000_000)
    body = problem(env.relay(tx, assignment["lease"]), "GAS_OVERPROVISIONED")
    assert body["details"]["actual"] == 100_000_000
    assert movement < body["details"]["limit"] < 100_000_000
    nothing_sent(env, tx, "GAS_OVERPROVISIONED")
    fitting = contract_call(env, sender, assignment, data, body["details"]["limit"])
    final = env.wait_state(accepted(env, fitting, assignment["lease"])["txHash"], ("FINALIZED",))
    assert final["outcome"] == "success"


# Infrastructure before the commit point --------------------------------------------------------------
def test_upstream_unavailable_when_every_gateway_is_down(env: Any, problem: Any, nothing_sent: Any) -> None:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    env.faults(gateway={"down": True})
    try:
        response = env.relay(tx, assignment["lease"])
    finally:
        env.faults(gateway={"down": False})
    problem(response, "UPSTREAM_UNAVAILABLE")
    nothing_sent(env, tx, "UPSTREAM_UNAVAILABLE")


@pytest.mark.parametrize(
    ("mode", "code"), [("slow", "SIGNER_TIMEOUT"), ("unavailable", "SIGNER_UNAVAILABLE")]
)
def test_signer_failures(make_env: Any, problem: Any, nothing_sent: Any, mode: str, code: str) -> None:
    env = make_env(app_kwargs={"signer_wrapper": faulty(mode)})
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    problem(env.relay(tx, assignment["lease"]), code)
    nothing_sent(env, tx, code)


def test_signer_fenced_when_another_holder_takes_the_identity(
    make_env: Any, problem: Any, nothing_sent: Any, operator: Any
) -> None:
    env = make_env()
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    far = int(time.time() * 1000) + 3_600_000
    operator.db_execute(env, "UPDATE signer_fences SET holder = 'intruder', expires_at_ms = :far", far=far)
    deadline = time.monotonic() + 20  # the claim is renewed every third of its 15 s TTL
    while env.client.get("/readyz").json()["checks"].get("signer") != "fenced":
        assert time.monotonic() < deadline, "the signer did not fence itself"
        time.sleep(0.05)
    problem(env.relay(tx, assignment["lease"]), "SIGNER_FENCED")
    nothing_sent(env, tx, "SIGNER_FENCED")


def test_internal_when_the_signer_crashes(make_env: Any, problem: Any, nothing_sent: Any) -> None:
    env = make_env(app_kwargs={"signer_wrapper": faulty("crash")})
    env.client._transport.raise_server_exceptions = False  # answer the 500 instead of re-raising in the test
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    problem(env.relay(tx, assignment["lease"]), "INTERNAL")
    nothing_sent(env, tx, "INTERNAL")  # before the commit point: REJECTED like any other refusal
