"""Notification preference shapes: the OpenAPI document's NotificationPrefs and NotificationPrefsUpdate
(members: docs/notices.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from email_validator import EmailNotValidError, validate_email
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gasless.db.types import INT64_MAX
from gasless.notices.kinds import NoticeKind

DEFAULT_PLAN_THRESHOLDS = [80, 100]
MAX_THRESHOLDS = 5


def _email(value: str) -> str:
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(f"not a usable e-mail address: {exc}") from None


def _percentages(values: list[int]) -> list[int]:
    return sorted(set(values))


EmailAddress = Annotated[str, Field(min_length=3, max_length=254), AfterValidator(_email)]
Micro = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    planUsedPct: Annotated[
        list[Annotated[int, Field(ge=1, le=100)]],
        Field(max_length=MAX_THRESHOLDS),
        AfterValidator(_percentages),
    ] = Field(
        default_factory=lambda: list(DEFAULT_PLAN_THRESHOLDS),
        description="a `plan.threshold` notice when the period's used RU reach each percentage of the plan's",
    )
    escrowBelowMicro: Micro | None = Field(
        default=None,
        description="an `escrow.low` notice when pay-as-you-go escrow falls below this (off: null)",
    )
    paygSpentMicro: Micro | None = Field(
        default=None,
        description="a `payg.spending` notice when pay-as-you-go spending in one period reaches this (off: null)",
    )


class EmailChannelUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    address: EmailAddress = Field(
        description="where notices are e-mailed once verified; a new address is `pending` until the link "
        "e-mailed to it is opened"
    )


class EmailChannel(BaseModel):
    address: str
    status: Literal["pending", "verified"]
    pendingSinceMs: int | None = Field(description="when the current verification link was sent")
    linkExpiresAtMs: int | None = Field(description="when that link stops working; null once verified")
    verifiedAtMs: int | None


class NotificationPrefsUpdate(BaseModel):
    """The whole preferences (PUT replaces): members left out take their defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    thresholds: Thresholds = Field(default_factory=Thresholds)
    email: EmailChannelUpdate | None = Field(default=None, description="null: no e-mail channel")
    kinds: dict[NoticeKind, bool] = Field(
        default_factory=dict, description="per-kind e-mail switches; a kind left out is on"
    )


class NotificationPrefs(BaseModel):
    account: str
    thresholds: Thresholds
    email: EmailChannel | None
    kinds: dict[NoticeKind, bool] = Field(description="every kind with its e-mail switch")
    updatedAtMs: int | None = Field(description="null while the account keeps the defaults")
