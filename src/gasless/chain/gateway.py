"""A client for the MultiversX gateway (proxy) REST API over several gateways.

Reads fail over: one gateway being down, slow or answering 5xx must not stall the service, so a read starts at
the gateway that answered last and moves on to the others; a gateway that just failed is tried after the
healthy ones for a while (`COOL_DOWN_MS`). A node's answer (a 4xx, or a 5xx whose envelope carries a node
message such as `transaction not found`) is final and is never retried elsewhere: another gateway onto the
same network would say the same. A 429 is back-pressure, not an outage: when every gateway was throttled
or failed, a read waits as the gateway's `Retry-After` asks (within `THROTTLE_WAIT_MS`) and tries again.

Sends are different: a transaction is broadcast to every gateway at once (the hash is the same everywhere,
so duplicates are harmless), and the caller gets the first acknowledgement as soon as any gateway gives it.
Each gateway has up to four send requests in flight; the sends that arrive while four are out leave
together, in one `send-multiple`, when one ends (as do sends asked for in the same turn of the loop). At
low load a send leaves at once; under load a relay costs a fraction of a request (a request's CPU is mostly
the kernel's TCP, on both ends: docs/performance.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gasless.chain.addresses import METACHAIN

SEND_PATH = "/transaction/send"
SEND_MULTIPLE_PATH = "/transaction/send-multiple"
MAX_SEND_BATCH = 100  # transactions in one send-multiple
# Send requests to one gateway at once before later sends wait and go together: one made a send wait a
# gateway's answer at moderate load (addedMs p50 7 -> 15-32 ms at 130 relays/s, docs/performance.md).
SENDS_IN_FLIGHT = 4
# ... and more only while a full batch is waiting (a slow gateway must not hold a growing queue).
MAX_SENDS_IN_FLIGHT = 8

# 5xx answers whose text comes from the node (proxy `api/errors`, node `transactionAPI`): final answers.
_NODE_MESSAGE_MARKERS = (
    "not found",
    "transaction generation failed",
    "cannot be retrieved",
    "executequery",
)
# ... unless the text is about the gateway's own plumbing (no observer, proxying failed): try another one.
_INFRA_MARKERS = ("observer", "sending request error", "gateway", "timeout", "unavailable")
# 4xx statuses that speak about the gateway (rate limits, its own timeouts), not about the request.
_RETRYABLE_4XX = frozenset({408, 425, 429})
COOL_DOWN_MS = 5_000  # a gateway that failed a read is tried after the healthy ones for this long
THROTTLE_WAIT_MS = 1_500  # the longest a read waits, in total, for throttled gateways (429) to take it
DEFAULT_RETRY_AFTER_MS = 250  # a 429 without a usable Retry-After
MIN_THROTTLE_WAIT_MS = 50  # even `Retry-After: 0` waits this long, so the budget bounds the tries


class LatestFirstConnector(aiohttp.TCPConnector):
    """aiohttp's connector, handing out the connection returned last. aiohttp takes the one returned
    first, so a steady load rotates through every connection a slow spell opened and none stays idle for
    the keep-alive timeout (15 s) that closes it: the soak's hosts held 14-21 gateway connections each,
    rising at slow spells and never falling. Latest first, what the load does not need is left idle and
    aiohttp's own clean-up closes it."""

    def _release(self, key: Any, protocol: Any, *, should_close: bool = False) -> None:
        super()._release(key, protocol, should_close=should_close)
        conns = self._conns.get(key)
        if conns and conns[-1][0] is protocol:
            conns.rotate(1)  # appended at the right, taken from the left: move it to the left


def gateway_session() -> aiohttp.ClientSession:
    """The host's HTTP session for its gateways (LatestFirstConnector, aiohttp's other defaults)."""
    return aiohttp.ClientSession(connector=LatestFirstConnector())


class GatewayUnavailable(Exception):
    """No gateway gave an answer (all down, 5xx, timed out or answered with something not an envelope)."""


