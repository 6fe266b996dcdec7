"""Auth tests: the relay suite's app on a real localnet (`env`, `make_env`, `problem`) plus `auth`, a kit
that makes real native-auth tokens, accounts with authorised senders, suspensions and API keys."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from relay_kit import load_conftest

from gasless.chain.addresses import address_of
from gasless.client.actions import action_headers
from gasless.client.keys import UserKey
from gasless.client.native_auth import make_native_auth_token
from gasless.localnet.owner import owner_call

relay_env = load_conftest("relay")
env = relay_env.env
make_env = relay_env.make_env
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem

# The platform group of the error catalogue (docs/errors.json), kept by hand: code -> HTTP status (never
# retryable, no `resign`).
PLATFORM_STATUS = {
    "UNAUTHENTICATED": 401,
    "TOKEN_INVALID": 401,
    "TOKEN_EXPIRED": 401,
    "ORIGIN_NOT_ALLOWED": 403,
    "API_KEY_INVALID": 401,
    "API_KEY_SCOPE": 403,
    "FORBIDDEN": 403,
    "ADMIN_ONLY": 403,
    "ACCOUNT_SUSPENDED": 403,
    "NOT_FOUND": 404,
    "LIMIT_REACHED": 409,
}


def check_platform_problem(response: Any, code: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """`response` is the interface contract's problem document for platform `code`, with exactly `details` (or none)."""
    status = PLATFORM_STATUS[code]
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["code"] == code and body["status"] == status, body
    assert body["type"] == relay_env.DOCS_ERRORS_URL + code.lower().replace("_", "-")
    assert body["title"] and isinstance(body["detail"], str) and body["detail"], body
    assert body["retryable"] is False and "resign" not in body, body
    assert body["instance"] == response.headers["Relay-Request-Id"], body
    assert body.get("details") == details, body
    return body  # type: ignore[no-any-return]


class AuthKit:
    """Real credentials against one env: tokens signed by sender keys, on-chain roles, API keys."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.origin = env.settings.network.app_origin
        self._sender_fee_zero = False

    # Native-auth -----------------------------------------------------------------------------------
    def block(self) -> dict[str, Any]:
        return self.env.client.get("/v1/network").json()["nativeAuth"]  # type: ignore[no-any-return]

    def token(
        self, who: Any, *, ttl_seconds: int = 600, origin: str | None = None, block: str | None = None
    ) -> str:
        return make_native_auth_token(
            who.key,
            origin=self.origin if origin is None else origin,
            block_hash=block or self.block()["blockHash"],
            ttl_seconds=ttl_seconds,
        )

    def bearer(self, who: Any, **kwargs: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(who, **kwargs)}"}

    def wait_next_block(self, after_nonce: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.block()["blockNonce"] > after_nonce:
                return
            time.sleep(0.05)
        raise AssertionError("no new shard-1 block")

    # On-chain roles --------------------------------------------------------------------------------
    def account(self, shard: int = 1) -> Any:
        """A new address with an account (a granted plan) in the billing contract."""
        return self.env.new_sender(shard, plan=True)

    def stranger(self, shard: int = 1) -> Any:
        return self.env.new_sender(shard, plan=False)

    def add_sender(self, account: Any, sender: Any) -> None:
        """`account` signs a real `addSenders` transaction naming `sender` (sender fee set to 0 first)."""
        if not self._sender_fee_zero:
            self.env.owner("setSenderFeeRu", [0])
            self._sender_fee_zero = True
        self._post_localnet("/localnet/faucet", {"address": account.address, "egldAtto": str(10**18)})
        wallet = SimpleNamespace(
            address=address_of(account.key.generate_public_key().buffer), secret_key=account.key
        )
        sender_address = address_of(sender.key.generate_public_key().buffer)
        asyncio.run(
            owner_call(self.env.localnet.url, wallet, self.env.contract, "addSenders", [0, [sender_address]])  # type: ignore[arg-type]
        )
        self.wait_me(
            sender,
            lambda accounts: any(a["address"] == account.address and a["role"] == "sender" for a in accounts),
        )

    def suspend(self, account: Any, suspended: bool = True) -> None:
        self.env.owner(
            "setAccountSuspended", [address_of(account.key.generate_public_key().buffer), suspended]
        )
        self.wait_me(account, lambda accounts: bool(accounts) and accounts[0]["suspended"] is suspended)

    def wait_me(self, who: Any, seen: Any, timeout: float = 10.0) -> None:
        """Poll GET /v1/me as `who` until `seen(accounts)` holds (the contract mirror caches views ~1 s)."""
        headers = self.bearer(who)
        deadline = time.monotonic() + timeout
        accounts: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            response = self.env.client.get("/v1/me", headers=headers)
            assert response.status_code == 200, response.text
            accounts = response.json()["accounts"]
            if seen(accounts):
                return
            time.sleep(0.05)
        raise AssertionError(f"GET /v1/me never showed the change: {accounts}")

    def _post_localnet(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{self.env.localnet.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=5).read()

    # API keys --------------------------------------------------------------------------------------
    def post_key(self, account: Any, body: dict[str, Any], client: Any = None) -> Any:
        """POST a key creation the way a client must: the first attempt answers with the challenge, the
        account's key signs it (per-action signature), and the same request goes again, signed. Returns
        the second answer (or the first when it is not the challenge)."""
        client = client or self.env.client
        raw = json.dumps(body).encode()
        path = f"/v1/account/{account.address}/keys"
        headers = {**self.bearer(account), "Content-Type": "application/json"}
        first = client.post(path, content=raw, headers=headers)
        if first.status_code != 403 or first.json().get("code") != "ACTION_SIGNATURE_INVALID":
            return first
        signed = action_headers(UserKey(account.key), "createApiKey", raw, first.json()["details"])
        return client.post(path, content=raw, headers={**headers, **signed})

    def create_key(self, account: Any, **body: Any) -> dict[str, Any]:
        response = self.post_key(account, {"label": "ci", **body})
        assert response.status_code == 201, response.text
        return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def auth(env: Any) -> AuthKit:
    return AuthKit(env)


@pytest.fixture
def auth_for() -> Any:
    """`auth_for(env)`: an AuthKit for another env (e.g. a second host from `make_env`)."""
    return AuthKit


@pytest.fixture
def platform_problem() -> Any:
    """`platform_problem(response, code, details=None)`: see `check_platform_problem`."""
    return check_platform_problem
