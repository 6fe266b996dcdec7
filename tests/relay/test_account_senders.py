"""Pages through HTTP on a real listing: `GET /v1/account/{erd}/senders` over senders added on chain."""

from __future__ import annotations

import time
from typing import Any

import pytest
from multiversx_sdk import Address, UserSecretKey
from relay_kit import user_call

from gasless.chain.addresses import address_of
from gasless.core.crypto import PurposeKeys
from gasless.http.pages import CURSOR_TTL_MS, CursorCodec

SENDERS = 12


@pytest.fixture
def account(env: Any) -> tuple[str, UserSecretKey, list[str]]:
    """An account with SENDERS authorised senders, added on chain by the account itself."""
    owner = env.new_sender(1, plan=False)
    env_post(env, "/localnet/faucet", {"address": owner.address, "egldAtto": str(10**18), "usdcMicro": 10**6})
    user_call(env, owner.key, "deposit", [], usdc=10**6)
    senders = [
        address_of(env.new_sender(1, plan=False).key.generate_public_key().buffer) for _ in range(SENDERS)
    ]
    user_call(env, owner.key, "addSenders", [10**6, senders])
    env.wait_mirror()
    return owner.address, owner.key, [s.to_bech32() for s in senders]


def env_post(env: Any, path: str, body: dict[str, Any]) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{env.localnet.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).read()


def page(env: Any, account: str, **params: Any) -> Any:
    response = env.client.get(f"/v1/account/{account}/senders", params=params)
    assert response.status_code == 200, response.text
    return response


def walk(env: Any, account: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        body = page(env, account, **params).json()
        assert set(body) == {"items", "nextCursor"}
        pages.append([item["address"] for item in body["items"]])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages


def wait_for_senders(env: Any, account: str, expected: list[str]) -> None:
    """The contract mirror is a second old at most: wait until it shows the new list."""
    deadline = time.monotonic() + 10
    while True:
        items = [i["address"] for i in page(env, account, limit=200).json()["items"]]
        if items == expected or time.monotonic() > deadline:
            assert items == expected
            return
        time.sleep(0.1)


def test_every_page_of_an_account_in_order(env: Any, account: tuple[str, Any, list[str]]) -> None:
    erd, _, senders = account
    assert walk(env, erd, 5) == [senders[0:5], senders[5:10], senders[10:12]]
    assert walk(env, erd, 12) == [senders]  # exactly one full page: no next page
    whole = page(env, erd)  # default page size 50
    assert whole.json() == {"items": [{"address": a} for a in senders], "nextCursor": None}
    assert whole.headers["Cache-Control"] == "public, max-age=2" and whole.headers["ETag"]
    assert whole.headers["RateLimit-Limit"]
    again = env.client.get(f"/v1/account/{erd}/senders", headers={"If-None-Match": whole.headers["ETag"]})
    assert again.status_code == 304


def test_pages_resume_after_their_last_sender_when_senders_are_removed(
    env: Any, account: tuple[str, Any, list[str]]
) -> None:
    erd, key, senders = account
    first = page(env, erd, limit=5).json()
    assert [i["address"] for i in first["items"]] == senders[0:5]
    # A sender before the page's end goes away: an offset would now skip senders[5]; the cursor does not.
    user_call(env, key, "removeSenders", [[Address.new_from_bech32(senders[2])]])
    env.wait_mirror()
    remaining = senders[:2] + senders[3:]
    wait_for_senders(env, erd, remaining)
    second = page(env, erd, limit=5, cursor=first["nextCursor"]).json()
    assert [i["address"] for i in second["items"]] == senders[5:10]
    # The page's last sender itself goes away: the next page starts where it stood.
    user_call(env, key, "removeSenders", [[Address.new_from_bech32(senders[9])]])
    env.wait_mirror()
    wait_for_senders(env, erd, [s for s in remaining if s != senders[9]])
    third = page(env, erd, limit=5, cursor=second["nextCursor"]).json()
    assert third == {"items": [{"address": a} for a in senders[10:12]], "nextCursor": None}


def test_cursors_that_are_not_valid_here(env: Any, account: tuple[str, Any, list[str]], problem: Any) -> None:
    erd, _, _ = account
    cursor = page(env, erd, limit=5).json()["nextCursor"]
    assert page(env, erd, limit=5, cursor=cursor).status_code == 200

    def refused(value: str, on: str = erd) -> dict[str, Any]:
        response = env.client.get(f"/v1/account/{on}/senders", params={"limit": 5, "cursor": value})
        return problem(response, "CURSOR_INVALID")

    body, mac = cursor.split(".")
    flip = {"A": "B"}.get(body[3], "A")
    refused(body[:3] + flip + body[4:] + "." + mac)  # payload tampered
    refused(body + "." + mac[:-2] + ("AA" if mac[-2:] != "AA" else "BA"))  # MAC tampered
    for garbage in ("", "abc", "a.b.c", "%%%.###", "x" * 2_000):
        refused(garbage)
    # Another account's listing (the account exists; the cursor is genuine but not for it).
    other = env.new_sender(1)  # granted a plan: an account with no senders
    env.wait_mirror()
    assert env.client.get(f"/v1/account/{other.address}/senders").status_code == 200
    assert "another listing" in refused(cursor, on=other.address)["detail"]
    # Minted with this environment's key but for another listing, another environment, or long ago.
    keys = PurposeKeys(
        env.settings.master_secret.get_secret_value().encode(),
        env.settings.key_env,
        env.settings.network.chain_id,
    )
    position = {"after": account[2][4], "index": 4}
    filters = {"account": erd}
    fresh = CursorCodec(keys).mint("listAccountSenders", filters, position)
    assert [i["address"] for i in page(env, erd, limit=2, cursor=fresh).json()["items"]] == account[2][5:7]
    refused(CursorCodec(keys).mint("listAccountPurchases", filters, position))
    live = PurposeKeys(keys.master_secret, "live", keys.chain_id)
    refused(CursorCodec(live).mint("listAccountSenders", filters, position))
    old = CursorCodec(keys, clock=lambda: time.time() - (CURSOR_TTL_MS + 120_000) / 1000)
    assert "expired" in refused(old.mint("listAccountSenders", filters, position))["detail"]


def test_page_size_and_addresses(env: Any, account: tuple[str, Any, list[str]], problem: Any) -> None:
    erd, _, senders = account
    for bad in ("0", "201", "-1", "ten"):
        response = env.client.get(f"/v1/account/{erd}/senders", params={"limit": bad})
        assert problem(response, "MALFORMED_REQUEST")["details"]["field"] == "limit"
    assert len(page(env, erd, limit=1).json()["items"]) == 1
    assert page(env, erd, limit=200).json()["items"] == [{"address": a} for a in senders]
    malformed = env.client.get("/v1/account/erd1nope/senders")
    assert problem(malformed, "MALFORMED_REQUEST")["details"]["field"] == "erd"
    stranger = env.new_sender(1, plan=False)  # a valid address with no account
    problem(env.client.get(f"/v1/account/{stranger.address}/senders"), "NOT_FOUND")
    # An authorised sender is not an account.
    problem(env.client.get(f"/v1/account/{senders[0]}/senders"), "NOT_FOUND")
