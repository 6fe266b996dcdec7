"""Billing on the relay path, through HTTP on a real localnet: plans and their period caps, the rate-class
limiter per account, the admission policy, sponsor keys and their policy, the usage ledger rows written by
the tracker."""

from __future__ import annotations

import time
from typing import Any

from relay_kit import Sender, key_in_shard  # type: ignore[import-not-found]
from sqlalchemy import create_engine, select

from gasless.chain.addresses import address_of
from gasless.db import reservations, usage_ledger
from gasless.keys.schemas import ApiKeyPolicy

M = 1_000_000
MONTH_MS = 2_592_000_000


def _addr(sender: Any) -> Any:
    return address_of(sender.key.generate_public_key().buffer)


def _tier(env: Any, tier_id: int, rate_class: int, included_ru: int) -> None:
    env.owner(
        "setTier",
        [tier_id, f"T{tier_id}".encode(), "Human", rate_class, 1 * M, included_ru, MONTH_MS, True, False],
    )


def _relay_transfer(env: Any, sender: Any, **build: Any) -> Any:
    assignment = env.assign(sender)
    tx = env.build(sender, assignment, **build)
    response = env.relay(tx, assignment["lease"])
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def _ledger(env: Any) -> list[Any]:
    url = env.settings.effective_database_url.replace("+aiosqlite", "")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(usage_ledger)).all())
    finally:
        engine.dispose()


def _reservations(env: Any) -> list[Any]:
    url = env.settings.effective_database_url.replace("+aiosqlite", "")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(reservations)).all())
    finally:
        engine.dispose()


def _host_call(env: Any, function: Any, *args: Any) -> Any:
    return env.client.portal.call(function, *args)


def test_plan_cap_quota_exhausted_and_ledger(env: Any, problem: Any) -> None:
    _tier(env, 20, 3, 3)
    sender = env.new_sender(plan=False)
    env.owner("grant", [_addr(sender), 20, 1])
    hashes = []
    for _ in range(3):
        response = _relay_transfer(env, sender)
        assert response.status_code in (200, 202), response.text
        billing = response.json()["billing"]
        assert billing["billingClass"] == "plan" and billing["ru"] == 1 and billing["free"] is False
        assert billing["account"] == sender.address and billing["authMode"] == "signed_tx"
        hashes.append(response.json()["txHash"])
    refused = _relay_transfer(env, sender)
    body = problem(refused, "QUOTA_EXHAUSTED")
    assert "Retry-After" not in refused.headers
    assert body["details"]["reason"] == "PLAN_CAP"
    for tx_hash in hashes:
        env.wait_state(tx_hash, ("EXECUTED", "FINALIZED"))
    deadline = time.monotonic() + 10
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = _ledger(env)
        if len(rows) == 3:
            break
        time.sleep(0.1)
    assert sorted(r.tx_hash for r in rows) == sorted(hashes)
    assert all(r.billed and r.status == "success" and r.ru == 1 and r.billing_class == "plan" for r in rows)
    assert all(r.state == "settled" for r in _reservations(env))


def test_no_entitlement_for_a_stranger(env: Any, problem: Any) -> None:
    stranger = env.new_sender(plan=False)
    response = _relay_transfer(env, stranger)
    body = problem(response, "NO_ENTITLEMENT")
    assert body["details"]["reason"] == "NO_ACCOUNT"
    assert response.headers["PAYMENT-REQUIRED"]


def test_suspended_account(env: Any, problem: Any) -> None:
    sender = env.new_sender()
    env.owner("setAccountSuspended", [_addr(sender), True])
    time.sleep(1.1)  # the account view is cached for 1 s
    response = _relay_transfer(env, sender)
    assert response.status_code == 403 and response.json()["code"] == "ACCOUNT_SUSPENDED", response.text


def test_gas_limit_above_class_ceiling(env: Any, problem: Any) -> None:
    sender = env.new_sender(plan=False)
    env.owner("grant", [_addr(sender), 1, 1])  # Starter: class 1, ceiling 100 M
    body = problem(_relay_transfer(env, sender, gas_limit=150 * M), "GAS_LIMIT_TOO_HIGH")
    assert body["details"] == {"limit": 100 * M, "actual": 150 * M}


def test_deploy_not_allowed(env: Any) -> None:
    sender = env.new_sender()
    zero = address_of(bytes(32)).to_bech32()
    response = _relay_transfer(env, sender, receiver=zero, data=b"0061736d@0500@0502", gas_limit=5 * M)
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "DEPLOY_NOT_ALLOWED"


