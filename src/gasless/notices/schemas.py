"""Notice shapes (kinds and members: docs/notices.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gasless.db.types import INT64_MAX
from gasless.http.pages import Page
from gasless.notices.kinds import NoticeKind, Severity


class Notice(BaseModel):
    """One notice of the account's merged log: its own notices and the global ones."""

    seq: int = Field(ge=1, le=INT64_MAX, description="position in the log (int64); later notices are greater")
    kind: NoticeKind
    scope: Literal["account", "global"] = Field(description="`global`: the same notice for every account")
    account: str | None = Field(description="the account it concerns; null for a global notice")
    severity: Severity
    title: str
    message: str
    data: dict[str, Any] = Field(description="the kind's figures (docs/notices.md)")
    createdAtMs: int
    acknowledged: bool = Field(description="true once the account acknowledged up to this seq or beyond")


class NoticePage(Page[Notice]):
    """A page of notices, newest first."""

    acknowledgedSeq: int = Field(ge=0, description="the account's acknowledgement high-water mark (0: none)")


class NoticeAck(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    upToSeq: int = Field(
        ge=0,
        le=INT64_MAX,
        description="acknowledge every notice with this seq or lower (a seq beyond the log acknowledges what "
        "exists now; acknowledging less than before changes nothing)",
    )
