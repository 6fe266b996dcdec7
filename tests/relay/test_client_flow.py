"""gasless.client against the real API (uvicorn on a socket) on a real localnet, plus the flow's decisions
against a scripted client and the SSE follower against a small stream server."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from multiversx_sdk import Transaction
from relay_kit import ServedApi

from gasless.chain.addresses import address_of
from gasless.client import (
    BuildContext,
    RelayClient,
    RelayProblem,
    ResignLimitReached,
    SSEParser,
    Transfer,
    UserKey,
    presence_proof,
)
from gasless.client.api import RelayResult
from gasless.core.settings import Settings
from gasless.hosting.app import create_app, purpose_keys
from gasless.localnet.owner import owner_call
from gasless.relay.leases import LEASE_VALIDITY_MS, LeaseCodec
from gasless.signer import SignerUnavailable

STATE_ORDER = ("COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED")
TIMESTAMPS = ("receivedAtMs", "cosignedAtMs", "broadcastAtMs", "executedBlockTsMs", "finalizedAtMs")


# The API on a real socket -------------------------------------------------------------------------------
@dataclass
class Served:
    """One served API host and the localnet behind it."""

    url: str
    settings: Settings
    localnet: Any
    server: ServedApi

    @property
    def gateway(self) -> str:
        return self.localnet.url

    @property
    def chain_id(self) -> str:
        return self.settings.network.chain_id

    async def grant(self, key: UserKey) -> None:
        contract = self.localnet.net.info["contract"]
        await owner_call(
            self.localnet.url,
            self.localnet.net.genesis.owner,
            contract,
            "grant",
            [address_of(key.public_key), 3, 1],
        )

    async def new_sender(self, shard: int = 1, *, plan: bool = True) -> UserKey:
        key = key_in_shard(shard)
        if plan:
            await self.grant(key)
        return key

    def faults(self, method: str = "POST", **body: Any) -> None:
        request = urllib.request.Request(
            f"{self.localnet.url}/localnet/faults",
            data=json.dumps(body).encode() if method == "POST" else None,
            headers={"Content-Type": "application/json"},
            method=method,
        )
        urllib.request.urlopen(request, timeout=5).read()


def key_in_shard(shard: int) -> UserKey:
    while True:
        key = UserKey.generate()
        if key.shard == shard:
            return key


def start_served(relay_conftest: dict[str, Any], tmp_path: Path, localnet: Any, **app_kwargs: Any) -> Served:
    """Settings exactly as tests/relay/conftest.py makes them, the app served on a socket."""
    settings = relay_conftest["relay_settings"](tmp_path, localnet)
    server = ServedApi(create_app(settings, **app_kwargs)).start()
    return Served(server.url, settings, localnet, server)


@pytest.fixture
def relay_conftest(make_env: Callable[..., Any]) -> dict[str, Any]:
    """tests/relay/conftest.py's module namespace (relay_settings, MASTER_SECRET, ...), reached through one
    of its fixtures: several modules are named `conftest`, so importing it by name is not reliable."""
    return make_env.__globals__


@pytest.fixture
def serve(
    relay_conftest: dict[str, Any], tmp_path: Path, unpaused_localnet: Any
) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(**app_kwargs: Any) -> Served:
        served = start_served(relay_conftest, tmp_path, unpaused_localnet, **app_kwargs)
        started.append(served)
        return served

    yield start
    for served in started:
        served.server.stop()


@pytest.fixture
def served(serve: Callable[..., Served]) -> Served:
    return serve()


class CountingSigner:
    """A TxSigner that counts transaction signatures (the flow must sign once unless it must re-sign)."""

    def __init__(self, key: UserKey) -> None:
        self.key = key
        self.signed: list[str] = []

    @property
    def address(self) -> str:
        return self.key.address

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message)

    def sign_transaction(self, tx: Transaction) -> bytes:
        signature = self.key.sign_transaction(tx)
        self.signed.append(signature.hex())
        return signature


async def follow_all(client: RelayClient, ident: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    return [intent async for intent in client.follow(ident, timeout_s=timeout_s)]


def assert_finalized(intents: list[dict[str, Any]], tx_hash: str) -> dict[str, Any]:
    states = [i["state"] for i in intents]
    assert states, "no intent seen"
    assert all(i["txHash"] == tx_hash for i in intents)
    ranks = [STATE_ORDER.index(s) for s in states]
    assert ranks == sorted(set(ranks)), f"states out of order or repeated: {states}"
    final = intents[-1]
    assert final["state"] == "FINALIZED" and final["final"] is True and final["outcome"] == "success"
    assert all(i["final"] is False for i in intents[:-1])
    return final


def assert_timestamps_consistent(final: dict[str, Any]) -> None:
    for member in TIMESTAMPS:
        assert isinstance(final[member], int), member
    assert final["receivedAtMs"] <= final["cosignedAtMs"] <= final["broadcastAtMs"]
    assert final["executedBlockTsMs"] <= final["finalizedAtMs"]
    latency = final["latency"]
    assert latency["acceptToCosignMs"] == final["cosignedAtMs"] - final["receivedAtMs"]
    assert latency["cosignToBroadcastMs"] == final["broadcastAtMs"] - final["cosignedAtMs"]
    assert latency["totalMs"] == final["finalizedAtMs"] - final["receivedAtMs"]
    assert latency["finalityMs"] == final["finalizedAtMs"] - final["executedBlockTsMs"]
    assert latency["roundsToInclusion"] >= 1


# Real service -----------------------------------------------------------------------------------------------
async def test_send_and_follow_until_finalized(served: Served) -> None:
    key = await served.new_sender(1)
    signer = CountingSigner(key)
    receiver = key_in_shard(1).address
    async with RelayClient(served.url) as client:
        assert await client.network_chain_id() == served.chain_id
        sent = await client.send(signer, Transfer(receiver, nonce=0, data="hello"))
        assert sent.status in (200, 202), sent.result.body
        assert sent.steps == ["assign", f"relay:{sent.status}"]
        assert len(signer.signed) == 1
        assert sent.result.duplicate is False
        assert sent.id == f"{key.address}:0"
        assert sent.result.request_id and sent.result.request_id.startswith("req_")
        assert sent.tx.relayer is not None and sent.tx.relayer.to_bech32() == sent.assignment["relayer"]
        assert sent.tx.version == 2 and sent.tx.gas_limit == 50_000 + 1_500 * 5 + 50_000

        intents = await follow_all(client, sent.id)
        final = assert_finalized(intents, sent.tx_hash)
        assert_timestamps_consistent(final)
        assert final["receiver"] == receiver

        # Reading by hash gives the same intent; the same bytes again are a duplicate, never resent.
        assert await client.intent(sent.tx_hash) == final
        again = await client.relay(sent.tx, sent.assignment["lease"])
        assert again.duplicate is True and again.tx_hash == sent.tx_hash and again.status == 200

        # A finished intent's stream gives the final state at once and closes.
        assert await follow_all(client, sent.tx_hash, timeout_s=5) == [final]


async def test_dropped_gateway_ack_answers_202_and_still_finalizes(served: Served) -> None:
    key = await served.new_sender(1)
    served.faults(gateway={"dropAcks": 1, "ackHangMs": 2_000})
    try:
        async with RelayClient(served.url) as client:
            sent = await client.send(key, Transfer(key_in_shard(1).address, nonce=0))
            assert sent.status == 202 and sent.result.state == "COSIGNED", sent.result.body
            intents = await follow_all(client, sent.id)
    finally:
        served.faults("DELETE")
    final = assert_finalized(intents, sent.tx_hash)
    assert final["cosignedAtMs"] < final["finalizedAtMs"]
    assert final["executedBlockTsMs"] <= final["finalizedAtMs"]


async def test_expired_lease_is_renewed_and_the_same_bytes_resent(served: Served) -> None:
    key = await served.new_sender(1)
    signer = CountingSigner(key)
    async with RelayClient(served.url) as client:
        assignment = await client.assign(key)
        # A lease of the same environment (same master secret), issued one validity window ago.
        issued = int(time.time() * 1000) - LEASE_VALIDITY_MS - 5_000
        expired, _ = LeaseCodec(purpose_keys(served.settings)).mint(
            sender=key.address, relayer=assignment["relayer"], kind="std", now_ms=issued
        )
        stale = {**assignment, "lease": expired, "issuedAtMs": issued}

        # The bare answer first: retryable, same bytes, renewable.
        probe = Transfer(key_in_shard(1).address, nonce=0)
        tx = probe(BuildContext(key.address, served.chain_id, stale))
        key.sign_transaction(tx)
        with pytest.raises(RelayProblem) as refused:
            await client.relay(tx, expired)
        problem = refused.value
        assert (problem.status, problem.code) == (409, "LEASE_EXPIRED")
        assert problem.retryable is True and problem.resign == "SAME_BYTES"
        assert problem.details == {"renewable": True}
        assert problem.request_id and problem.request_id.startswith("req_")

        # The flow renews (renewFor = the signed tx) and resends the very bytes it signed once.
        sent = await client.send(signer, probe, assignment=stale)
        assert sent.steps == ["relay:LEASE_EXPIRED", "assign:renew", f"relay:{sent.status}"]
        assert len(signer.signed) == 1 and sent.tx.signature.hex() == signer.signed[0]
        assert sent.tx.signature == tx.signature  # the bytes refused above, resent unchanged
        renewed = sent.assignment
        assert renewed["lease"] != expired and renewed["pinNonce"] == 0
        assert renewed["relayer"] == assignment["relayer"] and renewed["expiresAtMs"] > time.time() * 1000
        final = assert_finalized(await follow_all(client, sent.id), sent.tx_hash)
        assert_timestamps_consistent(final)


async def test_follow_falls_back_to_polling_after_the_stream_lifetime(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gasless.relay import routes

    monkeypatch.setattr(routes, "STREAM_LIFETIME_MS", 1_000)  # the app runs in this process
    key = await served.new_sender(1)
    served.faults(chain={"stalledShards": [1]})  # the intent stays BROADCAST while the shard is stalled
    try:
        async with RelayClient(served.url) as client:
            sent = await client.send(key, Transfer(key_in_shard(1).address, nonce=0))
            polls: list[str] = []
            read = client.intent

            async def counted(ident: str) -> dict[str, Any]:
                polls.append(ident)
                return await read(ident)

            client.intent = counted  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            loop.call_later(2.0, lambda: served.faults(chain={"stalledShards": []}))
            intents = [
                i
                async for i in client.follow(
                    sent.id, stream_lifetime_s=1.0, poll_interval_s=0.1, timeout_s=30
                )
            ]
    finally:
        served.faults("DELETE")
    final = assert_finalized(intents, sent.tx_hash)
    assert_timestamps_consistent(final)
    assert polls and set(polls) == {sent.id}  # the final state came from polling, not from the stream


class FailingFirstSigns:
    """Relayer signer whose first `failures` signatures fail as unavailable (503 SIGNER_UNAVAILABLE)."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    def relayers(self) -> Any:
        return self.inner.relayers()

    def check(self) -> None:
        self.inner.check()

    async def sign(self, relayer: str, message: bytes) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise SignerUnavailable("test: signer unreachable")
        return await self.inner.sign(relayer, message)


