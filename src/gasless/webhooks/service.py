"""Webhook management (owner routes), event recording into the outbox, and the delivery log listing.

Secrets are generated here, returned once (creation, rotation) and stored sealed; after a rotation the
previous secret keeps signing for `SECRET_OVERLAP_MS`. Events become delivery rows at once (the outbox):
`record_intent` is called for every intent state change this host makes, `send_test` for the test route.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog

from gasless.core.crypto import PurposeKeys
from gasless.core.errors import ApiError
from gasless.core.sealing import seal, unseal
from gasless.http.pages import CursorCodec, Page, PageParams
from gasless.webhooks.repository import DeliveryRow, WebhookRepository, WebhookRow, WebhooksFull
from gasless.webhooks.schemas import (
    TEST_EVENT_TYPE,
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookUpdate,
)
from gasless.webhooks.signing import new_secret
from gasless.webhooks.ssrf import AddressPolicy, UrlRefused

log = structlog.get_logger("gasless.webhooks")

MAX_WEBHOOKS = 10
SECRET_OVERLAP_MS = 86_400_000
LOG_RETENTION_MS = 30 * 86_400_000
ID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
SEAL_PURPOSE = "webhook-seal"
DELIVERIES_LISTING = "webhookDeliveries"
# Intent row state -> event type.
INTENT_EVENTS = {
    "COSIGNED": "intent.cosigned",
    "BROADCAST": "intent.broadcast",
    "EXECUTED": "intent.executed",
    "FINALIZED": "intent.finalized",
    "DEAD": "intent.dead",
}


def new_id(prefix: str, length: int = 20) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(length))


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def to_webhook(row: WebhookRow) -> Webhook:
    return Webhook(
        webhookId=row.webhook_id,
        url=row.url,
        eventTypes=list(row.event_types),
        enabled=row.enabled,
        description=row.description,
        createdMs=row.created_at_ms,
        updatedMs=row.updated_at_ms,
        previousSecretExpiresMs=row.previous_expires_at_ms,
    )


def to_delivery(row: DeliveryRow) -> WebhookDelivery:
    return WebhookDelivery(
        deliveryId=row.delivery_id,
        webhookId=row.webhook_id,
        eventId=row.event_id,
        eventType=row.event_type,
        status=row.status,  # type: ignore[arg-type]
        attempts=row.attempts,
        responseCode=row.last_status_code,
        latencyMs=row.last_latency_ms,
        error=row.last_error,
        createdMs=row.created_at_ms,
        updatedMs=row.updated_at_ms,
        nextAttemptMs=row.next_attempt_at_ms if row.status == "pending" else None,
        completedMs=row.completed_at_ms,
    )


def url_not_allowed(exc: UrlRefused) -> ApiError:
    return ApiError(
        "WEBHOOK_URL_NOT_ALLOWED",
        detail=f"{exc.message}; webhooks must be public https URLs on port 443",
        details={"reason": exc.reason},
    )


ACCOUNTS_REFRESH_S = 1.0


class WebhookService:
    def __init__(
        self,
        repo: WebhookRepository,
        keys: PurposeKeys,
        policy: AddressPolicy,
        cursors: CursorCodec,
        *,
        max_attempts: int,
        max_webhooks: int = MAX_WEBHOOKS,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.repo = repo
        self.keys = keys
        self.env = keys.env
        self.policy = policy
        self.cursors = cursors
        self.max_attempts = max_attempts
        self.max_webhooks = max_webhooks
        self.clock = clock  # Unix ms; tests inject one to step through the rotation overlap
        self.wake = asyncio.Event()  # set when deliveries were queued: the worker looks at once
        # Accounts that have any webhook, re-read at most every ACCOUNTS_REFRESH_S (and at once after a
        # change on this host): most intents belong to accounts without webhooks, and asking the database
        # per intent change cost more than the relay's own writes. A webhook registered on the other host
        # sees events from at most ACCOUNTS_REFRESH_S later.
        self._accounts: frozenset[str] = frozenset()
        self._accounts_until = 0.0

    async def _has_webhooks(self, account: str) -> bool:
        now = time.monotonic()
        if now >= self._accounts_until:
            self._accounts = frozenset(await self.repo.accounts_with_webhooks(self.env))
            self._accounts_until = now + ACCOUNTS_REFRESH_S
        return account in self._accounts

    def _accounts_changed(self) -> None:
        self._accounts_until = 0.0

    # Secrets ----------------------------------------------------------------------------------------
    def _seal(self, webhook_id: str, secret: str) -> str:
        return seal(self.keys, SEAL_PURPOSE, secret.encode(), webhook_id.encode())

    def secrets_in_use(self, row: WebhookRow) -> list[str]:
        """The secrets a delivery is signed with now: the current one, then the previous during overlap."""
        current = unseal(self.keys, SEAL_PURPOSE, row.secret_sealed, row.webhook_id.encode()).decode()
        in_use = [current]
        if (
            row.previous_secret_sealed is not None
            and row.previous_expires_at_ms is not None
            and self.clock() < row.previous_expires_at_ms
        ):
            previous = unseal(self.keys, SEAL_PURPOSE, row.previous_secret_sealed, row.webhook_id.encode())
            in_use.append(previous.decode())
        return in_use

    # Management -------------------------------------------------------------------------------------
    async def create(self, account: str, body: WebhookCreate) -> WebhookCreated:
        try:
            await self.policy.vet(body.url)
        except UrlRefused as exc:
            raise url_not_allowed(exc) from None
        webhook_id, secret, now = new_id("wh_"), new_secret(), self.clock()
        values = {
            "webhook_id": webhook_id,
            "account": account,
            "env": self.env,
            "url": body.url,
            "event_types": list(body.eventTypes),
            "enabled": body.enabled,
            "description": body.description,
            "secret_sealed": self._seal(webhook_id, secret),
            "previous_secret_sealed": None,
            "previous_expires_at_ms": None,
            "created_at_ms": now,
            "updated_at_ms": now,
        }
        try:
            row = await self.repo.insert(values, max_per_account=self.max_webhooks)
            self._accounts_changed()
        except WebhooksFull:
            raise ApiError(
                "LIMIT_REACHED",
                detail=f"the account already has {self.max_webhooks} webhooks; delete one first",
                details={"limit": self.max_webhooks, "resource": "webhooks"},
            ) from None
        return WebhookCreated(**to_webhook(row).model_dump(), secret=secret)

    async def list(self, account: str) -> list[Webhook]:
        return [to_webhook(row) for row in await self.repo.list_for(account, self.env)]

    async def row(self, account: str, webhook_id: str) -> WebhookRow:
        row = await self.repo.get(webhook_id, account, self.env) if len(webhook_id) <= 32 else None
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"account {account} has no webhook {webhook_id[:32]!r}")
        return row

    async def get(self, account: str, webhook_id: str) -> Webhook:
        return to_webhook(await self.row(account, webhook_id))

    async def update(self, account: str, webhook_id: str, body: WebhookUpdate) -> Webhook:
        await self.row(account, webhook_id)  # 404 before judging the URL
        changes: dict[str, Any] = {}
        for name, column in (("url", "url"), ("eventTypes", "event_types"), ("enabled", "enabled")):
            if name in body.model_fields_set and getattr(body, name) is not None:
                changes[column] = getattr(body, name)
        if "description" in body.model_fields_set:
            changes["description"] = body.description
        if "url" in changes:
            try:
                await self.policy.vet(changes["url"])
            except UrlRefused as exc:
                raise url_not_allowed(exc) from None
        changes["updated_at_ms"] = self.clock()
        row = await self.repo.update(webhook_id, account, self.env, changes)
        self._accounts_changed()
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"account {account} has no webhook {webhook_id[:32]!r}")
        return to_webhook(row)

    async def delete(self, account: str, webhook_id: str) -> None:
        self._accounts_changed()
        if len(webhook_id) > 32 or not await self.repo.delete(webhook_id, account, self.env):
            raise ApiError("NOT_FOUND", detail=f"account {account} has no webhook {webhook_id[:32]!r}")

    async def rotate(self, account: str, webhook_id: str) -> WebhookCreated:
        """A new secret (returned once); the one it replaces keeps signing for SECRET_OVERLAP_MS."""
        row = await self.row(account, webhook_id)
        secret, now = new_secret(), self.clock()
        current = unseal(self.keys, SEAL_PURPOSE, row.secret_sealed, row.webhook_id.encode()).decode()
        updated = await self.repo.update(
            webhook_id,
            account,
            self.env,
            {
                "secret_sealed": self._seal(webhook_id, secret),
                "previous_secret_sealed": self._seal(webhook_id, current),
                "previous_expires_at_ms": now + SECRET_OVERLAP_MS,
                "updated_at_ms": now,
            },
        )
        if updated is None:
            raise ApiError("NOT_FOUND", detail=f"account {account} has no webhook {webhook_id[:32]!r}")
        return WebhookCreated(**to_webhook(updated).model_dump(), secret=secret)

    async def deliveries(self, account: str, webhook_id: str, page: PageParams) -> Page[WebhookDelivery]:
        await self.row(account, webhook_id)
        filters = {"webhookId": webhook_id}
        after = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, DELIVERIES_LISTING, filters)
            if not (isinstance(position, list) and len(position) == 2 and isinstance(position[0], int)):
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            after = (position[0], str(position[1]))
        rows = await self.repo.deliveries_page(
            webhook_id, since_ms=self.clock() - LOG_RETENTION_MS, after=after, limit=page.limit + 1
        )
        more = len(rows) > page.limit
        rows = rows[: page.limit]
        cursor = (
            self.cursors.mint(DELIVERIES_LISTING, filters, [rows[-1].created_at_ms, rows[-1].delivery_id])
            if more
            else None
        )
        return Page[WebhookDelivery](items=[to_delivery(r) for r in rows], nextCursor=cursor)

    # Events -----------------------------------------------------------------------------------------
    def _event(self, event_id: str, event_type: str, account: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": event_id,
            "type": event_type,
            "createdMs": self.clock(),
            "env": self.env,
            "account": account,
            "data": data,
        }

    def _delivery_row(self, webhook: WebhookRow, event: dict[str, Any], max_attempts: int) -> dict[str, Any]:
        now = self.clock()
        return {
            "delivery_id": new_id("whd_"),
            "webhook_id": webhook.webhook_id,
            "account": webhook.account,
            "event_id": event["id"],
            "event_type": event["type"],
            "payload": event,
            "status": "pending",
            "attempts": 0,
            "max_attempts": max_attempts,
            "next_attempt_at_ms": now,
            "claimed_by": None,
            "claimed_until_ms": None,
            "last_status_code": None,
            "last_latency_ms": None,
            "last_error": None,
            "created_at_ms": now,
            "updated_at_ms": now,
            "completed_at_ms": None,
        }

    async def queue_test(self, account: str, webhook_id: str, *, worker: str, lease_ms: int) -> str:
        """Queue a `webhook.test` event for one webhook (enabled or not), already claimed by `worker` for
        its one attempt (no other worker can take it first); returns the delivery id. A test delivery is
        attempted once, now: it reports on the endpoint, it is not retried."""
        row = await self.row(account, webhook_id)
        event = self._event(
            new_id("evt_"), TEST_EVENT_TYPE, account, {"webhookId": webhook_id, "message": "test delivery"}
        )
        delivery = self._delivery_row(row, event, max_attempts=1)
        delivery.update(attempts=1, claimed_by=worker, claimed_until_ms=self.clock() + lease_ms)
        await self.repo.enqueue([delivery])
        return str(delivery["delivery_id"])

    async def record_intent(self, intent: dict[str, Any], account: str, state: str, seq: int) -> int:
        """Queue `intent.<state>` for the account's subscribed webhooks. The event id is derived from the
        intent's hash and change sequence, so recording the same change twice queues it once."""
        event_type = INTENT_EVENTS.get(state)
        if event_type is None:
            return 0
        if not await self._has_webhooks(account):
            return 0
        targets = await self.repo.subscribed(account, self.env, event_type)
        if not targets:
            return 0
        event = self._event(f"evt_{intent['txHash']}_{seq}", event_type, account, {"intent": intent})
        queued = await self.repo.enqueue([self._delivery_row(t, event, self.max_attempts) for t in targets])
        if queued:
            self.wake.set()
        return queued

    async def record_notice(self, notice: dict[str, Any]) -> int:
        """Queue a notice (event type: its kind) for the subscribed webhooks: the account's own, or every
        account's for a global notice. The event id is the notice's seq, so queuing it twice queues it once."""
        kind, account = str(notice["kind"]), notice.get("account")
        if account is None:
            targets = await self.repo.subscribed_anywhere(self.env, kind)
        elif await self._has_webhooks(str(account)):
            targets = await self.repo.subscribed(str(account), self.env, kind)
        else:
            targets = []
        rows = []
        for target in targets:
            event = self._event(f"evt_notice_{notice['seq']}", kind, target.account, {"notice": notice})
            rows.append(self._delivery_row(target, event, self.max_attempts))
        queued = await self.repo.enqueue(rows)
        if queued:
            self.wake.set()
        return queued
