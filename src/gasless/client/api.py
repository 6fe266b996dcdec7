"""`RelayClient`: the service's relay routes over aiohttp (assign, relay, read, follow, the whole flow).

Every error answer is raised as a `RelayProblem`; a 200/202 relay answer is a `RelayResult`. The flow with
the catalogue's retry semantics is `send` (see `gasless.client.flow`), following an intent is `follow`
(see `gasless.client.follow`).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
from multiversx_sdk import Transaction

from gasless.client.build import TxBuilder, tx_wire
from gasless.client.flow import SendResult, send_flow
from gasless.client.follow import follow_intent
from gasless.client.keys import TxSigner, presence_proof
from gasless.client.problems import RelayProblem
from gasless.client.results import RelayResult

DEFAULT_TIMEOUT_S = 30.0
_RETRYABLE_ASSIGN_ATTEMPTS = 3


class RelayClient:
    """An integrator's client of one relay API (`base_url` such as `http://127.0.0.1:8080`)."""

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        chain_id: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._owns_session = session is None
        self._chain_id = chain_id
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock_offset_ms = 0  # server clock minus ours, learnt from ASSIGN_PROOF_* answers

    # Session ----------------------------------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    async def __aenter__(self) -> RelayClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # HTTP -------------------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One request; the status, the decoded body and the headers; a RelayProblem for >= 400."""
        async with self.session.request(
            method, self.url(path), json=json, headers=dict(headers or {}), timeout=self.timeout
        ) as response:
            text = await response.text()
            try:
                body: Any = jsonlib.loads(text) if text else None
            except ValueError:
                body = text
            if response.status >= 400:
                raise RelayProblem.from_response(response.status, body, response.headers)
            return response.status, body, response.headers

    # Meta -------------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        _, body, _ = await self.request("GET", "/healthz")
        return dict(body)

    async def network_chain_id(self) -> str:
        """The chain id this host serves (`chain_id=` when given, else `GET /healthz`)."""
        if self._chain_id is None:
            self._chain_id = str((await self.health())["chainId"])
        return self._chain_id

    def server_now_ms(self) -> int:
        return int(time.time() * 1000) + self.clock_offset_ms

    # Assign -----------------------------------------------------------------------------------------
    async def assign(
        self,
        signer: TxSigner,
        *,
        renew_for: Transaction | Mapping[str, Any] | None = None,
        cancel: int | None = None,
        kind: str = "key",
        bearer: str | None = None,
        with_next_nonce: bool = False,
    ) -> dict[str, Any]:
        """`POST /v1/relay/assign` with a presence proof (or a native-auth `bearer` token); with
        `with_next_nonce`, the answer's `nextNonce` is the sender's next usable nonce.

        On `ASSIGN_PROOF_INVALID` the proof is made once more at `details.serverTimeMs` (a skewed clock);
        retryable answers (`RATE_LIMITED`, `NO_RELAYER_AVAILABLE`, ...) are retried after their delay.
        """
        chain_id = await self.network_chain_id()
        body: dict[str, Any] = {"sender": signer.address}
        if renew_for is not None:
            body["renewFor"] = tx_wire(renew_for) if isinstance(renew_for, Transaction) else dict(renew_for)
        if cancel is not None:
            body["cancel"] = cancel
        if with_next_nonce:
            body["withNextNonce"] = True
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        server_time: int | None = None
        skew_retried = False
        attempts = 0
        while True:
            attempts += 1
            if not bearer:
                at_ms = server_time if server_time is not None else self.server_now_ms()
                body["proof"] = presence_proof(signer, signer.address, chain_id, at_ms, kind=kind)
            try:
                _, answer, _ = await self.request("POST", "/v1/relay/assign", json=body, headers=headers)
                return dict(answer)
            except RelayProblem as problem:
                served = problem.details.get("serverTimeMs")
                if (
                    problem.code == "ASSIGN_PROOF_INVALID"
                    and not skew_retried
                    and not bearer
                    and isinstance(served, int)
                ):
                    skew_retried = True
                    server_time = served
                    self.clock_offset_ms = served - int(time.time() * 1000)
                    continue
                if problem.retryable and attempts < _RETRYABLE_ASSIGN_ATTEMPTS:
                    await asyncio.sleep(min(problem.retry_after_s or 0.5 * attempts, 10.0))
                    server_time = None
                    continue
                raise

    # Relay ------------------------------------------------------------------------------------------
    async def relay(
        self,
        tx: Transaction | Mapping[str, Any],
        lease: str,
        *,
        intent_key: str | None = None,
        api_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> RelayResult:
        """`POST /v1/relay` of one signed transaction; a RelayProblem when refused (nothing was sent)."""
        body: dict[str, Any] = {
            "tx": tx_wire(tx) if isinstance(tx, Transaction) else dict(tx),
            "lease": lease,
        }
        if intent_key is not None:
            body["intentKey"] = intent_key
        headers: dict[str, str] = {}
        if api_key is not None:
            headers["X-Api-Key"] = api_key
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        status, answer, response_headers = await self.request("POST", "/v1/relay", json=body, headers=headers)
        return RelayResult(status, dict(answer), response_headers.get("Relay-Request-Id"))

    async def validate(
        self, tx: Transaction | Mapping[str, Any], lease: str | None = None, *, intent_key: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"tx": tx_wire(tx) if isinstance(tx, Transaction) else dict(tx)}
        if lease is not None:
            body["lease"] = lease
        if intent_key is not None:
            body["intentKey"] = intent_key
        _, answer, _ = await self.request("POST", "/v1/validate", json=body)
        return dict(answer)

    async def quote(self, tx: Transaction | Mapping[str, Any]) -> dict[str, Any]:
        body = {"tx": tx_wire(tx) if isinstance(tx, Transaction) else dict(tx)}
        _, answer, _ = await self.request("POST", "/v1/quote", json=body)
        return dict(answer)

    # Read and follow --------------------------------------------------------------------------------
    async def intent(self, ident: str) -> dict[str, Any]:
        """`GET /v1/relay/{id}`: the Intent of `<sender>:<nonce>` or a transaction hash."""
        _, body, _ = await self.request("GET", f"/v1/relay/{quote(ident, safe=':')}")
        return dict(body)

    def follow(
        self,
        ident: str,
        *,
        poll_interval_s: float = 1.0,
        stream_lifetime_s: float = 120.0,
        timeout_s: float | None = None,
        max_reconnects: int = 5,
    ) -> AsyncIterator[dict[str, Any]]:
        """Each new state of intent `ident` until one with `final: true` (see `gasless.client.follow`)."""
        return follow_intent(
            self,
            ident,
            poll_interval_s=poll_interval_s,
            stream_lifetime_s=stream_lifetime_s,
            timeout_s=timeout_s,
            max_reconnects=max_reconnects,
        )

    # The whole flow ---------------------------------------------------------------------------------
    async def send(
        self,
        signer: TxSigner,
        builder: TxBuilder,
        *,
        assignment: Mapping[str, Any] | None = None,
        intent_key: str | None = None,
        api_key: str | None = None,
        kind: str = "key",
        max_attempts: int = 6,
        max_wait_s: float = 30.0,
    ) -> SendResult:
        """Assign, build, sign once, relay, recovering as the catalogue says (see `gasless.client.flow`)."""
        return await send_flow(
            self,
            signer,
            builder,
            assignment=assignment,
            intent_key=intent_key,
            api_key=api_key,
            kind=kind,
            max_attempts=max_attempts,
            max_wait_s=max_wait_s,
        )


async def gateway_nonce(
    gateway_url: str, address: str, *, session: aiohttp.ClientSession | None = None
) -> int:
    """The account nonce from a gateway's `GET /address/{addr}/nonce`."""
    own = session is None
    http = session or aiohttp.ClientSession()
    try:
        url = f"{gateway_url.rstrip('/')}/address/{address}/nonce"
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)) as response:
            body = await response.json(content_type=None)
        if response.status != 200 or not isinstance(body, dict) or body.get("error"):
            raise RuntimeError(f"gateway {gateway_url} did not give the nonce: {body!r}")
        return int(body["data"]["nonce"])
    finally:
        if own:
            await http.close()