async def test_retryable_same_bytes_error_is_retried_with_identical_bytes(
    serve: Callable[..., Served],
) -> None:
    wrappers: list[FailingFirstSigns] = []

    def wrap(inner: Any) -> FailingFirstSigns:
        wrappers.append(FailingFirstSigns(inner, failures=2))
        return wrappers[-1]

    served = serve(signer_wrapper=wrap)
    key = await served.new_sender(1)
    signer = CountingSigner(key)
    async with RelayClient(served.url) as client:
        sent = await client.send(signer, Transfer(key_in_shard(1).address, nonce=0))
        relays = [s for s in sent.steps if s.startswith("relay:")]
        assert relays == ["relay:SIGNER_UNAVAILABLE", "relay:SIGNER_UNAVAILABLE", f"relay:{sent.status}"]
        assert sum(s.startswith("wait:") for s in sent.steps) == 2
        assert len(signer.signed) == 1  # one user signature, resent as is
        assert wrappers[0].calls == 3
        assert_finalized(await follow_all(client, sent.id), sent.tx_hash)


async def test_assign_retries_once_with_the_server_time_on_a_skewed_clock(served: Served) -> None:
    key = await served.new_sender(1)
    async with RelayClient(served.url) as client:
        client.clock_offset_ms = -120_000  # our clock two minutes behind: the first proof is stale
        assignment = await client.assign(key)
        assert abs(client.clock_offset_ms) < 5_000  # learnt from details.serverTimeMs
        assert assignment["kind"] == "std" and assignment["shard"] == 1
        proof = presence_proof(key.secret_key, key.address, served.chain_id, 1)
        with pytest.raises(RelayProblem) as refused:
            await client.request("POST", "/v1/relay/assign", json={"sender": key.address, "proof": proof})
        assert refused.value.code == "ASSIGN_PROOF_INVALID" and "serverTimeMs" in refused.value.details


