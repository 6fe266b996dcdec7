"""Senders who transact around the service between two blocks, through HTTP on a real localnet.

A relay of a sender whose previous relay committed in the same block reuses that relay's account read (an
account changes only with a block); the pool is read fresh every time. Shard 1 is stalled (no block) while
the sender also sends straight to the gateway, then released; every answer must be what fresh reads give.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from multiversx_sdk import Transaction
from relay_kit import RelayEnv, Sender, fund, send_direct

GAS_PRICE = 1_000_000_000


@contextmanager
def _between_two_blocks(env: RelayEnv) -> Iterator[None]:
    """The sender's shard (1) produces no block until the end of the block."""
    env.faults(chain={"stalledShards": [1]})
    try:
        yield
    finally:
        env.faults(chain={"stalledShards": []})


def _funded_sender(env: RelayEnv) -> Sender:
    sender = env.new_sender(1)
    fund(env, sender.address)
    return sender


def _accepted(env: RelayEnv, tx: Transaction, lease: str) -> dict[str, Any]:
    response = env.relay(tx, lease)
    assert response.status_code in (200, 202), response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_nonce_used_around_the_service_is_seen_in_the_pool_then_on_chain(env: RelayEnv) -> None:
    sender = _funded_sender(env)
    assignment = env.assign(sender)
    with _between_two_blocks(env):
        first = _accepted(env, env.build(sender, assignment, nonce=0), assignment["lease"])
        # Same block: nonce 1 taken in the pool by a transfer sent around the service.
        send_direct(env, sender, nonce=1)
        taken = env.relay(env.build(sender, assignment, nonce=1, data=b"mine"), assignment["lease"])
        assert taken.status_code == 409, taken.text
        assert taken.json()["code"] == "RESIGN_SAME_NONCE"

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
    with _between_two_blocks(env):
        ours = _accepted(env, env.build(sender, assignment, nonce=0), assignment["lease"])
        # Same block: the sender outbids our nonce 0 in the pool, then relays nonce 1 through us.
        replacement = send_direct(env, sender, nonce=0, gas_price=GAS_PRICE + 1)
        after = _accepted(env, env.build(sender, assignment, nonce=1), assignment["lease"])

    dead = env.wait_state(ours["txHash"], ("DEAD",))
    assert dead["deadReason"], dead  # the winner is not ours: the service knows only that the nonce went
    env.wait_state(after["txHash"], ("FINALIZED",))
    with urllib.request.urlopen(f"{env.localnet.url}/transaction/{replacement}", timeout=5) as answer:
        assert json.loads(answer.read())["data"]["transaction"]["status"] == "success"
    again = env.relay(env.build(sender, assignment, nonce=0, data=b"again"), assignment["lease"])
    assert again.status_code == 409 and again.json()["code"] == "NONCE_TOO_LOW", again.text
    _accepted(env, env.build(sender, assignment, nonce=2), assignment["lease"])
