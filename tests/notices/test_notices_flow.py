"""A plan crossing its 80% threshold, end to end on localnet: the notice in the account's log, a signed
webhook delivery, an e-mail read back from a real SMTP server once the address is verified, and the
acknowledgement (on host b too when PostgreSQL and Redis run two hosts)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from notice_kit import (  # type: ignore[import-not-found]
    FAST,
    add_webhook,
    link_of,
    notices,
    put_prefs,
    relay_transfer,
    small_plan,
    wait_until,
)

from gasless.webhooks.signing import SIGNATURE_HEADER, verify_signature


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.redis])])
def hosts(request: pytest.FixtureRequest, served: Any, smtp: Any) -> list[Any]:
    """One host on SQLite; hosts a and b on one PostgreSQL and one Redis."""
    common = {**FAST, "smtp_url": smtp.url}
    if request.param == "sqlite":
        return [served(**common)]
    database_url = request.getfixturevalue("postgres_url")
    redis_url = request.getfixturevalue("redis_url")
    shared = {
        **common,
        "database_url": database_url,
        "redis_url": redis_url,
        "redis_prefix": f"t-{uuid.uuid4().hex[:8]}",
    }
    return [served(name="a", host_id="a", **shared), served(name="b", host_id="b", **shared)]


def test_threshold_notice_webhook_mail_and_ack(hosts: list[Any], smtp: Any, receiver: Any) -> None:
    server, env, auth = hosts[0]
    last, _, auth_last = hosts[-1]  # host b when there are two
    account = small_plan(env, included_ru=5)
    owner = auth.bearer(account)
    address = f"owner-{uuid.uuid4().hex[:8]}@example.com"

    # The e-mail channel: pending until the link mailed to the address is opened.
    prefs = put_prefs(server.client, account, owner, {"email": {"address": address}})
    assert prefs.status_code == 200, prefs.text
    assert prefs.json()["email"]["status"] == "pending"
    assert prefs.json()["thresholds"]["planUsedPct"] == [80, 100]
    (verification,) = smtp.wait(address, 1)
    assert "Confirm" in verification.subject
    link = link_of(verification)
    opened = last.client.get(_path(link))
    assert opened.status_code == 200 and opened.json()["status"] == "verified", opened.text
    got = last.client.get(f"/v1/account/{account.address}/notifications", headers=auth_last.bearer(account))
    assert got.status_code == 200 and got.json()["email"]["status"] == "verified", got.text

    webhook = add_webhook(server.client, account, owner, receiver.url, ["plan.threshold"])

    # 4 transfers of 1 RU on a 5 RU plan: 80%.
    for _ in range(4):
        relay_transfer(env, account)
    page = wait_until(
        lambda: [n for n in notices(server.client, account, owner)["items"] if n["kind"] == "plan.threshold"],
        "the 80% notice",
    )
    (notice,) = page
    assert notice["scope"] == "account" and notice["account"] == account.address
    assert (
        notice["data"]["thresholdPct"] == 80
        and notice["data"]["usedRu"] == 4
        and notice["data"]["includedRu"] == 5
    )
    assert notice["severity"] == "warning" and notice["acknowledged"] is False

    # The webhook: one signed delivery of the notice, event type = its kind.
    (delivered,) = receiver.wait(1)
    assert verify_signature(webhook["secret"], delivered.headers[SIGNATURE_HEADER], delivered.body, 300_000)
    event = json.loads(delivered.body)
    assert event["type"] == "plan.threshold" and event["id"] == f"evt_notice_{notice['seq']}"
    assert event["data"]["notice"]["seq"] == notice["seq"] and event["account"] == account.address

    # The e-mail, now that the address is verified: the notice's words, no secret.
    mail = smtp.wait_subject(address, "Plan 80% used")
    assert "4 of its 5 RU" in mail.text and mail.message["Message-ID"].endswith("@gasless>")
    assert webhook["secret"] not in mail.text and "token=" not in mail.text

    # The fifth transfer: 100%, a second notice; acknowledge up to the first.
    relay_transfer(env, account)
    wait_until(
        lambda: (
            len([n for n in notices(server.client, account, owner)["items"] if n["kind"] == "plan.threshold"])
            == 2
        ),
        "the 100% notice",
    )
    items = [n for n in notices(server.client, account, owner)["items"] if n["kind"] == "plan.threshold"]
    assert [n["data"]["thresholdPct"] for n in items] == [100, 80]  # newest first
    assert items[0]["severity"] == "critical"
    ack = server.client.post(
        f"/v1/account/{account.address}/notices/ack", json={"upToSeq": notice["seq"]}, headers=owner
    )
    assert ack.status_code == 204 and ack.content == b""
    again = server.client.post(
        f"/v1/account/{account.address}/notices/ack", json={"upToSeq": notice["seq"] - 1}, headers=owner
    )
    assert again.status_code == 204  # idempotent: the mark never goes back

    for host, _, host_auth in hosts:  # the acknowledgement is the database's: every host sees it
        listed = notices(host.client, account, host_auth.bearer(account), unacknowledged="true")
        assert listed["acknowledgedSeq"] == notice["seq"]
        unacked = [n for n in listed["items"] if n["account"] == account.address]
        assert [n["seq"] for n in unacked if n["kind"] == "plan.threshold"] == [items[0]["seq"]]
        assert all(n["seq"] > notice["seq"] and not n["acknowledged"] for n in listed["items"])
        since = notices(host.client, account, host_auth.bearer(account), sinceSeq=notice["seq"])
        assert notice["seq"] not in [n["seq"] for n in since["items"]]
        full = notices(host.client, account, host_auth.bearer(account))
        assert {n["seq"]: n["acknowledged"] for n in full["items"]}[notice["seq"]] is True


def _path(link: str) -> str:
    """The link's path and query (the test servers listen on their own ports, not the link's host)."""
    return "/" + link.split("://", 1)[1].split("/", 1)[1]
