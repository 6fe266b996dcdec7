"""The e-mail channel: pending until the link mailed to the address is opened; links are single use,
expire, and belong to one environment; an unverified address receives nothing but its link."""

from __future__ import annotations

import time
import uuid
from typing import Any

from notice_kit import FAST, add_webhook, link_of, put_prefs, wait_until  # type: ignore[import-not-found]
from relay_kit import MASTER_SECRET  # type: ignore[import-not-found]

from gasless.core.crypto import PurposeKeys
from gasless.notifications.links import VerificationLinks


def _path(link: str) -> str:
    return "/" + link.split("://", 1)[1].split("/", 1)[1]


def _refused(response: Any, code: str, reason: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code and body["details"] == {"reason": reason}, body


def _address() -> str:
    return f"owner-{uuid.uuid4().hex[:8]}@example.com"


def test_link_verifies_once_and_other_links_are_refused(served: Any, smtp: Any) -> None:
    server, _env, auth = served(**FAST, smtp_url=smtp.url, email_link_ttl_ms=60_000)
    account = auth.account()
    owner = auth.bearer(account)
    address = _address()
    saved = put_prefs(server.client, account, owner, {"email": {"address": address.upper()}})
    assert saved.status_code == 200, saved.text
    channel = saved.json()["email"]
    assert channel["address"] == address.upper().split("@")[0] + "@example.com"  # the domain is normalised
    assert channel["status"] == "pending" and channel["verifiedAtMs"] is None
    assert channel["linkExpiresAtMs"] - channel["pendingSinceMs"] == 60_000
    normalised = address.upper().split("@")[0] + "@example.com"
    (first,) = smtp.wait(normalised, 1)

    # Saving again mails a fresh link; the first one no longer works.
    again = put_prefs(server.client, account, owner, {"email": {"address": address.upper()}})
    assert again.status_code == 200 and again.json()["email"]["status"] == "pending"
    second = smtp.wait(normalised, 2)[1]
    assert link_of(first) != link_of(second)
    _refused(server.client.get(_path(link_of(first))), "TOKEN_INVALID", "used")

    # In a browser: a page, not JSON; the address is verified.
    page = server.client.get(_path(link_of(second)), headers={"Accept": "text/html"})
    assert page.status_code == 200 and "Address confirmed" in page.text, page.text
    assert page.headers["Cache-Control"] == "no-store" and page.headers["Referrer-Policy"] == "no-referrer"
    state = server.client.get(f"/v1/account/{account.address}/notifications", headers=owner).json()
    assert state["email"]["status"] == "verified" and state["email"]["verifiedAtMs"] is not None
    # Single use: the same link again is refused (JSON clients get the problem, browsers a page).
    _refused(server.client.get(_path(link_of(second))), "TOKEN_INVALID", "used")
    reused = server.client.get(_path(link_of(second)), headers={"Accept": "text/html"})
    assert reused.status_code == 401 and "does not work" in reused.text

    # Saving the verified address again keeps it verified (no new mail); other preferences change.
    kept = put_prefs(
        server.client,
        account,
        owner,
        {"email": {"address": state["email"]["address"]}, "thresholds": {"planUsedPct": [50, 90]}},
    )
    assert kept.json()["email"]["status"] == "verified" and kept.json()["thresholds"]["planUsedPct"] == [
        50,
        90,
    ]

    # A link of another environment (the live keys), and a tampered or malformed one.
    keys = server.host.keys
    live = VerificationLinks(PurposeKeys(MASTER_SECRET.encode(), "live", keys.chain_id), "http://x")
    other, _ = live.mint(account.address, state["email"]["address"], int(time.time() * 1000))
    _refused(server.client.get(_path(other)), "TOKEN_INVALID", "environment")
    tampered = link_of(second)[:-3] + ("AAA" if not link_of(second).endswith("AAA") else "BBB")
    _refused(server.client.get(_path(tampered)), "TOKEN_INVALID", "signature")
    _refused(
        server.client.get("/notifications/verify", params={"token": "nope"}), "TOKEN_INVALID", "malformed"
    )
    missing = server.client.get("/notifications/verify")
    assert missing.status_code == 400 and missing.json()["code"] == "MALFORMED_REQUEST"


def test_an_expired_link_is_refused(served: Any, smtp: Any) -> None:
    server, _env, auth = served(**FAST, smtp_url=smtp.url, email_link_ttl_ms=1_000)
    account = auth.account()
    owner = auth.bearer(account)
    address = _address()
    channel = put_prefs(server.client, account, owner, {"email": {"address": address}}).json()["email"]
    (mail,) = smtp.wait(address, 1)
    wait_until(lambda: time.time() * 1000 >= channel["linkExpiresAtMs"], "the link's expiry")
    _refused(server.client.get(_path(link_of(mail))), "TOKEN_EXPIRED", "expired")
    state = server.client.get(f"/v1/account/{account.address}/notifications", headers=owner).json()
    assert state["email"]["status"] == "pending"


def test_an_unverified_address_receives_no_notice(served: Any, smtp: Any, receiver: Any) -> None:
    server, _env, auth = served(**FAST, smtp_url=smtp.url)
    account = auth.account()
    owner = auth.bearer(account)
    address = _address()
    assert put_prefs(server.client, account, owner, {"email": {"address": address}}).status_code == 200
    (verification,) = smtp.wait(address, 1)
    add_webhook(server.client, account, owner, receiver.url, ["key.created"])

    # A notice while the address is pending: delivered to the webhook, not mailed.
    first_key = auth.create_key(account, label="first")
    (delivered,) = receiver.wait(1)
    assert first_key["keyId"] in delivered.body.decode()

    # Verified, then a second notice: that one is mailed, the first never is.
    assert server.client.get(_path(link_of(verification))).status_code == 200
    second_key = auth.create_key(account, label="second")
    receiver.wait(2)
    mail = smtp.wait_subject(address, "API key created")
    assert second_key["keyId"] in mail.text and second_key["secret"] not in mail.text
    subjects = [m.subject for m in smtp.mails_to(address)]
    assert sum("API key created" in s for s in subjects) == 1, subjects
    assert not any(first_key["keyId"] in m.text for m in smtp.mails_to(address))

    # A per-kind switch turns the kind's mails off.
    switched = put_prefs(
        server.client, account, owner, {"email": {"address": address}, "kinds": {"key.created": False}}
    )
    assert (
        switched.json()["kinds"]["key.created"] is False and switched.json()["kinds"]["key.revoked"] is True
    )
    third_key = auth.create_key(account, label="third")
    receiver.wait(3)
    revoked = server.client.delete(f"/v1/account/{account.address}/keys/{third_key['keyId']}", headers=owner)
    assert revoked.status_code == 204
    smtp.wait_subject(address, "API key revoked")  # mailed after the third key's creation notice
    assert not any(third_key["keyId"] in m.text and "created" in m.subject for m in smtp.mails_to(address))


def test_a_mail_refused_at_first_is_retried(served: Any) -> None:
    """No SMTP server answers at first: the verification mail waits in the outbox and goes out once one does
    (retried with back-off, never lost)."""
    import asyncio
    import socket
    import threading

    from gasless.notifications.mail import MailCatcher

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, _env, auth = served(**FAST, smtp_url=f"smtp://127.0.0.1:{port}")
    account = auth.account()
    address = _address()
    assert (
        put_prefs(server.client, account, auth.bearer(account), {"email": {"address": address}}).status_code
        == 200
    )
    outbox = server.host.notifications.outbox
    loop = server.server_loop()

    def attempts() -> int:
        rows = asyncio.run_coroutine_threadsafe(outbox.for_account(account.address), loop).result(10)
        return rows[0].attempts if rows and rows[0].last_error else 0

    wait_until(lambda: attempts() >= 2, "two refused attempts")
    catcher_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=catcher_loop.run_forever, daemon=True)
    thread.start()
    catcher = MailCatcher(port=port)
    asyncio.run_coroutine_threadsafe(catcher.start(), catcher_loop).result(10)
    try:
        wait_until(lambda: [m for m in catcher.mails if address in m.envelope_to], "the retried mail")

        def outbox_row() -> Any:
            return asyncio.run_coroutine_threadsafe(outbox.for_account(account.address), loop).result(10)[0]

        # The catcher has the mail once the SMTP exchange ends; the worker marks the row just after that.
        wait_until(lambda: outbox_row().status != "pending", "the row marked")
        row = outbox_row()
        assert row.status == "sent" and row.attempts >= 3 and row.sent_at_ms is not None
        assert len([m for m in catcher.mails if address in m.envelope_to]) == 1
    finally:
        asyncio.run_coroutine_threadsafe(catcher.stop(), catcher_loop).result(10)
        catcher_loop.call_soon_threadsafe(catcher_loop.stop)
        thread.join(10)
