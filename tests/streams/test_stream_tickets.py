"""Stream tickets and the refusals of `GET /v1/stream` (none of these opens a stream: TestClient)."""

from __future__ import annotations

import time
from typing import Any

from gasless.core.crypto import PurposeKeys
from gasless.streams.tickets import LocalUsedTickets, StreamTickets

ALL_TOPICS = ["intents", "quota", "account", "notices", "incidents", "pricing"]


def _ticket(env: Any, headers: dict[str, str], **body: Any) -> Any:
    return env.client.post("/v1/stream/tickets", json=body, headers=headers)


def test_ticket_is_issued_to_the_owner_a_sender_and_a_read_key(env: Any, auth: Any) -> None:
    account, sender = auth.account(), auth.stranger()
    auth.add_sender(account, sender)
    before = int(time.time() * 1000)
    owner = _ticket(env, auth.bearer(account), account=account.address)
    assert owner.status_code == 201, owner.text
    doc = owner.json()
    assert doc["account"] == account.address and doc["topics"] == ALL_TOPICS
    assert doc["ticket"].startswith("st1.") and owner.headers["Cache-Control"] == "no-store"
    assert before + 30_000 <= doc["expiresAtMs"] <= int(time.time() * 1000) + 30_000
    by_sender = _ticket(env, auth.bearer(sender), account=account.address, topics=["intents", "quota"])
    assert by_sender.status_code == 201 and by_sender.json()["topics"] == ["intents", "quota"]
    key = auth.create_key(account, policy={"scopes": ["read"]})["secret"]
    by_key = _ticket(env, {"X-Api-Key": key}, account=account.address)
    assert by_key.status_code == 201, by_key.text
    assert len({owner.json()["ticket"], by_sender.json()["ticket"], by_key.json()["ticket"]}) == 3


def test_ticket_refusals(env: Any, auth: Any, platform_problem: Any, problem: Any) -> None:
    account, stranger = auth.account(), auth.stranger()
    platform_problem(_ticket(env, {}, account=account.address), "UNAUTHENTICATED")
    platform_problem(
        _ticket(env, auth.bearer(stranger), account=account.address), "FORBIDDEN", {"role": None}
    )
    relay_only = auth.create_key(account, policy={"scopes": ["relay"]})["secret"]
    platform_problem(
        _ticket(env, {"X-Api-Key": relay_only}, account=account.address),
        "API_KEY_SCOPE",
        {"requiredScope": "read", "keyScopes": ["relay"]},
    )
    bad_topic = problem(
        _ticket(env, auth.bearer(account), account=account.address, topics=["x"]), "MALFORMED_REQUEST"
    )
    assert bad_topic["details"]["field"].startswith("topics")
    bad_account = problem(_ticket(env, auth.bearer(account), account="erd1nope"), "MALFORMED_REQUEST")
    assert bad_account["details"] == {"field": "account"}


def test_stream_refusals_before_any_event(env: Any, auth: Any, platform_problem: Any, problem: Any) -> None:
    account, stranger = auth.account(), auth.stranger()
    params = {"account": account.address}
    platform_problem(env.client.get("/v1/stream", params=params), "UNAUTHENTICATED")
    platform_problem(
        env.client.get("/v1/stream", params=params, headers=auth.bearer(stranger)),
        "FORBIDDEN",
        {"role": None},
    )
    unknown = problem(
        env.client.get(
            "/v1/stream", params={**params, "topics": "intents,weather"}, headers=auth.bearer(account)
        ),
        "MALFORMED_REQUEST",
    )
    assert unknown["details"] == {"field": "topics"} and "weather" in unknown["detail"]
    missing = problem(env.client.get("/v1/stream", headers=auth.bearer(account)), "MALFORMED_REQUEST")
    assert missing["details"] == {"field": "account"}
    # Credentials first: without one (or with a forged one) the missing account is not what is said.
    platform_problem(env.client.get("/v1/stream", params={"topics": "intents"}), "UNAUTHENTICATED")
    forged = {"Authorization": "Bearer not-a-native-auth-token"}
    assert env.client.get("/v1/stream", headers=forged).status_code == 401
    # A native-auth token is never accepted in the URL, whatever else is sent.
    in_url = env.client.get("/v1/stream", params={**params, "access_token": auth.token(account)})
    platform_problem(in_url, "TOKEN_INVALID", {"reason": "token_in_url"})
    ticket = _ticket(env, auth.bearer(account), account=account.address).json()["ticket"]
    in_url = env.client.get("/v1/stream", params={"ticket": ticket, "token": auth.token(account)})
    platform_problem(in_url, "TOKEN_INVALID", {"reason": "token_in_url"})


def test_bad_tampered_expired_and_foreign_tickets(env: Any, auth: Any, ticket_invalid: Any) -> None:
    account = auth.account()
    doc = _ticket(env, auth.bearer(account), account=account.address, topics=["intents"]).json()
    ticket = doc["ticket"]

    def opened(value: str, **params: str) -> Any:
        return env.client.get("/v1/stream", params={"ticket": value, **params})

    ticket_invalid(opened("nonsense"), "malformed")
    ticket_invalid(opened("st1.e30"), "malformed")
    prefix, payload, tag = ticket.split(".")
    # Any change to the payload (say, another account or more topics) breaks the MAC.
    flipped = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1]
    ticket_invalid(opened(f"{prefix}.{flipped}.{tag}"), "signature")
    ticket_invalid(opened(f"{prefix}.{payload}.{tag[::-1]}"), "signature")
    # Minted with this deployment's master secret for another environment, or another chain: refused.
    chain_id = env.settings.network.chain_id
    secret = env.settings.master_secret.get_secret_value().encode()
    for other in (PurposeKeys(secret, "live", chain_id), PurposeKeys(secret, "test", "1")):
        foreign, _ = StreamTickets(other, LocalUsedTickets()).issue(
            account.address, ("intents",), account.address, "owner"
        )
        ticket_invalid(opened(foreign), "signature")
    # Expired: the host's ticket clock moved past the 30 000 ms lifetime (the ticket is still unused).
    tickets = env.client.app.state.host.streams.tickets
    real_clock = tickets.clock
    tickets.clock = lambda: real_clock() + 30_000
    try:
        body = ticket_invalid(opened(ticket), "expired")
        assert "30000 ms" in body["detail"]
    finally:
        tickets.clock = real_clock
    # A ticket narrows what it opens: no other topics, no other account.
    other = auth.account()
    refused = env.client.get("/v1/stream", params={"ticket": ticket, "topics": "quota"})
    assert refused.status_code == 400 and refused.json()["details"] == {"field": "topics"}
    refused = env.client.get("/v1/stream", params={"ticket": ticket, "account": other.address})
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
