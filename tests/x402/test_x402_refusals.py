"""Malformed or forged x402 payments are refused with nothing co-signed: bad base64, a wrong version, a
tampered `accepted`, a quoteMac of the other environment, an expired quote, a payment transaction whose
receiver, amount, token or function differs from the quote, a missing payment id, a bad signature; then
the pauses (before any co-signature) and a verified payment that cannot settle (PAYMENT_FAILED)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from multiversx_sdk import Address
from purchase_kit import fund  # type: ignore[import-not-found]
from relay_kit import MASTER_SECRET, load_conftest  # type: ignore[import-not-found]
from test_prepare_refusals import eventually, pause  # type: ignore[import-not-found]
from x402.http.utils import decode_payment_signature_header, encode_payment_signature_header
from x402.schemas import PaymentPayload, PaymentRequired

from gasless.chain.abi import load_billing_abi
from gasless.chain.calls import contract_call
from gasless.chain.codec import tx_from_wire, tx_to_wire
from gasless.client.keys import UserKey
from gasless.client.x402 import pay_header, read_challenge, read_settlement
from gasless.core.crypto import PurposeKeys
from gasless.core.errors import CATALOGUE
from gasless.purchases.quotes import QuoteSigner
from gasless.x402.challenges import PaymentTerms, X402Challenges

relay_env = load_conftest("relay")
TOPUP = "/v1/x402/topup"


def challenge(env: Any, body: dict[str, Any], path: str = TOPUP) -> PaymentRequired:
    answer = env.client.post(path, json=body)
    assert answer.status_code == 402, answer.text
    return read_challenge(answer.headers)


def funded_payer(env: Any, usdc: int = 30_000_000) -> tuple[Any, dict[str, Any]]:
    payer = env.new_sender(plan=False)
    fund(env, payer.address, usdc_micro=usdc)
    return payer, {"payer": payer.address, "amountMicroUsdc": 10_000_000}


def check_nothing_cosigned(env: Any, payer: Any, payment_id: str | None = None) -> None:
    """No intent of the payer, its nonce and pool untouched, no payment record."""
    assert env.client.get(f"/v1/relay/{payer.address}:0").status_code == 404
    assert relay_env.chain_nonce(env, payer.address) == 0
    assert relay_env.pool_hashes(env, payer.address) == set()
    if payment_id is not None:
        assert env.client.get(f"/v1/x402/payments/{payment_id}").status_code == 404


def refused(
    env: Any, body: dict[str, Any], header: str, code: str, status: int = 402, path: str = TOPUP
) -> dict[str, Any]:
    answer = env.client.post(path, json=body, headers={"PAYMENT-SIGNATURE": header})
    assert answer.status_code == status, answer.text
    problem = relay_env.check_problem(answer, code)
    return problem  # type: ignore[no-any-return]


def re_signed(payer: Any, unsigned: dict[str, Any], **changes: Any) -> dict[str, Any]:
    tx = tx_from_wire({**unsigned, "signature": "00" * 64})
    for name, value in changes.items():
        setattr(tx, name, value)
    UserKey(payer.key).sign_transaction(tx)
    return tx_to_wire(tx)


def call_data(env: Any, payer: str, function: str, args: list[Any], token: str | None, amount: int) -> bytes:
    tx = contract_call(
        abi=load_billing_abi(),
        chain_id=env.settings.network.chain_id,
        sender=Address.new_from_bech32(payer),
        contract=Address.new_from_bech32(env.contract),
        function=function,
        arguments=args,
        gas_limit=10_000_000,
        nonce=0,
        payment_token=token,
        payment_amount=amount,
    )
    return bytes(tx.data)


def header_with(required: PaymentRequired, payer: Any, edit: Callable[[dict[str, Any]], None]) -> str:
    """A paid header whose decoded JSON was edited (after signing the real payment transaction)."""
    header, _ = pay_header(required, UserKey(payer.key), payment_id="pay_edit_0123456789abcdef")
    document = json.loads(base64.b64decode(header))
    edit(document)
    return base64.b64encode(json.dumps(document).encode()).decode()


def test_unreadable_headers_are_payment_invalid(env: Any) -> None:
    payer, body = funded_payer(env)
    challenge(env, body)
    for header, reason in (
        ("not base64 at all!", "malformed_header"),
        (base64.b64encode(b"{not json").decode(), "malformed_header"),
        (base64.b64encode(b'{"x402Version": 2}').decode(), "malformed_header"),
    ):
        problem = refused(env, body, header, "PAYMENT_INVALID")
        assert problem["details"]["reason"] == reason, problem
    check_nothing_cosigned(env, payer)


@pytest.mark.parametrize("version", [1, 3])
def test_another_x402_version_is_refused(env: Any, version: int) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)

    def edit(document: dict[str, Any]) -> None:
        document["x402Version"] = version

    problem = refused(env, body, header_with(required, payer, edit), "PAYMENT_INVALID")
    assert problem["details"]["reason"] in ("unsupported_version", "malformed_header")
    check_nothing_cosigned(env, payer, "pay_edit_0123456789abcdef")


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("amount", "1"),
        ("payTo", "erd1qqqqqqqqqqqqqpgqfzydqmdw7m2vazsp6u5p95yxz76t2p9rd8ss0zp9ts"),
        ("asset", "USDC-c76f1f"),
        ("network", "mvx:1"),
        ("extra.payer", "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"),
        ("extra.bucket", 1),
        ("extra.kind", "purchase"),
    ],
)
def test_a_tampered_accepted_entry_does_not_verify(env: Any, member: str, value: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)

    def edit(document: dict[str, Any]) -> None:
        target = document["accepted"]
        *path, last = member.split(".")
        for part in path:
            target = target[part]
        target[last] = value

    problem = refused(env, body, header_with(required, payer, edit), "PAYMENT_INVALID")
    assert problem["details"]["reason"] in ("accepted_tampered", "wrong_network"), problem
    check_nothing_cosigned(env, payer, "pay_edit_0123456789abcdef")


def _foreign_challenges(
    env: Any, *, env_name: str | None = None, clock: Callable[[], float] = time.time
) -> X402Challenges:
    served = env.client.app.state.host.x402.challenges
    keys = served.quotes.keys
    other = PurposeKeys(MASTER_SECRET.encode(), env_name or keys.env, keys.chain_id)
    return X402Challenges(
        QuoteSigner(other, clock=clock),
        chain_id=served.chain_id,
        contract=served.contract,
        payment_token=served.asset,
        base_url=served.base_url,
        clock=clock,
    )


def _requote(env: Any, required: PaymentRequired, challenges: X402Challenges) -> PaymentRequired:
    """The same challenge with its quote re-minted by `challenges` (the transaction template kept)."""
    entry = required.accepts[0]
    terms = PaymentTerms("topup", entry.extra["payer"], entry.extra["beneficiary"], int(entry.amount))
    quote = challenges.sign(terms)
    template = {k: entry.extra[k] for k in ("function", "transaction", "lease", "relayer")}
    requirement = challenges.requirement(terms, quote, template=template)
    return challenges.payment_required("topup", requirement, "test")


def test_a_quote_mac_of_the_other_environment_does_not_verify(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)
    served_env = env.client.app.state.host.x402.challenges.quotes.keys.env
    other_env = "live" if served_env == "test" else "test"
    forged = _requote(env, required, _foreign_challenges(env, env_name=other_env))
    header, payment_id = pay_header(forged, UserKey(payer.key))
    problem = refused(env, body, header, "PAYMENT_INVALID")
    assert problem["details"]["reason"] == "accepted_tampered"
    check_nothing_cosigned(env, payer, payment_id)


def test_a_challenge_never_allows_more_than_the_quote_validity(env: Any) -> None:
    """`maxTimeoutSeconds` follows the quote's real end: at most 120 s (the interface contract's quote validity)."""
    _, body = funded_payer(env)
    required = challenge(env, body)
    for entry in required.accepts:
        assert 110 <= entry.max_timeout_seconds <= 120, entry


def test_an_expired_quote_is_quote_expired(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)
    long_ago = time.time() - 600
    stale = _requote(env, required, _foreign_challenges(env, clock=lambda: long_ago))
    header, payment_id = pay_header(stale, UserKey(payer.key))
    problem = refused(env, body, header, "QUOTE_EXPIRED", status=409)
    assert problem["details"]["expiresAtMs"] < int(time.time() * 1000)
    check_nothing_cosigned(env, payer, payment_id)


def test_a_payment_transaction_other_than_the_quoted_one_is_refused(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)
    unsigned = required.accepts[0].extra["transaction"]
    token = env.settings.network.payment_token
    stranger = env.new_sender(plan=False).address
    variants = {
        "receiver": re_signed(payer, unsigned, receiver=Address.new_from_bech32(stranger)),
        "amount": re_signed(
            payer, unsigned, data=call_data(env, payer.address, "deposit", [], token, 1_000_000)
        ),
        "token": re_signed(
            payer, unsigned, data=call_data(env, payer.address, "deposit", [], "WEGLD-bd4d79", 10_000_000)
        ),
        "function": re_signed(
            payer,
            unsigned,
            data=call_data(
                env, payer.address, "depositFor", [Address.new_from_bech32(stranger)], token, 10_000_000
            ),
        ),
        "value": re_signed(payer, unsigned, value=1),
    }
    for name, wire in variants.items():
        header, payment_id = pay_header(required, UserKey(payer.key), transaction=wire)
        problem = refused(env, body, header, "PAYMENT_INVALID")
        assert problem["details"]["reason"] == "transaction_mismatch", (name, problem)
        check_nothing_cosigned(env, payer, payment_id)
    # Signed by someone else: not the payer's payment.
    wire = re_signed(payer, unsigned)
    wire["signature"] = "11" * 64
    header, payment_id = pay_header(required, UserKey(payer.key), transaction=wire)
    assert refused(env, body, header, "PAYMENT_INVALID")["details"]["reason"] == "signature_invalid"
    check_nothing_cosigned(env, payer, payment_id)


def test_the_payment_id_and_the_request_must_match(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)

    def drop_id(document: dict[str, Any]) -> None:
        document["extensions"]["payment-identifier"]["info"].pop("id")

    problem = refused(env, body, header_with(required, payer, drop_id), "PAYMENT_INVALID")
    assert problem["details"]["reason"] == "payment_id_missing"
    # The id where the interface contract writes it (`.id`) is accepted as well as x402's `.info.id`.
    header, _ = pay_header(required, UserKey(payer.key), payment_id="pay_id_place_0123456789")
    document = decode_payment_signature_header(header)
    assert isinstance(document, PaymentPayload) and document.extensions is not None
    document.extensions["payment-identifier"] = {"id": "pay_id_place_0123456789"}
    other = refused(
        env,
        {**body, "amountMicroUsdc": 99_000_000},
        encode_payment_signature_header(document),
        "PAYMENT_INVALID",
    )
    assert other["details"]["reason"] == "request_mismatch"
    check_nothing_cosigned(env, payer, "pay_id_place_0123456789")
    paid = env.client.post(
        TOPUP, json=body, headers={"PAYMENT-SIGNATURE": encode_payment_signature_header(document)}
    )
    assert paid.status_code == 200, paid.text
    assert paid.json()["paymentId"] == "pay_id_place_0123456789"


def test_pauses_are_answered_before_any_cosignature(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)
    header, payment_id = pay_header(required, UserKey(payer.key))
    paid = lambda: env.client.post(TOPUP, json=body, headers={"PAYMENT-SIGNATURE": header})  # noqa: E731
    try:
        pause(env, venue=True)
        relay_env.check_problem(eventually(paid, 503), "SWAP_VENUE_PAUSED")
        check_nothing_cosigned(env, payer, payment_id)
        pause(env, venue=False, contract={"paused": True})
        relay_env.check_problem(eventually(paid, 503), "CONTRACT_PAUSED")
        check_nothing_cosigned(env, payer, payment_id)
        # The challenge itself is refused while paused: nothing to sign.
        relay_env.check_problem(env.client.post(TOPUP, json=body), "CONTRACT_PAUSED")
    finally:
        pause(env, venue=False, contract={"paused": False})
    assert eventually(paid, 200).status_code == 200


def test_a_verified_payment_that_cannot_settle_is_payment_failed(env: Any) -> None:
    payer, body = funded_payer(env)
    required = challenge(env, body)
    # Between the challenge and the payment, the payer uses the quoted nonce for a transfer of its own.
    env.owner("grant", [Address.new_from_bech32(payer.address), 3, 1])
    assignment = env.assign(payer)
    transfer = env.relay(env.build(payer, assignment), assignment["lease"])
    assert transfer.status_code in (200, 202), transfer.text
    env.wait_state(transfer.json()["txHash"], ("EXECUTED", "FINALIZED"))
    header, payment_id = pay_header(required, UserKey(payer.key))
    answer = env.client.post(TOPUP, json=body, headers={"PAYMENT-SIGNATURE": header})
    problem = relay_env.check_problem(answer, "PAYMENT_FAILED")
    reason = problem["details"]["reason"]
    assert reason in CATALOGUE and not CATALOGUE[reason].retryable, problem
    settlement = read_settlement(answer.headers)
    assert settlement.success is False and settlement.transaction == "" and settlement.payer == payer.address
    # The failure is the payment's stored answer, on replay and by polling; the payment never left.
    again = env.client.post(TOPUP, json=body, headers={"PAYMENT-SIGNATURE": header})
    assert again.status_code == 402 and again.json()["code"] == "PAYMENT_FAILED"
    polled = env.client.get(f"/v1/x402/payments/{payment_id}")
    assert polled.status_code == 402 and polled.json()["code"] == "PAYMENT_FAILED"
    assert read_settlement(polled.headers).success is False
    assert relay_env.chain_nonce(env, payer.address) == 1


@pytest.mark.parametrize("simulate", ["contract_calls", "never"])
def test_a_payment_reverted_by_the_contract_is_payment_failed(make_env: Any, simulate: str) -> None:
    """Refused by simulation, or (simulation off) co-signed, sent and reverted on chain: the node reads the
    reverted call `success`, the tracker's outcome from process-status is `fail`, so the payment fails with
    `reason: reverted` instead of waiting for an event that never comes."""
    env = make_env(simulate=simulate)
    payer, body = funded_payer(env)
    required = challenge(env, body)
    bounds = env.client.get("/v1/pricing").json()["deposit"]
    env.owner(
        "setDepositBounds", [int(bounds["minMicroUsdc"]), 5_000_000]
    )  # the quoted 10 USDC is too much now
    header, payment_id = pay_header(required, UserKey(payer.key))
    answer = env.client.post(TOPUP, json=body, headers={"PAYMENT-SIGNATURE": header})
    problem = relay_env.check_problem(answer, "PAYMENT_FAILED")
    expected = "SIMULATION_FAILED" if simulate == "contract_calls" else "reverted"
    assert problem["details"]["reason"] == expected, problem
    assert read_settlement(answer.headers).success is False
    polled = env.client.get(f"/v1/x402/payments/{payment_id}")
    assert polled.status_code == 402 and polled.json()["details"]["reason"] == problem["details"]["reason"]
