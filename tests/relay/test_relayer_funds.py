"""Relayer funds through HTTP on a real localnet: a relayer under its floor is no longer assigned (and a lease
minted before is answered RESIGN_REQUIRED with the shard's other relayer), a relayer near its floor takes only
what its balance can pay (a co-signature counts against the floor at once), relays go on with the shard's
other relayer, and the balance, fees in flight, spend rate and time to the floor show in `/readyz` and in the
metrics. Balances are set through localnet's admin API (`POST /localnet/balance`)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from relay_kit import RelayEnv, Sender, localnet_post  # type: ignore[import-not-found]

GAS_LIMIT = 100_000  # env.build's plain transfer
GAS_PRICE = 1_000_000_000
FEE = GAS_LIMIT * GAS_PRICE  # the most one relay can cost its relayer


def wait_for(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return value


def set_balance(env: RelayEnv, address: str, atto: int) -> None:
    answer = localnet_post(env, "/localnet/balance", {"address": address, "egldAtto": atto})
    assert answer["data"]["balance"] == str(atto), answer


def chain_balance(env: RelayEnv, address: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{env.localnet.url}/address/{address}/balance", timeout=5) as answer:
        return int(json.loads(answer.read())["data"]["balance"])


def funds(env: RelayEnv, address: str) -> dict[str, Any]:
    """The relayer's entry in `/readyz` (the host's relayer pool)."""
    answer = env.client.get("/readyz")
    assert answer.status_code == 200, answer.text
    return next(entry for entry in answer.json()["relayers"] if entry["address"] == address)


def seen_at(env: RelayEnv, address: str, balance: int) -> dict[str, Any]:
    """The relayer's entry once the pool has read `balance` from the chain."""
    return wait_for(
        lambda: (entry := funds(env, address))["balanceAtto"] == str(balance) and entry,
        f"the pool reading {address}'s balance {balance}",
    )


def metric(env: RelayEnv, name: str, relayer: str) -> float | None:
    registry = env.client.app.state.host.metrics.registry  # type: ignore[attr-defined]
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("relayer") == relayer:
                return float(sample.value)
    return None


def senders_of(env: RelayEnv, relayer: str, count: int) -> list[Sender]:
    """New senders of shard 1 (with a plan) that the pool assigns to `relayer` while both are funded."""
    found: list[Sender] = []
    while len(found) < count:
        sender = env.new_sender(1)
        if env.assign(sender)["relayer"] == relayer:
            found.append(sender)
    return found


def relay_to_the_end(env: RelayEnv, sender: Sender, assignment: dict[str, Any]) -> dict[str, Any]:
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    return env.wait_state(answer.json()["txHash"], ("FINALIZED", "DEAD"))


def test_a_relayer_under_its_floor_is_not_assigned_and_relays_go_on_with_the_other(
    env: RelayEnv, operator: Any, problem: Any
) -> None:
    low, other = operator.relayers_in(env, 1)
    floor = env.settings.relayer_min_balance_atto
    senders = senders_of(env, low, 3)
    held = env.assign(senders[0])  # a lease for `low`, minted while it is funded
    assert held["relayer"] == low

    set_balance(env, low, floor - 1)
    entry = seen_at(env, low, floor - 1)
    assert entry["assignable"] is False and entry["state"] == "active"
    assert entry["floorAtto"] == str(floor) and entry["secondsToFloor"] == 0
    assert metric(env, "gasless_relayer_assignable", low) == 0.0
    assert metric(env, "gasless_relayer_balance_egld", low) == (floor - 1) / 10**18
    assert metric(env, "gasless_relayer_time_to_floor_seconds", low) == 0.0
    assert metric(env, "gasless_relayer_assignable", other) == 1.0

    # The lease minted before: the relay is answered with a new assignment, to the shard's other relayer.
    refused = env.relay(env.build(senders[0], held), held["lease"])
    moved = problem(refused, "RESIGN_REQUIRED")["details"]["assignment"]
    assert moved["relayer"] == other and moved["pinNonce"] == 0
    outcomes = [relay_to_the_end(env, senders[0], moved)]
    # Every new assignment of its senders goes to the other relayer, and their relays go through.
    for sender in senders[1:]:
        assignment = env.assign(sender)
        assert assignment["relayer"] == other
        outcomes.append(relay_to_the_end(env, sender, assignment))
    assert [(o["state"], o["outcome"]) for o in outcomes] == [("FINALIZED", "success")] * 3
    assert chain_balance(env, low) == floor - 1  # it paid for nothing

    # Refilled, it is assigned again.
    set_balance(env, low, 10**18)
    assert seen_at(env, low, 10**18)["assignable"] is True