async def test_refusal_without_recovery_is_raised(served: Served) -> None:
    key = await served.new_sender(1)
    async with RelayClient(served.url) as client:
        with pytest.raises(RelayProblem) as refused:
            await client.send(key, Transfer(key_in_shard(1).address, nonce=5))
    assert refused.value.code == "NONCE_GAP" and refused.value.resign == "NONE"


# The flow's decisions against a scripted client ---------------------------------------------------------------
class ScriptedClient:
    """Answers `relay` from a script of problems (then 200) and records what the flow asked."""

    def __init__(self, script: list[RelayProblem]) -> None:
        self.script = list(script)
        self.relayed: list[tuple[str, str, int]] = []  # (signature hex, lease, gas price)
        self.assigned: list[dict[str, Any]] = []

    async def network_chain_id(self) -> str:
        return "localnet"

    async def assign(self, signer: Any, **kwargs: Any) -> dict[str, Any]:
        self.assigned.append(kwargs)
        return assignment_of(f"lease-{len(self.assigned)}")

    async def relay(self, tx: Transaction, lease: str, **_: Any) -> RelayResult:
        self.relayed.append((tx.signature.hex(), lease, tx.gas_price))
        if self.script:
            raise self.script.pop(0)
        return RelayResult(
            200, {"id": f"{tx.sender.to_bech32()}:{tx.nonce}", "txHash": "00" * 32, "state": "BROADCAST"}
        )


