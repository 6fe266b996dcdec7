"""An API key revoked (DELETE through HTTP) while a relay it pays for is in flight, on a real localnet:
the in-flight relay still executes, settles and bills the key's account (`apiKeyId` on the ledger row);
the next relay with the key is refused with API_KEY_INVALID and nothing is reserved for it."""

from __future__ import annotations

from typing import Any

from billing_paths_kit import addr, reservation_rows, wait_ledger


def test_revoked_key_settles_its_in_flight_relay(env: Any, auth: Any) -> None:
    sponsor = env.new_sender(plan=False)
    env.owner("grant", [addr(sponsor), 2, 1])  # Builder: may sponsor other senders
    key = auth.create_key(sponsor)
    stranger = env.new_sender(plan=False)
    headers = {"X-Api-Key": key["secret"]}
    env.faults(chain={"stalledShards": [1]})  # the sponsored relay stays in flight
    try:
        assignment = env.assign(stranger)
        response = env.relay(env.build(stranger, assignment), assignment["lease"], headers=headers)
        assert response.status_code in (200, 202), response.text
        assert response.json()["billing"] == {
            "authMode": "api_key",
            "billingClass": "sponsor",
            "account": sponsor.address,
            "ru": 1,
            "free": False,
        }
        stranger.nonce += 1
        in_flight = response.json()
        revoked = env.client.delete(
            f"/v1/account/{sponsor.address}/keys/{key['keyId']}", headers=auth.bearer(sponsor)
        )
        assert revoked.status_code == 204, revoked.text
        (held,) = reservation_rows(env)
        assert held.state == "reserved" and held.api_key_id == key["keyId"]  # revocation leaves it alone

        refused = env.relay(env.build(stranger, assignment), assignment["lease"], headers=headers)
        assert refused.status_code == 401, refused.text
        body = refused.json()
        assert body["code"] == "API_KEY_INVALID" and body["status"] == 401 and body["retryable"] is False
        assert refused.headers["content-type"].startswith("application/problem+json")
    finally:
        env.faults(chain={"stalledShards": []})

    env.wait_state(in_flight["txHash"], ("EXECUTED", "FINALIZED"))
    row = wait_ledger(env, [in_flight["txHash"]])[in_flight["txHash"]]
    assert row.billed and row.status == "success" and row.billing_class == "sponsor" and row.ru == 1
    assert row.account == sponsor.address and row.sender == stranger.address
    assert row.api_key_id == key["keyId"]
    (settled,) = reservation_rows(env)  # the refused relay reserved nothing
    assert settled.state == "settled" and settled.intent_pk == row.intent_pk
    usage = env.client.get(f"/v1/usage/{in_flight['txHash']}", headers=auth.bearer(sponsor))
    assert usage.status_code == 200, usage.text
    assert usage.json()["apiKeyId"] == key["keyId"] and usage.json()["billed"] is True
