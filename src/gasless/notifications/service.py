"""Notification preferences and the e-mail channel.

PUT replaces the preferences. A new address (or one still pending) gets a fresh verification link by mail,
queued in the same transaction as the preferences, and stays `pending` until the link is opened; the link
before it stops working. Only a verified address ever receives notices (`mails_for`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from gasless.core.errors import ApiError
from gasless.notices.kinds import NOTICE_KINDS
from gasless.notifications.links import VerificationLinks, link_refused
from gasless.notifications.repository import MailOutbox, PrefsRepository, PrefsRow
from gasless.notifications.schemas import (
    EmailChannel,
    NotificationPrefs,
    NotificationPrefsUpdate,
    Thresholds,
)

MAIL_ATTEMPTS = 6
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def new_mail_id() -> str:
    return "mail_" + "".join(secrets.choice(ID_ALPHABET) for _ in range(24))


def mail_row(
    *, dedupe_key: str, account: str, to: str, purpose: str, subject: str, body: str, now_ms: int
) -> dict[str, Any]:
    return {
        "mail_id": new_mail_id(),
        "dedupe_key": dedupe_key[:200],
        "account": account,
        "to_address": to,
        "purpose": purpose,
        "subject": subject[:200],
        "body": body,
        "status": "pending",
        "attempts": 0,
        "max_attempts": MAIL_ATTEMPTS,
        "next_attempt_at_ms": now_ms,
        "claimed_by": None,
        "claimed_until_ms": None,
        "last_error": None,
        "created_at_ms": now_ms,
        "sent_at_ms": None,
    }


def thresholds_of(row: PrefsRow | None) -> Thresholds:
    return Thresholds() if row is None else Thresholds.model_validate(row.thresholds)


def emails_kind(row: PrefsRow, kind: str) -> bool:
    return row.email_status == "verified" and bool(row.kinds.get(kind, True))


class NotificationService:
    def __init__(
        self,
        prefs: PrefsRepository,
        outbox: MailOutbox,
        links: VerificationLinks,
        *,
        env: str,
        on_queued: Callable[[], None] | None = None,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.prefs = prefs
        self.outbox = outbox
        self.links = links
        self.env = env
        self.on_queued = on_queued  # wakes this host's mail worker
        self.clock = clock

    def _document(self, account: str, row: PrefsRow | None) -> NotificationPrefs:
        kinds = {kind: True for kind in NOTICE_KINDS}
        email = None
        if row is not None:
            kinds.update({k: bool(v) for k, v in row.kinds.items() if k in kinds})
            if row.email_address is not None:
                email = EmailChannel(
                    address=row.email_address,
                    status=row.email_status,  # type: ignore[arg-type]
                    pendingSinceMs=row.email_pending_since_ms,
                    linkExpiresAtMs=row.email_token_expires_ms,
                    verifiedAtMs=row.email_verified_at_ms,
                )
        return NotificationPrefs(
            account=account,
            thresholds=thresholds_of(row),
            email=email,
            kinds=kinds,  # type: ignore[arg-type]
            updatedAtMs=None if row is None else row.updated_at_ms,
        )

    async def get(self, account: str) -> NotificationPrefs:
        return self._document(account, await self.prefs.get(account))

    async def put(self, account: str, update: NotificationPrefsUpdate) -> NotificationPrefs:
        now = self.clock()
        current = await self.prefs.get(account)
        values: dict[str, Any] = {
            "thresholds": update.thresholds.model_dump(mode="json"),
            "kinds": {k: v for k, v in update.kinds.items() if not v},  # stored: the kinds switched off
            "created_at_ms": now,
            "updated_at_ms": now,
        }
        mail = None
        address = update.email.address if update.email is not None else None
        if address is None:
            values.update(
                email_address=None,
                email_status=None,
                email_token_id=None,
                email_token_expires_ms=None,
                email_pending_since_ms=None,
                email_verified_at_ms=None,
            )
        elif current is not None and current.email_address == address and current.email_status == "verified":
            pass  # the verified address stays verified
        else:
            link, claims = self.links.mint(account, address, now)
            values.update(
                email_address=address,
                email_status="pending",
                email_token_id=claims.token_id,
                email_token_expires_ms=claims.expires_ms,
                email_pending_since_ms=now,
                email_verified_at_ms=None,
            )
            mail = mail_row(
                dedupe_key=f"verify:{claims.token_id}",
                account=account,
                to=address,
                purpose="verify",
                subject="Confirm your e-mail address for gasless notices",
                body=(
                    f"Someone (hopefully you) asked for the notices of account {account} to be sent to this "
                    f"address ({self.env} environment).\n\nOpen this link to confirm it:\n\n{link}\n\n"
                    f"The link works once and expires in {self.links.ttl_ms // 3_600_000} hours. If you did not "
                    "ask for this, ignore this mail: nothing is sent to an unconfirmed address.\n"
                ),
                now_ms=now,
            )
        row = await self.prefs.put(account, values, mail)
        if mail is not None and self.on_queued is not None:
            self.on_queued()
        return self._document(account, row)

    async def verify(self, token: str) -> tuple[str, str]:
        """Open a verification link: (account, address) once verified; TOKEN_INVALID / TOKEN_EXPIRED else."""
        claims = self.links.open(token, self.clock())
        if not await self.prefs.verify(claims.account, claims.token_id, claims.address, self.clock()):
            raise link_refused(
                "used",
                "this link was already used, or a newer link replaced it (save the address again for a new one)",
            )
        return claims.account, claims.address

    def mails_for(
        self, notice: Any, prefs: Iterable[PrefsRow], text: Callable[[Any], tuple[str, str]]
    ) -> list[dict[str, Any]]:
        """The mails a notice sends: one per verified address whose switch for its kind is on."""
        now = self.clock()
        rows = []
        for row in prefs:
            if row.email_address is None or not emails_kind(row, notice.kind):
                continue
            subject, body = text(notice)
            rows.append(
                mail_row(
                    dedupe_key=f"notice:{notice.seq}:{row.account}",
                    account=row.account,
                    to=row.email_address,
                    purpose=notice.kind,
                    subject=subject,
                    body=body,
                    now_ms=now,
                )
            )
        return rows

    async def queue(self, rows: list[dict[str, Any]]) -> int:
        queued = await self.outbox.enqueue(rows)
        if queued and self.on_queued is not None:
            self.on_queued()
        return queued


__all__ = ["ApiError", "NotificationService", "mail_row"]
