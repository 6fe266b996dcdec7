"""The relay API on a real localnet: an app per test, senders with plans, helpers to sign and relay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from multiversx_sdk import Transaction
from relay_kit import (  # noqa: F401  (re-exported for the directories that load this conftest by path)
    MASTER_SECRET,
    RelayEnv,
    Sender,
    _addr,
    key_in_shard,
    relay_settings,
    start_env,
    unthrottled_limits,
    wait_ready,
)

from gasless.localnet.owner import unpause


@pytest.fixture
def unpaused_localnet(localnet: Any) -> Any:
    asyncio.run(unpause(localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"]))
    return localnet


@pytest.fixture
def env(tmp_path: Path, unpaused_localnet: Any) -> Iterator[RelayEnv]:
    yield from start_env(tmp_path, unpaused_localnet)


@pytest.fixture
def make_env(tmp_path: Path, unpaused_localnet: Any) -> Iterator[Callable[..., RelayEnv]]:
    """Start an env with overrides (settings or create_app keyword arguments)."""
    generators: list[Iterator[RelayEnv]] = []

    def make(**kwargs: Any) -> RelayEnv:
        gen = start_env(tmp_path, unpaused_localnet, **kwargs)
        generators.append(gen)
        return next(gen)

    yield make
    for gen in generators:
        with pytest.raises(StopIteration):
            next(gen)


# Error-path helpers (test_relay_errors, test_relay_bad_input, test_assign_errors) ------------------------
# The oracle is this table, kept by hand apart from the service's catalogue (published as docs/errors.json):
# code -> (HTTP status, retryable, resign or None outside the relay group, required `details` members).
CONTRACT_ERRORS: dict[str, tuple[int, bool, str | None, tuple[str, ...]]] = {
    "MALFORMED_REQUEST": (400, False, "NONE", ("field",)),
    "VARIANTS_NOT_SUPPORTED": (400, False, "NONE", ()),
    "RELAYER_SIGNATURE_PRESENT": (400, False, "NONE", ()),
    "CHAIN_ID_MISMATCH": (400, False, "NONE", ()),
    "TX_VERSION_UNSUPPORTED": (400, False, "NONE", ()),
    "TX_OPTIONS_UNSUPPORTED": (400, False, "NONE", ()),
    "LEASE_MISSING": (400, False, "NONE", ()),
    "LEASE_INVALID": (403, False, "NONE", ()),
    "LEASE_MISMATCH": (409, False, "NONE", ()),
    "LEASE_EXPIRED": (409, True, "SAME_BYTES", ("renewable",)),
    "NONCE_PIN_MISMATCH": (409, False, "NONE", ()),
    "RESIGN_REQUIRED": (409, False, "NEW_SIGNATURE_SAME_NONCE", ("assignment",)),
    "RESIGN_SAME_NONCE": (409, False, "NEW_SIGNATURE_SAME_NONCE", ("assignment", "minGasPrice")),
    "REPLACEMENT_UNDERPRICED": (422, False, "NONE", ("minGasPrice",)),
    "INTENT_ALREADY_EXECUTED": (409, False, "NONE", ("intent.txHash",)),
    "NOTHING_TO_CANCEL": (409, False, "NONE", ()),
    "NONCE_TOO_LOW": (409, False, "NONE", ("onchainNonce", "poolLastNonce", "expectedNonce")),
    "NONCE_IN_FLIGHT": (409, True, "SAME_BYTES", ("occupiedBy", "pinnedNonce")),
    "NONCE_GAP": (409, False, "NONE", ()),
    "TOO_MANY_IN_FLIGHT": (429, True, "NONE", ()),
    "RELAYER_UNKNOWN": (422, False, "NONE", ()),
    "RELAYER_SHARD_MISMATCH": (422, False, "NONE", ()),
    "RELAYER_RETIRED": (410, False, "NONE", ()),
    "GAS_PRICE_OUT_OF_RANGE": (422, False, "NONE", ("limit", "actual", "bound")),
    "GAS_LIMIT_TOO_LOW": (422, False, "NONE", ("limit", "actual")),
    "GAS_LIMIT_TOO_HIGH": (422, False, "NONE", ("limit", "actual")),
    "GAS_OVERPROVISIONED": (422, False, "NONE", ("limit", "actual")),
    "DATA_TOO_LARGE": (422, False, "NONE", ("limit", "actual")),
    "SENDER_SIGNATURE_INVALID": (422, False, "NONE", ()),
    "GUARDIAN_SIGNATURE_INVALID": (422, False, "NONE", ()),
    "GUARDIAN_REQUIRED": (422, False, "NONE", ()),
    "GUARDIAN_MISMATCH": (422, False, "NONE", ()),
    "GUARDIAN_IS_RELAYER": (422, False, "NONE", ()),
    "INSUFFICIENT_SENDER_BALANCE": (422, False, "NONE", ()),
    "SIMULATION_FAILED": (422, False, "NONE", ("returnMessage",)),
    "CONTRACT_PAUSED": (503, True, "SAME_BYTES", ("scope",)),
    "SWAP_VENUE_PAUSED": (503, True, "SAME_BYTES", ()),
    "ASSIGN_PROOF_REQUIRED": (401, False, "NONE", ("serverTimeMs",)),
    "ASSIGN_PROOF_INVALID": (401, False, "NONE", ("serverTimeMs",)),
    "INTENT_ALREADY_SUBMITTED": (409, False, "NONE", ("intent",)),
    "SIGNER_TIMEOUT": (503, True, "SAME_BYTES", ()),
    "NO_ENTITLEMENT": (402, False, "NONE", ("reason",)),
    "RATE_LIMITED": (429, True, "SAME_BYTES", ("retryAfterMs", "scope")),
    "NO_RELAYER_AVAILABLE": (503, True, "SAME_BYTES", ()),
    "UPSTREAM_UNAVAILABLE": (503, True, "SAME_BYTES", ()),
    "SIGNER_UNAVAILABLE": (503, True, "SAME_BYTES", ()),
    "SIGNER_FENCED": (503, True, "SAME_BYTES", ()),
    "INTERNAL": (500, True, "SAME_BYTES", ()),
    "QUOTA_EXHAUSTED": (429, False, "NONE", ("reason",)),
    "GAS_BUDGET_EXCEEDED": (429, True, "SAME_BYTES", ("retryAfterMs",)),
    "HOURLY_BURN_EXCEEDED": (429, True, "SAME_BYTES", ()),
    "SENDER_NOT_AUTHORIZED": (403, False, "NONE", ("reason", "account")),
    "RECEIVER_NOT_ALLOWED": (403, False, "NONE", ()),
    "NOT_FOUND": (404, False, None, ()),
    "PAYLOAD_TOO_LARGE": (413, False, None, ()),
    "CURSOR_INVALID": (400, False, None, ()),
    # Purchase group (no Resign member outside the relay group).
    "PRICE_ABOVE_MAX": (409, False, None, ()),
    "TIER_NOT_PURCHASABLE": (422, False, None, ()),
    "QUEUED_BLOCK_EXISTS": (409, False, None, ()),
    "DOWNGRADE_NOT_IMMEDIATE": (409, False, None, ()),
    "INSUFFICIENT_CREDITS": (402, False, None, ()),
    "DEPOSIT_BELOW_MIN": (422, False, None, ()),
    "DEPOSIT_ABOVE_MAX": (422, False, None, ()),
    "SWAP_BUDGET_EXHAUSTED": (503, True, None, ("retryAfterMs",)),
    "PAYG_PRICE_ABOVE_MAX": (409, False, None, ()),
    "DEPLOY_NOT_ALLOWED": (403, False, None, ()),
    "UNSUPPORTED_TX_FIELD": (422, False, None, ()),
    "QUOTE_EXPIRED": (409, False, None, ()),
    "RENEW_NOT_APPLICABLE": (409, False, None, ("predictedOutcome",)),
    # x402 group.
    "PAYMENT_REQUIRED": (402, False, None, ()),
    "PAYMENT_INVALID": (402, False, None, ()),
    "PAYMENT_FAILED": (402, False, None, ()),
}
DOCS_ERRORS_URL = "https://docs.gasless.example/errors/"


def check_problem(response: Any, code: str) -> dict[str, Any]:
    """The response is the interface contract's problem document for `code`; returns it."""
    status, retryable, resign, details = CONTRACT_ERRORS[code]
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["code"] == code, body
    assert body["type"] == DOCS_ERRORS_URL + code.lower().replace("_", "-")
    assert body["status"] == status and body["title"] and isinstance(body["detail"], str)
    assert body["retryable"] is retryable, body
    if resign is None:
        assert "resign" not in body, body
    else:
        assert body["resign"] == resign, body
    assert body["instance"] and body["instance"] == response.headers["Relay-Request-Id"]
    for name in details:
        value: Any = body.get("details") or {}
        for part in name.split("."):
            assert isinstance(value, dict) and part in value, f"details.{name} missing: {body}"
            value = value[part]
    if status == 429 and retryable:
        retry_ms = body["details"]["retryAfterMs"]
        assert isinstance(retry_ms, int) and retry_ms >= 1
        seconds = int(response.headers["Retry-After"])
        assert seconds >= 1 and seconds * 1000 >= retry_ms > (seconds - 1) * 1000
    return body  # type: ignore[no-any-return]