RELAYER_A = key_in_shard(1).address
RELAYER_B = key_in_shard(1).address


def assignment_of(lease: str, relayer: str = RELAYER_A, pin: int | None = None) -> dict[str, Any]:
    return {"relayer": relayer, "shard": 1, "lease": lease, "kind": "std", "pinNonce": pin, "renewable": True}


def problem(code: str, status: int, resign: str, retryable: bool = False, **details: Any) -> RelayProblem:
    return RelayProblem(status=status, code=code, retryable=retryable, resign=resign, details=details)


async def scripted_send(
    script: list[RelayProblem], **kwargs: Any
) -> tuple[ScriptedClient, CountingSigner, Any]:
    from gasless.client.flow import send_flow

    client = ScriptedClient(script)
    signer = CountingSigner(key_in_shard(1))
    result = await send_flow(
        client,  # type: ignore[arg-type]
        signer,
        Transfer(RELAYER_B, nonce=7),
        assignment=assignment_of("lease-0"),
        **kwargs,
    )
    return client, signer, result


async def test_flow_resign_required_rebuilds_for_the_new_relayer_same_nonce() -> None:
    moved = assignment_of("lease-new", RELAYER_B, pin=7)
    client, signer, result = await scripted_send(
        [problem("RESIGN_REQUIRED", 409, "NEW_SIGNATURE_SAME_NONCE", assignment=moved)]
    )
    assert len(signer.signed) == 2 and client.relayed[1][1] == "lease-new"
    assert result.tx.nonce == 7 and result.tx.relayer.to_bech32() == RELAYER_B
    assert result.steps == ["relay:RESIGN_REQUIRED", "resign:RESIGN_REQUIRED", "relay:200"]


