"""E-mail: the SMTP client (aiosmtplib), the mail worker every host runs, and the local mail catcher.

The worker claims due rows of the mail outbox (gasless.notifications.repository), sends each through the
configured SMTP server and records the outcome; a refused or failed attempt is retried after the next
back-off step, then marked `failed`. Each mail carries `Message-ID: <mail_id@gasless>`, so in the rare case
of a host dying after the server accepted a mail but before recording it (the row is then sent again by
the next claim), the copy is recognisable. Nothing secret goes into a log: addresses are logged by their
domain only, bodies never.

The mail catcher (`MailCatcher`) is a real SMTP server (aiosmtpd) on loopback that keeps every mail it
receives: in a Maildir under the data directory (`gasless up`), and in memory for whoever runs it (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import mailbox
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiosmtplib
import structlog
from aiosmtpd.smtp import SMTP as SmtpProtocol
from aiosmtpd.smtp import Envelope, Session

from gasless.core.workers import PollingLoop
from gasless.notifications.repository import MailOutbox, MailRow

log = structlog.get_logger("gasless.mail")

CLAIM_BATCH = 16
LEASE_MS = 30_000


@dataclass(frozen=True)
class SmtpTarget:
    """Where mail goes: `smtp://[user:password@]host[:port]` (STARTTLS when the server offers it) or
    `smtps://...` (TLS from the first byte)."""

    host: str
    port: int
    implicit_tls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> SmtpTarget:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ValueError("the SMTP URL must be smtp://host[:port] or smtps://host[:port]")
        implicit = parts.scheme == "smtps"
        return cls(
            host=parts.hostname,
            port=parts.port or (465 if implicit else 25),
            implicit_tls=implicit,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


def build_message(row: MailRow, sender: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = row.to_address
    message["Subject"] = row.subject
    message["Message-ID"] = f"<{row.mail_id}@gasless>"
    message["X-Gasless-Purpose"] = row.purpose
    message.set_content(row.body)
    return message


def domain_of(address: str) -> str:
    return address.rpartition("@")[2]


class MailWorker:
    """Sends the outbox (every host runs one; claims keep them apart)."""

    def __init__(
        self,
        outbox: MailOutbox,
        target: SmtpTarget,
        *,
        sender: str,
        worker_id: str,
        backoff_ms: Sequence[int],
        poll_ms: int,
        timeout_ms: int = 10_000,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.outbox = outbox
        self.target = target
        self.sender = sender
        self.worker_id = worker_id
        self.backoff_ms = list(backoff_ms)
        self.poll_ms = poll_ms
        self.timeout_ms = timeout_ms
        self.clock = clock
        self.loop = PollingLoop("mail-worker", self._tick, poll_ms=poll_ms)
        self.wake = self.loop.wake  # set when mail was queued on this host: look at once

    async def start(self) -> None:
        self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()

    async def _tick(self) -> bool:
        claimed = await self.outbox.claim_due(
            worker=self.worker_id, now_ms=self.clock(), lease_ms=LEASE_MS, limit=CLAIM_BATCH
        )
        await asyncio.gather(*(self.attempt(row) for row in claimed))
        return len(claimed) == CLAIM_BATCH

    async def attempt(self, row: MailRow) -> None:
        error: str | None = None
        try:
            await aiosmtplib.send(
                build_message(row, self.sender),
                hostname=self.target.host,
                port=self.target.port,
                use_tls=self.target.implicit_tls,
                username=self.target.username,
                password=self.target.password,
                timeout=self.timeout_ms / 1000,
            )
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {getattr(exc, 'code', '')}".strip(": ")
        now = self.clock()
        if error is None:
            status, next_at = "sent", now
        elif row.attempts >= row.max_attempts:
            status, next_at = "failed", now
        else:
            step = self.backoff_ms[min(row.attempts - 1, len(self.backoff_ms) - 1)]
            status, next_at = "pending", now + step
        await self.outbox.finish(
            row, worker=self.worker_id, now_ms=now, status=status, next_attempt_at_ms=next_at, error=error
        )
        log.info(
            "mail attempt",
            mail_id=row.mail_id,
            purpose=row.purpose,
            to_domain=domain_of(row.to_address),
            attempt=row.attempts,
            outcome=status,
            error=error,
        )


# The local mail catcher ----------------------------------------------------------------------------------
@dataclass
class CaughtMail:
    envelope_from: str
    envelope_to: list[str]
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"] or "")

    @property
    def text(self) -> str:
        body = self.message.get_body(preferencelist=("plain",))
        return body.get_content() if body is not None else ""  # type: ignore[union-attr]


class _Keeper:
    """aiosmtpd handler: accept every mail, keep it."""

    def __init__(self, catcher: MailCatcher) -> None:
        self.catcher = catcher

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        data = raw if isinstance(raw, bytes) else raw.encode()
        self.catcher.keep(str(envelope.mail_from), [str(r) for r in envelope.rcpt_tos], data)
        return "250 Message accepted for delivery"


class MailCatcher:
    """A real SMTP server on loopback (aiosmtpd) keeping what it receives: `mails` in memory, and a Maildir
    when `maildir` is given. `start()` binds `port` (0: any free port) in the running event loop."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, maildir: Path | None = None) -> None:
        self.host = host
        self.port = port
        self.maildir = mailbox.Maildir(str(maildir), create=True) if maildir is not None else None
        self.mails: list[CaughtMail] = []
        self.received = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self.on_mail: Callable[[CaughtMail], None] | None = None

    @property
    def url(self) -> str:
        return f"smtp://{self.host}:{self.port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        handler = _Keeper(self)
        self._server = await loop.create_server(
            lambda: SmtpProtocol(handler, hostname="gasless-mail-catcher", loop=loop), self.host, self.port
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):  # not wait_for: see gasless.core.workers.wait_event
                    await self._server.wait_closed()
            self._server = None

    def keep(self, mail_from: str, rcpt_tos: list[str], data: bytes) -> None:
        message = BytesParser(policy=email.policy.default).parsebytes(data)
        caught = CaughtMail(mail_from, rcpt_tos, message)  # type: ignore[arg-type]
        self.mails.append(caught)
        if self.maildir is not None:
            self.maildir.add(data)
        if self.on_mail is not None:
            self.on_mail(caught)
