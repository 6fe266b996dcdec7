"""Helpers for the billing path tests (tests/billing/test_*_paths.py): calls to the billing contract relayed
through the API, the localnet faucet, direct user calls, and reads of the host's billing tables."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

from sqlalchemy import create_engine, select

from gasless.chain.addresses import address_of
from gasless.db import account_period_usage, reservations, usage_ledger
from gasless.localnet.contracts.billing import BILLING_GAS
from gasless.localnet.owner import owner_call
from gasless.localnet.processing import ESDT_TRANSFER_GAS

DAY_MS = 86_400_000
MONTH_MS = 2_592_000_000
USDC = 1_000_000  # micro-USDC in one USDC


def addr(sender: Any) -> Any:
    return address_of(sender.key.generate_public_key().buffer)


def faucet(env: Any, address: str, *, egld_atto: int = 10**18, usdc_micro: int = 0) -> None:
    body = {"address": address, "egldAtto": str(egld_atto), "usdcMicro": str(usdc_micro)}
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/faucet",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).read()


def user_call(env: Any, who: Any, function: str, args: list[Any], **kwargs: Any) -> str:
    """`who` signs and sends a contract call straight to the gateway (not relayed), with its own EGLD."""
    faucet(env, who.address)
    wallet = SimpleNamespace(address=addr(who), secret_key=who.key)
    tx_hash = asyncio.run(owner_call(env.localnet.url, wallet, env.contract, function, args, **kwargs))  # type: ignore[arg-type]
    who.nonce += 1  # the call used the account's next nonce
    return tx_hash


def call_gas(env: Any, function: str, data: bytes) -> int:
    """A gas limit the simulation accepts for a billing-contract call (movement + 1.2 x processing)."""
    rules = env.client.app.state.host.network.params.gas_rules()
    movement = rules.movement_gas(data_len=len(data), guarded=False, relayed=True)
    builtin = ESDT_TRANSFER_GAS if data.startswith(b"ESDTTransfer@") else 0
    return movement + int(1.2 * (BILLING_GAS[function] + builtin))


def contract_data(function: str, *args: bytes | int) -> bytes:
    parts = [function.encode()]
    for arg in args:
        if isinstance(arg, int):  # top-level encoding: 0 (and false) is empty
            text = f"{arg:x}" if arg else ""
            parts.append((("0" if len(text) % 2 else "") + text).encode())
        else:
            parts.append(arg.hex().encode())
    return b"@".join(parts)


def relay_contract_call(env: Any, sender: Any, function: str, *args: bytes | int, **extra: Any) -> Any:
    """Relay `function(args)` on the billing contract signed by `sender`; bumps its nonce on success."""
    data = contract_data(function, *args)
    return relay_data(env, sender, data, call_gas(env, function, data), **extra)


def relay_data(
    env: Any,
    sender: Any,
    data: bytes,
    gas_limit: int | None = None,
    *,
    receiver: str | None = None,
    **extra: Any,
) -> Any:
    """Relay a call signed by `sender`; without `gas_limit`, the gateway's simulation sizes it first."""
    assignment = env.assign(sender)
    target = receiver or env.contract
    if gas_limit is None:
        gas_limit = simulated_gas(
            env, env.build(sender, assignment, receiver=target, data=data, gas_limit=60_000_000)
        )
    tx = env.build(sender, assignment, receiver=target, data=data, gas_limit=gas_limit)
    response = env.relay(tx, assignment["lease"], **extra)
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def relay_transfer(env: Any, sender: Any) -> Any:
    """A plain transfer relayed for `sender` on a fresh assignment; bumps its nonce when accepted."""
    assignment = env.assign(sender)
    response = env.relay(env.build(sender, assignment), assignment["lease"])
    if response.status_code in (200, 202):
        sender.nonce += 1
    return response


def wait_final(env: Any, response: Any) -> None:
    """The relay was accepted, and is FINALIZED (an EXECUTED intent is still in flight: it holds the sender's
    one free slot)."""
    assert response.status_code in (200, 202), response.text
    env.wait_state(response.json()["id"], ("FINALIZED",))


def simulated_gas(env: Any, tx: Any) -> int:
    """The gas the network's cost estimate gives for `tx` (`POST /transaction/cost`, as the service measures
    it), plus 10% of its processing part."""
    host = env.client.app.state.host
    wire = {**tx.to_dictionary(), "relayerSignature": "00" * 64}
    cost = env.client.portal.call(lambda: host.gateway.cost(wire))
    assert not cost.get("returnMessage"), cost
    used = int(cost["txGasUnits"])
    movement = host.network.params.gas_rules().movement_gas(
        data_len=len(tx.data), guarded=False, relayed=True
    )
    return used + (used - movement) // 10


def deposit_for_data(env: Any, beneficiary: Any, amount_micro: int) -> bytes:
    """`ESDTTransfer@USDC@amount@depositFor@beneficiary`: a free operation that needs no account."""
    token = env.localnet.net.info["paymentToken"].encode()
    return contract_data(
        "ESDTTransfer", token, amount_micro, b"depositFor", bytes(addr(beneficiary).get_public_key())
    )


def _rows(env: Any, table: Any) -> list[Any]:
    url = env.settings.effective_database_url.replace("+aiosqlite", "")
    engine = create_engine(url, connect_args={"timeout": 10})
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(table)).all())
    finally:
        engine.dispose()


def ledger(env: Any) -> list[Any]:
    return _rows(env, usage_ledger)


def reservation_rows(env: Any) -> list[Any]:
    return _rows(env, reservations)


def period_usage(env: Any) -> list[Any]:
    return _rows(env, account_period_usage)


def wait_ledger(env: Any, tx_hashes: list[str], timeout: float = 15.0) -> dict[str, Any]:
    """The ledger rows of `tx_hashes` once all are written (the tracker writes them on EXECUTED/DEAD)."""
    deadline = time.monotonic() + timeout
    rows: dict[str, Any] = {}
    while time.monotonic() < deadline:
        rows = {r.tx_hash: r for r in ledger(env) if r.tx_hash in tx_hashes}
        if len(rows) == len(set(tx_hashes)):
            return rows
        time.sleep(0.1)
    raise AssertionError(f"ledger rows missing: {set(tx_hashes) - set(rows)}")


def check_relay_problem(
    response: Any,
    code: str,
    status: int,
    *,
    retryable: bool,
    resign: str,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A relay-group problem document for codes outside the relay suite's CONTRACT_ERRORS table."""
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["code"] == code and body["status"] == status, body
    assert body["retryable"] is retryable and body["resign"] == resign, body
    assert body["instance"] == response.headers["Relay-Request-Id"], body
    if details is not None:
        assert body["details"] == details, body
    return body  # type: ignore[no-any-return]