def test_a_relayer_near_its_floor_takes_only_what_its_balance_can_pay(env: RelayEnv, operator: Any) -> None:
    # The host read every balance when it started, before this test: nothing was spent yet.
    test_start = time.time()
    low, other = operator.relayers_in(env, 1)
    initial = {low: chain_balance(env, low), other: chain_balance(env, other)}
    floor = env.settings.relayer_min_balance_atto
    senders = senders_of(env, low, 6)
    start = floor + 2 * FEE  # room for three relays: the third leaves it at its floor less one fee
    set_balance(env, low, start)
    seen_at(env, low, start)

    used: list[str] = []
    hashes: list[str] = []
    last_sent: dict[str, float] = {}  # before each relayer's last relay was sent: its last fee came after
    # The co-signed relays stay in flight until all six are assigned: the shard makes no block meanwhile.
    # (Executed earlier, a fee could be counted twice for a moment, spent and still in flight, the safe
    # way: the third relay then went to the other relayer on a loaded machine.)
    env.faults(chain={"stalledShards": [senders[0].shard]})
    try:
        for sender in senders:
            assignment = env.assign(sender)
            used.append(assignment["relayer"])
            last_sent[assignment["relayer"]] = time.time()
            answer = env.relay(env.build(sender, assignment), assignment["lease"])
            assert answer.status_code in (200, 202), answer.text
            hashes.append(answer.json()["txHash"])
    finally:
        env.faults(chain={"stalledShards": []})
    assert used == [low] * 3 + [other] * 3, used
    finals = [env.wait_state(tx_hash, ("FINALIZED", "DEAD")) for tx_hash in hashes]
    assert [(f["state"], f["outcome"]) for f in finals] == [("FINALIZED", "success")] * 6
    # Never under what one more transaction could cost: the floor is above the largest fee.
    left = chain_balance(env, low)
    assert left == start - 3 * FEE and left >= floor - FEE > 0

    assert chain_balance(env, other) == initial[other] - 3 * FEE  # the other paid its three fees, no more

    def watched_s(relayer: str, spent: int, per_hour: float) -> float:
        """The spend rate is the balance drops this host read over the time it has watched (its first reading,
        at its start, to the reading that gave the rate), per hour: `spent` at `per_hour` is that time. It
        began before this test and ended after the relayer's last fee (and by now), and it is under an hour."""
        assert per_hour > 0, f"{relayer}: no spend rate"
        seconds = spent * 3600 / per_hour
        since_genesis = time.time() - env.localnet.net.info["genesisMs"] / 1000  # the host started after it
        assert last_sent[relayer] - test_start <= seconds <= since_genesis + 0.01, (relayer, spent, per_hour)
        return seconds

    # A refresh reads the intents before the balances, so the one that first reads `left` may still count
    # the last fee as in flight (counted twice, the safe way); the next one does not.
    entry = wait_for(
        lambda: (e := funds(env, low))["balanceAtto"] == str(left) and e["inFlightAtto"] == "0" and e,
        f"{low}'s balance {left} read with nothing in flight",
    )
    assert entry["assignable"] is False and entry["secondsToFloor"] == 0
    # Every drop counts, the one set through the admin API (when it lowered the balance) and the 3 fees.
    spent_low = max(0, initial[low] - start) + 3 * FEE
    rate = wait_for(lambda: int(funds(env, low)["spendAttoPerHour"] or 0), "a spend rate for the relayer")
    watched_s(low, spent_low, rate)
    busy = wait_for(
        lambda: (
            (e := seen_at(env, other, initial[other] - 3 * FEE))["spendAttoPerHour"] not in (None, "0") and e
        ),
        "the other's rate",
    )
    watched_s(other, 3 * FEE, int(busy["spendAttoPerHour"]))
    available = int(busy["balanceAtto"]) - int(busy["inFlightAtto"])
    expected = (available - floor) * 3600 // int(busy["spendAttoPerHour"])
    assert abs(busy["secondsToFloor"] - expected) <= 1 and busy["assignable"] is True
    # The metric is the same figure, in EGLD (read at a later refresh, perhaps: over a longer watch).
    watched_s(other, 3 * FEE, (metric(env, "gasless_relayer_spend_egld_per_hour", other) or 0) * 10**18)
    assert (metric(env, "gasless_relayer_time_to_floor_seconds", other) or 0) > 0
