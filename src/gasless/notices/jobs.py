"""The notice workers.

`NoticeWorker` is a singleton (role `notices`, one host at a time): every `poll_ms` it runs the sources
(gasless.notices.sources), then dispatches what is not dispatched yet: for each new notice, the webhook
deliveries of the subscribed webhooks and the e-mails of the verified addresses whose switch is on are
queued (each under a key derived from the notice's seq, so a dispatch repeated after a crash queues nothing
twice), then the notice is marked dispatched. Sending is the webhook and mail workers' job, on every host.

`NoticeTail` runs on every host: it follows the log by seq and hands each new notice to this host's
account streams (topic `notices`; a global notice to every stream, and a pricing change also as topic
`pricing` with the new pricing document). Each host reads the database itself, so nothing depends on the
cross-host fan-out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gasless.core.workers import PollingLoop
from gasless.notices.kinds import PRICING_KINDS
from gasless.notices.repository import NoticeRepository, NoticeRow, SourceReads
from gasless.notices.service import NoticeService, to_notice
from gasless.notices.sources import NoticeSources, mail_text
from gasless.notifications.links import VerificationLinks
from gasless.notifications.mail import MailWorker, SmtpTarget
from gasless.notifications.repository import MailOutbox, PrefsRepository
from gasless.notifications.service import NotificationService

log = structlog.get_logger("gasless.notices")

NOTICES_ROLE = "notices"
DISPATCH_BATCH = 200


class NoticeWorker:
    def __init__(
        self,
        sources: NoticeSources,
        repo: NoticeRepository,
        prefs: PrefsRepository,
        notifications: NotificationService,
        *,
        record_webhook: Callable[[dict[str, Any]], Awaitable[int]] | None,
        poll_ms: int,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.sources = sources
        self.repo = repo
        self.prefs = prefs
        self.notifications = notifications
        self.record_webhook = record_webhook
        self.poll_ms = poll_ms
        self.clock = clock
        self.loop = PollingLoop("notice-worker", self._tick, poll_ms=poll_ms)
        self.wake = self.loop.wake

    async def start(self) -> None:
        self.sources.forget_cursors()  # leading (again): another host may have moved them meanwhile
        self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()

    async def _tick(self) -> bool:
        await self.sources.scan()
        return await self.dispatch() == DISPATCH_BATCH

    async def dispatch(self) -> int:
        rows = await self.repo.undispatched(DISPATCH_BATCH)
        if not rows:
            return 0
        accounts = sorted({r.account for r in rows if r.account is not None})
        prefs = await self.prefs.many(accounts)
        verified: list[Any] | None = None
        mails: list[dict[str, Any]] = []
        for row in rows:
            if self.record_webhook is not None:
                await self.record_webhook(to_notice(row, 0).model_dump(mode="json", exclude={"acknowledged"}))
            if row.account is None:
                if verified is None:
                    verified = await self.prefs.verified()
                targets = verified
            else:
                targets = [prefs[row.account]] if row.account in prefs else []
            mails.extend(self.notifications.mails_for(row, targets, mail_text))
        await self.notifications.queue(mails)
        await self.repo.mark_dispatched([r.seq for r in rows], self.clock())
        return len(rows)


class NoticeTail:
    def __init__(
        self,
        repo: NoticeRepository,
        hub: Any,
        *,
        pricing: Callable[[], Awaitable[dict[str, Any]]] | None,
        poll_ms: int,
    ) -> None:
        self.repo = repo
        self.hub = hub
        self.pricing = pricing
        self.poll_ms = poll_ms
        self.seq: int | None = None
        self.loop = PollingLoop("notice-tail", self._tick, poll_ms=poll_ms)

    async def start(self) -> None:
        with contextlib.suppress(Exception):  # a database not answering yet: the first tick sets it
            self.seq = await self.repo.last_seq()  # what exists at start-up is not news
        self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()

    async def _tick(self) -> bool:
        if self.seq is None:
            self.seq = await self.repo.last_seq()
        rows = await self.repo.after(self.seq, 500)
        await self._deliver(rows)
        return len(rows) == 500

    async def _deliver(self, rows: list[NoticeRow]) -> None:
        pricing_changed = False
        for row in rows:
            doc = to_notice(row, 0).model_dump(mode="json", exclude={"acknowledged"})
            if row.account is None:
                self.hub.deliver_everywhere("notices", str(row.seq), doc)
                pricing_changed = pricing_changed or row.kind in PRICING_KINDS
            else:
                self.hub.deliver(row.account, "notices", str(row.seq), doc, row.created_at_ms)
            self.seq = row.seq
        if pricing_changed and self.pricing is not None:
            self.hub.deliver_everywhere("pricing", "pricing", await self.pricing())


@dataclass
class NoticeParts:
    """What one host runs for notices: the stream tail and the mail worker on every host; the notices
    singleton once the relay core runs (it needs the account reads and the pricing views)."""

    notices: NoticeService
    notifications: NotificationService
    prefs: PrefsRepository
    tail: NoticeTail
    mail: MailWorker | None

    async def start(self) -> None:
        await self.tail.start()
        if self.mail is not None:
            await self.mail.start()

    async def stop(self) -> None:
        for part in (self.tail, self.mail):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()

    def attach(
        self,
        engine: Any,
        singletons: Any,
        *,
        account_reads: Any,
        tariff_entries: Callable[[], Awaitable[list[Any]]] | None,
        webhooks: Any | None,
        streams: Any | None,
        bus: Any,
        follower: Any | None,
        poll_ms: int,
    ) -> NoticeWorker:
        """Once the relay core runs: the notices singleton (role `notices`), and the stream topics fed by
        the account reads (`quota` after settlements and purchases, `account` on contract events)."""
        repo = self.notices.repo
        sources = NoticeSources(
            repo,
            SourceReads(engine),
            self.prefs,
            quotas=account_reads.quotas,
            tariff_entries=tariff_entries,
            append=self.notices.append,
        )
        worker = NoticeWorker(
            sources,
            repo,
            self.prefs,
            self.notifications,
            record_webhook=webhooks.record_notice if webhooks is not None else None,
            poll_ms=poll_ms,
        )
        self.notices.on_appended = worker.wake.set
        singletons.add(NOTICES_ROLE, worker)
        if streams is not None:
            streams.attach_accounts(bus, account_reads.quotas, account_reads.account, follower)
        return worker


def build_notices(
    engine: Any,
    keys: Any,
    cursors: Any,
    settings: Any,
    hub: Any,
    *,
    worker_id: str,
    pricing: Callable[[], Any],
) -> NoticeParts:
    """The notices and notifications of one host (the worker is added with the relay core)."""
    repo = NoticeRepository(engine)
    prefs = PrefsRepository(engine)
    outbox = MailOutbox(engine)
    mail = None
    if settings.smtp_url is not None:
        mail = MailWorker(
            outbox,
            SmtpTarget.parse(settings.smtp_url.get_secret_value()),
            sender=settings.mail_from,
            worker_id=worker_id,
            backoff_ms=settings.mail_retry_backoff_ms,
            poll_ms=settings.mail_poll_ms,
        )
    links = VerificationLinks(keys, settings.network.api_base_url, ttl_ms=settings.email_link_ttl_ms)
    notifications = NotificationService(
        prefs, outbox, links, env=settings.key_env, on_queued=mail.wake.set if mail is not None else None
    )

    async def pricing_document() -> dict[str, Any]:
        service = pricing()  # the pricing service exists once the relay core runs
        if service is None:
            raise RuntimeError("the pricing service is not running yet")
        document: dict[str, Any] = await service.changed_document()
        return document

    tail = NoticeTail(repo, hub, pricing=pricing_document, poll_ms=min(settings.notices_poll_ms, 500))
    return NoticeParts(NoticeService(repo, cursors), notifications, prefs, tail, mail)
