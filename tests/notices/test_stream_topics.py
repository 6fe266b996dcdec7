"""Every account-stream topic delivers an event after the change that should produce it: `quota` after a
settlement, `account` (and `quota`) after a contract event naming the account, `notices` after a new
notice, `pricing` after a tariff change, `incidents` after an operator's incident."""

from __future__ import annotations

from typing import Any

from notice_kit import FAST, Admin, relay_transfer, wait_until  # type: ignore[import-not-found]
from sqlalchemy import create_engine, select

from gasless.chain.addresses import address_of
from gasless.db.tables import service_meta


def _next(stream: Any, topic: str, accept: Any = lambda data: True) -> dict[str, Any]:
    """The next `topic` event whose StreamEvent satisfies `accept` (other events are skipped)."""
    while True:
        frame = stream.frame()
        if frame.get("event") == topic and accept(frame["data"]):
            return frame["data"]  # type: ignore[no-any-return]


def _tariff_baseline(settings: Any) -> None:
    """Wait until the notices worker has recorded the tariff it started with (later changes are news)."""
    engine = create_engine(settings.effective_database_url.replace("+aiosqlite", ""))
    try:

        def recorded() -> bool:
            with engine.connect() as conn:
                return (
                    conn.execute(
                        select(service_meta.c.value).where(service_meta.c.key == "notices.tariff")
                    ).first()
                    is not None
                )

        wait_until(recorded, "the tariff baseline")
    finally:
        engine.dispose()


def test_each_topic_after_its_change(served: Any, sse: Any) -> None:
    server, env, auth = served(**FAST, stream_keepalive_ms=200)
    account = auth.account()
    headers = auth.bearer(account)
    _tariff_baseline(env.settings)
    stream = sse(server.client, {"account": account.address}, headers)
    try:
        assert stream.frame()["id"].endswith(".0")

        # quota: after the relay settles, the used RU count it.
        relay_transfer(env, account)
        quota = _next(stream, "quota", lambda d: (d["data"].get("usedRu") or 0) >= 1)
        assert quota["key"] == "quota" and quota["data"]["account"] == account.address
        assert quota["data"]["state"] == "active"

        # account (and quota): a contract event naming the account.
        env.owner("setAccountSuspended", [address_of(account.key.generate_public_key().buffer), True])
        changed = _next(stream, "account", lambda d: d["data"]["suspended"] is True)
        assert changed["data"]["address"] == account.address
        halted = _next(stream, "quota", lambda d: d["data"]["state"] == "halted")
        assert halted["data"]["haltReason"] == "suspended"
        env.owner("setAccountSuspended", [address_of(account.key.generate_public_key().buffer), False])
        _next(stream, "account", lambda d: d["data"]["suspended"] is False)

        # notices: a new notice of the account (a key created).
        key = auth.create_key(account, label="stream")
        notice = _next(stream, "notices", lambda d: d["data"]["kind"] == "key.created")
        assert notice["data"]["data"]["keyId"] == key["keyId"] and notice["data"]["scope"] == "account"

        # pricing: a tariff change (a global notice on `notices`, the new document on `pricing`).
        env.owner("setRuPrice", [7])
        global_notice = _next(stream, "notices", lambda d: d["data"]["kind"] == "tariff.changed")
        assert global_notice["data"]["scope"] == "global" and global_notice["data"]["account"] is None
        pricing = _next(stream, "pricing")
        assert pricing["key"] == "pricing" and pricing["data"]["ruPriceMicroUsdc"] == "7"

        # incidents: an operator's incident.
        incident = Admin(env.settings.effective_database_url).open(
            "Shard 1 slow", "Looking into it.", "--shard", "1"
        )
        published = _next(stream, "incidents", lambda d: d["key"] == incident["id"])
        assert published["data"]["status"] == "investigating"
    finally:
        stream.close()


def test_quota_events_of_several_accounts_each_carry_their_own_usage(served: Any, sse: Any) -> None:
    """Settlements of several accounts in one window are read in one batch (`AccountReads.quotas`): each
    account's stream gets its own account's quota, with its own used RU, as `GET .../quota` reports it."""
    server, env, auth = served(**FAST, stream_keepalive_ms=200)
    accounts = [auth.account(), auth.account()]
    streams = [sse(server.client, {"account": a.address}, auth.bearer(a)) for a in accounts]
    try:
        for stream in streams:
            assert stream.frame()["id"].endswith(".0")
        # One relay for the first account and two for the second, back to back: their settlements land in
        # the same tracker round, so the quota topic reads both accounts in one batch.
        relay_transfer(env, accounts[0])
        relay_transfer(env, accounts[1])
        relay_transfer(env, accounts[1])

        def quota_of(account: Any) -> dict[str, Any]:
            answer = server.client.get(f"/v1/account/{account.address}/quota")
            assert answer.status_code == 200, answer.text
            return answer.json()  # type: ignore[no-any-return]

        first = wait_until(lambda: quota_of(accounts[0]).get("usedRu"), "the first account's settlement")
        # The same transfer twice: twice the RU, once both settled.
        wait_until(
            lambda: quota_of(accounts[1]).get("usedRu") == 2 * first, "the second account's settlements"
        )
        expected = [quota_of(account) for account in accounts]
        for account, stream, quota in zip(accounts, streams, expected, strict=True):
            event = _next(stream, "quota", lambda d, want=quota["usedRu"]: d["data"].get("usedRu") == want)
            assert event["data"]["account"] == account.address and event["data"]["address"] == account.address
            assert event["data"]["state"] == "active"
            assert event["data"]["includedRu"] == quota["includedRu"]
            assert event["data"]["periodId"] == quota["periodId"]
    finally:
        for stream in streams:
            stream.close()
