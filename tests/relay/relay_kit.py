"""Relay test helpers importable from any test directory (`from relay_kit import ...`): a module name that,
unlike `conftest`, no other directory shadows. `tests/relay/conftest.py` builds its fixtures on these."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import secrets
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Self

import aiohttp
import uvicorn
from fastapi.testclient import TestClient
from multiversx_sdk import Address, Transaction, TransactionComputer, UserSecretKey

from gasless.chain.abi import load_billing_abi
from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.chain.calls import contract_call
from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.limits.buckets import Rate, RouteLimitTable
from gasless.localnet.owner import owner_call
from gasless.relay.checks import presence_message

MASTER_SECRET = "relay-tests-master-secret-0123456789abcdef"


def reserved_port() -> socket.socket:
    """A free loopback port, bound and not listening: until a server listens on it, a connection is refused.
    Reusable at once once closed (SO_REUSEADDR): a host restarted on its predecessor's URL binds it again."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ServedApi:
    """An ASGI app (usually `create_app(settings)`) served by uvicorn from a background thread on a free loopback
    port, or on `sock` (bound, not listening), with its lifespan: `start()` returns once `/readyz` answers 200.
    A context manager too."""

    def __init__(self, app: Any, sock: socket.socket | None = None) -> None:
        self.app = app
        self.sock = sock or reserved_port()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="api", daemon=True
        )

    def start(self, timeout: float = 30.0) -> Self:
        self.thread.start()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except Exception as exc:  # noqa: BLE001 - not up yet (a 503 raises HTTPError too)
                last = repr(exc)
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"API not ready at {self.url}: {last}")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unthrottled_limits() -> RouteLimitTable:
    """The interface contract's request-limit table with every class but assignment out of reach: functional tests read
    status and validate far more often than one IP may (test_route_limits.py tests those classes, with the
    interface contract's table and tight ones of its own); the assignment limits stay as the interface contract sets them."""
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
        """Wait until the contract mirror applied the hyperblock that notarizes the shard blocks existing now
        (the next one: the metachain notarizes a shard block a round after it is proposed), so everything
        executed by now is in it."""
        import json as _json
        import urllib.request

        with urllib.request.urlopen(f"{self.localnet.url}/network/status/4294967295", timeout=5) as answer:
            target = int(_json.loads(answer.read())["data"]["status"]["erd_nonce"]) + 1
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


# The local network, around the service ---------------------------------------------------------------------
def localnet_post(env: Any, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{env.localnet.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())


def fund(env: Any, address: str, egld_atto: int = 10**18) -> None:
    localnet_post(env, "/localnet/faucet", {"address": address, "egldAtto": egld_atto})


def send_direct(env: Any, sender: Sender, *, nonce: int = 0, gas_price: int = 1_000_000_000) -> str:
    """A plain (not relayed) transfer signed by the sender, sent straight to the localnet gateway."""
    tx = Transaction(
        sender=address_of(sender.key.generate_public_key().buffer),
        receiver=address_of(key_in_shard(sender.shard).generate_public_key().buffer),
        gas_limit=50_000,
        chain_id=env.settings.network.chain_id,
        nonce=nonce,
        gas_price=gas_price,
        version=2,
    )
    tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
    answer = localnet_post(env, "/transaction/send", tx.to_dictionary())
    assert not answer.get("error"), answer
    return str(answer["data"]["txHash"])


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
        # Long enough that a loaded CI machine never lets the proof lapse between renewals (seen at 5 s).
        "signer_fence_ttl_ms": 15_000,
    }
    values.update(overrides)
    return Settings(**values)


_MIGRATED_SQLITE: list[bytes] = []  # this process's SQLite database migrated to head, once


def migrated_sqlite(path: Path) -> None:
    """Create the SQLite database `path` as a copy of one this process migrated to head: a host then starts
    on a database at head (a restart's case) instead of running every migration again, a fifth of a second of
    CPU per test. Fresh databases are migrated by the tests of `gasless serve`/`up`, tests/db and the
    PostgreSQL envs."""
    if not _MIGRATED_SQLITE:
        import sqlite3
        import tempfile

        from gasless.db.migrate import upgrade

        with tempfile.TemporaryDirectory() as scratch:
            template = Path(scratch) / "template.db"
            # In a thread of its own: a caller inside a running event loop cannot asyncio.run.
            migrating = threading.Thread(
                target=asyncio.run, args=(upgrade(f"sqlite+aiosqlite:///{template}"),)
            )
            migrating.start()
            migrating.join()
            with sqlite3.connect(template) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            _MIGRATED_SQLITE.append(template.read_bytes())
    path.parent.mkdir(parents=True, exist_ok=True)  # the data directory, as the host would make it
    path.write_bytes(_MIGRATED_SQLITE[0])


