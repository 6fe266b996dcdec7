"""GatewayClient against the real localnet gateways: reads with failover, broadcast, node rejections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest
from multiversx_sdk import Transaction, TransactionComputer

from gasless.chain.addresses import METACHAIN
from gasless.chain.codec import tx_hash, tx_to_wire
from gasless.chain.gateway import (
    SENDS_IN_FLIGHT,
    GatewayClient,
    GatewayRejected,
    GatewayUnavailable,
    SendResult,
)

computer = TransactionComputer()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def set_faults(session: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with session.post(f"{url}/localnet/faults", json=faults) as response:
        assert response.status == 200, await response.text()


def wallet(net: Any, kind: str, shard: int) -> Any:
    wallets = net.net.genesis.relayers if kind == "relayer" else net.net.genesis.users
    return next(w for w in wallets if w.shard == shard)


def relayed_wire(net: Any, shard: int = 1, nonce: int = 0, *, data: bytes = b"ping") -> dict[str, Any]:
    """A real, signed Relayed-V3 transfer from the shard's demo user (no EGLD) paid by its relayer."""
    sender, relayer = wallet(net, "user", shard), wallet(net, "relayer", shard)
    tx = Transaction(
        sender=sender.address,
        receiver=sender.address,
        nonce=nonce,
        chain_id="localnet",
        version=2,
        gas_limit=50_000 + 50_000 + 1_500 * len(data),
        gas_price=10**9,
        data=data,
        relayer=relayer.address,
    )
    tx.signature = sender.secret_key.sign(computer.compute_bytes_for_signing(tx))
    tx.relayer_signature = relayer.secret_key.sign(computer.compute_bytes_for_signing(tx))
    return tx_to_wire(tx)


def expected_hash(wire: dict[str, Any]) -> str:
    return tx_hash(Transaction.new_from_dictionary(wire))


# Reads ------------------------------------------------------------------------------------------------
async def test_reads_return_real_data(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, [localnet.url])
    config = await client.network_config()
    assert config["erd_chain_id"] == "localnet" and config["erd_round_duration"] == 100
    meta = await client.network_status(METACHAIN)
    assert meta["erd_highest_final_nonce"] <= meta["erd_nonce"]
    user = wallet(localnet, "user", 1).address.to_bech32()
    account = await client.account(user)
    assert account == {**account, "address": user, "nonce": 0, "balance": "0"}
    assert (await client.guardian_data(user))["guarded"] is False
    block = await client.block_by_nonce(1, 0)
    assert block["nonce"] == 0 and block["shard"] == 1 and block["hash"]
    assert await client.pool_for_sender(user) == []


async def test_pool_simulate_cost_and_transaction(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, [localnet.url])
    wire = relayed_wire(localnet, shard=2)
    simulated = await client.simulate(wire)
    assert simulated["status"] == "success" and simulated["hash"] == expected_hash(wire)
    cost = await client.cost({**wire, "gasLimit": 0})
    assert cost["txGasUnits"] == 50_000 + 50_000 + 4 * 1_500 and cost["returnMessage"] == ""

    localnet.call(lambda: localnet.net.chain.faults.stalled_shards.add(2))  # keep it in the pool
    ack = await client.broadcast(wire).first_ack
    assert ack.ok
    sender = wire["sender"]
    pool = await client.pool_for_sender(sender)
    assert pool == [{"hash": ack.tx_hash, "nonce": 0, "gasprice": 10**9, "relayer": wire["relayer"]}]
    pending = await client.transaction(ack.tx_hash, sender=sender)
    assert pending is not None and pending["status"] == "pending"
    localnet.call(lambda: localnet.net.chain.faults.stalled_shards.discard(2))
    for _ in range(100):
        done = await client.transaction(ack.tx_hash)
        assert done["hash"] == ack.tx_hash  # the gateway keeps answering for the hash while it executes
        if done["notarizedAtDestinationInMetaNonce"]:
            break
        await asyncio.sleep(0.05)
    assert done["status"] == "success" and done["relayerAddress"] == wire["relayer"]
    # Without `sender`, the proxy copies the destination's notarization into hyperblockNonce; with it, not.
    assert done["hyperblockNonce"] == done["notarizedAtDestinationInMetaNonce"] > 0
    by_sender = await client.transaction(ack.tx_hash, sender=sender)
    assert by_sender is not None and "hyperblockNonce" not in by_sender
    assert by_sender["notarizedAtDestinationInMetaNonce"] == done["hyperblockNonce"]