@pytest.fixture
def problem() -> Callable[[Any, str], dict[str, Any]]:
    """`problem(response, code)`: assert the interface contract's problem document for `code` and return it."""
    return check_problem


def gateway_data(env: RelayEnv, path: str) -> Any:
    """GET on the localnet gateway (not the API): the envelope's `data`."""
    import json as _json
    import urllib.request

    with urllib.request.urlopen(f"{env.localnet.url}{path}", timeout=5) as answer:
        return _json.loads(answer.read())["data"]


def gateway_knows(env: RelayEnv, tx_hash: str) -> bool:
    import urllib.error

    try:
        gateway_data(env, f"/transaction/{tx_hash}")
    except urllib.error.HTTPError:
        return False
    return True


def chain_nonce(env: RelayEnv, address: str) -> int:
    return int(gateway_data(env, f"/address/{address}/nonce")["nonce"])


def pool_hashes(env: RelayEnv, address: str) -> set[str]:
    data = gateway_data(env, f"/transaction/pool?by-sender={address}&fields=hash,nonce")
    return {entry["txFields"]["hash"] for entry in data["txPool"]["transactions"]}


def cosigned_hash(env: RelayEnv, tx: Transaction) -> str | None:
    """The hash `tx` would have once co-signed by our relayer (Ed25519 is deterministic), or None."""
    import copy

    from gasless.chain.codec import signing_bytes, tx_hash

    keys = {w.address.to_bech32(): w.secret_key for w in env.localnet.net.genesis.relayers}
    relayer = tx.relayer.to_bech32() if tx.relayer is not None and not tx.relayer.is_empty() else None
    if relayer not in keys:
        return None
    signed = copy.deepcopy(tx)
    signed.relayer_signature = keys[relayer].sign(signing_bytes(signed))
    return tx_hash(signed)


