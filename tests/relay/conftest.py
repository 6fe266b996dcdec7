"""The relay API on a real localnet: an app per test, senders with plans, helpers to sign and relay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from multiversx_sdk import Transaction, TransactionComputer, UserSecretKey

from gasless.app import create_app
from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.limits import Rate, RouteLimitTable
from gasless.localnet.owner import owner_call, unpause
from gasless.relay.checks import presence_message
from gasless.settings import Settings

MASTER_SECRET = "relay-tests-master-secret-0123456789abcdef"


def unthrottled_limits() -> RouteLimitTable:
    """The spec's request-limit table with every class but assignment out of reach: functional tests read
    status and validate far more often than one IP may (test_route_limits.py tests those classes, with the
    spec's table and tight ones of its own); the assignment limits stay as the spec sets them."""
    huge = 1_000_000
    values: dict[str, Any] = {}
    for name, value in vars(RouteLimitTable()).items():
        if name.startswith("assign_"):
            continue
        if isinstance(value, Rate):
            values[name] = Rate(huge, huge)
        elif isinstance(value, int):
            values[name] = huge
        else:
            values[name] = {c: Rate(huge, huge) if isinstance(v, Rate) else huge for c, v in value.items()}
    return RouteLimitTable(**values)


_computer = TransactionComputer()


def key_in_shard(shard: int) -> UserSecretKey:
    while True:
        key = UserSecretKey.generate()
        if shard_of_pubkey(key.generate_public_key().buffer) == shard:
            return key


@dataclass
class Sender:
    key: UserSecretKey
    nonce: int = 0

    @property
    def address(self) -> str:
        return address_of(self.key.generate_public_key().buffer).to_bech32()

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.key.generate_public_key().buffer)