async def test_unknown_hash_is_none(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, [localnet.url])
    assert await client.transaction("ab" * 32) is None


async def test_node_errors_raise_rejected_with_the_node_string(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, localnet.urls)
    with pytest.raises(GatewayRejected) as err:
        await client.account("erd1notanaddress")
    assert (err.value.message, err.value.status) == ("cannot decode address", 400)
    with pytest.raises(GatewayRejected) as err:
        await client.block_by_nonce(1, 10**9)
    assert (err.value.message, err.value.status) == ("block not found", 500)
    wire = relayed_wire(localnet)
    with pytest.raises(GatewayRejected) as err:
        await client.simulate({**wire, "nonce": -1})
    assert err.value.status == 400
    assert err.value.message.startswith("transaction generation failed: nonce")
    with pytest.raises(ValueError):
        await client.post("/transaction/send", wire)  # sends go through broadcast()


async def test_vm_query_decodes_and_rejects(localnet, session) -> None:  # type: ignore[no-untyped-def]
    client = GatewayClient(session, [localnet.url])
    contract = localnet.net.genesis.contract.to_bech32()
    parts = await client.vm_query(contract, "getPauseState")
    assert parts and all(isinstance(p, bytes) for p in parts)
    owner = localnet.net.genesis.owner.address
    senders = await client.vm_query(contract, "getSenders", [owner.get_public_key()])
    assert senders == []
    with pytest.raises(GatewayRejected) as err:
        await client.vm_query(contract, "noSuchView")
    assert "not found" in err.value.message
    with pytest.raises(GatewayRejected) as err:
        await client.vm_query(owner.to_bech32(), "getPauseState")
    assert err.value.message == "executeQuery: executeQuery: contract not found" and err.value.status == 400


