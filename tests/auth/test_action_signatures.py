"""Per-action signatures on key creation: the route's own challenge, signed by the account's key
(CHALLENGE_INVALID, ACTION_SIGNATURE_INVALID), through HTTP with real native-auth tokens and Ed25519 keys."""

from __future__ import annotations

import json
import time
from typing import Any

from multiversx_sdk import UserSecretKey

from gasless.auth.actions import CHALLENGE_HEADER, SIGNATURE_HEADER, ActionSignatures, action_message
from gasless.client.actions import action_headers
from gasless.client.keys import UserKey
from gasless.core.crypto import PurposeKeys


def _attempt(env: Any, auth: Any, account: Any, raw: bytes, extra: dict[str, str] | None = None) -> Any:
    headers = {**auth.bearer(account), "Content-Type": "application/json", **(extra or {})}
    return env.client.post(f"/v1/account/{account.address}/keys", content=raw, headers=headers)


def _problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["status"] == status
    # Every refusal hands out a fresh challenge and the exact message to sign, so the client retries at once.
    assert set(body["details"]) == {"challenge", "message", "expiresAtMs"}
    assert body["details"]["expiresAtMs"] > time.time() * 1000
    return body


def test_unsigned_creation_gets_a_challenge_and_the_signed_retry_creates(env: Any, auth: Any) -> None:
    account = auth.account()
    raw = b'{"label": "ci"}'
    body = _problem(_attempt(env, auth, account, raw), 403, "ACTION_SIGNATURE_INVALID")
    details = body["details"]
    assert (
        details["message"]
        == action_message(
            env.settings.network.chain_id, account.address, "createApiKey", raw, details["challenge"]
        ).decode()
    )
    assert env.client.get(f"/v1/account/{account.address}/keys", headers=auth.bearer(account)).json() == {
        "items": []
    }
    signed = action_headers(UserKey(account.key), "createApiKey", raw, details)
    created = _attempt(env, auth, account, raw, signed)
    assert created.status_code == 201, created.text
    # Any JSON spelling of the same body signs the same message (RFC 8785 canonical form).
    respelled = json.dumps({"label": "ci"}, separators=(",", ":")).encode()
    again = _problem(_attempt(env, auth, account, respelled), 403, "ACTION_SIGNATURE_INVALID")
    signed = action_headers(UserKey(account.key), "createApiKey", raw, again["details"])
    assert _attempt(env, auth, account, respelled, signed).status_code == 201


def test_signature_by_another_key_or_over_another_body_is_refused(env: Any, auth: Any) -> None:
    account = auth.account()
    raw = b'{"label": "ci"}'
    details = _problem(_attempt(env, auth, account, raw), 403, "ACTION_SIGNATURE_INVALID")["details"]
    challenge = details["challenge"]
    intruder = UserSecretKey.generate()
    forged = intruder.sign(details["message"].encode()).hex()
    _problem(
        _attempt(env, auth, account, raw, {CHALLENGE_HEADER: challenge, SIGNATURE_HEADER: forged}),
        403,
        "ACTION_SIGNATURE_INVALID",
    )
    # The account's own signature, but over a body other than the one sent.
    other_body = action_message(
        env.settings.network.chain_id, account.address, "createApiKey", b'{"label": "x"}', challenge
    )
    mine = account.key.sign(other_body).hex()
    _problem(
        _attempt(env, auth, account, raw, {CHALLENGE_HEADER: challenge, SIGNATURE_HEADER: mine}),
        403,
        "ACTION_SIGNATURE_INVALID",
    )
    _problem(
        _attempt(env, auth, account, raw, {CHALLENGE_HEADER: challenge, SIGNATURE_HEADER: "zz"}),
        403,
        "ACTION_SIGNATURE_INVALID",
    )
    # Nothing was created by any of these.
    listed = env.client.get(f"/v1/account/{account.address}/keys", headers=auth.bearer(account)).json()
    assert listed == {"items": []}


def test_bad_challenges_are_challenge_invalid(env: Any, auth: Any) -> None:
    account, other = auth.account(), auth.account()
    raw = b'{"label": "ci"}'
    signer = UserKey(account.key)

    def signed_with(challenge: str) -> dict[str, str]:
        message = action_message(
            env.settings.network.chain_id, account.address, "createApiKey", raw, challenge
        )
        return {CHALLENGE_HEADER: challenge, SIGNATURE_HEADER: signer.sign(message).hex()}

    fresh = _problem(_attempt(env, auth, account, raw), 403, "ACTION_SIGNATURE_INVALID")["details"][
        "challenge"
    ]
    payload, tag = fresh.split(".")
    tampered = f"{payload}.{'A' if tag[0] != 'A' else 'B'}{tag[1:]}"
    for bad in (tampered, "not-a-challenge", "", "a.b.c", fresh + "="):
        body = _problem(_attempt(env, auth, account, raw, signed_with(bad)), 401, "CHALLENGE_INVALID")
        assert "malformed" in body["detail"] or "not issued" in body["detail"]
    # Issued for another account (properly signed by this account's key: still refused).
    theirs = _problem(_attempt(env, auth, other, raw), 403, "ACTION_SIGNATURE_INVALID")["details"][
        "challenge"
    ]
    body = _problem(_attempt(env, auth, account, raw, signed_with(theirs)), 401, "CHALLENGE_INVALID")
    assert "another account" in body["detail"]
    # Issued by another environment's keys.
    foreign = ActionSignatures(PurposeKeys(b"another-secret", "live", env.settings.network.chain_id))
    other_env = foreign.issue(account.address, "createApiKey", account.address).token
    _problem(_attempt(env, auth, account, raw, signed_with(other_env)), 401, "CHALLENGE_INVALID")
    # Single use: the second use of a challenge that already created a key is refused.
    assert _attempt(env, auth, account, raw, signed_with(fresh)).status_code == 201
    body = _problem(_attempt(env, auth, account, raw, signed_with(fresh)), 401, "CHALLENGE_INVALID")
    assert "already used" in body["detail"]


def test_expired_challenge_is_challenge_invalid(env: Any, auth: Any) -> None:
    account = auth.account()
    raw = b'{"label": "ci"}'
    details = _problem(_attempt(env, auth, account, raw), 403, "ACTION_SIGNATURE_INVALID")["details"]
    signed = action_headers(UserKey(account.key), "createApiKey", raw, details)
    actions = env.client.app.state.host.action_signatures
    actions.clock = lambda: time.time() + 121  # past the 120 000 ms validity
    try:
        body = _problem(_attempt(env, auth, account, raw, signed), 401, "CHALLENGE_INVALID")
    finally:
        actions.clock = time.time
    assert "expired" in body["detail"]
