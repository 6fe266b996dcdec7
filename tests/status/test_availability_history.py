"""The status page's availability over a history: a host started on a database holding intents co-signed on
earlier days (written as the service writes them) counts each on its day, the 30-day figure appears once the
first activity is 30 days old, and what is still fresh (co-signed in the last half hour, status/repository.py)
is read afresh on every request while older rows are counted once: a new intent shows at once, and one whose
broadcast is recorded later moves from bad to good. The counted days are kept in the database: a host
starting later reads them, not the rows behind them."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from multiversx_sdk import UserSecretKey
from relay_kit import start_env  # type: ignore[import-not-found]
from sqlalchemy import create_engine, delete, insert, update

from gasless.chain.addresses import address_of, shard_of
from gasless.db.migrate import upgrade
from gasless.db.tables import intents

DAY_MS = 86_400_000


def _intent(url: str, sender: str, nonce: int, cosigned_at_ms: int, broadcast: bool) -> None:
    tx_hash = hashlib.sha256(f"{sender}:{nonce}".encode()).hexdigest()
    engine = create_engine(url.replace("+aiosqlite", ""))
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(intents).values(
                    sender=sender,
                    nonce=nonce,
                    slot_seq=0,
                    tx_hash=tx_hash,
                    bytes_sha256=hashlib.sha256(tx_hash.encode()).hexdigest(),
                    state="FINALIZED" if broadcast else "DEAD",
                    seq=1,
                    sender_shard=shard_of(sender),
                    receiver=sender,
                    relayer=sender,
                    cross_shard=False,
                    gas_limit=50_000,
                    gas_price=1_000_000_000,
                    value_atto=0,
                    lease_kind="std",
                    billing={},
                    tx={},
                    host_id="old",
                    received_at_ms=cosigned_at_ms - 5,
                    cosigned_at_ms=cosigned_at_ms,
                    broadcast_at_ms=cosigned_at_ms + 5 if broadcast else None,
                    updated_at_ms=cosigned_at_ms + 5,
                    send_attempts=1 if broadcast else 0,
                )
            )
    finally:
        engine.dispose()


def _broadcast(url: str, sender: str, nonce: int) -> None:
    engine = create_engine(url.replace("+aiosqlite", ""))
    try:
        with engine.begin() as conn:
            conn.execute(
                update(intents)
                .where(intents.c.sender == sender, intents.c.nonce == nonce)
                .values(state="FINALIZED", broadcast_at_ms=int(time.time() * 1000), send_attempts=1)
            )
    finally:
        engine.dispose()


def _days(env: Any) -> tuple[dict[int, Any], Any]:
    answer = env.client.get("/v1/status")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return {d["dayStartMs"]: d["availabilityPct"] for d in body["availabilityDaily90"]}, body[
        "availability30d"
    ]


def test_availability_counts_earlier_days_and_reads_recent_ones_afresh(tmp_path: Path, make_env: Any) -> None:
    url = f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}"  # the database the env's host opens
    asyncio.run(upgrade(url))
    sender = address_of(UserSecretKey.generate().generate_public_key().buffer).to_bech32()
    today = int(time.time() * 1000) // DAY_MS * DAY_MS
    old, recent = today - 40 * DAY_MS, today - 3 * DAY_MS
    for nonce, broadcast in enumerate((True, True, True, False)):  # 3 of 4 on day -40
        _intent(url, sender, nonce, old + 3_600_000 + nonce, broadcast)
    _intent(url, sender, 10, recent + 3_600_000, True)
    _intent(url, sender, 11, recent + 3_600_001, False)  # 1 of 2 on day -3
    env = make_env(database_url=url)

    days, overall = _days(env)
    assert days[old] == 75.0 and days[recent] == 50.0
    assert days[today - DAY_MS] is None
    assert overall == 50.0  # the last 30 days: day -3 only (first activity 40 days ago)

    now = int(time.time() * 1000)
    fresh_day = (now - 60_000) // DAY_MS * DAY_MS
    _intent(url, sender, 20, now - 60_000, False)  # co-signed a minute ago, not broadcast (yet)
    days, overall = _days(env)
    assert days[fresh_day] == 0.0  # read afresh
    assert days[old] == 75.0 and days[recent] == 50.0  # the counted days, kept
    assert overall == round(100.0 * 1 / 3, 3)

    _broadcast(url, sender, 20)  # its gateway acknowledgement is recorded
    days, overall = _days(env)
    assert days[fresh_day] == 100.0
    assert overall == round(100.0 * 2 / 3, 3)


def test_a_host_starting_takes_the_counted_days_from_the_database(
    tmp_path: Path, unpaused_localnet: Any
) -> None:
    url = f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}"
    asyncio.run(upgrade(url))
    sender = address_of(UserSecretKey.generate().generate_public_key().buffer).to_bech32()
    old = int(time.time() * 1000) // DAY_MS * DAY_MS - 40 * DAY_MS
    for nonce, broadcast in enumerate((True, True, True, False)):
        _intent(url, sender, nonce, old + 3_600_000 + nonce, broadcast)

    first = start_env(tmp_path, unpaused_localnet, database_url=url)
    days, _ = _days(next(first))
    assert days[old] == 75.0
    with pytest.raises(StopIteration):
        next(first)

    # The rows behind the counted day leave the database; a host starting now never reads them again.
    engine = create_engine(url.replace("+aiosqlite", ""))
    try:
        with engine.begin() as conn:
            assert conn.execute(delete(intents).where(intents.c.sender == sender)).rowcount == 4
    finally:
        engine.dispose()
    second = start_env(tmp_path, unpaused_localnet, database_url=url)
    days, _ = _days(next(second))
    assert days[old] == 75.0
    with pytest.raises(StopIteration):
        next(second)


def test_counts_stored_by_a_host_whose_clock_is_ahead_are_taken_and_not_counted_twice(tmp_path: Path) -> None:
    """Host A's clock is a minute ahead: its stored counts reach a minute past host B's own bound. B takes
    them (it does not count the older rows again) and reads afresh only what lies after them, so an intent
    in that minute is counted once."""
    from gasless.db import create_engine as create_async_engine
    from gasless.status.repository import STABLE_AFTER_MS, StatusRepository

    url = f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}"
    asyncio.run(upgrade(url))
    sender = address_of(UserSecretKey.generate().generate_public_key().buffer).to_bech32()
    now = int(time.time() * 1000)
    start = now // DAY_MS * DAY_MS - 89 * DAY_MS
    old = now - 3 * DAY_MS
    in_between = now - STABLE_AFTER_MS + 30_000  # stable for A, fresh for B
    _intent(url, sender, 0, old, True)
    _intent(url, sender, 1, in_between, False)

    async def run() -> dict[int, list[int]]:
        engine = create_async_engine(url)
        try:
            await StatusRepository(engine).outcomes_by_day(start, (), now_ms=now + 60_000)  # host A
            async with engine.begin() as conn:  # the old row leaves: B can only know it from A's counts
                await conn.execute(delete(intents).where(intents.c.nonce == 0))
            return await StatusRepository(engine).outcomes_by_day(start, (), now_ms=now)  # host B
        finally:
            await engine.dispose()

    host_b = asyncio.run(run())
    assert host_b == {old // DAY_MS * DAY_MS: [1, 0], in_between // DAY_MS * DAY_MS: [0, 1]}
