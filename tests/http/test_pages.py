"""The shared page parameters and cursors, on a small app with the service's problem rendering.

The senders listing (tests/relay/test_account_senders.py) proves them on a real listing; this file covers
what no listing uses yet (the time window) and the cursor codec's own rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from manual_clock import ManualClock

from gasless.core.crypto import PurposeKeys, b64url, b64url_decode
from gasless.core.errors import ApiError
from gasless.http.pages import CURSOR_TTL_MS, CursorCodec, PageQuery, WindowQuery
from gasless.http.problems import install_problem_handlers

KEYS = PurposeKeys(b"pages-test-master-secret-0123456789abcdef", "test", "localnet")


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_problem_handlers(app, "https://docs.gasless.example")

    @app.get("/items")
    async def items(page: PageQuery, window: WindowQuery) -> dict[str, Any]:
        return {"limit": page.limit, "cursor": page.cursor, "from": window.from_ms, "to": window.to_ms}

    return TestClient(app)


def test_wire_names_and_defaults(client: TestClient) -> None:
    assert client.get("/items").json() == {"limit": 50, "cursor": None, "from": None, "to": None}
    answer = client.get("/items", params={"limit": 200, "cursor": "c", "from": 5, "to": 5})
    assert answer.json() == {"limit": 200, "cursor": "c", "from": 5, "to": 5}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"from": -1}, "from"),
        ({"to": "yesterday"}, "to"),
        ({"from": 10, "to": 9}, "from"),
    ],
)
def test_out_of_range_parameters_are_malformed(
    client: TestClient, params: dict[str, Any], field: str
) -> None:
    answer = client.get("/items", params=params)
    assert answer.status_code == 400
    assert answer.json()["code"] == "MALFORMED_REQUEST" and answer.json()["details"]["field"] == field


def test_cursor_round_trip_and_expiry_on_the_minute() -> None:
    clock = ManualClock(1_800_000_000.5)
    codec = CursorCodec(KEYS, clock=clock)
    cursor = codec.mint("listThings", {"account": "erd1a", "kind": ["x"]}, {"after": "k", "index": 3})
    assert codec.open(cursor, "listThings", {"kind": ["x"], "account": "erd1a"}) == {"after": "k", "index": 3}
    # Minted again within the same minute: the same bytes.
    clock.now += 20
    assert codec.mint("listThings", {"account": "erd1a", "kind": ["x"]}, {"after": "k", "index": 3}) == cursor
    # Valid until the next whole minute after minting, plus the TTL; stale from then on.
    expiry_s = (1_800_000_000_500 // 60_000 + 1) * 60 + CURSOR_TTL_MS / 1000
    clock.now = expiry_s - 0.001
    assert codec.open(cursor, "listThings", {"account": "erd1a", "kind": ["x"]})["index"] == 3
    clock.now = expiry_s
    with pytest.raises(ApiError) as stale:
        codec.open(cursor, "listThings", {"account": "erd1a", "kind": ["x"]})
    assert stale.value.code == "CURSOR_INVALID" and "expired" in stale.value.detail


def test_cursor_is_bound_to_listing_filters_environment_and_spelling() -> None:
    codec = CursorCodec(KEYS)
    cursor = codec.mint("listThings", {"account": "erd1a"}, 7)

    def refused(value: str, listing: str = "listThings", filters: dict[str, Any] | None = None) -> None:
        with pytest.raises(ApiError) as caught:
            codec.open(value, listing, filters if filters is not None else {"account": "erd1a"})
        assert caught.value.code == "CURSOR_INVALID"

    refused(cursor, listing="listOthers")
    refused(cursor, filters={"account": "erd1b"})
    refused(cursor, filters={})
    chain_d = CursorCodec(PurposeKeys(KEYS.master_secret, "test", "D"))
    refused(chain_d.mint("listThings", {"account": "erd1a"}, 7))
    body, mac = cursor.split(".")
    refused(body + "=." + mac)  # padded: another spelling of the same bytes
    refused(b64url(b64url_decode(body)) + "." + mac + "A")
    # A genuine MAC over a payload of another version is still refused.
    other_version = b'{"f":"x","l":"listThings","p":7,"v":2,"x":99999999999999}'
    refused(f"{b64url(other_version)}.{b64url(KEYS.mac('cursor', other_version))}")
