"""Delivery of queued webhook events: the worker every host runs, one attempt per claim.

Each attempt: claim the row (a lease of timeout + margin), check the URL again, resolve through the
guarded resolver (only vetted addresses are connected to), POST the event body signed with every secret in
use, never follow a redirect, and record status, response code and latency. A 2xx is success; anything
else is retried on the backoff schedule until `max_attempts`, then the delivery is `failed`.

Headers: `Gasless-Signature`, `Gasless-Event-Id` (stable across attempts: receivers dedupe on it),
`Gasless-Event-Type`, `Gasless-Delivery-Id`, `Gasless-Attempt` (the attempt number; one attempt id is sent
at most once). Delivery is at least once: a host that dies after the receiver answered but before the
outcome was written leaves the row to be attempted again (same event id, next attempt number).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import structlog

from gasless.core.workers import cancel_and_wait, wait_event
from gasless.webhooks.repository import DeliveryRow, WebhookRepository
from gasless.webhooks.service import LOG_RETENTION_MS, WebhookService
from gasless.webhooks.signing import SIGNATURE_HEADER, signature_header
from gasless.webhooks.ssrf import HTTPS_PORT, GuardedResolver, TargetRefused, UrlRefused

log = structlog.get_logger("gasless.webhooks.delivery")

CLAIM_BATCH = 16
LEASE_MARGIN_MS = 5_000
USER_AGENT = "gasless-webhooks/1"


def body_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


class Dispatcher:
    """Sends deliveries; `run` is the background worker (every host runs one; claims keep them apart)."""

    def __init__(
        self,
        service: WebhookService,
        repo: WebhookRepository,
        *,
        worker_id: str,
        timeout_ms: int,
        backoff_ms: Sequence[int],
        poll_ms: int,
    ) -> None:
        self.service = service
        self.repo = repo
        self.worker_id = worker_id
        self.timeout_ms = timeout_ms
        self.backoff_ms = list(backoff_ms)
        self.poll_ms = poll_ms
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[Any]] = set()

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = GuardedResolver(
                self.service.policy, lambda _host, port: "https" if port == HTTPS_PORT else "http"
            )
            # No DNS cache: every new connection resolves (and is vetted) again. No env proxies.
            connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, limit=64)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhook-deliveries")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            try:
                claimed = await self.repo.claim_due(
                    worker=self.worker_id,
                    now_ms=self.service.clock(),
                    lease_ms=self.timeout_ms + LEASE_MARGIN_MS,
                    limit=CLAIM_BATCH,
                )
                for row in claimed:
                    task = asyncio.create_task(self.attempt(row))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database hiccup: try again next round
                log.warning("webhook claim failed", error=type(exc).__name__)
                claimed = []
            if len(claimed) < CLAIM_BATCH:
                self.service.wake.clear()
                await wait_event(self.service.wake, self.poll_ms / 1000)

    async def send_test(self, account: str, webhook_id: str) -> DeliveryRow | None:
        """Queue a `webhook.test` delivery claimed by this worker and attempt it now (the test route)."""
        delivery_id = await self.service.queue_test(
            account, webhook_id, worker=self.worker_id, lease_ms=self.timeout_ms + LEASE_MARGIN_MS
        )
        row = await self.repo.delivery(delivery_id)
        if row is not None:
            await self.attempt(row)
        return await self.repo.delivery(delivery_id)

    async def attempt(self, row: DeliveryRow) -> None:
        status_code: int | None = None
        error: str | None = None
        started = time.monotonic()
        webhook = await self.repo.by_id(row.webhook_id)
        if webhook is None:
            error = "webhook deleted"
        elif not webhook.enabled and row.event_type != "webhook.test":
            error = "webhook disabled"
        else:
            try:
                status_code = await self._post(row, webhook.url, self.service.secrets_in_use(webhook))
                if not 200 <= status_code < 300:
                    error = "redirect not followed" if 300 <= status_code < 400 else f"HTTP {status_code}"
            except UrlRefused as exc:
                error = f"target refused: {exc.reason}"
            except TimeoutError:
                error = "timeout"
            except aiohttp.ClientConnectorError as exc:
                refused = exc.os_error if isinstance(exc.os_error, TargetRefused) else None
                error = (
                    f"target refused: {refused.reason}"
                    if refused
                    else f"connection failed: {type(exc).__name__}"
                )
            except aiohttp.ClientError as exc:
                error = f"connection failed: {type(exc).__name__}"
            except Exception as exc:  # never let one delivery break the worker
                error = f"failed: {type(exc).__name__}"
        latency_ms = int((time.monotonic() - started) * 1000)
        now = self.service.clock()
        final = error is None or row.attempts >= row.max_attempts or webhook is None
        status = "succeeded" if error is None else ("failed" if final else "pending")
        next_at = None if final else now + self._backoff(row.attempts)
        recorded = await self.repo.finish_attempt(
            row,
            worker=self.worker_id,
            now_ms=now,
            status=status,
            next_attempt_at_ms=next_at,
            status_code=status_code,
            latency_ms=latency_ms,
            error=error,
        )
        log.info(
            "webhook attempt",
            delivery_id=row.delivery_id,
            webhook_id=row.webhook_id,
            event_type=row.event_type,
            attempt=row.attempts,
            status=status,
            response_code=status_code,
            latency_ms=latency_ms,
            recorded=recorded is not None,
        )

    def _backoff(self, attempts: int) -> int:
        if not self.backoff_ms:
            return 1_000
        base = self.backoff_ms[min(attempts - 1, len(self.backoff_ms) - 1)]
        return base + random.randint(0, base // 10)  # jitter spreads retries of one outage

    async def _post(self, row: DeliveryRow, url: str, secrets_in_use: list[str]) -> int:
        policy = self.service.policy
        target = policy.parse(url)
        # The literal case: aiohttp never calls the resolver for an IP literal, so vet it here.
        await policy.allowed_addresses(target)
        body = body_bytes(row.payload)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: signature_header(secrets_in_use, self.service.clock(), body),
            "Gasless-Event-Id": row.event_id,
            "Gasless-Event-Type": row.event_type,
            "Gasless-Delivery-Id": row.delivery_id,
            "Gasless-Attempt": str(row.attempts),
        }
        timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000)
        async with self._session_now().post(
            url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        ) as response:
            with contextlib.suppress(Exception):
                await response.content.read(1_024)  # drain a little; the body itself is ignored
            return response.status


class IntentRecorder:
    """Bus observer: turns intent state changes into outbox rows, off the publisher's path."""

    def __init__(self, service: WebhookService) -> None:
        self.service = service
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=100_000)
        self._task: asyncio.Task[None] | None = None

    def observe(self, row: Any) -> None:
        billing = row.billing if isinstance(row.billing, dict) else {}
        account = billing.get("account")
        if not account:
            return
        intent = {
            "id": f"{row.sender}:{row.nonce}",
            "sender": row.sender,
            "nonce": int(row.nonce),
            "txHash": row.tx_hash,
            "state": row.state,
            "receiver": row.receiver,
            "relayer": row.relayer,
            "outcome": getattr(row, "outcome", None),
            "deadReason": getattr(row, "dead_reason", None),
            "executedBlockTsMs": getattr(row, "executed_block_ts_ms", None),
            "finalizedAtMs": getattr(row, "finalized_at_ms", None),
            "billing": billing,
        }
        try:
            self._queue.put_nowait((intent, account, row.state, int(row.seq)))
        except asyncio.QueueFull:
            log.error("webhook event queue full; event dropped", tx_hash=row.tx_hash)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhook-recorder")

    async def stop(self) -> None:
        # Write what was already observed before stopping (a clean shutdown loses nothing).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):  # not wait_for: see gasless.core.workers.wait_event
                await self._drain()
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _drain(self) -> None:
        while not self._queue.empty():
            await self._write(self._queue.get_nowait())

    async def _run(self) -> None:
        while True:
            await self._write(await self._queue.get())

    async def _write(self, item: Any) -> None:
        intent, account, state, seq = item
        for attempt in range(3):
            try:
                await self.service.record_intent(intent, account, state, seq)
                return
            except Exception as exc:
                log.warning("webhook event not recorded", error=type(exc).__name__, attempt=attempt)
                await asyncio.sleep(0.2 * (attempt + 1))


class DeliveryRetention:
    """Singleton: drops finished deliveries older than 30 days, and expired idempotency records."""

    def __init__(self, repo: WebhookRepository, idempotency: Any, *, every_ms: int = 600_000) -> None:
        self.repo = repo
        self.idempotency = idempotency
        self.every_ms = every_ms
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhook-retention")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            now = int(time.time() * 1000)
            try:
                await self.repo.purge(now - LOG_RETENTION_MS)
                await self.idempotency.purge(now)
            except Exception as exc:
                log.warning("webhook retention run failed", error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)
