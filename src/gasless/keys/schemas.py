"""Request and response shapes of the sponsor API key routes, named as the interface contract names them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gasless.http.formats import CheckedAddress

MAX_RECEIVERS = 100
ApiKeyScope = Literal["relay", "read"]
ALL_SCOPES: tuple[ApiKeyScope, ...] = ("relay", "read")


def _label(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("label must not be blank")
    if any(not ch.isprintable() for ch in value):
        raise ValueError("label must not contain control characters")
    return value


Address = CheckedAddress
Label = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_label)]


class ApiKeyLimits(BaseModel):
    """Tighter limits of the key's own; the account's rate class still applies (never looser)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    ruPerSecond: int | None = Field(default=None, ge=1, le=100, description="sustained RU per second")
    ruPerHour: int | None = Field(default=None, ge=1, le=6_000, description="RU per hour")
    maxGasLimit: int | None = Field(
        default=None, ge=50_000, le=600_000_000, description="largest gas limit a relay may carry"
    )


class ApiKeyPolicy(BaseModel):
    """What a key may do. Stored now; enforced on the relay path by billing (RECEIVER_NOT_ALLOWED, ...)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    scopes: list[ApiKeyScope] = Field(
        default_factory=lambda: list(ALL_SCOPES),
        min_length=1,
        description="`relay`: pay for POST /v1/relay; `read`: read the account's dashboard data and streams",
    )
    allowedReceivers: list[Address] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_RECEIVERS,
        description="receivers the key pays for; null allows any receiver",
    )
    limits: ApiKeyLimits = Field(default_factory=ApiKeyLimits)

    @model_validator(mode="after")
    def _dedupe(self) -> ApiKeyPolicy:
        self.scopes = [scope for scope in ALL_SCOPES if scope in self.scopes]
        if self.allowedReceivers is not None:
            self.allowedReceivers = list(dict.fromkeys(self.allowedReceivers))
        return self


class ApiKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    label: Label
    policy: ApiKeyPolicy = Field(default_factory=ApiKeyPolicy)


class ApiKeyUpdate(BaseModel):
    """Label, policy or both; a policy given here replaces the whole stored policy."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    label: Label | None = None
    policy: ApiKeyPolicy | None = None

    @model_validator(mode="after")
    def _something(self) -> ApiKeyUpdate:
        if self.label is None and self.policy is None:
            raise ValueError("give a label, a policy or both")
        return self


class ApiKey(BaseModel):
    """A sponsor API key as listed: never its secret."""

    keyId: str = Field(description="public id; also the `apiKeyId` of usage rows")
    label: str
    env: Literal["live", "test"]
    prefix: str = Field(description="`gls_<env>_<keyId>`: the start of the key string, to recognise it")
    policy: ApiKeyPolicy
    createdMs: int
    updatedMs: int


class ApiKeyCreated(ApiKey):
    """The new key with its secret: shown this once, never again."""

    secret: str = Field(description="the whole key string, for the `X-Api-Key` header")


class ApiKeyList(BaseModel):
    """The account's active keys (at most 10), oldest first; one page, so no cursor."""

    items: list[ApiKey]