async def test_flow_resign_same_nonce_pays_the_minimum_gas_price() -> None:
    cancel = {**assignment_of("lease-cancel", pin=7), "kind": "cancel"}
    client, signer, result = await scripted_send(
        [
            problem(
                "RESIGN_SAME_NONCE",
                409,
                "NEW_SIGNATURE_SAME_NONCE",
                assignment=cancel,
                minGasPrice=1_000_000_001,
            )
        ]
    )
    assert [r[2] for r in client.relayed] == [1_000_000_000, 1_000_000_001]
    assert client.relayed[1][1] == "lease-cancel" and result.tx.nonce == 7


async def test_flow_signs_again_at_most_once() -> None:
    moved = assignment_of("lease-new", RELAYER_B, pin=7)
    again = problem("RESIGN_REQUIRED", 409, "NEW_SIGNATURE_SAME_NONCE", assignment=moved)
    with pytest.raises(ResignLimitReached):
        await scripted_send([again, again])


async def test_flow_lease_expired_not_renewable_assigns_and_signs_again() -> None:
    client, signer, result = await scripted_send(
        [problem("LEASE_EXPIRED", 409, "SAME_BYTES", True, renewable=False)]
    )
    assert client.assigned == [{"kind": "key"}]  # a fresh assignment, not a renewal
    assert len(signer.signed) == 2 and client.relayed[1][1] == "lease-1" and result.tx.nonce == 7


async def test_flow_lease_expired_renewable_renews_for_the_signed_bytes() -> None:
    client, signer, _ = await scripted_send(
        [problem("LEASE_EXPIRED", 409, "SAME_BYTES", True, renewable=True)]
    )
    assert len(signer.signed) == 1 and client.relayed[0][0] == client.relayed[1][0]
    renew_for = client.assigned[0]["renew_for"]
    assert renew_for.signature.hex() == signer.signed[0] and client.relayed[1][1] == "lease-1"


async def test_flow_same_bytes_waits_for_retry_after_and_is_bounded() -> None:
    busy = problem("RATE_LIMITED", 429, "SAME_BYTES", True, retryAfterMs=50, scope="sender")
    started = time.monotonic()
    client, signer, result = await scripted_send([busy, busy])
    assert time.monotonic() - started >= 0.1
    assert result.steps == [
        "relay:RATE_LIMITED",
        "wait:0.050",
        "relay:RATE_LIMITED",
        "wait:0.050",
        "relay:200",
    ]
    assert len({r[0] for r in client.relayed}) == 1 and len(signer.signed) == 1
    with pytest.raises(RelayProblem):
        await scripted_send([busy] * 3, max_attempts=3)
    slow = problem("UPSTREAM_UNAVAILABLE", 503, "SAME_BYTES", True, retryAfterMs=5_000)
    with pytest.raises(RelayProblem):
        await scripted_send([slow], max_wait_s=1.0)


async def test_flow_retryable_without_same_bytes_and_none_are_raised() -> None:
    for raised in (problem("TOO_MANY_IN_FLIGHT", 429, "NONE", True), problem("NONCE_GAP", 409, "NONE")):
        with pytest.raises(RelayProblem) as caught:
            await scripted_send([raised])
        assert caught.value is raised


# SSE: parser and follower against a small stream server ------------------------------------------------------
def test_sse_parser_handles_line_ends_comments_and_split_chunks() -> None:
    parser = SSEParser()
    chunks = [b": ping\r\n\r\nevent: intent\r", b'\nid: 4\ndata: {"a":', "\u00e9".encode()[:1]]
    chunks += ["\u00e9".encode()[1:] + b"}\r\rdata: x\n\n", b"retry: 1500\nid: 5\ndata: a\ndata: b\n\n"]
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    assert [(e.event, e.id, e.data) for e in events] == [
        ("intent", "4", '{"a":\u00e9}'),
        ("message", "4", "x"),
        ("message", "5", "a\nb"),
    ]
    assert parser.retry_ms == 1500 and parser.last_event_id == "5"


