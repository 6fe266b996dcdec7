"""The notice kinds (docs/notices.md): what each says, who sees it, and how loud it is.

A kind is also the webhook event type that carries it (`plan.threshold`, ...), beside the intent events.
Global kinds have no account: every account reads them in its merged log.
"""

from __future__ import annotations

from typing import Literal, get_args

NoticeKind = Literal[
    "plan.threshold",
    "plan.period_ending",
    "plan.purchased",
    "plan.renewed",
    "plan.renewal_skipped",
    "escrow.low",
    "payg.started",
    "payg.spending",
    "key.created",
    "key.revoked",
    "webhook.failing",
    "incident.declared",
    "incident.updated",
    "incident.resolved",
    "tariff.changed",
    "schedule.changed",
    "sender_fee.increase",
]
NOTICE_KINDS: tuple[str, ...] = get_args(NoticeKind)
GLOBAL_KINDS = frozenset({"tariff.changed", "schedule.changed", "sender_fee.increase"})
# Kinds that tell the stream's `pricing` topic the pricing document changed.
PRICING_KINDS = GLOBAL_KINDS
Severity = Literal["info", "warning", "critical"]
