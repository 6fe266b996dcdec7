"""Webhook routes: thin adapters from HTTP to WebhookService (native-auth; writes owner-only)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Header, Path, Request, Response

from gasless.auth.deps import AccountRead, AccountWrite, account_read
from gasless.core.errors import ApiError
from gasless.http.formats import VISIBLE_ASCII_KEY_PATTERN
from gasless.http.idempotency import idempotent
from gasless.http.json_body import api_router
from gasless.http.pages import PageQuery
from gasless.limits.route_classes import Caller, account_rate, private_read
from gasless.webhooks.schemas import (
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookDeliveryPage,
    WebhookList,
    WebhookUpdate,
)
from gasless.webhooks.service import to_delivery

router = api_router(tags=["webhooks"])
WebhookIdPath = Annotated[str, Path(max_length=64, description="the webhook's id (`wh_...`)")]
NO_STORE = "no-store"
# Documented here; read and judged by gasless.http.idempotency (16..128 visible ASCII, else 400).
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="16 to 128 visible ASCII characters; a retry with the same key and body replays the "
        "first answer (`Idempotent-Replayed: true`) for 86 400 000 ms",
        json_schema_extra={"pattern": VISIBLE_ASCII_KEY_PATTERN},
    ),
]
BASE = "/v1/account/{erd}/webhooks"


def _host(request: Request) -> Any:
    host = request.app.state.host
    if host.webhooks is None:
        raise ApiError(
            "UPSTREAM_UNAVAILABLE", detail="this host is starting", details={"retryAfterMs": 1_000}
        )
    return host


async def _writer(access: AccountWrite) -> Caller:
    return Caller(account=access.account)


# "Writes on keys, webhooks, notifications": 1 req/s, burst 5 per account.
WRITE_LIMIT = account_rate("account_write", caller=_writer)
PRIVATE_READ = private_read(account_read)


@router.get(BASE, operation_id="listWebhooks", response_model=WebhookList, dependencies=[PRIVATE_READ])
async def list_webhooks(request: Request, response: Response, access: AccountRead) -> WebhookList:
    """The account's webhooks, oldest first (secrets are never returned again)."""
    response.headers["Cache-Control"] = NO_STORE
    return WebhookList(items=await _host(request).webhooks.list(access.account))


@router.post(
    BASE,
    operation_id="createWebhook",
    response_model=WebhookCreated,
    status_code=201,
    dependencies=[WRITE_LIMIT],
)
async def create_webhook(
    request: Request, body: WebhookCreate, access: AccountWrite, idempotency_key: IdempotencyKeyHeader = None
) -> Response:
    """A new webhook; its signing secret is in this response only. Accepts `Idempotency-Key`."""
    service = _host(request).webhooks
    return await idempotent(
        request,
        scope=access.account,
        operation="createWebhook",
        status_code=201,
        run=lambda: service.create(access.account, body),
    )


@router.get(
    BASE + "/{webhookId}", operation_id="getWebhook", response_model=Webhook, dependencies=[PRIVATE_READ]
)
async def get_webhook(
    request: Request, response: Response, webhookId: WebhookIdPath, access: AccountRead
) -> Webhook:
    response.headers["Cache-Control"] = NO_STORE
    webhook: Webhook = await _host(request).webhooks.get(access.account, webhookId)
    return webhook


@router.patch(
    BASE + "/{webhookId}", operation_id="updateWebhook", response_model=Webhook, dependencies=[WRITE_LIMIT]
)
async def update_webhook(
    request: Request, response: Response, webhookId: WebhookIdPath, body: WebhookUpdate, access: AccountWrite
) -> Webhook:
    """Change the URL (checked like at creation), event types, `enabled` or description."""
    response.headers["Cache-Control"] = NO_STORE
    webhook: Webhook = await _host(request).webhooks.update(access.account, webhookId, body)
    return webhook


@router.delete(
    BASE + "/{webhookId}",
    operation_id="deleteWebhook",
    status_code=204,
    response_class=Response,
    dependencies=[WRITE_LIMIT],
)
async def delete_webhook(request: Request, webhookId: WebhookIdPath, access: AccountWrite) -> Response:
    """Delete the webhook, its pending deliveries and its delivery log."""
    await _host(request).webhooks.delete(access.account, webhookId)
    return Response(status_code=204, headers={"Cache-Control": NO_STORE})


@router.post(
    BASE + "/{webhookId}/test",
    operation_id="testWebhook",
    response_model=WebhookDelivery,
    dependencies=[WRITE_LIMIT],
)
async def test_webhook(
    request: Request,
    webhookId: WebhookIdPath,
    access: AccountWrite,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Send a signed `webhook.test` event now (one attempt, no retries) and return how it went.
    Accepts `Idempotency-Key`."""
    host = _host(request)

    async def send() -> WebhookDelivery:
        row = await host.webhook_dispatcher.send_test(access.account, webhookId)
        if row is None:  # the webhook was deleted meanwhile
            raise ApiError("NOT_FOUND", detail=f"account {access.account} has no webhook {webhookId[:32]!r}")
        return to_delivery(row)

    return await idempotent(request, scope=access.account, operation="testWebhook", run=send)


@router.post(
    BASE + "/{webhookId}/rotate-secret",
    operation_id="rotateWebhookSecret",
    response_model=WebhookCreated,
    dependencies=[WRITE_LIMIT],
)
async def rotate_webhook_secret(
    request: Request, response: Response, webhookId: WebhookIdPath, access: AccountWrite
) -> WebhookCreated:
    """A new signing secret, shown once; the previous one keeps signing too for 86 400 000 ms."""
    response.headers["Cache-Control"] = NO_STORE
    created: WebhookCreated = await _host(request).webhooks.rotate(access.account, webhookId)
    return created


@router.get(
    BASE + "/{webhookId}/deliveries",
    operation_id="listWebhookDeliveries",
    response_model=WebhookDeliveryPage,
    dependencies=[PRIVATE_READ],
)
async def list_webhook_deliveries(
    request: Request, response: Response, webhookId: WebhookIdPath, page: PageQuery, access: AccountRead
) -> WebhookDeliveryPage:
    """The webhook's deliveries of the last 30 days, newest first."""
    response.headers["Cache-Control"] = NO_STORE
    result: WebhookDeliveryPage = await _host(request).webhooks.deliveries(access.account, webhookId, page)
    return result