@dataclass
class RelayEnv:
    client: TestClient
    localnet: Any
    settings: Settings
    contract: str
    extra: dict[str, Any] = field(default_factory=dict)

    # Chain helpers ----------------------------------------------------------------------------------
    def owner(self, function: str, args: list[Any]) -> str:
        return asyncio.run(
            owner_call(self.localnet.url, self.localnet.net.genesis.owner, self.contract, function, args)
        )

    def new_sender(self, shard: int = 1, *, plan: bool = True) -> Sender:
        sender = Sender(key_in_shard(shard))
        if plan:
            self.owner("grant", [address_of(sender.key.generate_public_key().buffer), 3, 1])
        return sender

    # API helpers ----------------------------------------------------------------------------------
    def proof(self, sender: Sender, *, at_ms: int | None = None, kind: str = "key") -> dict[str, Any]:
        now = at_ms if at_ms is not None else int(time.time() * 1000)
        message = presence_message(self.settings.network.chain_id, sender.address, now)
        return {"kind": kind, "serverTimeMs": now, "signature": sender.key.sign(message).hex()}

    def assign(self, sender: Sender, **extra: Any) -> dict[str, Any]:
        body = {"sender": sender.address, "proof": self.proof(sender), **extra}
        response = self.client.post("/v1/relay/assign", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def build(
        self,
        sender: Sender,
        assignment: dict[str, Any],
        *,
        receiver: str | None = None,
        nonce: int | None = None,
        value: int = 0,
        data: bytes = b"",
        gas_limit: int | None = None,
        gas_price: int = 1_000_000_000,
        sign: bool = True,
        **fields: Any,
    ) -> Transaction:
        tx = Transaction(
            sender=address_of(sender.key.generate_public_key().buffer),
            receiver=address_of(key_in_shard(sender.shard).generate_public_key().buffer)
            if receiver is None
            else _addr(receiver),
            gas_limit=gas_limit if gas_limit is not None else 100_000 + 1_500 * len(data),
            chain_id=self.settings.network.chain_id,
            nonce=sender.nonce if nonce is None else nonce,
            value=value,
            data=data,
            gas_price=gas_price,
            version=2,
            relayer=_addr(assignment["relayer"]),
            **fields,
        )
        if sign:
            tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
        return tx

    def relay(self, tx: Transaction, lease: str | None, **extra: Any) -> Any:
        body: dict[str, Any] = {"tx": tx.to_dictionary()}
        if lease is not None:
            body["lease"] = lease
        body.update(extra.pop("body", {}))
        return self.client.post("/v1/relay", json=body, **extra)

    def wait_state(self, ident: str, states: tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            response = self.client.get(f"/v1/relay/{ident}")
            if response.status_code == 200:
                last = response.json()
                if last["state"] in states:
                    return last
            time.sleep(0.05)
        raise AssertionError(f"{ident} did not reach {states}; last {last}")

    def wait_mirror(self, timeout: float = 15.0) -> int:
        """Wait until the contract mirror applied every hyperblock existing now (final one round later)."""
        import json as _json
        import urllib.request

        with urllib.request.urlopen(f"{self.localnet.url}/network/status/4294967295", timeout=5) as answer:
            target = int(_json.loads(answer.read())["data"]["status"]["erd_nonce"])
        follower = self.client.app.state.host.mirror_follower  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if follower.cursor is not None and follower.cursor >= target:
                return target
            time.sleep(0.02)
        raise AssertionError(f"the mirror did not reach hyperblock {target}; at {follower.cursor}")

    def faults(self, **body: Any) -> None:
        import json as _json
        import urllib.request

        request = urllib.request.Request(
            f"{self.localnet.url}/localnet/faults",
            data=_json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=5).read()


def _addr(bech32: str) -> Any:
    from gasless.chain.addresses import parse_address

    return parse_address(bech32)


def relay_settings(tmp_path: Path, localnet: Any, **overrides: Any) -> Settings:
    info = localnet.net.info
    values: dict[str, Any] = {
        "profile": "localnet",
        "host_id": "a",
        "master_secret": MASTER_SECRET,
        "gateway_urls": localnet.urls,
        "database_url": f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}",
        "data_dir": tmp_path,
        "contract_address": info["contract"],
        "pair_address": info.get("pair"),
        "wrapper_address": info.get("wrapper"),
        "relayer_key_files": [w.path for w in localnet.net.genesis.relayers],
        "relayer_refresh_ms": 200,
        "signer_fence_ttl_ms": 2_000,
    }
    values.update(overrides)
    return Settings(**values)


def start_env(
    tmp_path: Path, localnet: Any, *, app_kwargs: dict[str, Any] | None = None, **overrides: Any
) -> Iterator[RelayEnv]:
    settings = relay_settings(tmp_path, localnet, **overrides)
    contract = localnet.net.info["contract"]
    kwargs: dict[str, Any] = {"route_limits": unthrottled_limits(), **(app_kwargs or {})}
    with TestClient(create_app(settings, **kwargs)) as client:
        wait_ready(client)
        yield RelayEnv(client, localnet, settings, contract)


def wait_ready(client: TestClient, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get("/readyz")
        if response.status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"host not ready: {client.get('/readyz').json()}")


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
# The oracle is the spec's table (interface-spec "Errors"), not the service's catalogue:
# code -> (HTTP status, retryable, resign or None outside the relay group, required `details` members).
SPEC_ERRORS: dict[str, tuple[int, bool, str | None, tuple[str, ...]]] = {
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
    "NOT_FOUND": (404, False, None, ()),
    "PAYLOAD_TOO_LARGE": (413, False, None, ()),
    "CURSOR_INVALID": (400, False, None, ()),
}
DOCS_ERRORS_URL = "https://docs.gasless.example/errors/"


def check_problem(response: Any, code: str) -> dict[str, Any]:
    """The response is the spec's problem document for `code`; returns it."""
    status, retryable, resign, details = SPEC_ERRORS[code]
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
    """`problem(response, code)`: assert the spec's problem document for `code` and return it."""
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
    time.sleep(max(0.0, 0.3 - (time.monotonic() - started)))  # a few 100 ms rounds
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
    """Set relayers' state in the database; returns once the host's pool refresh (200 ms) has seen it."""
    for address in addresses:
        db_execute(env, "UPDATE relayers SET state = :state WHERE address = :a", state=state, a=address)
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