class GatewayRejected(Exception):
    """A gateway answered with an error envelope: the node's verdict, the same on every gateway."""

    def __init__(self, message: str, status: int | None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.url = url


@dataclass(frozen=True)
class SendResult:
    url: str
    tx_hash: str | None
    error: str | None
    status: int | None  # HTTP status; None when no HTTP answer came (connection error, timeout)
    elapsed_ms: float

    @property
    def ok(self) -> bool:
        return self.tx_hash is not None


@dataclass(frozen=True)
class Broadcast:
    """One transaction on its way to every gateway."""

    first_ack: asyncio.Future[SendResult]  # first success; else the last failure; never an exception
    results: asyncio.Task[list[SendResult]]  # every send, in the order of `GatewayClient.urls`


@dataclass(frozen=True)
class _PendingSend:
    wire: Mapping[str, Any]
    result: asyncio.Future[SendResult]
    queued_at: float  # perf_counter() when the caller asked: elapsed_ms counts the wait too
    expected_hash: str | None = None  # the hash the caller computed, to match send-multiple's answer


@dataclass(frozen=True)
class _Answer:
    """One gateway's HTTP answer, classified."""

    kind: str  # "ok" | "rejected" | "retry"
    data: Any = None
    message: str = ""
    status: int | None = None
    retry_after_ms: int | None = None  # a 429's Retry-After


def _retry_after_ms(value: str | None) -> int:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        seconds = None
    if seconds is None or seconds < 0:
        return DEFAULT_RETRY_AFTER_MS
    return int(seconds * 1000)


def _resolve(pending: _PendingSend, result: SendResult) -> None:
    if not pending.result.done():  # the caller may have given up (cancelled) meanwhile
        pending.result.set_result(result)


def _fail_all(batch: Sequence[_PendingSend], url: str, message: str, status: int | None = None) -> None:
    now = time.perf_counter()
    for p in batch:
        _resolve(p, SendResult(url, None, message, status, (now - p.queued_at) * 1000))


def _is_node_message(message: str) -> bool:
    text = message.lower()
    if any(marker in text for marker in _INFRA_MARKERS):
        return False
    return any(marker in text for marker in _NODE_MESSAGE_MARKERS)


def _classify(status: int, raw: bytes) -> _Answer:
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        envelope = None
    if (
        not isinstance(envelope, dict)
        or "data" not in envelope
        or not ("error" in envelope or "code" in envelope)
    ):
        # A load balancer's HTML page, a truncated body: not the gateway speaking.
        return _Answer("retry", message=f"HTTP {status}: not a gateway envelope", status=status)
    error = envelope.get("error") or ""
    error = error if isinstance(error, str) else str(error)
    if status == 200 and not error:
        return _Answer("ok", data=envelope.get("data"), status=status)
    message = error or f"HTTP {status}: {envelope.get('code') or 'error'}"
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        return _Answer("rejected", message=message, status=status)
    if status == 200 or (status == 500 and _is_node_message(message)):
        return _Answer("rejected", message=message, status=status)
    return _Answer("retry", message=message, status=status)


class GatewayClient:
    """Gateway reads with failover and sends broadcast to all gateways, on a caller-owned aiohttp session."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Sequence[str],
        *,
        timeout_ms: int = 2000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("at least one gateway URL is required")
        self.urls: tuple[str, ...] = tuple(u.rstrip("/") for u in urls)
        self.timeout_ms = timeout_ms
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self._preferred = 0  # index of the gateway that answered last: reads start there
        self._clock = clock  # seconds, for the cool-down (a test steps it instead of waiting 5 s)
        self._cooling: dict[str, float] = {}  # gateway -> clock time until which it is tried last
        self._queues: dict[str, list[_PendingSend]] = {}  # sends waiting for their gateway, by URL
        self._runners: dict[str, set[asyncio.Task[None]]] = {}  # requests under way, by URL
        self._closed = False
        # Called with (gateway URL, kind) for every answer that is not the node speaking (metrics).
        self.on_failure: Callable[[str, str], None] | None = None

    @property
    def preferred_url(self) -> str:
        return self.urls[self._preferred]

    # Raw requests ---------------------------------------------------------------------------------------
    async def _request(
        self, method: str, url: str, path: str, params: Mapping[str, str] | None, body: Any
    ) -> _Answer:
        try:
            async with self._session.request(
                method,
                url + path,
                params=dict(params) if params else None,
                json=body if method == "POST" else None,
                timeout=self._timeout,
            ) as response:
                raw = await response.read()
                answer = _classify(response.status, raw)
                if response.status == 429 and answer.kind == "retry":
                    answer = _Answer(
                        "retry",
                        message=answer.message,
                        status=429,
                        retry_after_ms=_retry_after_ms(response.headers.get("Retry-After")),
                    )
        except TimeoutError:
            self._failed(url, "timeout")
            return _Answer("retry", message=f"timed out after {self.timeout_ms} ms")
        except aiohttp.ClientError as exc:
            self._failed(url, "connection")
            return _Answer("retry", message=f"{type(exc).__name__}: {exc}")
        if answer.kind == "retry":
            status = answer.status or 0
            self._failed(
                url,
                "throttled" if status in _RETRYABLE_4XX else "http_5xx" if status >= 500 else "bad_answer",
            )
        return answer

    def _failed(self, url: str, kind: str) -> None:
        if self.on_failure is not None:
            self.on_failure(url, kind)

    def _order(self) -> list[int]:
        """Gateways in the order a read tries them: from the one that answered last, cooling ones last."""
        count = len(self.urls)
        order = [(self._preferred + step) % count for step in range(count)]
        if self._cooling:
            now = self._clock()
            for url, until in list(self._cooling.items()):
                if until <= now:
                    del self._cooling[url]
            order.sort(key=lambda index: self.urls[index] in self._cooling)  # stable: healthy ones first
        return order

    def cooling(self) -> tuple[str, ...]:
        """Gateways that failed a read within `COOL_DOWN_MS`, which reads try after the others. Not shown by
        /readyz or the metrics: failures are counted through `on_failure`."""
        now = self._clock()
        return tuple(url for url, until in self._cooling.items() if until > now)

    async def _call(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: Any,
        usable: Callable[[Any], bool] | None = None,
    ) -> Any:
        if not path.startswith("/"):
            path = "/" + path
        failures: list[str] = []
        waited_ms = 0
        order = self._order()
        while True:
            throttled: list[tuple[int, int]] = []  # (index, Retry-After ms) of the gateways that said 429
            for index in order:
                url = self.urls[index]
                answer = await self._request(method, url, path, params, body)
                if answer.kind == "ok" and usable is not None and not usable(answer.data):
                    # A 200 that says the gateway could not ask its observers (`{"txPool": null}`).
                    answer = _Answer("retry", message="an answer without the data asked for", status=200)
                    self._failed(url, "bad_answer")
                if answer.kind == "retry":
                    failures.append(f"{url}: {answer.message}")
                    if answer.retry_after_ms is not None:
                        throttled.append((index, answer.retry_after_ms))
                    else:
                        self._cooling[url] = self._clock() + COOL_DOWN_MS / 1000
                    continue
                self._preferred = index  # it answered (even a rejection is an answer): start there next time
                self._cooling.pop(url, None)
                if answer.kind == "rejected":
                    raise GatewayRejected(answer.message, answer.status, url)
                return answer.data
            # Throttled gateways are busy, not down: wait as they ask, within the budget, and ask them again.
            wait_ms = min((max(MIN_THROTTLE_WAIT_MS, ms) for _, ms in throttled), default=None)
            if wait_ms is None or waited_ms + wait_ms > THROTTLE_WAIT_MS:
                break
            await asyncio.sleep(wait_ms / 1000)
            waited_ms += wait_ms
            order = [index for index, _ in throttled]
        raise GatewayUnavailable(f"{method} {path}: no gateway answered ({'; '.join(failures)})")

    async def get(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        usable: Callable[[Any], bool] | None = None,
    ) -> Any:
        """The envelope's `data` of a GET, failing over across gateways (and past answers `usable` refuses)."""
        return await self._call("GET", path, params, None, usable)

    async def post(self, path: str, body: Any, *, params: Mapping[str, str] | None = None) -> Any:
        """The envelope's `data` of a POST that changes nothing (simulate, cost, VM query), with failover."""
        if path.rstrip("/").split("?")[0] in (SEND_PATH, SEND_PATH + "-multiple"):
            # A send must reach every gateway at once, not one after another on failure: use broadcast().
            raise ValueError("use broadcast() for /transaction/send")
        return await self._call("POST", path, params, body)

    # Broadcast ------------------------------------------------------------------------------------------
    async def _send(self, url: str, wire: Mapping[str, Any], started: float | None = None) -> SendResult:
        started = time.perf_counter() if started is None else started
        answer = await self._request("POST", url, SEND_PATH, None, dict(wire))
        elapsed = (time.perf_counter() - started) * 1000
        if answer.kind == "ok":
            tx_hash = answer.data.get("txHash") if isinstance(answer.data, dict) else None
            if isinstance(tx_hash, str) and tx_hash:
                return SendResult(url, tx_hash, None, answer.status, elapsed)
            return SendResult(url, None, "acknowledgement without txHash", answer.status, elapsed)
        return SendResult(url, None, answer.message, answer.status, elapsed)

    def _submit(
        self, url: str, wire: Mapping[str, Any], expected_hash: str | None = None
    ) -> asyncio.Future[SendResult]:
        """Queue one send to one gateway; its future always gets a SendResult (failures included)."""
        pending = _PendingSend(
            wire, asyncio.get_running_loop().create_future(), time.perf_counter(), expected_hash
        )
        if self._closed:
            _fail_all([pending], url, "gateway client closed")
            return pending.result
        queue = self._queues.setdefault(url, [])
        queue.append(pending)
        running = self._runners.setdefault(url, set())
        # done(), not membership: a runner that just emptied the queue is done before its callback runs.
        active = sum(1 for task in running if not task.done())
        if active < SENDS_IN_FLIGHT or (active < MAX_SENDS_IN_FLIGHT and len(queue) >= MAX_SEND_BATCH):
            task = asyncio.get_running_loop().create_task(self._run_sends(url), name="gateway-sends")
            running.add(task)
            task.add_done_callback(running.discard)
        return pending.result

    async def _run_sends(self, url: str) -> None:
        """Send what waits for `url`, a batch at a time, until nothing does."""
        queue = self._queues[url]
        while queue:
            batch, queue[:MAX_SEND_BATCH] = queue[:MAX_SEND_BATCH], []
            try:
                await self._send_batch(url, batch)
            except BaseException as exc:  # cancelled (client closed) or a bug: nobody may wait for good
                _fail_all(batch, url, f"{type(exc).__name__}: send abandoned")
                raise

    async def _send_batch(self, url: str, batch: list[_PendingSend]) -> None:
        if len(batch) == 1:
            _resolve(batch[0], await self._send(url, batch[0].wire, batch[0].queued_at))
            return
        answer = await self._request("POST", url, SEND_MULTIPLE_PATH, None, [dict(p.wire) for p in batch])
        if answer.kind == "retry":  # the gateway did not answer: as a failed single send would report
            _fail_all(batch, url, answer.message, answer.status)
            return
        hashes = (
            answer.data.get("txsHashes") if answer.kind == "ok" and isinstance(answer.data, dict) else None
        )
        hashes = hashes if isinstance(hashes, dict) else {}
        # `txsHashes` is keyed by position among the transactions that passed the proxy's own field checks,
        # not by position in the request (mx-chain-proxy-go process/transactionProcessor.go
        # SendMultipleTransactions): a refused one shifts the keys after it. A send is acknowledged by its
        # own hash where the caller gave it; by position only when nothing was left out.
        sent = {value for value in hashes.values() if isinstance(value, str) and value}
        by_position = len(hashes) == len(batch)
        left: list[_PendingSend] = []
        now = time.perf_counter()
        for index, p in enumerate(batch):
            if p.expected_hash is not None:
                tx_hash = p.expected_hash if p.expected_hash in sent else None
            else:
                tx_hash = hashes.get(str(index)) if by_position else None
            if isinstance(tx_hash, str) and tx_hash:
                _resolve(p, SendResult(url, tx_hash, None, answer.status, (now - p.queued_at) * 1000))
            else:
                left.append(p)
        # The gateway skips a transaction it refuses without saying why: sent alone, the node says why.
        if left:
            results = await asyncio.gather(*(self._send(url, p.wire, p.queued_at) for p in left))
            for p, result in zip(left, results, strict=True):
                _resolve(p, result)

    async def aclose(self) -> None:
        """Stop sending: sends under way, waiting or asked for later resolve as failures (the next start
        re-sends what no gateway acknowledged)."""
        self._closed = True
        runners = [task for running in self._runners.values() for task in running]
        for task in runners:
            task.cancel()
        if runners:
            await asyncio.gather(*runners, return_exceptions=True)
        for url, queue in self._queues.items():
            _fail_all(queue, url, "gateway client closed")
            queue.clear()

    def broadcast(self, wire: Mapping[str, Any], tx_hash: str | None = None) -> Broadcast:
        """POST /transaction/send to every gateway concurrently; never raises (must run inside a loop).
        `tx_hash`, the transaction's own hash, matches it in a send-multiple answer."""
        loop = asyncio.get_running_loop()
        first_ack: asyncio.Future[SendResult] = loop.create_future()
        failures: list[SendResult] = []

        async def one(url: str) -> SendResult:
            started = time.perf_counter()
            try:
                result = await self._submit(url, wire, tx_hash)
            except Exception as exc:  # noqa: BLE001 - a broadcast reports failures, it never raises them
                elapsed = (time.perf_counter() - started) * 1000
                result = SendResult(url, None, f"{type(exc).__name__}: {exc}", None, elapsed)
            if result.ok:
                if not first_ack.done():
                    first_ack.set_result(result)
            else:
                failures.append(result)  # in completion order: the last one is the fallback answer
            return result

        async def every() -> list[SendResult]:
            sends = [asyncio.ensure_future(one(url)) for url in self.urls]
            try:
                results = list(await asyncio.gather(*sends))
            except asyncio.CancelledError:
                for send in sends:
                    send.cancel()
                if not first_ack.done():
                    first_ack.cancel()  # nobody will ever answer: do not leave awaiters hanging
                raise
            if not first_ack.done():
                first_ack.set_result(failures[-1] if failures else results[-1])
            return results

        return Broadcast(first_ack, loop.create_task(every(), name="gateway-broadcast"))

    # Typed helpers --------------------------------------------------------------------------------------
    async def network_config(self) -> dict[str, Any]:
        return (await self.get("/network/config"))["config"]

    async def network_status(self, shard: int) -> dict[str, Any]:
        return (await self.get(f"/network/status/{shard}"))["status"]

    async def meta_status(self) -> dict[str, Any]:
        return await self.network_status(METACHAIN)

    async def account(self, bech32: str) -> dict[str, Any]:
        account, _ = await self.account_at_block(bech32)
        return account

    async def account_at_block(self, bech32: str) -> tuple[dict[str, Any], int | None]:
        """The account and the nonce of the block its state is from (`blockInfo`; None if not given)."""
        data = await self.get(f"/address/{bech32}")
        block = (data.get("blockInfo") or {}).get("nonce")
        return data["account"], int(block) if block is not None else None

    async def esdt_balance(self, bech32: str, token: str) -> int:
        data = await self.get(f"/address/{bech32}/esdt/{token}")
        return int(((data or {}).get("tokenData") or {}).get("balance") or 0)

    async def guardian_data(self, bech32: str) -> dict[str, Any]:
        return (await self.get(f"/address/{bech32}/guardian-data"))["guardianData"]

    async def pool_for_sender(
        self, bech32: str, fields: str = "hash,nonce,gasprice,relayer"
    ) -> list[dict[str, Any]]:
        """The sender's pending transactions. `{"txPool": null}` (200) means the proxy's observers of that
        shard all failed: not an empty pool, so another gateway is asked, else GatewayUnavailable."""
        data = await self.get(
            "/transaction/pool",
            {"by-sender": bech32, "fields": fields},
            usable=lambda d: isinstance(d, dict) and isinstance(d.get("txPool"), dict),
        )
        return [entry.get("txFields") or {} for entry in data["txPool"].get("transactions") or []]

    async def transaction(self, tx_hash: str, *, sender: str | None = None) -> dict[str, Any] | None:
        """The transaction with its results, or None when the node does not know the hash."""
        params = {"withResults": "true"}
        if sender:
            params["sender"] = sender  # lets the proxy ask the sender's shard directly
        try:
            data = await self.get(f"/transaction/{tx_hash}", params)
        except GatewayRejected as exc:
            if "transaction not found" in exc.message.lower():
                return None
            raise
        return data["transaction"]

    async def process_status(self, tx_hash: str) -> tuple[str, str | None]:
        """(status, reason) of `/transaction/{h}/process-status`: `success`, `fail`, `pending` or `unknown`
        (the proxy could not tell); None reason when it gives none. GatewayRejected when it is not known."""
        data = await self.get(f"/transaction/{tx_hash}/process-status")
        status = data.get("status") if isinstance(data, dict) else None
        reason = data.get("reason") if isinstance(data, dict) else None
        return (str(status) if status else "unknown"), (str(reason) if reason else None)

    async def simulate(self, wire: Mapping[str, Any], *, check_signature: bool = False) -> dict[str, Any]:
        params = None if check_signature else {"checkSignature": "false"}
        data = await self.post("/transaction/simulate", dict(wire), params=params)
        return data.get("result") if isinstance(data, dict) else None  # type: ignore[no-any-return]

    async def cost(self, wire: Mapping[str, Any]) -> dict[str, Any]:
        return await self.post("/transaction/cost", dict(wire))

    async def vm_query(
        self, sc_address: str, func: str, args: Sequence[bytes] = (), caller: str | None = None
    ) -> list[bytes]:
        """A view function's return data; GatewayRejected(returnMessage) when the VM did not return ok."""
        body: dict[str, Any] = {"scAddress": sc_address, "funcName": func, "args": [a.hex() for a in args]}
        if caller:
            body["caller"] = caller
        output = (await self.post("/vm-values/query", body))["data"]
        code = output.get("returnCode")
        if code != "ok":
            raise GatewayRejected(output.get("returnMessage") or str(code), 200)
        return [base64.b64decode(part) if part else b"" for part in output.get("returnData") or []]

    async def block_by_nonce(self, shard: int, nonce: int) -> dict[str, Any]:
        return (await self.get(f"/block/{shard}/by-nonce/{nonce}"))["block"]

    async def block_by_hash(self, shard: int, block_hash: str) -> dict[str, Any] | None:
        """The block, or None when that shard's nodes do not have it. The proxy answers an unknown block
        `500 sending request error, getting block failed: ...` (docs/chain.md): that text is the node's
        verdict, not an outage; GatewayUnavailable for anything else that is not an answer."""
        try:
            return (await self.get(f"/block/{shard}/by-hash/{block_hash}"))["block"]  # type: ignore[no-any-return]
        except GatewayRejected:
            return None
        except GatewayUnavailable as exc:
            text = str(exc).lower()
            if "getting block failed" in text or "block not found" in text:
                return None
            raise