def test_rate_limited_per_account_with_headers(env: Any, problem: Any) -> None:
    sender = env.new_sender(plan=False)
    env.owner("grant", [_addr(sender), 1, 1])  # class 1: 1 RU/s, burst 15
    assignment = env.assign(sender)  # one lease for all (assignments have limits of their own)
    for _ in range(15):
        response = env.relay(env.build(sender, assignment), assignment["lease"])
        assert response.status_code in (200, 202), response.text
        sender.nonce += 1
    assert response.headers["RateLimit-Limit"] == "15"
    # The bucket refills 1 RU/s: on a slow machine a relay or two may get through before the refusal.
    for _ in range(10):
        refused = env.relay(env.build(sender, assignment), assignment["lease"])
        if refused.status_code != 429:
            assert refused.status_code in (200, 202), refused.text
            sender.nonce += 1
            continue
        break
    body = problem(refused, "RATE_LIMITED")
    assert body["details"]["scope"] == "account"
    assert refused.headers["RateLimit-Remaining"] == "0" and refused.headers["RateLimit-Limit"] == "15"


def test_gas_budget_and_hourly_burn(env: Any, problem: Any) -> None:
    env.owner("setRateClass", [7, 100, 300, 1 * M, 100 * M, 100 * M, 6_000])
    env.owner("setRateClass", [8, 100, 300, 100 * M, 1_000 * M, 100 * M, 3])
    _tier(env, 21, 7, 100_000)
    _tier(env, 22, 8, 100_000)
    gassy = env.new_sender(plan=False)
    env.owner("grant", [_addr(gassy), 21, 1])
    assert _relay_transfer(env, gassy, gas_limit=60 * M).status_code in (200, 202)
    body = problem(_relay_transfer(env, gassy, gas_limit=60 * M), "GAS_BUDGET_EXCEEDED")
    assert body["details"]["retryAfterMs"] >= 1
    hourly = env.new_sender(plan=False)
    env.owner("grant", [_addr(hourly), 22, 1])
    for _ in range(3):
        assert _relay_transfer(env, hourly).status_code in (200, 202)
    problem(_relay_transfer(env, hourly), "HOURLY_BURN_EXCEEDED")


def test_platform_admission_budget(make_env: Any, problem: Any) -> None:
    env = make_env(billing_platform_ru_per_second=0.001, billing_platform_ru_burst=25)
    sender = env.new_sender()  # Growth: burst 60 RU
    assert _relay_transfer(env, sender, gas_limit=100 * M).status_code in (200, 202)  # 15 RU
    body = problem(_relay_transfer(env, sender, gas_limit=100 * M), "RATE_LIMITED")
    assert body["details"]["scope"] == "platform"


def _create_key(env: Any, account: str, **policy: Any) -> Any:
    host = env.client.app.state.host
    return _host_call(env, host.api_keys.create, account, "test key", ApiKeyPolicy(**policy))


def test_sponsor_key_pays_then_revoked(env: Any, problem: Any) -> None:
    sponsor_account = env.new_sender(plan=False)
    env.owner("grant", [_addr(sponsor_account), 2, 1])  # Builder
    key = _create_key(env, sponsor_account.address)
    stranger = env.new_sender(plan=False)
    assignment = env.assign(stranger)
    tx = env.build(stranger, assignment)
    response = env.relay(tx, assignment["lease"], headers={"X-Api-Key": key.secret})
    assert response.status_code in (200, 202), response.text
    billing = response.json()["billing"]
    assert billing == {
        "authMode": "api_key",
        "billingClass": "sponsor",
        "account": sponsor_account.address,
        "ru": 1,
        "free": False,
    }
    stranger.nonce += 1
    # NFT transfers are only paid by the sender's own plan or a plan naming the sender; a sponsor key pays
    # for one only when its receiver list names the destination.
    destination = env.new_sender(plan=False)
    nft = (
        b"ESDTNFTTransfer@" + b"NFT-abcdef".hex().encode() + b"@01@01@" + _addr(destination).to_hex().encode()
    )
    assignment = env.assign(stranger)
    tx = env.build(stranger, assignment, receiver=stranger.address, data=nft)
    body = problem(
        env.relay(tx, assignment["lease"], headers={"X-Api-Key": key.secret}), "RECEIVER_NOT_ALLOWED"
    )
    assert body["details"] == {
        "reason": "token_transfer_needs_own_plan",
        "receiver": destination.address,
        "apiKeyId": key.keyId,
    }
    listing = _create_key(env, sponsor_account.address, allowedReceivers=[destination.address])
    accepted = env.relay(tx, assignment["lease"], headers={"X-Api-Key": listing.secret})
    assert accepted.status_code in (200, 202), accepted.text
    assert accepted.json()["billing"]["authMode"] == "api_key"
    stranger.nonce += 1
    # Revoked: the next relay with the key is refused (every host within 2 000 ms).
    _host_call(env, env.client.app.state.host.api_keys.revoke, sponsor_account.address, key.keyId)
    assignment = env.assign(stranger)
    tx = env.build(stranger, assignment)
    refused = env.relay(tx, assignment["lease"], headers={"X-Api-Key": key.secret})
    assert refused.status_code == 401 and refused.json()["code"] == "API_KEY_INVALID", refused.text


