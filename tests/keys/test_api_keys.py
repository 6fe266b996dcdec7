"""Sponsor API keys through HTTP (real native-auth owners, real keys, real relays) and their repository on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from gasless.core.crypto import PurposeKeys
from gasless.db import create_engine, upgrade
from gasless.keys.key_format import checksum
from gasless.keys.repository import ApiKeyRepository, SlotsFull
from gasless.keys.service import CACHE_TTL_MS
from gasless.limits.buckets import Rate, RouteLimitTable

KEY = re.compile(r"gls_test_([0-9A-Za-z]{16})[0-9A-Za-z]{32}[0-9A-Za-z]{6}")
DEFAULT_POLICY = {
    "scopes": ["relay", "read"],
    "allowedReceivers": None,
    "limits": {"ruPerSecond": None, "ruPerHour": None, "maxGasLimit": None},
}


def _keys_path(account: Any, key_id: str | None = None) -> str:
    return f"/v1/account/{account.address}/keys" + (f"/{key_id}" if key_id else "")


def _relay_signed(env: Any, sender: Any, headers: dict[str, str]) -> Any:
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    return env.relay(tx, assignment["lease"], headers=headers)


def _db_rows(env: Any) -> list[dict[str, Any]]:
    url = env.settings.effective_database_url.replace("sqlite+aiosqlite", "sqlite", 1)
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(sqlalchemy.text("SELECT * FROM api_keys"))]
    finally:
        engine.dispose()


def test_key_lifecycle(env: Any, auth: Any, platform_problem: Any) -> None:
    account = auth.account()
    owner = auth.bearer(account)

    # Create: the secret is shown once, never cached.
    created = auth.post_key(
        account, {"label": "  backend  ", "policy": {"scopes": ["relay"], "limits": {"ruPerSecond": 2}}}
    )
    assert created.status_code == 201, created.text
    assert created.headers["Cache-Control"] == "no-store"
    key = created.json()
    secret = key["secret"]
    match = KEY.fullmatch(secret)
    assert match is not None and match.group(1) == key["keyId"]
    assert secret[-6:] == checksum(secret[:-6])
    assert key["prefix"] == f"gls_test_{key['keyId']}" and secret.startswith(key["prefix"])
    assert key["label"] == "backend" and key["env"] == "test"
    assert key["policy"] == {
        **DEFAULT_POLICY,
        "scopes": ["relay"],
        "limits": {**DEFAULT_POLICY["limits"], "ruPerSecond": 2},
    }
    assert key["createdMs"] == key["updatedMs"] > 0

    # List: the key without its secret.
    listed = env.client.get(_keys_path(account), headers=owner)
    assert listed.status_code == 200 and listed.headers["Cache-Control"] == "no-store"
    assert listed.json() == {"items": [{k: v for k, v in key.items() if k != "secret"}]}
    assert secret not in listed.text and secret[len(key["prefix"]) :] not in listed.text

    # Use: a real relay paid for with the key (the key's account billing comes with the billing issue).
    sender = env.new_sender(1)
    used = _relay_signed(env, sender, {"X-Api-Key": secret})
    assert used.status_code in (200, 202), used.text
    sender.nonce += 1

    # Update label and policy (the policy is replaced as a whole).
    receiver = env.new_sender(1, plan=False).address
    patched = env.client.patch(
        _keys_path(account, key["keyId"]),
        json={"label": "backend v2", "policy": {"allowedReceivers": [receiver, receiver]}},
        headers=owner,
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["label"] == "backend v2" and "secret" not in patched.json()
    assert patched.json()["policy"] == {**DEFAULT_POLICY, "allowedReceivers": [receiver]}
    assert patched.json()["updatedMs"] >= key["updatedMs"]

    # Revoke: gone from the list, refused at once on this host.
    revoked = env.client.delete(_keys_path(account, key["keyId"]), headers=owner)
    assert revoked.status_code == 204 and revoked.content == b""
    assert env.client.get(_keys_path(account), headers=owner).json() == {"items": []}
    refused = _relay_signed(env, sender, {"X-Api-Key": secret})
    platform_problem(refused, "API_KEY_INVALID", {"reason": "revoked"})
    for again in (
        env.client.delete(_keys_path(account, key["keyId"]), headers=owner),
        env.client.patch(_keys_path(account, key["keyId"]), json={"label": "x"}, headers=owner),
    ):
        platform_problem(again, "NOT_FOUND")


def test_secret_is_stored_only_as_an_hmac_bound_to_env_and_chain(env: Any, auth: Any) -> None:
    key = auth.create_key(auth.account())
    secret, hidden = key["secret"], key["secret"][len(key["prefix"]) :]
    [row] = _db_rows(env)
    assert row["key_id"] == key["keyId"] and hidden not in repr(row)
    master = env.settings.master_secret.get_secret_value().encode()
    chain_id = env.settings.network.chain_id
    expected = PurposeKeys(master, "test", chain_id).mac("api-key", secret.encode()).hex()
    assert row["secret_hmac"] == expected
    # The same key under the other environment's or another chain's purpose key would not verify.
    for other in (PurposeKeys(master, "live", chain_id), PurposeKeys(master, "test", "D")):
        assert other.mac("api-key", secret.encode()).hex() != expected
    # Nowhere in the database files either (WAL included).
    for path in Path(env.settings.effective_database_url.split("///", 1)[1]).parent.glob("api.db*"):
        assert hidden.encode() not in path.read_bytes(), path


def test_limit_of_ten_active_keys(env: Any, auth: Any, platform_problem: Any) -> None:
    account = auth.account()
    keys = [auth.create_key(account, label=f"k{i}") for i in range(10)]
    refused = auth.post_key(account, {"label": "eleventh"})
    body = platform_problem(refused, "LIMIT_REACHED", {"limit": 10, "resource": "apiKeys"})
    assert "10 active API keys" in body["detail"]
    # Another account is not affected; a revocation frees a place.
    assert auth.create_key(auth.account())["env"] == "test"
    assert (
        env.client.delete(_keys_path(account, keys[3]["keyId"]), headers=auth.bearer(account)).status_code
        == 204
    )
    assert auth.create_key(account, label="replacement")["label"] == "replacement"
    assert len(env.client.get(_keys_path(account), headers=auth.bearer(account)).json()["items"]) == 10


def test_keys_are_per_account(env: Any, auth: Any, platform_problem: Any) -> None:
    alice, bob = auth.account(), auth.account()
    alices = auth.create_key(alice)
    # Bob (owner of his own account) cannot reach Alice's key through his own path.
    for response in (
        env.client.patch(_keys_path(bob, alices["keyId"]), json={"label": "mine"}, headers=auth.bearer(bob)),
        env.client.delete(_keys_path(bob, alices["keyId"]), headers=auth.bearer(bob)),
        env.client.delete(_keys_path(bob, "not-a-key-id"), headers=auth.bearer(bob)),
    ):
        platform_problem(response, "NOT_FOUND")
    assert [
        k["keyId"] for k in env.client.get(_keys_path(alice), headers=auth.bearer(alice)).json()["items"]
    ] == [alices["keyId"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "label"),
        ({"label": ""}, "label"),
        ({"label": "   "}, "label"),
        ({"label": "x" * 65}, "label"),
        ({"label": "ok", "secret": "mine"}, "secret"),
        ({"label": "ok", "policy": {"scopes": ["admin"]}}, "policy.scopes.0"),
        ({"label": "ok", "policy": {"scopes": []}}, "policy.scopes"),
        ({"label": "ok", "policy": {"allowedReceivers": ["erd1nope"]}}, "policy.allowedReceivers.0"),
        ({"label": "ok", "policy": {"limits": {"ruPerSecond": 0}}}, "policy.limits.ruPerSecond"),
        ({"label": "ok", "policy": {"limits": {"burst": 5}}}, "policy.limits.burst"),
    ],
)
def test_create_refuses_bad_bodies(
    env: Any, auth: Any, problem: Any, body: dict[str, Any], field: str
) -> None:
    account = auth.account()
    response = env.client.post(_keys_path(account), json=body, headers=auth.bearer(account))
    assert problem(response, "MALFORMED_REQUEST")["details"] == {"field": field}
    assert env.client.get(_keys_path(account), headers=auth.bearer(account)).json() == {"items": []}


def test_update_needs_a_change(env: Any, auth: Any, problem: Any) -> None:
    account = auth.account()
    key = auth.create_key(account)
    response = env.client.patch(_keys_path(account, key["keyId"]), json={}, headers=auth.bearer(account))
    problem(response, "MALFORMED_REQUEST")


def test_revocation_reaches_another_host_within_the_cache_lifetime(make_env: Any, auth_for: Any) -> None:
    """Hosts a and b share the database; b has looked the key up (cached) when a revokes it."""
    host_a = make_env()
    host_b = make_env(host_id="b")
    auth = auth_for(host_a)
    account = auth.account()
    key = auth.create_key(account)
    secret = key["secret"]

    def key_check(env: Any) -> Any:
        # An unparsable body: a good key passes to the relay checks (400), a bad one is refused first.
        return env.client.post("/v1/relay", content=b"x", headers={"X-Api-Key": secret}).json()

    assert key_check(host_b)["code"] == "MALFORMED_REQUEST"  # b now holds the key in its lookup cache
    assert (
        host_a.client.delete(_keys_path(account, key["keyId"]), headers=auth.bearer(account)).status_code
        == 204
    )
    assert key_check(host_a)["details"] == {"reason": "revoked"}  # the revoking host: at once

    # On b, move the lookup cache's clock past its lifetime instead of sleeping: then b reads the database.
    service_b = host_b.client.app.state.host.api_key_service
    assert CACHE_TTL_MS < 2_000  # the interface contract's bound on revocation reaching every host
    service_b.clock = lambda: time.monotonic() + service_b.cache_ttl_ms / 1000 + 0.001
    assert key_check(host_b)["details"] == {"reason": "revoked"}


# Repository on both databases -------------------------------------------------------------------------
ACCOUNT = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
OTHER = "erd1spyavw0956vq68xj8y4tenjpq2wd5a9p2c6j8gsz7ztyrnpxrruqzu66jx"


def _insert(repo: ApiKeyRepository, n: int, *, account: str = ACCOUNT, env: str = "test") -> Any:
    return repo.insert(
        key_id=f"{n:016d}",
        account=account,
        env=env,
        label=f"k{n}",
        policy={"scopes": ["relay"]},
        secret_hmac=f"{n:064x}",
        now_ms=1_000 + n,
        max_active=10,
    )


async def test_repository_slots_under_concurrency(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        await upgrade(engine)
        repo = ApiKeyRepository(engine)
        # Twelve creations at once for one account: exactly ten get a slot, on every database.
        results = await asyncio.gather(*(_insert(repo, n) for n in range(12)), return_exceptions=True)
        stored = [r for r in results if not isinstance(r, BaseException)]
        assert len(stored) == 10 and all(isinstance(r, SlotsFull) for r in results if r not in stored)
        assert sorted(row.slot for row in stored) == list(range(10))
        # The other environment and other accounts have their own slots.
        assert (await _insert(repo, 20, env="live")).slot == 0
        assert (await _insert(repo, 21, account=OTHER)).slot == 0

        active = await repo.active_for(ACCOUNT, "test")
        assert [row.key_id for row in active] == sorted(row.key_id for row in stored)
        victim = active[4]
        assert await repo.revoke(victim.key_id, account=OTHER, env="test", now_ms=5_000) is False
        assert await repo.revoke(victim.key_id, account=ACCOUNT, env="live", now_ms=5_000) is False
        assert await repo.revoke(victim.key_id, account=ACCOUNT, env="test", now_ms=5_000) is True
        assert await repo.revoke(victim.key_id, account=ACCOUNT, env="test", now_ms=5_001) is False
        gone = await repo.get(victim.key_id)
        assert gone is not None and gone.slot is None and gone.revoked_at_ms == 5_000 and not gone.active
        assert (await _insert(repo, 30)).slot == victim.slot  # the freed slot is reused

        updated = await repo.update(
            active[0].key_id, account=ACCOUNT, env="test", label="renamed", policy=None, now_ms=6_000
        )
        assert updated is not None and updated.label == "renamed" and updated.policy == {"scopes": ["relay"]}
        assert updated.updated_at_ms == 6_000 and updated.created_at_ms == active[0].created_at_ms
        assert (
            await repo.update(victim.key_id, account=ACCOUNT, env="test", label="x", policy=None, now_ms=7)
            is None
        )
        assert await repo.get("0" * 15 + "x") is None
    finally:
        await engine.dispose()


def test_key_writes_share_the_account_write_limit(make_env: Any, auth_for: Any, problem: Any) -> None:
    """Creations, changes and revocations of one account draw on one bucket (here burst 3, slow refill: a
    creation is two requests, the challenge and the signed one); the refusal is RATE_LIMITED with scope
    `account`, and another account is not affected."""
    table = dataclasses.replace(RouteLimitTable(), account_write=Rate(0.01, 3))
    served = make_env(app_kwargs={"route_limits": table})
    auth = auth_for(served)
    account, other = auth.account(), auth.account()

    first = auth.post_key(account, {"label": "a"}, client=served.client)
    assert first.status_code == 201 and first.headers["RateLimit-Limit"] == "3"
    assert first.headers["RateLimit-Remaining"] == "1"
    key_id = first.json()["keyId"]
    assert served.client.delete(_keys_path(account, key_id), headers=auth.bearer(account)).status_code == 204
    refused = served.client.patch(
        _keys_path(account, key_id), json={"label": "b"}, headers=auth.bearer(account)
    )
    body = problem(refused, "RATE_LIMITED")
    assert body["details"]["scope"] == "account" and refused.headers["RateLimit-Remaining"] == "0"
    assert auth.post_key(other, {"label": "a"}, client=served.client).status_code == 201
    # Reads are not writes.
    assert served.client.get(_keys_path(account), headers=auth.bearer(account)).status_code == 200