def check_nothing_sent(
    env: RelayEnv,
    tx: Transaction,
    code: str,
    *,
    nonce: int = 0,
    pool: Any = (),
    slot: bool = True,
) -> dict[str, Any]:
    """After a relay error: the submission reads REJECTED with `code`; the chain never saw it.

    `nonce` is the sender's expected account nonce and `pool` the hashes expected in its pool (what the
    test itself put there); `slot` also reads `GET /v1/relay/<sender>:<nonce>` (when no other intent of ours
    speaks for the slot).
    """
    from gasless.chain.codec import tx_hash

    started = time.monotonic()
    submitted = tx_hash(tx)
    sender = tx.sender.to_bech32()
    deadline = started + 5.0
    while True:
        answer = env.client.get(f"/v1/relay/{submitted}")
        if answer.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert answer.status_code == 200, f"no REJECTED record for {submitted}: {answer.text}"
    for doc in (answer.json(), env.client.get(f"/v1/tx/{submitted}").json()):
        assert doc["state"] == "REJECTED" and doc["final"] is True, doc
        assert doc["rejection"]["code"] == code and doc["cosignedAtMs"] is None, doc
        assert doc["id"] == f"{sender}:{tx.nonce}" and doc["txHash"] == submitted
    rejected = answer.json()
    if slot:
        by_slot = env.client.get(f"/v1/relay/{sender}:{tx.nonce}").json()
        assert by_slot["state"] == "REJECTED" and by_slot["rejection"]["code"] == code, by_slot
    env.localnet.wait_rounds(3)  # anything sent would have reached the pool or executed by then
    assert chain_nonce(env, sender) == nonce
    assert pool_hashes(env, sender) == set(pool)
    would_be = cosigned_hash(env, tx)
    if would_be is not None:
        assert not gateway_knows(env, would_be), "the co-signed transaction reached the network"
    return rejected  # type: ignore[no-any-return]


@pytest.fixture
def nothing_sent() -> Callable[..., dict[str, Any]]:
    """`nothing_sent(env, tx, code, nonce=0, pool=(), slot=True)`: see `check_nothing_sent`."""
    return check_nothing_sent


def db_execute(env: RelayEnv, sql: str, **params: Any) -> None:
    """A write to the API host's own database (SQLite), as an operator would make it."""
    import sqlalchemy

    url = env.settings.effective_database_url.replace("sqlite+aiosqlite", "sqlite", 1)
    engine = sqlalchemy.create_engine(url, connect_args={"timeout": 10})
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(sql), params)
    finally:
        engine.dispose()


def set_relayer_state(env: RelayEnv, state: str, *addresses: str) -> None:
    """Set relayers' state in the contract (the authority, as `gasless admin relayer-state` does); returns
    once the host's pool refresh (200 ms) has followed it."""
    for address in addresses:
        env.owner("setRelayerState", [_addr(address), state.capitalize()])
    pool = env.client.app.state.host.relayers  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all((info := pool.get(a)) is not None and info.state == state for a in addresses):
            return
        time.sleep(0.05)
    raise AssertionError(f"the relayer pool did not see {addresses} {state}")


def relayers_in(env: RelayEnv, shard: int) -> list[str]:
    return sorted(w.address.to_bech32() for w in env.localnet.net.genesis.relayers if w.shard == shard)


@pytest.fixture
def operator() -> Any:
    """Operator actions on the host's database: `db_execute`, `set_relayer_state`, `relayers_in`."""
    from types import SimpleNamespace

    return SimpleNamespace(
        db_execute=db_execute, set_relayer_state=set_relayer_state, relayers_in=relayers_in
    )
