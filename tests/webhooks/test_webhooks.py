"""Webhooks through HTTP: real native-auth owners, a real local receiver verifying signatures with the
shipped verifier, relays on the localnet producing intent events, SSRF refusals, rotation, retries,
restart survival, and the Idempotency-Key layer."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import webhook_kit

from gasless.webhooks import SIGNATURE_HEADER, verify_signature

# Fixtures (see webhook_kit).
env = webhook_kit.env
make_env = webhook_kit.make_env
unpaused_localnet = webhook_kit.unpaused_localnet
auth_for = webhook_kit.auth_for
receiver = webhook_kit.receiver
local_env = webhook_kit.local_env
auth = webhook_kit.auth
start_local_env = webhook_kit.start_local_env

HOUR_MS = 3_600_000


def _path(account: Any, webhook_id: str | None = None, tail: str = "") -> str:
    path = f"/v1/account/{account.address}/webhooks"
    return path + (f"/{webhook_id}" if webhook_id else "") + tail


def _create(env: Any, auth: Any, account: Any, url: str, **body: Any) -> dict[str, Any]:
    response = env.client.post(_path(account), json={"url": url, **body}, headers=auth.bearer(account))
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def _signature_values(header: str) -> tuple[int, list[str]]:
    parts = [part.split("=", 1) for part in header.split(",")]
    return int(dict(parts)["t"]), [value for name, value in parts if name == "v1"]


def _verified(secret: str, received: Any) -> bool:
    header = received.headers[SIGNATURE_HEADER]
    return verify_signature(secret, header, received.body, 300_000)


def test_webhook_lifecycle_and_signed_test_delivery(local_env: Any, auth: Any, receiver: Any) -> None:
    env = local_env
    account = auth.account()
    owner = auth.bearer(account)

    created = _create(env, auth, account, receiver.url, eventTypes=["intent.finalized"], description="ci")
    secret = created["secret"]
    assert secret.startswith("whsec_") and created["webhookId"].startswith("wh_")
    assert created["eventTypes"] == ["intent.finalized"] and created["enabled"] is True
    webhook = {k: v for k, v in created.items() if k != "secret"}

    listed = env.client.get(_path(account), headers=owner)
    assert listed.status_code == 200 and listed.headers["Cache-Control"] == "no-store"
    assert listed.json() == {"items": [webhook]}
    assert env.client.get(_path(account, created["webhookId"]), headers=owner).json() == webhook

    patched = env.client.patch(
        _path(account, created["webhookId"]),
        json={"eventTypes": ["intent.dead", "intent.executed"]},
        headers=owner,
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["eventTypes"] == ["intent.executed", "intent.dead"]

    # The test route sends a signed webhook.test event now and reports the delivery.
    tested = env.client.post(_path(account, created["webhookId"], "/test"), headers=owner)
    assert tested.status_code == 200, tested.text
    delivery = tested.json()
    assert delivery["status"] == "succeeded" and delivery["attempts"] == 1 and delivery["responseCode"] == 200
    assert delivery["eventType"] == "webhook.test" and delivery["latencyMs"] >= 0
    (received,) = receiver.wait(1)
    assert _verified(secret, received)
    assert not verify_signature("whsec_other", received.headers[SIGNATURE_HEADER], received.body, 300_000)
    assert not verify_signature(secret, received.headers[SIGNATURE_HEADER], received.body + b" ", 300_000)
    event = json.loads(received.body)
    assert event["type"] == "webhook.test" and event["id"] == delivery["eventId"]
    assert received.headers["Gasless-Event-Id"] == delivery["eventId"]
    assert received.headers["Gasless-Delivery-Id"] == delivery["deliveryId"]
    assert received.headers["Gasless-Attempt"] == "1"
    # A replayed old delivery is refused by the verifier's tolerance.
    t, _ = _signature_values(received.headers[SIGNATURE_HEADER])
    assert not verify_signature(
        secret, received.headers[SIGNATURE_HEADER], received.body, 1_000, now_ms=t + 5_000
    )

    page = env.client.get(_path(account, created["webhookId"], "/deliveries"), headers=owner)
    assert page.status_code == 200 and page.json() == {"items": [delivery], "nextCursor": None}

    deleted = env.client.delete(_path(account, created["webhookId"]), headers=owner)
    assert deleted.status_code == 204
    for method, tail in (
        ("get", ""),
        ("delete", ""),
        ("post", "/test"),
        ("post", "/rotate-secret"),
        ("get", "/deliveries"),
    ):
        gone = getattr(env.client, method)(_path(account, created["webhookId"], tail), headers=owner)
        assert gone.status_code == 404 and gone.json()["code"] == "NOT_FOUND", (method, tail, gone.text)


def test_deliveries_listing_pages_newest_first(local_env: Any, auth: Any, receiver: Any) -> None:
    account = auth.account()
    owner = auth.bearer(account)
    webhook = _create(local_env, auth, account, receiver.url)
    ids = []
    for _ in range(3):
        sent = local_env.client.post(_path(account, webhook["webhookId"], "/test"), headers=owner)
        ids.append(sent.json()["deliveryId"])
    first = local_env.client.get(
        _path(account, webhook["webhookId"], "/deliveries?limit=2"), headers=owner
    ).json()
    assert len(first["items"]) == 2 and first["nextCursor"]
    rest = local_env.client.get(
        _path(account, webhook["webhookId"], f"/deliveries?limit=2&cursor={first['nextCursor']}"),
        headers=owner,
    ).json()
    listed = [d["deliveryId"] for d in first["items"] + rest["items"]]
    assert sorted(listed) == sorted(ids) and rest["nextCursor"] is None
    created = [d["createdMs"] for d in first["items"] + rest["items"]]
    assert created == sorted(created, reverse=True)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/x", "scheme"),
        ("https://hooks.example.com:8443/x", "port"),
        ("https://127.0.0.1/x", "private_address"),
        ("https://10.1.2.3/x", "private_address"),
        ("https://[::1]/x", "private_address"),
        ("https://100.64.0.1/x", "private_address"),
        ("https://169.254.169.254/latest", "private_address"),
        ("https://[::ffff:127.0.0.1]/x", "private_address"),
        ("https://[fd00::1]/x", "private_address"),
        ("https://localhost/x", "localhost"),
        ("https://user:pw@hooks.example.com/x", "userinfo"),
        ("ftp://hooks.example.com/x", "scheme"),
    ],
)
def test_webhook_url_not_allowed(env: Any, auth_for: Any, url: str, reason: str) -> None:
    auth = auth_for(env)
    account = auth.account()
    response = env.client.post(_path(account), json={"url": url}, headers=auth.bearer(account))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "WEBHOOK_URL_NOT_ALLOWED" and body["details"] == {"reason": reason}


def test_hostname_resolving_to_loopback_is_refused_at_registration_and_at_connect(
    env: Any, auth_for: Any
) -> None:
    """Default settings (no local receivers). Name resolution is injected: the suite has no public DNS."""
    auth = auth_for(env)
    account = auth.account()
    owner = auth.bearer(account)
    policy = env.client.app.state.host.webhooks.policy
    answers: dict[str, list[str]] = {
        "hooks.example.com": ["93.184.216.34"],
        "rebind.example.com": ["127.0.0.1"],
    }
    lookups: list[str] = []

    async def lookup(host: str, port: int) -> list[str]:
        lookups.append(host)
        return answers[host]

    policy.lookup = lookup
    refused = env.client.post(_path(account), json={"url": "https://rebind.example.com/h"}, headers=owner)
    assert refused.status_code == 422 and refused.json()["details"] == {"reason": "private_address"}

    webhook = _create(env, auth, account, "https://hooks.example.com/h")
    # DNS rebinding: the name now points at loopback. The connection is never made to it.
    answers["hooks.example.com"] = ["127.0.0.1"]
    tested = env.client.post(_path(account, webhook["webhookId"], "/test"), headers=owner).json()
    assert tested["status"] == "failed" and tested["responseCode"] is None
    assert tested["error"] == "target refused: private_address"

    # Rebinding between the pre-check and the connect: the connector's resolver refuses it too.
    flips = iter([["93.184.216.34"], ["127.0.0.1"]])

    async def flipping(host: str, port: int) -> list[str]:
        return next(flips)

    policy.lookup = flipping
    tested = env.client.post(_path(account, webhook["webhookId"], "/test"), headers=owner).json()
    assert tested["status"] == "failed" and tested["responseCode"] is None
    assert tested["error"] == "target refused: private_address", tested


def test_limit_reached_at_eleven_and_forbidden_for_a_sender(local_env: Any, auth: Any, receiver: Any) -> None:
    account = auth.account()
    for _ in range(10):
        _create(local_env, auth, account, receiver.url)
    eleventh = local_env.client.post(_path(account), json={"url": receiver.url}, headers=auth.bearer(account))
    assert eleventh.status_code == 409 and eleventh.json()["code"] == "LIMIT_REACHED"
    assert eleventh.json()["details"] == {"limit": 10, "resource": "webhooks"}

    sender = auth.stranger()
    auth.add_sender(account, sender)
    as_sender = auth.bearer(sender)
    webhook_id = local_env.client.get(_path(account), headers=as_sender).json()["items"][0]["webhookId"]
    for method, tail, body in (
        ("post", "", {"url": receiver.url}),
        ("patch", f"/{webhook_id}", {"enabled": False}),
        ("delete", f"/{webhook_id}", None),
        ("post", f"/{webhook_id}/test", None),
        ("post", f"/{webhook_id}/rotate-secret", None),
    ):
        kwargs: dict[str, Any] = {"headers": as_sender}
        if body is not None:
            kwargs["json"] = body
        response = local_env.client.request(method.upper(), _path(account) + tail, **kwargs)
        assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN", (method, tail)
    assert (
        local_env.client.get(_path(account, webhook_id, "/deliveries"), headers=as_sender).status_code == 200
    )
    unauthenticated = local_env.client.get(_path(account))
    assert unauthenticated.status_code == 401


def test_relay_produces_intent_events_with_retries(local_env: Any, auth: Any, receiver: Any) -> None:
    env = local_env
    account = auth.account()
    owner = auth.bearer(account)
    webhook = _create(env, auth, account, receiver.url, eventTypes=["intent.executed", "intent.finalized"])
    receiver.statuses = [500, 500]  # the first two requests fail; the worker retries

    assignment = env.assign(account)
    tx = env.build(account, assignment)
    relayed = env.relay(tx, assignment["lease"])
    assert relayed.status_code in (200, 202), relayed.text
    tx_hash = relayed.json()["txHash"]
    env.wait_state(relayed.json()["id"], ("FINALIZED",))

    got = receiver.wait(4, timeout=20)
    events = [json.loads(r.body) for r in got]
    assert all(_verified(webhook["secret"], r) for r in got)
    ok = {e["type"] for e, r in zip(events, got, strict=True)}
    assert ok == {"intent.executed", "intent.finalized"}
    for e in events:
        assert e["data"]["intent"]["txHash"] == tx_hash and e["account"] == account.address
    # Deliveries: both succeeded; the first one took three attempts (two 500s), same event id each time.
    deliveries = env.client.get(_path(account, webhook["webhookId"], "/deliveries"), headers=owner).json()[
        "items"
    ]
    assert {d["status"] for d in deliveries} == {"succeeded"} and len(deliveries) == 2
    assert sorted(d["attempts"] for d in deliveries) in ([1, 3], [2, 2])
    first_id = got[0].headers["Gasless-Event-Id"]
    attempts_of_first = [
        r.headers["Gasless-Attempt"] for r in got if r.headers["Gasless-Event-Id"] == first_id
    ]
    assert attempts_of_first == [str(n) for n in range(1, len(attempts_of_first) + 1)]


def test_rotation_signs_with_both_secrets_during_the_overlap(
    local_env: Any, auth: Any, receiver: Any
) -> None:
    env = local_env
    account = auth.account()
    owner = auth.bearer(account)
    webhook = _create(env, auth, account, receiver.url)
    rotated = env.client.post(_path(account, webhook["webhookId"], "/rotate-secret"), headers=owner)
    assert rotated.status_code == 200, rotated.text
    new_secret = rotated.json()["secret"]
    assert new_secret != webhook["secret"] and rotated.json()["previousSecretExpiresMs"] is not None

    env.client.post(_path(account, webhook["webhookId"], "/test"), headers=owner)
    (during,) = receiver.wait(1)
    _, values = _signature_values(during.headers[SIGNATURE_HEADER])
    assert len(values) == 2
    assert _verified(new_secret, during) and _verified(webhook["secret"], during)

    # An injected clock past the overlap: only the new secret signs.
    service = env.client.app.state.host.webhooks
    expires = rotated.json()["previousSecretExpiresMs"]
    service.clock = lambda: expires + 1
    env.client.post(_path(account, webhook["webhookId"], "/test"), headers=owner)
    after = receiver.wait(2)[1]
    t, values = _signature_values(after.headers[SIGNATURE_HEADER])
    assert len(values) == 1 and t == expires + 1
    assert verify_signature(new_secret, after.headers[SIGNATURE_HEADER], after.body, 1_000, now_ms=t)
    assert not verify_signature(
        webhook["secret"], after.headers[SIGNATURE_HEADER], after.body, 1_000, now_ms=t
    )


def test_outbox_survives_a_restart(start_local_env: Any, auth_for: Any, receiver: Any) -> None:
    first = start_local_env()
    env = next(first)
    auth = auth_for(env)
    account = auth.account()
    owner = auth.bearer(account)
    webhook = _create(env, auth, account, receiver.url, eventTypes=["intent.finalized"])
    host = env.client.app.state.host
    env.client.portal.call(host.webhook_dispatcher.stop)  # this host records events but sends nothing
    assignment = env.assign(account)
    relayed = env.relay(env.build(account, assignment), assignment["lease"])
    env.wait_state(relayed.json()["id"], ("FINALIZED",))
    pending = _wait_deliveries(env, account, owner, webhook["webhookId"])
    assert [d["status"] for d in pending] == ["pending"] and receiver.received == []
    with pytest.raises(StopIteration):
        next(first)

    second = start_local_env()
    env = next(second)
    (received,) = receiver.wait(1)
    assert received.headers["Gasless-Event-Id"] == pending[0]["eventId"]
    assert _verified(webhook["secret"], received)
    with pytest.raises(StopIteration):
        next(second)


def _wait_deliveries(env: Any, account: Any, owner: dict[str, str], webhook_id: str) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        items = env.client.get(_path(account, webhook_id, "/deliveries"), headers=owner).json()["items"]
        if items:
            return items  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError("no delivery was recorded")


def test_idempotency_key_replay_reuse_and_malformed(local_env: Any, auth: Any, receiver: Any) -> None:
    env = local_env
    account = auth.account()
    headers = {**auth.bearer(account), "Idempotency-Key": "create-hook-0001-abcdef"}
    body = {"url": receiver.url, "eventTypes": ["intent.dead"]}
    first = env.client.post(_path(account), json=body, headers=headers)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    # Same key, same body (members reordered): the stored response, secret included, replayed.
    again = env.client.post(
        _path(account), json={"eventTypes": ["intent.dead"], "url": receiver.url}, headers=headers
    )
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert len(env.client.get(_path(account), headers=headers).json()["items"]) == 1
    # The stored response is sealed: the secret is nowhere in the database file in clear.
    raw = (env.settings.data_dir / "api.db").read_bytes()
    assert first.json()["secret"].encode() not in raw

    other = env.client.post(_path(account), json={**body, "enabled": False}, headers=headers)
    assert other.status_code == 422 and other.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
    # The same key on another operation is another record.
    webhook_id = first.json()["webhookId"]
    tested = env.client.post(_path(account, webhook_id, "/test"), headers=headers)
    assert tested.status_code == 200 and "Idempotent-Replayed" not in tested.headers
    replay = env.client.post(_path(account, webhook_id, "/test"), headers=headers)
    assert replay.json() == tested.json() and replay.headers["Idempotent-Replayed"] == "true"
    assert len(receiver.received) == 1  # the replay sent nothing

    for bad in ("short", "x" * 15, "x" * 129, "has a space in it!!"):
        response = env.client.post(_path(account), json=body, headers={**headers, "Idempotency-Key": bad})
        assert response.status_code == 400 and response.json()["code"] == "MALFORMED_REQUEST"
        assert response.json()["details"] == {"field": "Idempotency-Key"}


def test_idempotency_in_progress(local_env: Any, auth: Any, receiver: Any) -> None:
    env = local_env
    account = auth.account()
    webhook = _create(env, auth, account, receiver.url)
    headers = {**auth.bearer(account), "Idempotency-Key": "slow-test-delivery-0001"}
    receiver.delay_s = 2.0
    results: dict[str, Any] = {}

    def first_request() -> None:
        results["first"] = env.client.post(_path(account, webhook["webhookId"], "/test"), headers=headers)

    thread = threading.Thread(target=first_request)
    thread.start()
    receiver_started = _wait_until(lambda: _record_running(env))
    assert receiver_started
    second = env.client.post(_path(account, webhook["webhookId"], "/test"), headers=headers)
    thread.join(20)
    assert second.status_code == 409 and second.json()["code"] == "IDEMPOTENCY_IN_PROGRESS"
    assert second.headers["Retry-After"] == "1" and second.json()["retryable"] is True
    assert results["first"].status_code == 200
    third = env.client.post(_path(account, webhook["webhookId"], "/test"), headers=headers)
    assert third.json() == results["first"].json() and third.headers["Idempotent-Replayed"] == "true"


def _record_running(env: Any) -> bool:
    import sqlalchemy

    url = env.settings.effective_database_url.replace("sqlite+aiosqlite", "sqlite", 1)
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SELECT state FROM idempotency_keys")).all()
    finally:
        engine.dispose()
    return any(row[0] == "running" for row in rows)


def _wait_until(check: Any, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False