def start_env(
    tmp_path: Path, localnet: Any, *, app_kwargs: dict[str, Any] | None = None, **overrides: Any
) -> Iterator[RelayEnv]:
    settings = relay_settings(tmp_path, localnet, **overrides)
    database = tmp_path / "api.db"
    if settings.database_url == f"sqlite+aiosqlite:///{database.as_posix()}" and not database.exists():
        migrated_sqlite(database)
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


TESTS_DIR = Path(__file__).resolve().parents[1]


def load_conftest(directory: str) -> ModuleType:
    """Another test directory's conftest as a module, executed once per session under one name, so its
    fixtures can be offered by a sibling directory's conftest (`env = load_conftest("relay").env`)."""
    name = f"gasless_tests_{directory}_conftest"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, TESTS_DIR / directory / "conftest.py")
        if spec is None or spec.loader is None:
            raise ImportError(f"no conftest.py in tests/{directory}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def commit_point_values(
    sender: str,
    account: str,
    *,
    tx_hash: str | None = None,
    cosigned_at_ms: int = 1_700_000_000_000,
    **billing: Any,
) -> dict[str, Any]:
    """The values of one commit point (a co-signed plan-billed intent) for repository-level races, with
    random hashes; `billing` members override the plan decision's."""
    return {
        "sender": sender,
        "nonce": 0,
        "slot_seq": 0,
        "tx_hash": tx_hash or secrets.token_hex(32),
        "bytes_sha256": secrets.token_hex(32),
        "state": "COSIGNED",
        "seq": 1,
        "sender_shard": 1,
        "receiver": "erd1receiver",
        "relayer": "erd1relayer",
        "cross_shard": False,
        "gas_limit": 50_000,
        "gas_price": 1_000_000_000,
        "value_atto": 0,
        "lease_kind": "std",
        "billing": {
            "authMode": "signed_tx",
            "billingClass": "plan",
            "account": account,
            "ru": 1,
            "free": False,
            "periodId": 1_700_000_000_000,
            "paygPriceMicro": None,
            **billing,
        },
        "intent_key": None,
        "tx": {},
        "host_id": "a",
        "request_id": None,
        "received_at_ms": cosigned_at_ms,
        "cosigned_at_ms": cosigned_at_ms,
        "send_attempts": 0,
        "updated_at_ms": cosigned_at_ms,
    }


async def _user_call(env: RelayEnv, key: UserSecretKey, function: str, args: list[Any], usdc: int) -> str:
    gateway = env.localnet.url
    sender = address_of(key.generate_public_key().buffer)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway}/address/{sender.to_bech32()}/nonce") as resp:
            nonce = (await resp.json())["data"]["nonce"]
        tx = contract_call(
            abi=load_billing_abi(),
            chain_id=env.settings.network.chain_id,
            sender=sender,
            contract=Address.new_from_bech32(env.contract),
            function=function,
            arguments=args,
            gas_limit=60_000_000,
            nonce=nonce,
            payment_token=env.settings.network.payment_token if usdc else None,
            payment_amount=usdc,
        )
        tx.signature = key.sign(_computer.compute_bytes_for_signing(tx))
        async with http.post(f"{gateway}/transaction/send", json=tx.to_dictionary()) as resp:
            sent = await resp.json()
        assert not sent.get("error"), sent
        tx_hash: str = sent["data"]["txHash"]
        for _ in range(400):
            async with http.get(f"{gateway}/transaction/{tx_hash}/process-status") as resp:
                status = (await resp.json())["data"]
            if status["status"] in ("success", "fail"):
                assert status["status"] == "success", f"{function}: {status}"
                return tx_hash
            await asyncio.sleep(0.05)
    raise AssertionError(f"{function} did not execute")


def user_call(env: RelayEnv, key: UserSecretKey, function: str, args: list[Any], *, usdc: int = 0) -> str:
    """A signed call from `key` to the billing contract (the user pays its own gas), sent straight to the
    gateway and waited until it executed with success; its hash."""
    return asyncio.run(_user_call(env, key, function, args, usdc))
