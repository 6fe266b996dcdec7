"""An operator-declared incident reaches exactly the affected accounts, once each, as a notice and a signed
webhook delivery, with hosts a and b on one PostgreSQL and one Redis (the notices singleton on one of them;
the accounts read their notices on either)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from notice_kit import FAST, Admin, add_webhook, notices, relay_transfer, wait_until  # type: ignore[import-not-found]
from relay_kit import Sender, key_in_shard  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
KINDS = ["incident.declared", "incident.updated", "incident.resolved"]


def _incident_notices(host: Any, auth: Any, account: Any) -> list[dict[str, Any]]:
    items = notices(host.client, account, auth.bearer(account))["items"]
    return [n for n in items if n["kind"].startswith("incident.")]


def test_declared_incident_reaches_the_affected_accounts_once(
    served: Any, postgres_url: str, redis_url: str, receiver_factory: Any
) -> None:
    shared = {
        **FAST,
        "database_url": postgres_url,
        "redis_url": redis_url,
        "redis_prefix": f"t-{uuid.uuid4().hex[:8]}",
    }
    a, env_a, auth_a = served(name="a", host_id="a", **shared)
    b, env_b, auth_b = served(name="b", host_id="b", **shared)

    def account(shard: int) -> Any:
        sender = Sender(key_in_shard(shard))
        env_a.owner("grant", [address_of(sender.key.generate_public_key().buffer), 3, 1])
        return sender

    in_shard, elsewhere, idle = account(1), account(0), account(1)
    receivers = {}
    for who, host, auth in ((in_shard, a, auth_a), (elsewhere, b, auth_b), (idle, a, auth_a)):
        receivers[who.address] = receiver_factory()
        add_webhook(host.client, who, auth.bearer(who), receivers[who.address].url, KINDS)
    relay_transfer(env_a, in_shard)  # shard 1, through host a
    relay_transfer(env_b, elsewhere)  # shard 0, through host b

    admin = Admin(postgres_url)
    incident = admin.open(
        "Shard 1 inclusion delayed", "Blocks on shard 1 are slow.", "--shard", "1", "--impact", "major"
    )
    admin.update(incident["id"], "identified", "A validator set change.")
    admin.update(incident["id"], "resolved", "Back to normal.")
    # A later incident on shard 0 only: once its notice is out, the shard-1 updates were handled before it.
    marker = admin.open("Shard 0 probe", "Checking shard 0.", "--shard", "0", "--impact", "minor")
    wait_until(
        lambda: any(n["data"]["incidentId"] == marker["id"] for n in _incident_notices(b, auth_b, elsewhere)),
        "the shard-0 marker notice",
    )
    receivers[elsewhere.address].wait(1)
    received = receivers[in_shard.address].wait(3)

    # The affected account: three notices (declared, updated, resolved), the same on both hosts.
    for host, auth in ((a, auth_a), (b, auth_b)):
        found = _incident_notices(host, auth, in_shard)
        assert [n["kind"] for n in found] == list(reversed(KINDS)), found  # newest first
        assert {n["data"]["incidentId"] for n in found} == {incident["id"]}
        assert [n["data"]["updateSeq"] for n in found] == [3, 2, 1]
        assert found[-1]["severity"] == "warning" and found[0]["severity"] == "info"
    events = [json.loads(r.body) for r in received]
    assert sorted(e["type"] for e in events) == sorted(KINDS)
    assert len({e["id"] for e in events}) == 3 and all(e["account"] == in_shard.address for e in events)

    # The others: the shard-0 account only has the marker; the idle account has nothing.
    assert [n["data"]["incidentId"] for n in _incident_notices(a, auth_a, elsewhere)] == [marker["id"]]
    assert _incident_notices(b, auth_b, idle) == []
    assert [
        json.loads(r.body)["data"]["notice"]["data"]["incidentId"]
        for r in receivers[elsewhere.address].received
    ] == [marker["id"]]
    assert receivers[idle.address].received == []
    assert len(receivers[in_shard.address].received) == 3  # nothing twice, whichever host dispatched
