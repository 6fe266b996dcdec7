"""localnet's admin API under `/localnet/...` and the per-gateway fault injection middleware.

Chain-wide switches (stalled shards, clock offset, pause flags, balances) act on the shared network; the
gateway faults (down, added latency, jitter, 5xx rate, dropped send acknowledgements, a pool answered
`null`, lookups by sender answered 404) act on the one gateway that
received the admin call, so a test can break one of several gateways.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from gasless.chain.addresses import METACHAIN, InvalidAddress, address_of, parse_address
from gasless.localnet.chain import LocalChain
from gasless.localnet.envelope import CHAIN_KEY, REQUESTS_KEY, bad_request, fail, ok
from gasless.localnet.state import Guardian

ADMIN_PREFIX = "/localnet/"
SEND_PATHS = ("/transaction/send", "/transaction/send-multiple")


@dataclass
class GatewayFaults:
    down: bool = False
    latency_ms: dict[str, int] = field(default_factory=dict)  # path prefix -> added ms; "*" for all
    jitter_ms: int = 0  # each request also waits a random 0..jitter_ms: concurrent answers come out of order
    error_rate: float = 0.0  # share of requests answered 5xx before anything is processed
    error_status: int = 500
    error_paths: list[str] = field(default_factory=list)  # path prefixes error_rate applies to; empty: all
    drop_acks: int = 0  # the next N send acknowledgements are withheld (-1: all); the tx IS accepted
    ack_hang_ms: int = 30_000
    # The sender shard's observers all failed: the proxy answers the pool by sender `{"txPool": null}`, 200
    # (mx-chain-proxy-go process/transactionProcessor.go getTxPoolForSender).
    pool_null: bool = False
    # The sender shard's full-history observers failed: a lookup with `sender` answers 404 "transaction not
    # found" whatever the transaction (GetTransactionByHashAndSenderAddress maps every error to 404).
    history_not_found: bool = False
    # The next N requests (admin calls aside) are answered 429 with `Retry-After: 0` (a rate limiter's
    # back-pressure, as the public gateway gives).
    throttle_next: int = 0
    seed: int = 0

    def latency_for(self, path: str) -> int:
        best, best_len = self.latency_ms.get("*", 0), 0
        for prefix, ms in self.latency_ms.items():
            if prefix != "*" and path.startswith(prefix) and len(prefix) > best_len:
                best, best_len = ms, len(prefix)
        return best

    def errs(self, path: str) -> bool:
        """Whether `error_rate` applies to a request for `path`."""
        return not self.error_paths or any(path.startswith(prefix) for prefix in self.error_paths)


FAULTS_KEY: web.AppKey[GatewayFaults] = web.AppKey("faults", GatewayFaults)
RNG_KEY: web.AppKey[random.Random] = web.AppKey("rng", random.Random)
INFO_KEY: web.AppKey[dict[str, Any]] = web.AppKey("info", dict)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def fault_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith(ADMIN_PREFIX):
        return await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    request.app[REQUESTS_KEY][f"{request.method} {route}"] += 1
    faults = request.app[FAULTS_KEY]
    if faults.down:
        return fail("gateway unavailable", status=503)
    if faults.throttle_next > 0:
        faults.throttle_next -= 1
        response = fail("too many requests", status=429)
        response.headers["Retry-After"] = "0"
        return response
    delay = faults.latency_for(request.path)
    if faults.jitter_ms:
        delay += request.app[RNG_KEY].randint(0, faults.jitter_ms)
    if delay:
        await asyncio.sleep(delay / 1000)
    if faults.error_rate and faults.errs(request.path) and request.app[RNG_KEY].random() < faults.error_rate:
        return fail("injected failure", status=faults.error_status)
    if faults.pool_null and request.path == "/transaction/pool" and request.query.get("by-sender"):
        return ok({"txPool": None})
    if (
        faults.history_not_found
        and request.query.get("sender")
        and request.path.startswith("/transaction/")
        and request.path.count("/") == 2
    ):
        return fail("transaction not found", status=404)
    response = await handler(request)
    if request.path in SEND_PATHS and faults.drop_acks and response.status == 200:
        if faults.drop_acks > 0:
            faults.drop_acks -= 1
        # Accepted into the pool, but the acknowledgement never arrives in time.
        await asyncio.sleep(faults.ack_hang_ms / 1000)
        return fail("acknowledgement dropped", status=504)
    return response


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception:
        raise bad_request("invalid JSON body") from None
    if not isinstance(body, dict):
        raise bad_request("expected an object")
    return body


def _pubkey(value: Any) -> bytes:
    try:
        return parse_address(value).get_public_key()
    except (InvalidAddress, TypeError):
        raise bad_request(f"invalid address: {value!r}") from None


def _amount(body: dict[str, Any], name: str) -> int:
    value = body.get(name, 0)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"{name} must be a non-negative integer")
    return value


async def info(request: web.Request) -> web.Response:
    return ok(request.app[INFO_KEY])


async def faucet(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    body = await _body(request)
    pubkey = _pubkey(body.get("address"))
    egld, usdc = _amount(body, "egldAtto"), _amount(body, "usdcMicro")
    account = chain.world.get(pubkey)
    account.balance += egld
    token = request.app[INFO_KEY]["paymentToken"]
    if usdc:
        account.esdt[token] = account.esdt.get(token, 0) + usdc
    return ok(
        {
            "address": address_of(pubkey).to_bech32(),
            "balance": str(account.balance),
            "usdcMicro": account.esdt.get(token, 0),
        }
    )


async def set_balance(request: web.Request) -> web.Response:
    """Set an account's EGLD balance exactly (a relayer drained or refilled by a test)."""
    chain = request.app[CHAIN_KEY]
    body = await _body(request)
    pubkey = _pubkey(body.get("address"))
    account = chain.world.get(pubkey)
    account.balance = _amount(body, "egldAtto")
    return ok({"address": address_of(pubkey).to_bech32(), "balance": str(account.balance)})


