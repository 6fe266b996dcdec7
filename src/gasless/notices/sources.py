"""Where notices come from: the sources the notices singleton scans, and the words of each kind.

Every source is a scan over durable state with a cursor (service_meta `notices.<source>`) and a lookback, so
a leader that dies mid-scan loses nothing: the next leader scans the same rows again and the notices' dedupe
keys store each notice once. The dedupe key names what the notice is about (the account, its period and the
threshold; the incident update and the account; the tariff entry...), never the time it was found.

The notices singleton (role `notices`) runs the scan, then the dispatcher (gasless.notices.jobs).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from gasless.billing.schedule import RU_SCHEDULE_VERSION
from gasless.notices.repository import NewNotice, NoticeRepository, SourceReads
from gasless.notifications.repository import PrefsRepository
from gasless.notifications.service import thresholds_of

log = structlog.get_logger("gasless.notices")

LOOKBACK_MS = (
    60_000  # rows are looked for this far behind the cursor (clock skew between hosts, slow commits)
)
# An account's usage (and PAYG spending) is judged at most this often: judging reads its Quota (several
# queries), and a busy account's usage changes with every relay. A change waiting for its turn is still
# within the lookback when it comes (JUDGE_SPACING_MS < LOOKBACK_MS), so it is judged, at most this late.
JUDGE_SPACING_MS = 10_000
AFFECTED_BEFORE_MS = (
    86_400_000  # an incident affects accounts that relayed in the 24 h before it, or during it
)
PERIOD_ENDING_MS = 259_200_000  # `plan.period_ending` 72 h before the running plan block ends
PERIOD_SCAN_MS = 60_000
PURCHASE_KINDS = {
    "plan_purchase": "plan.purchased",
    "renewal": "plan.renewed",
    "renewal_skipped": "plan.renewal_skipped",
}


def usdc(micro: int) -> str:
    return f"{micro / 1_000_000:,.6f}".rstrip("0").rstrip(".") + " USDC"


def compose(kind: str, account: str | None, data: dict[str, Any], dedupe_key: str) -> NewNotice:
    """A notice of `kind` with its severity, title and message (the words live here, in one place)."""
    severity, title, body = "info", kind, ""
    if kind == "plan.threshold":
        pct = data["thresholdPct"]
        severity = "critical" if pct >= 100 else "warning"
        title = f"Plan {pct}% used"
        body = (
            f"The running period has used {data['usedRu']} of its {data['includedRu']} RU ({data['usedPct']}%)."
            + (" Relays now need pay-as-you-go or a new plan." if pct >= 100 else "")
        )
    elif kind == "plan.period_ending":
        renews = data["autoRenew"]
        severity = "info" if renews else "warning"
        title = "Plan renews soon" if renews else "Plan ends soon"
        body = f"The running plan block ends at {data['endMs']} (Unix ms)." + (
            " Auto-renew is on: it renews from credits if they cover it."
            if renews
            else " Auto-renew is off: buy again or turn auto-renew on to keep relaying on a plan."
        )
    elif kind == "plan.purchased":
        title, body = "Plan purchased", f"Tier {data.get('tierId')} bought (transaction {data['txHash']})."
    elif kind == "plan.renewed":
        title, body = "Plan renewed", f"Tier {data.get('tierId')} renewed (transaction {data['txHash']})."
    elif kind == "plan.renewal_skipped":
        severity, title = "warning", "Plan renewal skipped"
        body = f"The plan could not renew (transaction {data['txHash']}): top up credits or buy a plan."
    elif kind == "escrow.low":
        severity, title = "warning", "Pay-as-you-go escrow is low"
        body = (
            f"Escrow is {usdc(data['escrowMicro'])}, below your threshold of {usdc(data['thresholdMicro'])}."
        )
    elif kind == "payg.started":
        title = "Pay-as-you-go is paying"
        body = "The plan's RU for this period are used up; relays are now billed pay-as-you-go."
    elif kind == "payg.spending":
        severity, title = "warning", "Pay-as-you-go spending reached your threshold"
        body = f"{usdc(data['spentMicro'])} spent pay-as-you-go this period (threshold {usdc(data['thresholdMicro'])})."
    elif kind in ("key.created", "key.revoked"):
        verb = "created" if kind == "key.created" else "revoked"
        title = f"API key {verb}"
        body = (
            f"Sponsor API key {data['keyId']} ({data.get('label') or 'no label'}, {data['env']}) was {verb}."
        )
    elif kind == "webhook.failing":
        severity, title = "warning", "Webhook deliveries are failing"
        body = (
            f"A delivery to {data['url']} failed after {data['attempts']} attempts "
            f"(last answer: {data.get('responseCode') or data.get('error') or 'none'})."
        )
    elif kind.startswith("incident."):
        severity = (
            "info"
            if kind == "incident.resolved"
            else ("critical" if data["impact"] == "critical" else "warning")
        )
        scope = "every shard" if data.get("shard") is None else f"shard {data['shard']}"
        title = f"{data['status'].capitalize()}: {data['title']}"
        body = f"{data['body']} (affects {scope}; your account relayed there in the last 24 h.)"
    elif kind == "tariff.changed":
        title = f"Tariff change: {data['change']}"
        body = f"{data['change']} of {data['subjectId']} is now {data['value']}, effective {data['effectiveMs']} (Unix ms)."
    elif kind == "sender_fee.increase":
        severity, title = "warning", "Sender fee increase announced"
        body = (
            f"The fee for adding authorised senders rises to {data['value']} RU at {data['effectiveMs']} (Unix ms); "
            "the fee in force until then is unchanged."
        )
    elif kind == "schedule.changed":
        severity, title = "warning", f"RU schedule {data['version']} in force"
        body = f"The RU schedule changed from {data['previous']} to {data['version']}; see GET /v1/pricing."
    return NewNotice(account, kind, severity, title, body, data, dedupe_key)


def mail_text(notice: Any) -> tuple[str, str]:
    """Subject and body of a notice's e-mail: the notice's own words (never a secret)."""
    scope = "all accounts" if notice.account is None else notice.account
    return (
        f"[gasless] {notice.title}",
        f"{notice.body}\n\nNotice {notice.seq} ({notice.kind}) for {scope}.\n"
        "Manage these mails with PUT /v1/account/{erd}/notifications.\n",
    )


Quotas = Callable[[list[str]], Awaitable[Mapping[str, Any]]]  # the Quota of several accounts, in one read


class NoticeSources:
    def __init__(
        self,
        repo: NoticeRepository,
        reads: SourceReads,
        prefs: PrefsRepository,
        *,
        quotas: Quotas,
        tariff_entries: Callable[[], Awaitable[list[Any]]] | None,
        append: Callable[[list[NewNotice]], Awaitable[Any]],
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.repo = repo
        self.reads = reads
        self.prefs = prefs
        self.quotas = quotas
        self.tariff_entries = tariff_entries
        self.append = append
        self.clock = clock
        self._seen: set[str] = set()  # dedupe keys stored or found stored (saves the insert attempt)
        # The sources' cursors as stored: read once per leadership (`forget_cursors` when it starts), written
        # only when they move. Reading and rewriting them every scan was half of an idle host's statements.
        self._cursors: dict[str, Any] = {}
        self._period_scan_at = 0
        self._period_nonce = -1  # the newest mirror refresh the period-ending check has seen
        # (source, account) -> the state already judged (newest write, and a count that moves with every
        # change even within one millisecond): the lookback shows rows again for 60 s, and judging an
        # account reads its Quota, so each change is judged once per leader.
        self._judged: dict[tuple[str, str], tuple[int, int]] = {}
        self._judged_at: dict[tuple[str, str], int] = {}  # (source, account) -> clock when last judged

    async def _emit(self, notices: list[NewNotice]) -> None:
        fresh = [n for n in notices if n.dedupe_key not in self._seen]
        if fresh:
            await self.append(fresh)
            self._seen.update(n.dedupe_key for n in fresh)
        if len(self._seen) > 100_000:
            self._seen.clear()

    async def scan(self) -> None:
        for source in (
            self._plan_thresholds,
            self._payg,
            self._purchases,
            self._period_ending,
            self._escrow,
            self._incidents,
            self._keys,
            self._webhooks,
            self._pricing,
        ):
            try:
                await source()
            except Exception as exc:  # noqa: BLE001 - one source failing must not stop the others
                log.warning("notice source failed", source=source.__name__, error=repr(exc))

    def _unjudged(self, source: str, changed: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
        now = self.clock()
        fresh = [
            (a, t, n)
            for a, t, n in changed
            if self._judged.get((source, a)) != (t, n)
            and now - self._judged_at.get((source, a), now - JUDGE_SPACING_MS) >= JUDGE_SPACING_MS
        ]
        if len(self._judged) > 100_000:
            self._judged.clear()
            self._judged_at.clear()
        return fresh

    def _judge(self, source: str, changed: list[tuple[str, int, int]]) -> None:
        now = self.clock()
        for account, at, count in changed:
            self._judged[(source, account)] = (at, count)
            self._judged_at[(source, account)] = now

    def forget_cursors(self) -> None:
        """Read the cursors from the database again (another host may have led in between)."""
        self._cursors.clear()

    async def _cursor(self, name: str) -> Any:
        if name not in self._cursors:
            self._cursors[name] = await self.repo.cursor(name)
        return self._cursors[name]

    async def _save_cursor(self, name: str, value: Any) -> None:
        if name in self._cursors and self._cursors[name] == value:
            return
        self._cursors.pop(name, None)  # unknown until the write is known to have landed
        await self.repo.save_cursor(name, value, self.clock())
        self._cursors[name] = value

    async def _since(self, name: str) -> int:
        saved = await self._cursor(name)
        return (int(saved) if saved is not None else self.clock()) - LOOKBACK_MS

    async def _advance(self, name: str, seen: list[int]) -> None:
        if seen:
            await self._save_cursor(name, max(seen))
        elif await self._cursor(name) is None:
            await self._save_cursor(name, self.clock() - LOOKBACK_MS)

    # Plan usage -----------------------------------------------------------------------------------------
    async def _plan_thresholds(self) -> None:
        seen = await self.reads.plan_usage_changed(await self._since("usage"))
        changed = self._unjudged("usage", seen)
        prefs = await self.prefs.many([a for a, _, _ in changed])
        notices, judged = [], []
        quotas = await self.quotas([a for a, _, _ in changed]) if changed else {}
        for account, at, count in changed:
            quota = quotas[account]
            included, used = quota.includedRu, quota.usedRu
            if not included or used is None:
                continue  # the mirror has not seen the plan yet: judged again next time
            judged.append((account, at, count))
            pct = used * 100 // included
            for threshold in thresholds_of(prefs.get(account)).planUsedPct:
                if pct >= threshold:
                    data = {
                        "periodId": quota.periodId,
                        "thresholdPct": threshold,
                        "usedRu": used,
                        "includedRu": included,
                        "usedPct": int(pct),
                    }
                    key = f"plan.threshold:{account}:{quota.periodId}:{threshold}"
                    notices.append(compose("plan.threshold", account, data, key))
        await self._emit(notices)
        self._judge("usage", judged)
        await self._advance("usage", [t for _, t, _ in seen])

    async def _payg(self) -> None:
        seen = await self.reads.payg_reserved(await self._since("payg"))
        reserved = self._unjudged("payg", seen)
        prefs = await self.prefs.many([a for a, _, _ in reserved])
        notices, judged = [], []
        quotas = await self.quotas([a for a, _, _ in reserved]) if reserved else {}
        for account, at, count in reserved:
            quota = quotas[account]
            if quota.state == "NO_ACCOUNT":
                continue  # not mirrored yet: judged again next time
            judged.append((account, at, count))
            period = quota.periodId
            if period is not None:
                key = f"payg.started:{account}:{period}"
                notices.append(compose("payg.started", account, {"periodId": period}, key))
            threshold = thresholds_of(prefs.get(account)).paygSpentMicro
            if threshold is None:
                continue
            start = period if period is not None else self.clock() - self.clock() % 2_592_000_000
            spent = await self.reads.payg_spent(account, start)
            if spent >= threshold:
                data = {"periodId": start, "spentMicro": spent, "thresholdMicro": threshold}
                notices.append(compose("payg.spending", account, data, f"payg.spending:{account}:{start}"))
        await self._emit(notices)
        self._judge("payg", judged)
        await self._advance("payg", [t for _, t, _ in seen])

    # The contract's events ------------------------------------------------------------------------------
    async def _purchases(self) -> None:
        cursor = await self._cursor("purchases")
        if cursor is None:  # the first start: history is not news
            await self._save_cursor("purchases", await self.reads.last_purchase_seq())
            return
        rows = await self.reads.purchases_after(int(cursor), 500)
        notices = []
        for row in rows:
            kind = PURCHASE_KINDS.get(row.kind)
            if kind is None:
                continue
            data = {
                "tierId": row.tier_id,
                "txHash": row.tx_hash,
                "blockTsMs": row.block_ts_ms,
                "event": row.event,
            }
            notices.append(compose(kind, row.account, data, f"{kind}:{row.tx_hash}:{row.event_index}"))
        await self._emit(notices)
        if rows:
            await self._save_cursor("purchases", int(rows[-1].seq))

    async def _period_ending(self) -> None:
        """Accounts the mirror just refreshed (a purchase, a grant) at once; all of them every minute, as
        time brings plan ends into the 72 h window."""
        now = self.clock()
        everyone = now - self._period_scan_at >= PERIOD_SCAN_MS
        rows = await self.reads.accounts(-1 if everyone else self._period_nonce)
        if everyone:
            self._period_scan_at = now
        notices = []
        for row in rows:
            self._period_nonce = max(self._period_nonce, int(row.hyperblock_nonce))
            end = int((row.running or {}).get("end_ms") or 0)
            if not end or not (now < end <= now + PERIOD_ENDING_MS):
                continue
            data = {"endMs": end, "tierId": row.running.get("tier_id"), "autoRenew": bool(row.auto_renew)}
            key = f"plan.period_ending:{row.address}:{end}"
            notices.append(compose("plan.period_ending", row.address, data, key))
        await self._emit(notices)

    async def _escrow(self) -> None:
        watched = await self.prefs.with_thresholds()
        watched = [p for p in watched if p.thresholds.get("escrowBelowMicro") is not None]
        mirrored = await self.reads.escrow_of([p.account for p in watched])
        for prefs in watched:
            row = mirrored.get(prefs.account)
            if row is None or not (row.payg or {}).get("enabled"):
                continue
            threshold = int(prefs.thresholds["escrowBelowMicro"])
            low = int(row.escrow_micro) < threshold
            if low and not prefs.escrow_low:
                data = {"escrowMicro": int(row.escrow_micro), "thresholdMicro": threshold}
                key = f"escrow.low:{prefs.account}:{row.hyperblock_nonce}"
                await self._emit([compose("escrow.low", prefs.account, data, key)])
            if low != prefs.escrow_low:
                await self.prefs.set_escrow_low(prefs.account, low)

    # Incidents ------------------------------------------------------------------------------------------
    async def _incidents(self) -> None:
        updates = await self.reads.incident_updates_since(await self._since("incidents"))
        for update in updates:
            marker = f"incident:{update.incident_id}:{update.seq}"
            if marker in self._seen:
                continue
            if update.status == "resolved":
                kind = "incident.resolved"
            else:
                kind = "incident.declared" if update.seq == 1 else "incident.updated"
            start = int(update.created_at_ms) - AFFECTED_BEFORE_MS
            end = int(update.resolved_at_ms or update.at_ms)
            affected = await self.reads.accounts_with_relays(update.shard, start, max(end, int(update.at_ms)))
            data = {
                "incidentId": update.incident_id,
                "updateSeq": int(update.seq),
                "status": update.status,
                "title": update.title,
                "body": update.body,
                "impact": update.impact,
                "shard": update.shard,
                "source": update.source,
                "atMs": int(update.at_ms),
            }
            await self._emit([compose(kind, a, data, f"{marker}:{a}") for a in sorted(affected)])
            self._seen.add(marker)
        await self._advance("incidents", [int(u.at_ms) for u in updates])

    # Webhooks -------------------------------------------------------------------------------------------
    async def _keys(self) -> None:
        since = await self._since("keys")
        changes = await self.reads.key_changes(since)
        notices, seen = [], []
        for row in changes:
            data = {"keyId": row.key_id, "label": row.label, "env": row.env}
            if row.created_at_ms >= since:
                notices.append(compose("key.created", row.account, data, f"key.created:{row.key_id}"))
                seen.append(int(row.created_at_ms))
            if row.revoked_at_ms is not None and row.revoked_at_ms >= since:
                notices.append(compose("key.revoked", row.account, data, f"key.revoked:{row.key_id}"))
                seen.append(int(row.revoked_at_ms))
        await self._emit(notices)
        await self._advance("keys", seen)

    async def _webhooks(self) -> None:
        failed = await self.reads.failed_deliveries(await self._since("webhooks"))
        notices = []
        for row in failed:
            if row.event_type == "webhook.failing":
                continue  # a failing endpoint is told once a day, not once per failed notice of it
            day = int(row.completed_at_ms) // 86_400_000
            data = {
                "webhookId": row.webhook_id,
                "url": row.url,
                "eventType": row.event_type,
                "attempts": int(row.attempts),
                "responseCode": row.last_status_code,
                "error": row.last_error,
            }
            notices.append(
                compose("webhook.failing", row.account, data, f"webhook.failing:{row.webhook_id}:{day}")
            )
        await self._emit(notices)
        await self._advance("webhooks", [int(r.completed_at_ms) for r in failed])

    # Pricing (global notices) ---------------------------------------------------------------------------
    async def _pricing(self) -> None:
        schedule = await self._cursor("schedule")
        if schedule is not None and schedule != RU_SCHEDULE_VERSION:
            data = {"version": RU_SCHEDULE_VERSION, "previous": schedule}
            await self._emit(
                [compose("schedule.changed", None, data, f"schedule.changed:{RU_SCHEDULE_VERSION}")]
            )
        if schedule != RU_SCHEDULE_VERSION:
            await self._save_cursor("schedule", RU_SCHEDULE_VERSION)
        if self.tariff_entries is None:
            return
        entries = await self.tariff_entries()
        if not entries:
            return
        newest = max(e.seq for e in entries)
        cursor = await self._cursor("tariff")
        if cursor is None:  # the first start: the tariff so far is not news
            await self._save_cursor("tariff", newest)
            return
        notices = []
        for entry in sorted(entries, key=lambda e: e.seq):
            if entry.seq <= int(cursor):
                continue
            data = {
                "tariffSeq": entry.seq,
                "change": entry.kind,
                "subjectId": entry.subjectId,
                "value": entry.value,
                "effectiveMs": entry.effectiveMs,
                "policyVersion": entry.policyVersion,
            }
            increase = entry.kind == "SenderFeeRu" and entry.effectiveMs > entry.timestampMs
            kind = "sender_fee.increase" if increase else "tariff.changed"
            notices.append(compose(kind, None, data, f"tariff:{entry.seq}"))
        await self._emit(notices)
        if newest > int(cursor):
            await self._save_cursor("tariff", newest)
