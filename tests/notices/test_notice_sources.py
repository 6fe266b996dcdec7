"""Sources beyond the plan threshold, on localnet: a plan block ending within 72 h, pay-as-you-go escrow
below the account's threshold (once per fall), and an API key revoked."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from types import SimpleNamespace
from typing import Any

from notice_kit import FAST, M, notices, put_prefs, wait_until  # type: ignore[import-not-found]
from relay_kit import Sender, key_in_shard  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of
from gasless.localnet.contracts.seed import SEED_RU_PRICE_MICRO
from gasless.localnet.owner import owner_call

DAY_MS = 86_400_000


def _user_call(env: Any, who: Any, function: str, args: list[Any]) -> None:
    """`who` signs a contract call (funded with EGLD for its gas first)."""
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/faucet",
        data=json.dumps({"address": who.address, "egldAtto": str(10**18)}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).read()
    wallet = SimpleNamespace(address=address_of(who.key.generate_public_key().buffer), secret_key=who.key)
    asyncio.run(owner_call(env.localnet.url, wallet, env.contract, function, args))  # type: ignore[arg-type]


def _kinds(server: Any, auth: Any, account: Any, kind: str) -> list[dict[str, Any]]:
    return [n for n in notices(server.client, account, auth.bearer(account))["items"] if n["kind"] == kind]


def test_period_ending_escrow_low_and_key_revoked(served: Any) -> None:
    server, env, auth = served(**FAST)
    # A tier whose period is one day: its block ends within 72 h of the grant.
    env.owner("setTier", [71, b"T71", "Human", 3, 1 * M, 100, DAY_MS, True, False])
    account = Sender(key_in_shard(1))
    env.owner("grant", [address_of(account.key.generate_public_key().buffer), 71, 1])
    ending = wait_until(lambda: _kinds(server, auth, account, "plan.period_ending"), "plan.period_ending")
    (notice,) = ending
    assert notice["severity"] == "warning" and notice["data"]["autoRenew"] is False
    assert notice["data"]["tierId"] == 71 and notice["data"]["endMs"] > notice["createdAtMs"]

    # Escrow below the threshold once pay-as-you-go is on (escrow 0 < 1 USDC): one notice.
    owner = auth.bearer(account)
    saved = put_prefs(server.client, account, owner, {"thresholds": {"escrowBelowMicro": 1 * M}})
    assert saved.status_code == 200 and saved.json()["thresholds"]["escrowBelowMicro"] == 1 * M
    _user_call(env, account, "setPayg", [True, 0, False, SEED_RU_PRICE_MICRO])
    low = wait_until(lambda: _kinds(server, auth, account, "escrow.low"), "escrow.low")
    assert low[0]["data"] == {"escrowMicro": 0, "thresholdMicro": 1 * M}
    _user_call(env, account, "setPayg", [True, 0, False, SEED_RU_PRICE_MICRO + 1])  # still low: no repeat

    # A key created then revoked: both notices, never the secret.
    key = auth.create_key(account, label="short-lived")
    assert (
        server.client.delete(f"/v1/account/{account.address}/keys/{key['keyId']}", headers=owner).status_code
        == 204
    )
    revoked = wait_until(lambda: _kinds(server, auth, account, "key.revoked"), "key.revoked")
    assert revoked[0]["data"] == {"keyId": key["keyId"], "label": "short-lived", "env": "test"}
    assert key["secret"] not in json.dumps(notices(server.client, account, owner))
    assert len(_kinds(server, auth, account, "escrow.low")) == 1