def _contract(chain: LocalChain, bech32: str | None) -> Any:
    if not bech32:
        return None
    account = chain.world.peek(parse_address(bech32).get_public_key())
    return account.contract if account else None


async def set_pause(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    body = await _body(request)
    meta = request.app[INFO_KEY]
    contract, venue = _contract(chain, meta.get("contract")), _contract(chain, meta.get("pair"))
    flags = body.get("contract")
    if isinstance(flags, dict) and contract is not None:
        if "paused" in flags:
            contract.set_paused(bool(flags["paused"]))
        if "depositsPaused" in flags:
            contract.set_deposits_paused(bool(flags["depositsPaused"]))
    if "venue" in body and venue is not None:
        venue.set_paused(bool(body["venue"]))
    return ok(_pause_view(contract, venue))


def _pause_view(contract: Any, venue: Any) -> dict[str, Any]:
    view: dict[str, Any] = {}
    if contract is not None:
        view["contract"] = {
            "paused": contract.state.pause.paused,
            "depositsPaused": contract.state.pause.deposits_paused,
        }
    if venue is not None:
        view["venue"] = {"paused": venue.is_paused()}
    return view


async def get_pause(request: web.Request) -> web.Response:
    chain, meta = request.app[CHAIN_KEY], request.app[INFO_KEY]
    return ok(_pause_view(_contract(chain, meta.get("contract")), _contract(chain, meta.get("pair"))))


def _faults_view(request: web.Request) -> dict[str, Any]:
    chain = request.app[CHAIN_KEY]
    return {
        "gateway": asdict(request.app[FAULTS_KEY]),
        "chain": {
            "stalledShards": sorted(chain.faults.stalled_shards),
            "clockOffsetMs": chain.faults.clock_offset_ms,
        },
    }


async def get_faults(request: web.Request) -> web.Response:
    return ok(_faults_view(request))


async def set_faults(request: web.Request) -> web.Response:
    body = await _body(request)
    chain, faults = request.app[CHAIN_KEY], request.app[FAULTS_KEY]
    gateway = body.get("gateway", {})
    try:
        if "down" in gateway:
            faults.down = bool(gateway["down"])
        if "latencyMs" in gateway:
            faults.latency_ms = {str(k): int(v) for k, v in dict(gateway["latencyMs"]).items()}
        if "jitterMs" in gateway:
            faults.jitter_ms = max(0, int(gateway["jitterMs"]))
        if "errorRate" in gateway:
            faults.error_rate = min(1.0, max(0.0, float(gateway["errorRate"])))
        if "errorStatus" in gateway:
            faults.error_status = int(gateway["errorStatus"])
        if "errorPaths" in gateway:
            faults.error_paths = [str(prefix) for prefix in gateway["errorPaths"]]
        if "dropAcks" in gateway:
            faults.drop_acks = int(gateway["dropAcks"])
        if "ackHangMs" in gateway:
            faults.ack_hang_ms = int(gateway["ackHangMs"])
        if "poolNull" in gateway:
            faults.pool_null = bool(gateway["poolNull"])
        if "historyNotFound" in gateway:
            faults.history_not_found = bool(gateway["historyNotFound"])
        if "throttleNext" in gateway:
            faults.throttle_next = max(0, int(gateway["throttleNext"]))
        if "seed" in gateway:
            faults.seed = int(gateway["seed"])
            request.app[RNG_KEY].seed(faults.seed)
        chain_faults = body.get("chain", {})
        if "stalledShards" in chain_faults:
            shards = {int(s) for s in chain_faults["stalledShards"]}
            if not shards <= set(range(chain.config.num_shards)) | {METACHAIN}:
                return fail("unknown shard")
            chain.faults.stalled_shards = shards
        if "clockOffsetMs" in chain_faults:
            chain.faults.clock_offset_ms = int(chain_faults["clockOffsetMs"])
    except (TypeError, ValueError) as exc:
        return fail(f"invalid fault settings: {exc}")
    return ok(_faults_view(request))


async def clear_faults(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    request.app[FAULTS_KEY].__init__()  # type: ignore[misc]
    chain.faults.stalled_shards.clear()
    chain.faults.clock_offset_ms = 0
    return ok(_faults_view(request))


async def set_guardian(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    body = await _body(request)
    pubkey = _pubkey(body.get("address"))
    account = chain.world.get(pubkey)
    if body.get("guardian") in (None, ""):
        account.guardian = None
    else:
        epoch = body.get("activationEpoch", chain.epoch)
        account.guardian = Guardian(
            _pubkey(body["guardian"]), int(epoch), str(body.get("serviceUID", "localnet"))
        )
    return ok({"address": address_of(pubkey).to_bech32(), "guarded": account.guardian is not None})


async def snapshot(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    accounts = {}
    for pubkey, account in chain.world.accounts.items():
        entry: dict[str, Any] = {
            "nonce": account.nonce,
            "balance": str(account.balance),
            "shard": account.shard,
            "esdt": {k: str(v) for k, v in account.esdt.items() if v},
        }
        if account.guardian is not None:
            entry["guardian"] = address_of(account.guardian.address).to_bech32()
        if account.contract is not None:
            entry["contract"] = {"name": account.contract.name, "state": account.contract.snapshot()}
        accounts[address_of(pubkey).to_bech32()] = entry
    return ok(
        {
            "round": chain.round,
            "epoch": chain.epoch,
            "shards": {
                str(s): {"nonce": b[-1].nonce, "pool": sum(len(chain.pool[p]) for p in chain.pool_senders[s])}
                for s, b in chain.blocks.items()
            },
            "metachain": {
                "nonce": chain.hyperblocks[-1].nonce,
                "highestFinalNonce": chain.highest_final_hyper(),
            },
            "accounts": accounts,
            "transactions": len(chain.records),
        }
    )


async def submissions(request: web.Request) -> web.Response:
    """How many times a transaction was sent to this network (every gateway, accepted or not)."""
    tx_hash = request.match_info["tx_hash"].lower()
    return ok({"txHash": tx_hash, "submissions": request.app[CHAIN_KEY].submissions.get(tx_hash, 0)})


async def requests_counted(request: web.Request) -> web.Response:
    """The requests this gateway received since it started, by method and route (admin calls not counted)."""
    return ok({"requests": dict(sorted(request.app[REQUESTS_KEY].items()))})


async def produce_rounds(request: web.Request) -> web.Response:
    chain = request.app[CHAIN_KEY]
    body = await _body(request)
    count = _amount(body, "count") or 1
    for _ in range(min(count, 1_000)):
        chain.produce_round()
    return ok({"round": chain.round})


def add_admin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/localnet/info", info)
    r.add_post("/localnet/faucet", faucet)
    r.add_post("/localnet/balance", set_balance)
    r.add_get("/localnet/pause", get_pause)
    r.add_post("/localnet/pause", set_pause)
    r.add_get("/localnet/faults", get_faults)
    r.add_post("/localnet/faults", set_faults)
    r.add_delete("/localnet/faults", clear_faults)
    r.add_post("/localnet/guardian", set_guardian)
    r.add_get("/localnet/snapshot", snapshot)
    r.add_get("/localnet/submissions/{tx_hash}", submissions)
    r.add_post("/localnet/rounds", produce_rounds)
    r.add_get("/localnet/requests", requests_counted)
