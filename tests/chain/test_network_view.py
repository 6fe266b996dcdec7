"""NetworkView against the real localnet: params, shard statuses, shard-1 blocks, epochs and the clock offset."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gasless.chain.addresses import METACHAIN
from gasless.chain.gas import GasRules
from gasless.chain.gateway import GatewayClient, GatewayUnavailable
from gasless.chain.network import BlockRecord, NetworkParams, NetworkView


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def set_faults(session: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with session.post(f"{url}/localnet/faults", json=faults) as response:
        assert response.status == 200, await response.text()


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def view(localnet, session) -> AsyncIterator[NetworkView]:  # type: ignore[no-untyped-def]
    network = NetworkView(GatewayClient(session, [localnet.url], timeout_ms=1_000))
    await network.start()
    try:
        yield network
    finally:
        await network.stop()


# Pure parts -------------------------------------------------------------------------------------------
def test_params_from_config_accepts_strings_and_fills_optional_members() -> None:
    config = {
        "erd_chain_id": "D",
        "erd_round_duration": "6000",
        "erd_min_gas_price": 1_000_000_000,
        "erd_min_gas_limit": 50_000,
        "erd_gas_per_data_byte": 1_500,
        "erd_gas_price_modifier": "0.01",
        "erd_num_shards_without_meta": 3,
        "erd_rounds_per_epoch": 14_400,
        "erd_start_time": 1_694_000_000,
        "erd_min_transaction_version": 1,
    }
    params = NetworkParams.from_config(config)
    assert params.round_duration_ms == 6_000 and params.start_time_ms == 1_694_000_000_000
    assert params.gas_price_modifier == Decimal("0.01")
    assert params.gas_rules() == GasRules()  # the node's defaults: extras = MinGasLimit
    with pytest.raises(ValueError, match="erd_rounds_per_epoch"):
        NetworkParams.from_config({k: v for k, v in config.items() if k != "erd_rounds_per_epoch"})


def test_block_record_bounds_by_count_and_age() -> None:
    record = BlockRecord(max_age_ms=1_000, max_blocks=3)
    assert record.latest() is None and record.latest_timestamp_ms() is None
    for nonce in range(5):
        record.add(f"h{nonce}", nonce, 10_000 + nonce * 100)
    assert [record.timestamp_ms(f"h{n}") for n in range(5)] == [None, None, 10_200, 10_300, 10_400]
    record.add("h3", 3, 99)  # a block seen again changes nothing
    assert record.timestamp_ms("h3") == 10_300 and record.latest() == ("h4", 4, 10_400)
    record.add("h5", 5, 11_350)  # older than max_age behind the newest block: pruned
    assert record.timestamp_ms("h3") is None and record.timestamp_ms("h4") == 10_400
    assert record.latest_timestamp_ms() == 11_350 and len(record) == 2


# Against localnet -------------------------------------------------------------------------------------
async def test_start_loads_params_and_statuses(localnet, view) -> None:  # type: ignore[no-untyped-def]
    assert view.ready
    params = view.params
    assert params.chain_id == "localnet" and params.round_duration_ms == 100
    assert params.num_shards == 3 and params.rounds_per_epoch == 2_000 and params.min_tx_version == 1
    assert params.start_time_ms == localnet.net.chain.genesis_ms // 1000 * 1000
    assert params.gas_rules() == localnet.net.chain.config.rules
    assert view.epoch == 0
    assert {s: view.status(s) is not None for s in (0, 1, 2, METACHAIN)} == dict.fromkeys(
        (0, 1, 2, METACHAIN), True
    )
    assert view.meta_highest_final_nonce == view.status(METACHAIN).highest_final_nonce  # type: ignore[union-attr]


async def test_statuses_advance_and_callbacks_run(localnet, view) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []

    async def async_callback() -> None:
        calls.append("async")

    view.on_poll(lambda: calls.append("sync"))
    view.on_poll(async_callback)
    meta_final = view.meta_highest_final_nonce or 0
    shard0 = view.status(0).nonce  # type: ignore[union-attr]
    await wait_for(lambda: (view.meta_highest_final_nonce or 0) >= meta_final + 3)
    assert view.status(0).nonce >= shard0 + 3  # type: ignore[union-attr]
    meta = view.status(METACHAIN)
    assert meta is not None and meta.highest_final_nonce == meta.nonce - 1
    assert calls.count("sync") >= 3 and calls.count("async") >= 3


async def test_records_shard_one_blocks_matching_the_gateway(localnet, view, session) -> None:  # type: ignore[no-untyped-def]
    start = view.blocks.latest()
    assert start is not None  # start() already recorded the newest block
    await wait_for(lambda: view.blocks.latest()[1] >= start[1] + 5)  # type: ignore[index]
    latest = view.blocks.latest()
    assert latest[1] >= start[1] + 5  # type: ignore[index]
    client = GatewayClient(session, [localnet.url])
    for nonce in range(start[1], latest[1] + 1):  # gap-free
        block = await client.block_by_nonce(1, nonce)
        assert view.blocks.timestamp_ms(block["hash"]) == block["timestampMs"]
    assert view.blocks.latest_timestamp_ms() == latest[2]
    assert latest[2] == (await client.block_by_nonce(1, latest[1]))["timestampMs"]


async def test_params_are_reread_on_an_epoch_change_only(localnet, view) -> None:  # type: ignore[no-untyped-def]
    chain = localnet.net.chain
    await wait_for(lambda: view.status(METACHAIN).round >= 12)  # type: ignore[union-attr]

    def cheaper_gas() -> None:
        chain.config = dataclasses.replace(
            chain.config, rules=dataclasses.replace(chain.config.rules, min_gas_price=2 * 10**9)
        )

    localnet.call(cheaper_gas)
    polls = view.polls
    await wait_for(lambda: view.polls >= polls + 4)
    assert view.params.min_gas_price == 10**9 and view.epoch == 0  # same epoch: not re-read

    def new_epoch_with_slower_rounds() -> None:
        # 5 rounds per epoch puts the chain well past epoch 0; rounds of 200 ms from the current one on
        # (genesis moved so that the current round still starts when it did).
        r = chain.round
        chain.genesis_ms = chain.genesis_ms + r * chain.config.round_ms - r * 200
        chain.config = dataclasses.replace(chain.config, rounds_per_epoch=5, round_ms=200)

    localnet.call(new_epoch_with_slower_rounds)
    await wait_for(lambda: view.epoch > 0)
    params = view.params
    assert params.round_duration_ms == 200 and params.rounds_per_epoch == 5
    assert params.min_gas_price == 2 * 10**9
    assert view._interval_s() == pytest.approx(0.1)  # half a round, following the new round duration
    seen = view.epoch
    await wait_for(lambda: view.epoch > seen)  # the next epoch arrives 5 rounds later


async def test_clock_offset_is_small_normally_and_follows_a_shifted_chain_clock(
    localnet, view, session
) -> None:  # type: ignore[no-untyped-def]
    offset = view.clock_offset_ms()
    assert offset is not None and abs(offset) < 300  # a block's age when read, plus the request time
    await set_faults(session, localnet.url, {"chain": {"clockOffsetMs": 5_000}})
    # The chain's clock is 5 s ahead of ours: we are 5 s behind.
    await wait_for(lambda: abs((view.clock_offset_ms() or 0) + 5_000) < 300)
    await set_faults(session, localnet.url, {"chain": {"clockOffsetMs": 0}})
    await wait_for(lambda: abs(view.clock_offset_ms() or 10_000) < 300)


async def test_clock_offset_with_our_clock_ahead(localnet, session) -> None:  # type: ignore[no-untyped-def]
    network = NetworkView(GatewayClient(session, [localnet.url]), clock=lambda: time.time() + 7.5)
    assert network.clock_offset_ms() is None  # nothing observed yet
    await network.start()
    try:
        assert abs((network.clock_offset_ms() or 0) - 7_500) < 300
    finally:
        await network.stop()


async def test_one_stalled_shard_does_not_look_like_a_skew(localnet, view, session) -> None:  # type: ignore[no-untyped-def]
    # Shard 2 stops at a block stamped on the old clock while the others move 3 s ahead: the stalled shard's
    # offset is only its age (it looks like "no skew"), but it is not a live shard.
    await set_faults(session, localnet.url, {"chain": {"stalledShards": [2], "clockOffsetMs": 3_000}})
    await wait_for(lambda: abs((view.clock_offset_ms() or 0) + 3_000) < 300)
    stalled = view.status(2)
    assert stalled is not None and abs(stalled.observed_at_ms - stalled.block_ts_ms) < 3_000
    for _ in range(10):  # stays right while the stalled shard keeps ageing
        await asyncio.sleep(0.1)
        assert abs((view.clock_offset_ms() or 0) + 3_000) < 300
    # Without a skew, a stalled shard only gets older and never wins either.
    await set_faults(session, localnet.url, {"chain": {"clockOffsetMs": 0}})
    await wait_for(lambda: abs(view.clock_offset_ms() or 10_000) < 300)  # 0 is a right answer too
    for _ in range(10):  # and stays so while the stalled shard keeps ageing
        await asyncio.sleep(0.1)
        offset = view.clock_offset_ms()
        assert offset is not None and abs(offset) < 300


async def test_poll_failures_are_logged_and_retried(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, [localnet.url], timeout_ms=500)
    await set_faults(session, localnet.url, {"gateway": {"down": True}})
    with pytest.raises(GatewayUnavailable):
        await NetworkView(client).start()
    await set_faults(session, localnet.url, {"gateway": {"down": False}})
    network = NetworkView(client, poll_ms=20)  # below the floor: polls every 50 ms
    await network.start()
    try:
        with capture_logs() as logs:
            await set_faults(session, localnet.url, {"gateway": {"down": True}})
            polls = network.polls
            await wait_for(lambda: network.polls >= polls + 3)
            before = network.status(0).nonce  # type: ignore[union-attr]
            await set_faults(session, localnet.url, {"gateway": {"down": False}})
            await wait_for(lambda: network.status(0).nonce > before + 2)  # type: ignore[union-attr]
        events = [entry["event"] for entry in logs]
        assert "network.poll_failed" in events and "network.poll_recovered" in events
        failed = next(entry for entry in logs if entry["event"] == "network.poll_failed")
        assert failed["log_level"] == "warning" and "gateway unavailable" in failed["error"]
        assert network._interval_s() == pytest.approx(0.05)
    finally:
        await network.stop()


async def test_polls_follow_the_round_clock(run_localnet, tmp_path, session) -> None:  # type: ignore[no-untyped-def]
    # Twice a round, 25 ms after a round starts and half a round later, the phase read from the newest
    # metachain block's timestamp (the start of its round).
    net = run_localnet(tmp_path / "localnet", round_ms=1_000)
    clock = {"now": time.time()}
    network = NetworkView(GatewayClient(session, [net.url]), clock=lambda: clock["now"])
    await network.start()
    try:
        meta = network.status(METACHAIN)
        assert meta is not None and meta.block_ts_ms > 0
        block = meta.block_ts_ms
        for since_block_ms, wait_ms in [
            (25, 500),  # at an aligned moment: the next one, half a round later
            (125, 400),
            (524, 1),  # a poll that ended late still makes the aligned one
            (540, 485),
            (990, 35),
            (2_600, 425),  # rounds later (a block not seen yet): still in phase
            (-1_000, 25),  # our clock behind the chain's: the phase is still the chain's
        ]:
            clock["now"] = (block + since_block_ms) / 1000
            assert network.next_poll_delay_ms(polled_in_ms=3) == wait_ms, since_block_ms
        # A fixed cadence (poll_ms) keeps a steady interval: the poll's own duration counts against it.
        fixed = NetworkView(GatewayClient(session, [net.url]), poll_ms=200)
        await fixed.start()
        try:
            assert fixed.next_poll_delay_ms(polled_in_ms=30) == 170
        finally:
            await fixed.stop()
    finally:
        await network.stop()
