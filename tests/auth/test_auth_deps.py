"""Authentication through HTTP: native-auth, sponsor keys, roles, admin paths, origins and CORS.

Every credential is real: native-auth tokens signed by the callers' keys on a block the host recorded, API
keys created through the API, roles and suspensions written to the billing contract by signed transactions.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from gasless.auth.deps import DashboardRead
from gasless.auth.origins import OriginPolicy
from gasless.core.settings import Settings
from gasless.keys.key_format import make_key, new_key_id

EVIL = "https://evil.example"


# GET /v1/me and roles ---------------------------------------------------------------------------------
def test_me_lists_owned_and_sender_accounts(env: Any, auth: Any) -> None:
    account, sender, stranger = auth.account(), auth.stranger(), auth.stranger()
    auth.add_sender(account, sender)

    block = auth.block()
    token = auth.token(account, ttl_seconds=600, block=block["blockHash"])
    me = env.client.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200, me.text
    assert me.json() == {
        "address": account.address,
        "tokenExpiresMs": block["blockTimestampMs"] + 600_000,
        "accounts": [{"address": account.address, "role": "owner", "suspended": False}],
    }
    as_sender = env.client.get("/v1/me", headers=auth.bearer(sender)).json()
    assert as_sender["address"] == sender.address
    assert as_sender["accounts"] == [{"address": account.address, "role": "sender", "suspended": False}]
    assert env.client.get("/v1/me", headers=auth.bearer(stranger)).json()["accounts"] == []


def test_sender_reads_but_cannot_write(env: Any, auth: Any, platform_problem: Any) -> None:
    account, sender = auth.account(), auth.stranger()
    auth.add_sender(account, sender)
    key = auth.create_key(account)
    path = f"/v1/account/{account.address}/keys"

    listed = env.client.get(path, headers=auth.bearer(sender))
    assert listed.status_code == 200 and [k["keyId"] for k in listed.json()["items"]] == [key["keyId"]]
    for response in (
        env.client.post(path, json={"label": "mine"}, headers=auth.bearer(sender)),
        env.client.patch(f"{path}/{key['keyId']}", json={"label": "x"}, headers=auth.bearer(sender)),
        env.client.delete(f"{path}/{key['keyId']}", headers=auth.bearer(sender)),
    ):
        body = platform_problem(response, "FORBIDDEN", {"role": "sender"})
        assert "read-only" in body["detail"]
    assert [k["keyId"] for k in env.client.get(path, headers=auth.bearer(account)).json()["items"]] == [
        key["keyId"]
    ]


def test_forbidden_without_a_role(env: Any, auth: Any, platform_problem: Any) -> None:
    account, stranger = auth.account(), auth.stranger()
    # Neither the account nor one of its senders.
    platform_problem(
        env.client.get(f"/v1/account/{account.address}/keys", headers=auth.bearer(stranger)),
        "FORBIDDEN",
        {"role": None},
    )
    # Its own address, but no account in the contract: nothing to own.
    body = platform_problem(
        env.client.post(
            f"/v1/account/{stranger.address}/keys", json={"label": "x"}, headers=auth.bearer(stranger)
        ),
        "FORBIDDEN",
        {"role": None},
    )
    assert "no account" in body["detail"]


def test_suspended_account_refuses_changes_but_reads_and_revokes(
    env: Any, auth: Any, platform_problem: Any
) -> None:
    account = auth.account()
    key = auth.create_key(account)
    auth.suspend(account)
    path = f"/v1/account/{account.address}/keys"
    headers = auth.bearer(account)

    platform_problem(
        env.client.post(path, json={"label": "more"}, headers=headers),
        "ACCOUNT_SUSPENDED",
        {"account": account.address},
    )
    platform_problem(
        env.client.patch(f"{path}/{key['keyId']}", json={"label": "x"}, headers=headers),
        "ACCOUNT_SUSPENDED",
        {"account": account.address},
    )
    assert env.client.get("/v1/me", headers=headers).json()["accounts"][0]["suspended"] is True
    assert [k["keyId"] for k in env.client.get(path, headers=headers).json()["items"]] == [key["keyId"]]
    assert env.client.delete(f"{path}/{key['keyId']}", headers=headers).status_code == 204

    auth.suspend(account, False)
    assert auth.post_key(account, {"label": "back"}).status_code == 201


# Native-auth failures ---------------------------------------------------------------------------------
def test_unauthenticated(env: Any, auth: Any, platform_problem: Any) -> None:
    response = env.client.get("/v1/me")
    platform_problem(response, "UNAUTHENTICATED")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="gasless"'

    account = auth.account()
    key = auth.create_key(account)
    body = platform_problem(env.client.get("/v1/me", headers={"X-Api-Key": key["secret"]}), "UNAUTHENTICATED")
    assert "sponsor API key is not accepted here" in body["detail"]


def test_token_invalid(env: Any, auth: Any, platform_problem: Any) -> None:
    caller = auth.stranger()
    good = auth.token(caller)
    address_part, body_part, signature = good.split(".")
    forged_signature = ("0" if signature[0] != "0" else "1") + signature[1:]
    cases = {
        "not a token": "Bearer abc",
        "another scheme": f"Basic {good}",
        "empty bearer": "Bearer ",
        "forged signature": f"Bearer {address_part}.{body_part}.{forged_signature}",
        "another origin": f"Bearer {auth.token(caller, origin=EVIL)}",
        "unknown block": f"Bearer {auth.token(caller, block='ab' * 32)}",
    }
    for case, header in cases.items():
        response = env.client.get("/v1/me", headers={"Authorization": header})
        platform_problem(response, "TOKEN_INVALID")
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="gasless", error="invalid_token"', case


@pytest.mark.parametrize("param", ["access_token", "token", "Authorization"])
def test_token_in_url_is_refused_even_with_a_good_header(
    env: Any, auth: Any, platform_problem: Any, param: str
) -> None:
    caller = auth.stranger()
    token = auth.token(caller)
    response = env.client.get("/v1/me", params={param: token}, headers={"Authorization": f"Bearer {token}"})
    body = platform_problem(response, "TOKEN_INVALID", {"reason": "token_in_url"})
    assert "never accepted in a URL" in body["detail"] and param in body["detail"]


def test_token_expired(env: Any, auth: Any, platform_problem: Any) -> None:
    caller = auth.stranger()
    block = auth.block()
    token = auth.token(caller, ttl_seconds=0, block=block["blockHash"])
    auth.wait_next_block(block["blockNonce"])  # on the chain's clock the token is now past its validity
    response = env.client.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    body = platform_problem(response, "TOKEN_EXPIRED")
    assert "expired" in body["detail"]


# Sponsor keys on POST /v1/relay -------------------------------------------------------------------------
def _relay_with(env: Any, headers: dict[str, str], params: dict[str, str] | None = None) -> Any:
    # The body is not even JSON: a present key is judged before anything else.
    return env.client.post("/v1/relay", content=b"not json", headers=headers, params=params)


def test_api_key_invalid_on_relay(env: Any, auth: Any, platform_problem: Any) -> None:
    account = auth.account()
    secret = auth.create_key(account)["secret"]
    typo = secret[:20] + ("A" if secret[20] != "A" else "B") + secret[21:]
    cases = {
        "unknown": make_key("test", new_key_id()),
        "environment": make_key("live", new_key_id()),
        "malformed": "gls_test_short",
        "checksum": typo,
    }
    for reason, key in cases.items():
        body = platform_problem(_relay_with(env, {"X-Api-Key": key}), "API_KEY_INVALID", {"reason": reason})
        if reason == "environment":
            assert "live key" in body["detail"] and "test environment" in body["detail"]

    # The right key in the wrong header.
    body = platform_problem(
        _relay_with(env, {"Authorization": f"Bearer {secret}"}), "API_KEY_INVALID", {"reason": "bearer"}
    )
    assert "X-Api-Key" in body["detail"]
    # Or in the URL.
    platform_problem(
        _relay_with(env, {}, params={"api_key": secret}), "API_KEY_INVALID", {"reason": "key_in_url"}
    )
    # A valid key passes the key check and the request goes on to the relay checks.
    passed = _relay_with(env, {"X-Api-Key": secret})
    assert passed.status_code == 400 and passed.json()["code"] == "MALFORMED_REQUEST"


def test_api_key_scope(env: Any, auth: Any, platform_problem: Any) -> None:
    account = auth.account()
    read_only = auth.create_key(account, policy={"scopes": ["read"]})
    body = platform_problem(
        _relay_with(env, {"X-Api-Key": read_only["secret"]}),
        "API_KEY_SCOPE",
        {"requiredScope": "relay", "keyScopes": ["read"]},
    )
    assert "'relay'" in body["detail"]


def test_dashboard_read_takes_native_auth_or_a_read_key(
    env: Any, auth: Any, platform_problem: Any, problem: Any
) -> None:
    """`DashboardRead` on a route of this test's own: owner token, the account's read key, nothing else."""
    app: FastAPI = env.client.app

    @app.get("/v1/account/{erd}/probe")
    async def probe(access: DashboardRead) -> dict[str, Any]:
        return {"account": access.account, "role": access.role}

    account, other = auth.account(), auth.account()
    read_key = auth.create_key(account, policy={"scopes": ["read"]})["secret"]
    relay_key = auth.create_key(account, policy={"scopes": ["relay"]})["secret"]
    others_key = auth.create_key(other)["secret"]
    path = f"/v1/account/{account.address}/probe"

    assert env.client.get(path, headers=auth.bearer(account)).json() == {
        "account": account.address,
        "role": "owner",
    }
    assert env.client.get(path, headers={"X-Api-Key": read_key}).json() == {
        "account": account.address,
        "role": "key",
    }
    platform_problem(
        env.client.get(path, headers={"X-Api-Key": relay_key}),
        "API_KEY_SCOPE",
        {"requiredScope": "read", "keyScopes": ["relay"]},
    )
    platform_problem(env.client.get(path, headers={"X-Api-Key": others_key}), "FORBIDDEN", {"role": None})
    body = platform_problem(env.client.get(path), "UNAUTHENTICATED")
    assert "X-Api-Key" in body["detail"]
    malformed = problem(
        env.client.get("/v1/account/erd1nope/probe", headers=auth.bearer(account)), "MALFORMED_REQUEST"
    )
    assert malformed["details"] == {"field": "erd"}


# Admin paths ---------------------------------------------------------------------------------------------
def test_admin_paths_are_admin_only_whatever_the_credentials(
    env: Any, auth: Any, platform_problem: Any
) -> None:
    account = auth.account()
    key = auth.create_key(account)["secret"]
    credentials = [{}, auth.bearer(account), {"X-Api-Key": key}]
    for headers in credentials:
        for method, path in (
            ("GET", "/v1/admin"),
            ("GET", "/v1/admin/relayers"),
            ("POST", "/v1/admin/flags/pause"),
            ("DELETE", "/v1/admin/accounts/x"),
            ("PUT", "/v1/admin/keys/k"),
        ):
            body = platform_problem(env.client.request(method, path, headers=headers), "ADMIN_ONLY")
            assert "admin port" in body["detail"]
        head = env.client.head("/v1/admin/relayers", headers=headers)
        assert head.status_code == 403 and head.content == b""


# Origins and CORS ----------------------------------------------------------------------------------------
def _preflight(env: Any, path: str, origin: str, method: str, headers: str = "") -> Any:
    request_headers = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        request_headers["Access-Control-Request-Headers"] = headers
    return env.client.options(path, headers=request_headers)


def _vary(response: Any) -> set[str]:
    return {part.strip().lower() for part in response.headers.get("vary", "").split(",") if part.strip()}


def test_origin_not_allowed_on_credentialed_routes(env: Any, auth: Any, platform_problem: Any) -> None:
    caller = auth.account()
    headers = {**auth.bearer(caller), "Origin": EVIL}
    refused = env.client.get("/v1/me", headers=headers)
    body = platform_problem(refused, "ORIGIN_NOT_ALLOWED")
    assert EVIL in body["detail"]
    assert refused.headers["Access-Control-Allow-Origin"] == "*" and "origin" in _vary(refused)
    platform_problem(
        env.client.post(
            f"/v1/account/{caller.address}/keys", json={"label": "x"}, headers={**headers, "Origin": "null"}
        ),
        "ORIGIN_NOT_ALLOWED",
    )
    platform_problem(_preflight(env, "/v1/me", EVIL, "GET", "authorization"), "ORIGIN_NOT_ALLOWED")
    # A key sent from a foreign page to the (otherwise public) relay route is refused too.
    key = auth.create_key(caller)["secret"]
    platform_problem(
        env.client.post("/v1/relay", content=b"{}", headers={"Origin": EVIL, "X-Api-Key": key}),
        "ORIGIN_NOT_ALLOWED",
    )
    platform_problem(
        _preflight(env, "/v1/relay", EVIL, "POST", "content-type, x-api-key"), "ORIGIN_NOT_ALLOWED"
    )
    assert (
        env.client.get("/v1/me", headers=auth.bearer(caller)).status_code == 200
    )  # no Origin: not a browser


def test_cors_preflights(env: Any) -> None:
    app_origin = env.settings.network.app_origin
    for origin in (app_origin, "http://localhost:3000", "http://127.0.0.1:5173"):  # localhost: localnet only
        response = _preflight(env, "/v1/account/erd1x/keys", origin, "POST", "authorization, content-type")
        assert response.status_code == 204, response.text
        assert response.headers["Access-Control-Allow-Origin"] == origin
        assert response.headers["Access-Control-Allow-Methods"] == "GET, OPTIONS, POST"
        allowed = {h.strip() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"Authorization", "X-Api-Key", "Idempotency-Key", "Last-Event-ID", "Content-Type"} <= allowed
        assert int(response.headers["Access-Control-Max-Age"]) > 0
        assert "origin" in _vary(response) and "Access-Control-Allow-Credentials" not in response.headers

    # Public routes: any origin, never credentials mode.
    public = _preflight(env, "/v1/relay/assign", EVIL, "POST", "content-type")
    assert public.status_code == 204 and public.headers["Access-Control-Allow-Origin"] == "*"
    relay = _preflight(env, "/v1/relay", EVIL, "POST", "content-type, idempotency-key")
    assert relay.status_code == 204 and relay.headers["Access-Control-Allow-Origin"] == "*"
    assert relay.headers["Access-Control-Allow-Methods"] == "OPTIONS, POST"
    network = _preflight(env, "/v1/network", "null", "GET")
    assert network.status_code == 204 and network.headers["Access-Control-Allow-Origin"] == "*"


def test_cors_simple_requests(env: Any, auth: Any) -> None:
    app_origin = env.settings.network.app_origin
    public = env.client.get("/v1/network", headers={"Origin": EVIL})
    assert public.status_code == 200 and public.headers["Access-Control-Allow-Origin"] == "*"
    exposed = {h.strip() for h in public.headers["Access-Control-Expose-Headers"].split(",")}
    assert {
        "Relay-Request-Id",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "Retry-After",
        "ETag",
        "PAYMENT-REQUIRED",
        "PAYMENT-RESPONSE",
    } <= exposed
    assert "origin" in _vary(public)

    caller = auth.stranger()
    me = env.client.get("/v1/me", headers={**auth.bearer(caller), "Origin": app_origin})
    assert me.status_code == 200 and me.headers["Access-Control-Allow-Origin"] == app_origin
    assert "Access-Control-Allow-Credentials" not in me.headers and "origin" in _vary(me)
    # An error on a credentialed route is readable by the app (so it can show why).
    refused = env.client.get("/v1/me", headers={"Origin": app_origin})
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == app_origin

    # Without an Origin (servers, curl): no CORS headers, but caches still keep origins apart.
    plain = env.client.get("/v1/network")
    assert "Access-Control-Allow-Origin" not in plain.headers and "origin" in _vary(plain)


def test_app_origin_override_and_localhost(make_env: Any, platform_problem: Any) -> None:
    served = make_env(app_origin="https://app.example.test")
    allowed = _preflight(served, "/v1/me", "https://app.example.test", "GET", "authorization")
    assert allowed.status_code == 204
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example.test"
    # The profile default is replaced, not added to; localhost stays open because this is localnet.
    platform_problem(
        _preflight(served, "/v1/me", "https://other.example.test", "GET", "authorization"),
        "ORIGIN_NOT_ALLOWED",
    )
    assert _preflight(served, "/v1/me", "http://localhost:8080", "GET", "authorization").status_code == 204


def test_localhost_is_not_an_app_origin_off_localnet() -> None:
    devnet = Settings(profile="devnet", master_secret="x" * 32, database_url="sqlite+aiosqlite:///unused.db")
    policy = OriginPolicy.from_settings(devnet)
    assert policy.allows_credentials("https://devnet-app.gasless.example")
    assert policy.allows_credentials("https://devnet-app.gasless.example/")
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "https://app.gasless.example", "null"):
        assert not policy.allows_credentials(origin), origin


# A token minted before a restart ------------------------------------------------------------------------
def test_a_token_survives_a_restart_and_verifies_on_another_host(
    tmp_path: Any, unpaused_localnet: Any, auth: Any, platform_problem: Any
) -> None:
    """The block record is in memory only: a host started after the token's block never recorded it. The
    token's block is then verified once on the chain (the gateway's block by hash), as MultiversX's own
    native-auth server does; a hash the chain does not know stays `unknown block`."""
    from relay_kit import start_env

    account = auth.account()
    block = auth.block()
    token = auth.token(account, ttl_seconds=3_600, block=block["blockHash"])
    headers = {"Authorization": f"Bearer {token}"}
    assert auth.env.client.get("/v1/me", headers=headers).status_code == 200
    # A new host (as after a deploy), on its own database: its record starts at the newest block.
    auth.wait_next_block(block["blockNonce"] + 2)
    later = start_env(tmp_path / "restarted", unpaused_localnet)
    restarted = next(later)
    try:
        assert block["blockHash"] not in restarted.client.app.state.host.network.blocks
        me = restarted.client.get("/v1/me", headers=headers)
        assert me.status_code == 200, me.text
        assert me.json()["tokenExpiresMs"] == block["blockTimestampMs"] + 3_600_000
        forged = auth.token(account, ttl_seconds=600, block="ab" * 32)
        refused = restarted.client.get("/v1/me", headers={"Authorization": f"Bearer {forged}"})
        assert "unknown block" in platform_problem(refused, "TOKEN_INVALID")["detail"]
    finally:
        with pytest.raises(StopIteration):
            next(later)
