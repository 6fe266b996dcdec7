"""Request and response shapes of the webhook routes, named as the interface contract names them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gasless.http.pages import Page
from gasless.notices.kinds import NOTICE_KINDS, NoticeKind

# Intent events, named after the state the intent reached; `webhook.test` is sent by the test route only.
IntentEventType = Literal[
    "intent.cosigned", "intent.broadcast", "intent.executed", "intent.finalized", "intent.dead"
]
INTENT_EVENT_TYPES: tuple[str, ...] = (
    "intent.cosigned",
    "intent.broadcast",
    "intent.executed",
    "intent.finalized",
    "intent.dead",
)
NOTICE_EVENT_TYPES: tuple[str, ...] = NOTICE_KINDS  # a notice is delivered as the event type of its kind
EVENT_TYPES: tuple[str, ...] = INTENT_EVENT_TYPES + NOTICE_EVENT_TYPES
EventType = IntentEventType | NoticeKind
TEST_EVENT_TYPE = "webhook.test"
DeliveryStatus = Literal["pending", "succeeded", "failed"]


def _description(value: str) -> str:
    value = value.strip()
    if any(not ch.isprintable() for ch in value):
        raise ValueError("description must not contain control characters")
    return value


def _dedupe(types: list[str]) -> list[str]:
    return [t for t in EVENT_TYPES if t in types]


Url = Annotated[str, Field(min_length=8, max_length=2_048, description="https URL on port 443")]
Description = Annotated[str, Field(max_length=128), AfterValidator(_description)]
EventTypes = Annotated[
    list[EventType],
    Field(min_length=1, max_length=len(INTENT_EVENT_TYPES) + len(NOTICE_KINDS)),
    AfterValidator(_dedupe),
]


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    url: Url
    eventTypes: EventTypes = Field(
        default_factory=lambda: list(EVENT_TYPES),
        description="event types delivered to this webhook (default: every intent event and every notice kind)",
    )
    enabled: bool = True
    description: Description | None = None


class WebhookUpdate(BaseModel):
    """Any of URL, event types, enabled, description; members left out keep their value."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    url: Url | None = None
    eventTypes: EventTypes | None = None
    enabled: bool | None = None
    description: Description | None = None

    @model_validator(mode="after")
    def _something(self) -> WebhookUpdate:
        if not self.model_fields_set:
            raise ValueError("give at least one of url, eventTypes, enabled, description")
        return self


class Webhook(BaseModel):
    """A webhook as listed: never its secret."""

    webhookId: str
    url: str
    eventTypes: list[str]
    enabled: bool
    description: str | None
    createdMs: int
    updatedMs: int
    previousSecretExpiresMs: int | None = Field(
        description="after a rotation: until when deliveries also carry the previous secret's signature"
    )


class WebhookCreated(Webhook):
    """The webhook with its signing secret: shown at creation and at rotation only."""

    secret: str = Field(description="`whsec_...`: HMAC-SHA256 key of the `Gasless-Signature` header")


class WebhookList(BaseModel):
    """The account's webhooks (at most 10), oldest first; one page, so no cursor."""

    items: list[Webhook]


class WebhookDelivery(BaseModel):
    """One event sent (or being sent) to one webhook, and how its attempts went."""

    deliveryId: str
    webhookId: str
    eventId: str = Field(description="the event's id (`Gasless-Event-Id`): receivers dedupe on it")
    eventType: str
    status: DeliveryStatus
    attempts: int
    responseCode: int | None = Field(description="HTTP status of the last attempt (null: no response)")
    latencyMs: int | None = Field(description="duration of the last attempt")
    error: str | None = Field(description="why the last attempt failed, when it did")
    createdMs: int
    updatedMs: int
    nextAttemptMs: int | None = Field(description="when the next attempt is due (pending only)")
    completedMs: int | None


WebhookDeliveryPage = Page[WebhookDelivery]
