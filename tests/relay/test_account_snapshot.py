"""Senders who transact around the service between two blocks, through HTTP on a real localnet.

A relay of a sender whose previous relay committed in the same block reuses that relay's account read (an
account changes only with a block); the pool is read fresh every time. Shard 1 is stalled (no block) while
the sender also sends straight to the gateway, then released; every answer must be what fresh reads give.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from multiversx_sdk import Transaction, TransactionComputer
from relay_kit import RelayEnv, Sender, key_in_shard

from gasless.chain.addresses import address_of

_computer = TransactionComputer()
GAS_PRICE = 1_000_000_000


def _post(env: RelayEnv, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{env.localnet.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _funded_sender(env: RelayEnv) -> Sender:
    sender = env.new_sender(1)
    _post(env, "/localnet/faucet", {"address": sender.address, "egldAtto": 10**18})
    return sender


def _send_around(env: RelayEnv, sender: Sender, nonce: int, gas_price: int = GAS_PRICE) -> str:
    """A plain transfer signed and sent by the sender straight to the gateway: the service never sees it."""
    tx = Transaction(
        sender=address_of(sender.key.generate_public_key().buffer),
        receiver=address_of(key_in_shard(1).generate_public_key().buffer),
        gas_limit=50_000,
        chain_id=env.settings.network.chain_id,
        nonce=nonce,
        value=1,
        gas_price=gas_price,
        version=2,
    )
    tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
    answer = _post(env, "/transaction/send", tx.to_dictionary())
    assert answer.get("code") == "successful", answer
    return str(answer["data"]["txHash"])


def _accepted(env: RelayEnv, tx: Transaction, lease: str) -> dict[str, Any]:
    response = env.relay(tx, lease)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_nonce_used_around_the_service_is_seen_in_the_pool_then_on_chain(env: RelayEnv) -> None:
    sender = _funded_sender(env)
    assignment = env.assign(sender)
    env.faults(chain={"stalledShards": [1]})
    try:
        first = _accepted(env, env.build(sender, assignment, nonce=0), assignment["lease"])
        # Same block: nonce 1 taken in the pool by a transfer sent around the service.
        _send_around(env, sender, 1)
        taken = env.relay(env.build(sender, assignment, nonce=1, data=b"mine"), assignment["lease"])
        assert taken.status_code == 409, taken.text
        assert taken.json()["code"] == "RESIGN_SAME_NONCE"
    finally:
        env.faults(chain={"stalledShards": []})

    # A block executes both; once it is final, the account's nonce is 2 on chain.
    env.wait_state(first["txHash"], ("FINALIZED",))
    late = env.relay(env.build(sender, assignment, nonce=1, data=b"late"), assignment["lease"])
    assert late.status_code == 409, late.text
    problem = late.json()
    # An account kept from before the block would say nonce 0 and answer NONCE_GAP.
    assert problem["code"] == "NONCE_TOO_LOW", problem
    assert problem["details"]["onchainNonce"] == 2
    _accepted(env, env.build(sender, assignment, nonce=2), assignment["lease"])


def test_a_pool_replacement_around_the_service_between_two_blocks(env: RelayEnv) -> None:
    sender = _funded_sender(env)
    assignment = env.assign(sender)
    env.faults(chain={"stalledShards": [1]})
    try:
        ours = _accepted(env, env.build(sender, assignment, nonce=0), assignment["lease"])
        # Same block: the sender outbids our nonce 0 in the pool, then relays nonce 1 through us.
        replacement = _send_around(env, sender, 0, gas_price=GAS_PRICE + 1)
        after = _accepted(env, env.build(sender, assignment, nonce=1), assignment["lease"])
    finally:
        env.faults(chain={"stalledShards": []})

    dead = env.wait_state(ours["txHash"], ("DEAD",))
    assert dead["deadReason"], dead  # the winner is not ours: the service knows only that the nonce went
    env.wait_state(after["txHash"], ("FINALIZED",))
    with urllib.request.urlopen(f"{env.localnet.url}/transaction/{replacement}", timeout=5) as answer:
        assert json.loads(answer.read())["data"]["transaction"]["status"] == "success"
    again = env.relay(env.build(sender, assignment, nonce=0, data=b"again"), assignment["lease"])
    assert again.status_code == 409 and again.json()["code"] == "NONCE_TOO_LOW", again.text
    _accepted(env, env.build(sender, assignment, nonce=2), assignment["lease"])