def test_sponsor_key_policy(env: Any, problem: Any) -> None:
    builder = env.new_sender(plan=False)
    env.owner("grant", [_addr(builder), 2, 1])
    allowed = env.new_sender(plan=False).address
    key = _create_key(env, builder.address, allowedReceivers=[allowed])
    stranger = env.new_sender(plan=False)
    assignment = env.assign(stranger)
    tx = env.build(stranger, assignment)  # to a random receiver, not the allowed one
    problem(env.relay(tx, assignment["lease"], headers={"X-Api-Key": key.secret}), "RECEIVER_NOT_ALLOWED")
    starter = env.new_sender(plan=False)
    env.owner("grant", [_addr(starter), 1, 1])
    small = _create_key(env, starter.address)
    tx = env.build(stranger, assignment)
    response = env.relay(tx, assignment["lease"], headers={"X-Api-Key": small.secret})
    assert response.status_code == 403 and response.json()["code"] == "API_KEY_SCOPE", response.text
    assert response.json()["details"]["reason"] == "tier_below_builder"


def test_key_as_bearer_refused(env: Any) -> None:
    builder = env.new_sender(plan=False)
    env.owner("grant", [_addr(builder), 2, 1])
    key = _create_key(env, builder.address)
    stranger = env.new_sender(plan=False)
    assignment = env.assign(stranger)
    tx = env.build(stranger, assignment)
    response = env.relay(tx, assignment["lease"], headers={"Authorization": f"Bearer {key.secret}"})
    assert response.status_code == 401 and response.json()["code"] == "API_KEY_INVALID", response.text


def test_data_above_4096_bytes_only_for_allow_listed_accounts(make_env: Any, problem: Any) -> None:
    """docs/billing.md: data above 4 096 bytes on a self-serve account is DATA_TOO_LARGE; more only by
    allow-list (per paying account). Without any allow-listed account the static check refuses it (STATIC_CASES)."""
    listed = Sender(key_in_shard(1))
    env = make_env(billing_data_allowlist=[listed.address])
    env.owner("grant", [_addr(listed), 3, 1])
    other = env.new_sender()
    data = b"a" * 5_000
    assignment = env.assign(listed)
    accepted = env.relay(env.build(listed, assignment, data=data), assignment["lease"])
    assert accepted.status_code in (200, 202), accepted.text
    final = env.wait_state(accepted.json()["txHash"], ("FINALIZED",))
    assert final["outcome"] == "success"
    assignment = env.assign(other)
    refused = problem(
        env.relay(env.build(other, assignment, data=data), assignment["lease"]), "DATA_TOO_LARGE"
    )
    assert refused["details"] == {"limit": 4_096, "actual": 5_000, "account": other.address}
    # A free contract call is held to the same limit: the allow-list of one account must not open the
    # static check for everyone's free calls.
    free_caller = env.new_sender(plan=False)
    assignment = env.assign(free_caller)
    big_free = env.build(
        free_caller,
        assignment,
        receiver=env.contract,
        data=b"removeSenders@" + b"00" * 2_600,  # free, and 5 214 bytes
        gas_limit=20_000_000,
    )
    refused = problem(env.relay(big_free, assignment["lease"]), "DATA_TOO_LARGE")
    assert refused["details"]["account"] == free_caller.address and refused["details"]["actual"] > 4_096


def test_a_request_naming_its_payer_is_refused_for_a_sender_that_account_does_not_name(
    env: Any, problem: Any
) -> None:
    """`account` in the relay body names who pays: the sender's own account or one naming it as an
    authorised sender; any other is 403 SENDER_NOT_AUTHORIZED (`reason`, `account`), nothing sent."""
    owner, other = env.new_sender(), env.new_sender()
    stranger = env.new_sender(plan=False)
    for sender in (stranger, other):
        assignment = env.assign(sender)
        tx = env.build(sender, assignment)
        body = problem(
            env.relay(tx, assignment["lease"], body={"account": owner.address}), "SENDER_NOT_AUTHORIZED"
        )
        assert body["details"] == {"reason": "not_an_authorised_sender", "account": owner.address}
        env.wait_state(f"{sender.address}:0", ("REJECTED",))  # recorded after the answer, off its path
        assert env.client.get(f"/v1/intents/{sender.address}/0").json()["state"] == "REJECTED"
    assignment = env.assign(owner)
    malformed = env.relay(env.build(owner, assignment), assignment["lease"], body={"account": "erd1nope"})
    assert problem(malformed, "MALFORMED_REQUEST")["details"] == {"field": "account"}
    accepted = env.relay(env.build(owner, assignment), assignment["lease"], body={"account": owner.address})
    assert accepted.status_code in (200, 202), accepted.text
    assert accepted.json()["billing"]["account"] == owner.address
