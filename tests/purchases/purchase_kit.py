"""Helpers of the purchase tests: fund a wallet with USDC on localnet, sign a prepared transaction once and
relay it, read the contract's account view through the API."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from multiversx_sdk import Transaction, TransactionComputer

from gasless.chain.codec import tx_from_wire

_computer = TransactionComputer()


def fund(env: Any, address: str, *, usdc_micro: int = 0, egld_atto: int = 0) -> None:
    """localnet's faucet (an admin call, not a transaction)."""
    body = json.dumps({"address": address, "usdcMicro": str(usdc_micro), "egldAtto": str(egld_atto)}).encode()
    request = urllib.request.Request(
        f"{env.localnet.url}/localnet/faucet",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200


def signed(sender: Any, unsigned: dict[str, Any]) -> Transaction:
    """The prepared transaction exactly as built, signed once by the sender."""
    tx = tx_from_wire({**unsigned, "signature": "00" * 64})
    tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
    return tx


def relay_prepared(env: Any, sender: Any, prepared: dict[str, Any], lease: str | None = None) -> Any:
    tx = signed(sender, prepared["transaction"])
    return env.relay(tx, lease or prepared["assignment"]["lease"])


def usdc_balance(env: Any, address: str) -> int:
    with urllib.request.urlopen(f"{env.localnet.url}/address/{address}/esdt", timeout=5) as answer:
        tokens = json.loads(answer.read())["data"]["esdts"]
    token = env.settings.network.payment_token
    return int(tokens.get(token, {}).get("balance", "0"))
