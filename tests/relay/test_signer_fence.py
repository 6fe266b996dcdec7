"""The signer fence across a host's restarts on one database (gasless.signer.fence): a host that stops cleanly
gives its identity back, so the next one co-signs at once; a claim still held by a process that did not stop
keeps the next one fenced until that claim lapses, then the next one takes the identity. Both hosts here use a
ten-minute claim: a successor ready within the test's deadline can only be one that did not wait it out."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from fastapi.testclient import TestClient
from relay_kit import RelayEnv, relay_settings, start_env, unthrottled_limits

from gasless.hosting.app import create_app

TEN_MINUTES_MS = 600_000


def fence_rows(tmp_path: Path) -> list[Any]:
    engine = sqlalchemy.create_engine(f"sqlite:///{(tmp_path / 'api.db').as_posix()}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(sqlalchemy.text("SELECT * FROM signer_fences")).all())
    finally:
        engine.dispose()


def relayed(env: RelayEnv) -> str:
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    return str(answer.json()["txHash"])


def test_a_clean_stop_gives_the_signer_identity_to_the_next_host(
    tmp_path: Path, unpaused_localnet: Any
) -> None:
    first = start_env(tmp_path, unpaused_localnet, signer_fence_ttl_ms=TEN_MINUTES_MS)
    relayed(next(first))
    (claim,) = fence_rows(tmp_path)
    assert claim.expires_at_ms > time.time() * 1000 + TEN_MINUTES_MS / 2  # held, for ten minutes
    with pytest.raises(StopIteration):
        next(first)  # the host's lifespan ends: a clean stop
    (released,) = fence_rows(tmp_path)
    assert (released.holder, released.token, released.expires_at_ms) == (claim.holder, claim.token, 0)

    second = start_env(tmp_path, unpaused_localnet, signer_fence_ttl_ms=TEN_MINUTES_MS)
    relayed(next(second))  # ready (start_env waits for /readyz) and co-signing, with no claim to wait out
    (taken,) = fence_rows(tmp_path)
    assert taken.holder != claim.holder and taken.token == claim.token + 1
    with pytest.raises(StopIteration):
        next(second)


def test_a_claim_not_given_back_fences_the_next_host_until_it_lapses(
    tmp_path: Path, unpaused_localnet: Any, operator: Any
) -> None:
    settings = relay_settings(tmp_path, unpaused_localnet, signer_fence_ttl_ms=TEN_MINUTES_MS)
    first = start_env(tmp_path, unpaused_localnet, signer_fence_ttl_ms=TEN_MINUTES_MS)
    env = next(first)
    # As if the first host had died holding its claim, which ends in a few seconds.
    lapses_at_ms = int(time.time() * 1000) + 4_000
    operator.db_execute(env, "UPDATE signer_fences SET holder = 'died', expires_at_ms = :at", at=lapses_at_ms)
    with pytest.raises(StopIteration):
        next(first)  # its release finds the claim no longer its own and leaves it
    (left,) = fence_rows(tmp_path)
    assert (left.holder, left.expires_at_ms) == ("died", lapses_at_ms)

    with TestClient(create_app(settings, route_limits=unthrottled_limits())) as client:
        # Its own claim would be renewed every 200 s; the one it waits for ends first, and it tries again then.
        deadline = time.monotonic() + 60
        while (answer := client.get("/readyz")).status_code != 200:
            signer = answer.json()["checks"].get("signer")
            if time.time() * 1000 < lapses_at_ms - 100 and signer is not None:
                assert signer == "fenced", answer.json()  # never ready while the other claim lasts
            assert time.monotonic() < deadline, answer.json()
            time.sleep(0.05)
        (taken,) = fence_rows(tmp_path)
        assert taken.holder != "died" and taken.token == left.token + 1, taken
        assert taken.updated_at_ms > lapses_at_ms, (taken.updated_at_ms, lapses_at_ms)
        relayed(RelayEnv(client, unpaused_localnet, settings, env.contract))