def intent_doc(state: str, final: bool = False) -> dict[str, Any]:
    return {"id": "erd1x:0", "state": state, "final": final, "txHash": "ab" * 32}


def sse(seq: int, intent: dict[str, Any]) -> bytes:
    return f"event: intent\r\nid: {seq}\r\ndata: {json.dumps(intent)}\r\n\r\n".encode()


@pytest.fixture
async def stream_server() -> Any:
    servers: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        servers.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in servers:
        await runner.cleanup()


async def test_follow_resumes_with_last_event_id_after_a_drop(stream_server: Any) -> None:
    seen_ids: list[str | None] = []

    async def events(request: web.Request) -> web.StreamResponse:
        seen_ids.append(request.headers.get("Last-Event-ID"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if len(seen_ids) == 1:
            await response.write(sse(1, intent_doc("COSIGNED")) + sse(2, intent_doc("BROADCAST")))
            await asyncio.sleep(0.05)
            request.transport.close()  # type: ignore[union-attr]  # the connection drops mid-stream
            return response
        await response.write(sse(2, intent_doc("BROADCAST")) + sse(3, intent_doc("FINALIZED", True)))
        return response

    app = web.Application()
    app.router.add_get("/v1/relay/{id}/events", events)
    url = await stream_server(app)
    async with RelayClient(url) as client:
        states = [i["state"] async for i in client.follow("erd1x:0", timeout_s=10)]
    assert states == ["COSIGNED", "BROADCAST", "FINALIZED"]
    assert seen_ids == [None, "2"]


async def test_follow_polls_after_the_stream_lifetime(stream_server: Any) -> None:
    polls: list[int] = []

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(1, intent_doc("BROADCAST")))
        await asyncio.sleep(0.3)  # then the server closes the stream: its lifetime is over
        return response

    async def status(request: web.Request) -> web.Response:
        polls.append(1)
        doc = intent_doc("EXECUTED") if len(polls) < 3 else intent_doc("FINALIZED", True)
        return web.json_response(doc)

    app = web.Application()
    app.router.add_get("/v1/relay/{id}/events", events)
    app.router.add_get("/v1/relay/{id}", status)
    url = await stream_server(app)
    async with RelayClient(url) as client:
        states = [
            i["state"]
            async for i in client.follow(
                "erd1x:0", stream_lifetime_s=0.25, poll_interval_s=0.05, timeout_s=10
            )
        ]
    assert states == ["BROADCAST", "EXECUTED", "FINALIZED"]
    assert len(polls) == 3


async def test_follow_raises_not_found_and_times_out(stream_server: Any) -> None:
    async def missing(request: web.Request) -> web.Response:
        return web.json_response({"code": "NOT_FOUND", "status": 404, "detail": "no intent"}, status=404)

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(1, intent_doc("BROADCAST")))
        await asyncio.sleep(5)
        return response

    app = web.Application()
    app.router.add_get("/v1/relay/missing/events", missing)
    app.router.add_get("/v1/relay/{id}/events", endless)
    url = await stream_server(app)
    async with RelayClient(url) as client:
        with pytest.raises(RelayProblem) as caught:
            [i async for i in client.follow("missing")]
        assert caught.value.code == "NOT_FOUND" and caught.value.status == 404
        seen: list[str] = []
        with pytest.raises(TimeoutError):
            async for intent in client.follow("erd1x:0", timeout_s=0.5):
                seen.append(intent["state"])
        assert seen == ["BROADCAST"]


def test_problem_from_a_non_problem_answer() -> None:
    gateway = RelayProblem.from_response(502, "<html>bad gateway</html>", {"Retry-After": "2"})
    assert gateway.code == "HTTP_ERROR" and gateway.retryable and gateway.resign == "SAME_BYTES"
    assert gateway.retry_after_s == 2.0
    catalogued = RelayProblem.from_response(409, {"code": "NONCE_IN_FLIGHT", "details": {"pinnedNonce": 1}})
    assert catalogued.retryable is True and catalogued.resign == "SAME_BYTES"  # from the catalogue
