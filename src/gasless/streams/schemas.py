"""Account stream shapes: topics, tickets and the StreamEvent carried in each event's `data:`."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.http.formats import Address

StreamTopic = Literal["intents", "quota", "account", "notices", "incidents", "pricing"]
TOPICS: tuple[str, ...] = get_args(StreamTopic)
RESET = "reset"  # the extra event name every client must handle: reload, then follow the stream


def canonical_address(value: str) -> str:
    try:
        return parse_address(value).to_bech32()
    except InvalidAddress:
        raise ValueError("not a valid erd1 address") from None


class StreamTicketCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no coercion: `0` is not a boolean

    account: Address = Field(description="the account whose events the ticket opens")
    topics: list[StreamTopic] | None = Field(
        default=None, max_length=len(TOPICS), description="topics to receive (default all)"
    )

    @field_validator("account")
    @classmethod
    def _account(cls, value: str) -> str:
        return canonical_address(value)


class StreamTicket(BaseModel):
    """A single-use credential for `GET /v1/stream?ticket=...` (a browser EventSource sends no headers)."""

    ticket: str
    account: str
    topics: list[StreamTopic]
    expiresAtMs: int = Field(description="Unix ms; the ticket is refused from then on, and after one use")


class StreamEvent(BaseModel):
    """One account-stream event (`data:`). `event:` is the topic, or `reset` (then `data` is null and the
    client reloads what it shows before following the stream)."""

    topic: StreamTopic | Literal["reset"]
    account: str
    key: str | None = Field(description="what changed (an intent's `<sender>:<nonce>`); null on reset")
    atMs: int
    data: dict[str, Any] | None = Field(description="the changed resource (an Intent on `intents`)")
    reason: str | None = Field(
        default=None,
        description="on reset: `unknown_id` (other host, restart, malformed) or `window`",
    )