async def test_read_fails_over_when_the_first_gateway_is_down(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    first, second = net.urls
    client = GatewayClient(session, net.urls, timeout_ms=500)
    assert client.preferred_url == first
    await set_faults(session, first, {"gateway": {"down": True}})
    assert (await client.network_config())["erd_chain_id"] == "localnet"
    assert client.preferred_url == second  # the next read starts at the gateway that answered
    # A 5xx without a node message, and a gateway slower than the timeout, are failed over too.
    await set_faults(session, first, {"gateway": {"down": False, "errorRate": 1.0, "errorStatus": 500}})
    client = GatewayClient(session, net.urls, timeout_ms=500)
    assert (await client.network_status(0))["erd_nonce"] >= 0
    assert client.preferred_url == second
    await set_faults(session, first, {"gateway": {"errorRate": 0.0, "latencyMs": {"*": 1_000}}})
    client = GatewayClient(session, net.urls, timeout_ms=300)
    assert (await client.network_status(1))["erd_nonce"] >= 0
    # A node's answer is final: the slow gateway (which would answer within this timeout) is never asked.
    client = GatewayClient(session, [second, first], timeout_ms=5_000)
    started = asyncio.get_running_loop().time()
    with pytest.raises(GatewayRejected) as err:
        await client.account("erd1notanaddress")
    assert err.value.url == second and client.preferred_url == second
    assert asyncio.get_running_loop().time() - started < 1.5


async def test_all_gateways_down_is_unavailable(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    for url in net.urls:
        await set_faults(session, url, {"gateway": {"down": True}})
    client = GatewayClient(session, net.urls, timeout_ms=500)
    with pytest.raises(GatewayUnavailable) as err:
        await client.network_config()
    assert "gateway unavailable" in str(err.value)
    unreachable = GatewayClient(session, ["http://127.0.0.1:9"], timeout_ms=300)
    with pytest.raises(GatewayUnavailable):
        await unreachable.network_config()


# Broadcast --------------------------------------------------------------------------------------------
async def test_broadcast_to_two_gateways_acks_with_the_hash(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    client = GatewayClient(session, net.urls)
    wire = relayed_wire(net)
    sent = client.broadcast(wire)
    ack = await sent.first_ack
    assert isinstance(ack, SendResult) and ack.ok and ack.status == 200
    assert ack.tx_hash == expected_hash(wire) and ack.url in net.urls and ack.elapsed_ms > 0
    results = await sent.results
    assert [r.url for r in results] == net.urls
    assert all(r.ok and r.tx_hash == ack.tx_hash for r in results)  # the same tx: the same hash


async def test_broadcast_acks_when_one_gateway_drops_acks(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    first, second = net.urls
    await set_faults(session, first, {"gateway": {"dropAcks": -1, "ackHangMs": 1_500}})
    client = GatewayClient(session, net.urls, timeout_ms=600)
    wire = relayed_wire(net, shard=0)
    sent = client.broadcast(wire)
    ack = await sent.first_ack
    assert ack.ok and ack.url == second and ack.tx_hash == expected_hash(wire)
    dropped, answered = await sent.results
    assert not dropped.ok and dropped.status is None and "timed out" in (dropped.error or "")
    assert answered.ok


async def test_broadcast_acks_when_one_gateway_is_down(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    first, second = net.urls
    await set_faults(session, second, {"gateway": {"down": True}})
    client = GatewayClient(session, net.urls)
    wire = relayed_wire(net, shard=2)
    sent = client.broadcast(wire)
    ack = await sent.first_ack
    assert ack.ok and ack.url == first and ack.tx_hash == expected_hash(wire)
    results = await sent.results
    assert (results[1].ok, results[1].status, results[1].error) == (False, 503, "gateway unavailable")


async def test_broadcast_all_down_resolves_with_a_failure(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    await set_faults(session, net.urls[0], {"gateway": {"down": True}})
    client = GatewayClient(session, [*net.urls[:1], "http://127.0.0.1:9"], timeout_ms=500)
    sent = client.broadcast(relayed_wire(net))
    ack = await sent.first_ack  # never raises
    assert not ack.ok and ack.tx_hash is None and ack.error
    results = await sent.results
    assert not any(r.ok for r in results)
    assert results[0].status == 503 and results[1].status is None


async def test_broadcast_of_a_bad_tx_reports_the_node_error(localnet_two_gateways, session) -> None:  # type: ignore[no-untyped-def]
    net = localnet_two_gateways
    client = GatewayClient(session, net.urls)
    wire = {**relayed_wire(net), "signature": "00" * 64}
    sent = client.broadcast(wire)
    ack = await sent.first_ack
    assert not ack.ok
    assert (ack.status, ack.error) == (400, "transaction generation failed: ed25519: invalid signature")
    assert all(r.error == ack.error for r in await sent.results)


# Sends that wait for their gateway leave together --------------------------------------------------------
@pytest.fixture
async def counted() -> AsyncIterator[tuple[aiohttp.ClientSession, list[str]]]:
    """A session that records the path of every request it makes."""
    paths: list[str] = []

    async def on_start(_s: Any, _ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        paths.append(params.url.path)

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    async with aiohttp.ClientSession(trace_configs=[trace]) as s:
        yield s, paths


async def until_requested(paths: list[str], count: int) -> None:
    async with asyncio.timeout(5):
        while len(paths) < count:
            await asyncio.sleep(0.001)


async def slow_sends(
    session: aiohttp.ClientSession, url: str, paths: list[str], latency_ms: int = 300, **client: Any
) -> GatewayClient:
    """A client of a gateway whose every send takes `latency_ms`, with the request log emptied."""
    await set_faults(session, url, {"gateway": {"latencyMs": {"/transaction/send": latency_ms}}})
    paths.clear()
    return GatewayClient(session, [url], **client)


async def test_a_lone_send_leaves_at_once_as_a_single_send(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    client = GatewayClient(session, [localnet.url])
    wire = relayed_wire(localnet)
    ack = await client.broadcast(wire).first_ack
    assert ack.ok and ack.tx_hash == expected_hash(wire)
    assert paths == ["/transaction/send"]


async def test_sends_asked_for_together_leave_in_one_send_multiple(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    # Every send takes 300 ms: the first is in flight while the other nine are asked for in one turn.
    client = await slow_sends(session, localnet.url, paths)
    wires = [relayed_wire(localnet, nonce=n) for n in range(10)]
    sent = [client.broadcast(wires[0])]
    await until_requested(paths, 1)
    sent += [client.broadcast(w) for w in wires[1:]]
    acks = [await s.first_ack for s in sent]
    assert [a.tx_hash for a in acks] == [expected_hash(w) for w in wires]
    assert paths == ["/transaction/send", "/transaction/send-multiple"]
    # The node took all ten: each is known by its hash.
    for wire in wires:
        known = await client.transaction(expected_hash(wire))
        assert known is not None and known["hash"] == expected_hash(wire)


async def test_sends_beyond_the_requests_in_flight_wait_and_leave_together(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    client = await slow_sends(session, localnet.url, paths)
    wires = [relayed_wire(localnet, nonce=n) for n in range(10)]
    sent = []
    for count, wire in enumerate(wires[:SENDS_IN_FLIGHT], start=1):  # each leaves alone, at once
        sent.append(client.broadcast(wire))
        await until_requested(paths, count)
    sent += [client.broadcast(w) for w in wires[SENDS_IN_FLIGHT:]]
    acks = [await s.first_ack for s in sent]
    assert [a.tx_hash for a in acks] == [expected_hash(w) for w in wires]
    assert paths == ["/transaction/send"] * SENDS_IN_FLIGHT + ["/transaction/send-multiple"]


async def test_a_refused_transaction_in_a_batch_gets_the_node_error(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    client = await slow_sends(session, localnet.url, paths)
    good = [relayed_wire(localnet, nonce=n) for n in range(3)]
    bad = {**relayed_wire(localnet, nonce=3), "signature": "00" * 64}
    sent = [client.broadcast(good[0], expected_hash(good[0]))]
    await until_requested(paths, 1)
    sent += [client.broadcast(w, expected_hash(w)) for w in [*good[1:], bad]]
    acks = [await s.first_ack for s in sent]
    assert [a.tx_hash for a in acks[:3]] == [expected_hash(w) for w in good]
    # The gateway skips it silently in the batch; sent alone, the node says why.
    assert (acks[3].ok, acks[3].status) == (False, 400)
    assert acks[3].error == "transaction generation failed: ed25519: invalid signature"
    assert paths == ["/transaction/send", "/transaction/send-multiple", "/transaction/send"]


async def test_a_batch_to_a_gateway_that_went_down_fails_every_send(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    client = await slow_sends(session, localnet.url, paths)
    first = client.broadcast(relayed_wire(localnet, nonce=0))
    await until_requested(paths, 1)
    rest = [client.broadcast(relayed_wire(localnet, nonce=n)) for n in range(1, 4)]
    await set_faults(session, localnet.url, {"gateway": {"down": True}})  # while the first is under way
    assert (await first.first_ack).ok  # it was in before the gateway went down
    for s in rest:
        ack = await s.first_ack
        assert (ack.ok, ack.status, ack.error) == (False, 503, "gateway unavailable")
    assert paths[-1] == "/transaction/send-multiple"


async def test_closing_the_client_resolves_every_waiting_send(localnet, counted) -> None:  # type: ignore[no-untyped-def]
    session, paths = counted
    client = await slow_sends(session, localnet.url, paths, 5_000, timeout_ms=10_000)
    sent = [client.broadcast(relayed_wire(localnet, nonce=0))]
    await until_requested(paths, 1)  # the first request is under way, the others wait behind it
    sent += [client.broadcast(relayed_wire(localnet, nonce=n)) for n in range(1, 3)]
    async with asyncio.timeout(2):  # far less than the gateway's 5 s: nothing waits for it
        await client.aclose()
        acks = [await s.first_ack for s in sent]
        await asyncio.gather(*(s.results for s in sent))
    assert not any(a.ok for a in acks)
    assert {a.error for a in acks[1:]} == {"gateway client closed"}


async def test_the_gateway_session_reuses_the_latest_connection_and_lets_a_bursts_extra_ones_close() -> None:
    """Ten requests at once open ten connections; then one request at a time: each goes over the
    connection returned last, so the other nine stay idle until the keep-alive timeout closes them
    (aiohttp's own order, the first returned first, kept all ten alive under a steady load)."""
    from aiohttp import web

    from gasless.chain.gateway import LatestFirstConnector

    release = asyncio.Event()
    held = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal held
        if request.query.get("hold"):
            held += 1
            await release.wait()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        return web.Response(text=str(peer[1] if peer else 0))

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server = cast(web.Server, runner.server)  # set by setup()
    session = aiohttp.ClientSession(connector=LatestFirstConnector(keepalive_timeout=0.5))
    burst: list[asyncio.Task[str]] = []
    try:

        async def get(hold: bool = False) -> str:
            async with session.get(f"http://127.0.0.1:{port}/", params={"hold": "1"} if hold else {}) as r:
                return await r.text()

        burst = [asyncio.create_task(get(hold=True)) for _ in range(10)]
        deadline = time.monotonic() + 30
        while held < 10:  # the condition waited for: ten requests in the handler at once
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert len(server.connections) == 10
        release.set()
        await asyncio.gather(*burst)
        ports: set[str] = set()
        while len(server.connections) > 1:  # the condition waited for: nine connections closed
            assert time.monotonic() < deadline
            ports.add(await get())
            await asyncio.sleep(0.02)  # one request at a time, as a quiet host sends them
        assert len(ports) == 1  # every request of the steady load went over the same connection
    finally:
        release.set()
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        await runner.cleanup()
        await session.close()
