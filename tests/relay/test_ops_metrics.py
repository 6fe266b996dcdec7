"""The metrics the alert rules read (deploy/prometheus/), from a real host on a real localnet: the
dependencies as the host's probe finds them (a gateway made `down` reads 0), a send no gateway acknowledged,
an intent co-signed and not yet acknowledged, the tracker's and the mirror's lag, the webhook backlog and
the signer fence."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from relay_kit import RelayEnv  # type: ignore[import-not-found]


def scrape(env: RelayEnv) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = env.client.app.state.host.metrics.registry  # type: ignore[attr-defined]
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(env: RelayEnv, name: str, **labels: str) -> float | None:
    for found, number in scrape(env).get(name, []):
        if all(found.get(k) == v for k, v in labels.items()):
            return number
    return None


def wait_for(check: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.05)
    return result


def test_the_metrics_the_alerts_read(env: RelayEnv) -> None:
    # The probe's first round (at start) found every dependency; the signer holds its identity.
    wait_for(lambda: value(env, "gasless_dependency_up", dependency="gateway") == 1.0, "the first probe")
    assert value(env, "gasless_dependency_up", dependency="database") == 1.0
    assert value(env, "gasless_signer_fenced") == 0.0
    assert value(env, "gasless_webhook_backlog") == 0.0
    assert value(env, "gasless_webhook_backlog_oldest_seconds") == 0.0
    wait_for(lambda: value(env, "gasless_mirror_lag_hyperblocks") is not None, "the mirror's lag")
    wait_for(lambda: value(env, "gasless_tracker_lag_hyperblocks") is not None, "the tracker's lag")
    assert value(env, "gasless_relayer_floor_egld") == env.settings.relayer_min_balance_atto / 10**18

    # A send no gateway acknowledges in time (held past the gateway timeout, 5 s): the intent waits
    # COSIGNED and its age shows; the send is counted; once the gateway answers again, the tracker's re-send
    # takes the intent to the end.
    before = value(env, "gasless_broadcast_unacknowledged_total") or 0.0
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    env.faults(gateway={"latencyMs": {"/transaction/send": 8_000}})
    try:
        answer = env.relay(env.build(sender, assignment), assignment["lease"])
        assert answer.status_code == 202 and answer.json()["state"] == "COSIGNED", answer.text
        wait_for(  # its age grows while no gateway acknowledges it
            lambda: (value(env, "gasless_tracker_oldest_unexecuted_seconds", state="COSIGNED") or 0) >= 2,
            "a COSIGNED intent 2 s old",
        )
        wait_for(
            lambda: (value(env, "gasless_broadcast_unacknowledged_total") or 0) >= before + 1, "the count"
        )
    finally:
        env.faults(gateway={"latencyMs": {}})
    final = env.wait_state(answer.json()["txHash"], ("FINALIZED",), timeout=30)
    assert final["outcome"] == "success"
    assert value(env, "gasless_tracker_oldest_unexecuted_seconds", state="COSIGNED") is None

    # The gateway silent: the next probe (every 5 s) finds no gateway.
    env.faults(gateway={"down": True})
    try:
        wait_for(lambda: value(env, "gasless_dependency_up", dependency="gateway") == 0.0, "gateway down", 15)
        assert value(env, "gasless_dependency_up", dependency="database") == 1.0
    finally:
        env.faults(gateway={"down": False})
    wait_for(lambda: value(env, "gasless_dependency_up", dependency="gateway") == 1.0, "gateway back", 15)
