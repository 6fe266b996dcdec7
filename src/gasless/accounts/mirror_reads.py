"""Account, quota and purchase-timeline reads over the contract mirror."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.accounts.schemas import Account, PaygSettings, PlanBlock, PurchaseEvent, PurchasesPage, Quota
from gasless.core.errors import ApiError
from gasless.db.tables import PURCHASE_KINDS, account_period_usage
from gasless.http.formats import CommaList
from gasless.http.pages import CursorCodec, PageParams, TimeWindow
from gasless.mirror.repository import MirrorRepository

PERIOD_MS = 2_592_000_000  # 30 days: a plan block of n months has n periods from its start
PURCHASES_LISTING = "listAccountPurchases"
CSV_CHUNK = 500
CSV_COLUMNS = (
    "blockTsMs",
    "kind",
    "event",
    "amountMicro",
    "tierId",
    "txHash",
    "eventIndex",
    "hyperblockNonce",
    "details",
)


def period_of(start_ms: int, end_ms: int, now_ms: int) -> int | None:
    """The running period's id: its start in ms (same rule as the billing core); None without a period."""
    if end_ms == 0:
        return None
    return start_ms + (max(0, now_ms - start_ms) // PERIOD_MS) * PERIOD_MS


KIND_LIST = CommaList("kind", PURCHASE_KINDS)  # `kind=deposit,grant`: the pattern the document publishes


def parse_kinds(raw: str | None) -> list[str] | None:
    kinds = KIND_LIST.parse(raw)
    return sorted(kinds) if kinds is not None else None


class AccountReads:
    def __init__(
        self,
        engine: AsyncEngine,
        mirror: MirrorRepository,
        cursors: CursorCodec,
        chain_now_ms: Callable[[], int],
    ) -> None:
        self.engine = engine
        self.mirror = mirror
        self.cursors = cursors
        self.chain_now_ms = chain_now_ms

    async def _tier_names(self) -> dict[int, dict[str, Any]]:
        tiers = await self.mirror.view("tiers") or []
        return {int(t["id"]): t for t in tiers}

    @staticmethod
    def _block(block: dict[str, Any] | None, tiers: dict[int, dict[str, Any]]) -> PlanBlock | None:
        if block is None:
            return None
        tier = tiers.get(int(block["tier_id"]))
        return PlanBlock(
            tierId=int(block["tier_id"]),
            tierName=tier["name"] if tier else None,
            startMs=int(block["start_ms"]),
            endMs=int(block["end_ms"]) or None,
            includedRu=int(block["included_ru"]),
            months=int(block["months"]),
            pricePaidMicro=int(block["price_paid_micro"]),
            ref=str(block["ref"]),
        )

    async def account(self, address: str) -> Account:
        row = await self.mirror.account(address)
        if row is None:
            raise ApiError("NOT_FOUND", detail=f"no account {address} in the billing contract")
        tiers = await self._tier_names()
        payg = row["payg"]
        return Account(
            address=address,
            creditsMicro=row["credits_micro"],
            escrowMicro=row["escrow_micro"],
            runningPlan=self._block(row["running"], tiers),
            queuedPlan=self._block(row["queued"], tiers),
            autoRenew=row["auto_renew"],
            payg=PaygSettings(
                enabled=bool(payg["enabled"]),
                budgetMicro=int(payg["budget_micro"]),
                autoTopup=bool(payg["auto_topup"]),
                maxPaygPriceMicro=int(payg["max_payg_price_micro"]),
            ),
            suspended=row["suspended"],
            createdMs=row["created_ms"],
            senderCount=row["sender_count"],
            mirroredHyperblockNonce=row["hyperblock_nonce"],
        )

    async def quota(self, address: str) -> Quota:
        return (await self.quotas([address]))[address]

    async def quotas(self, addresses: Sequence[str]) -> dict[str, Quota]:
        """The Quota of each address, read together: one query for the accounts, one for the tier names and
        one for the plan usage rows, whatever their number. The streams' `quota` topic reads every account
        whose intents settled in a window this way: one read per account was three statements each, most
        of a busy multi-host service's statements after the relay's own (bench/statements.py)."""
        now = self.chain_now_ms()
        wanted = list(dict.fromkeys(addresses))
        rows = await self.mirror.accounts(wanted)
        # address -> (the paying account, how it was resolved, its row); an address without an account of
        # its own is looked up as an authorised sender (rare: the topic names paying accounts).
        found: dict[str, tuple[str, str, dict[str, Any] | None]] = {}
        for address in wanted:
            if address in rows:
                found[address] = (address, "account", rows[address])
                continue
            owner = await self.mirror.account_of_sender(address)
            row = await self.mirror.account(owner) if owner is not None else None
            found[address] = (owner or address, "authorised_sender", row)
        tiers = await self._tier_names() if any(row is not None for _, _, row in found.values()) else {}
        quotas: dict[str, Quota] = {}
        pending: dict[str, tuple[dict[str, Any], dict[str, Any], int, bool]] = {}
        for address, (account, resolved, row) in found.items():
            outcome = self._quota_before_usage(address, account, resolved, row, tiers, now)
            if isinstance(outcome, Quota):
                quotas[address] = outcome
            else:
                pending[address] = outcome
        used = await self._used_many({(found[a][0], period) for a, (_, _, period, _) in pending.items()})
        for address, (base, running, period, payg_funded) in pending.items():
            quotas[address] = self._quota_with_usage(
                base, running, period, payg_funded, used.get((found[address][0], period), 0)
            )
        return quotas

    def _quota_before_usage(
        self,
        address: str,
        account: str,
        resolved: str,
        row: dict[str, Any] | None,
        tiers: dict[int, dict[str, Any]],
        now: int,
    ) -> Quota | tuple[dict[str, Any], dict[str, Any], int, bool]:
        """The Quota when the plan usage row does not matter; else what `_quota_with_usage` needs."""
        if row is None:
            return Quota(
                address=address, account=None, resolvedFrom=None, state="NO_ACCOUNT", evaluatedAtMs=now
            )
        base: dict[str, Any] = {
            "address": address,
            "account": account,
            "resolvedFrom": resolved,
            "evaluatedAtMs": now,
            "creditsMicro": row["credits_micro"],
            "escrowMicro": row["escrow_micro"],
            "paygEnabled": bool(row["payg"]["enabled"]),
        }
        # The contract promotes a queued block once the running one ended: evaluate as it would now.
        running, queued = row["running"], row["queued"]
        if queued is not None and (running is None or (running["end_ms"] and running["end_ms"] <= now)):
            if queued["start_ms"] <= now:
                running = queued
        payg_funded = bool(row["payg"]["enabled"]) and (
            row["escrow_micro"] > 0 or (bool(row["payg"]["auto_topup"]) and row["credits_micro"] > 0)
        )
        if row["suspended"]:
            return Quota(**base, state="halted", haltReason="suspended")
        if running is not None:
            tier = tiers.get(int(running["tier_id"]))
            base.update(tierId=int(running["tier_id"]), rateClass=int(tier["rateClass"]) if tier else None)
        if running is None or (running["end_ms"] and running["end_ms"] <= now):
            if payg_funded:
                return Quota(**base, state="payg")
            return Quota(**base, state="halted", haltReason="no_plan" if running is None else "plan_ended")
        period = period_of(int(running["start_ms"]), int(running["end_ms"]), now)
        if period is None:  # a period-less (pay-as-you-go) tier
            return Quota(
                **base,
                state="payg" if payg_funded else "halted",
                haltReason=None if payg_funded else "no_plan",
            )
        return base, running, period, payg_funded

    @staticmethod
    def _quota_with_usage(
        base: dict[str, Any], running: dict[str, Any], period: int, payg_funded: bool, used: int
    ) -> Quota:
        included = int(running["included_ru"])
        base.update(
            periodId=period,
            periodStartMs=period,
            periodEndMs=min(period + PERIOD_MS, int(running["end_ms"])),
            includedRu=included,
            usedRu=used,
            remainingRu=max(0, included - used),
        )
        if used < included:
            return Quota(**base, state="active")
        if payg_funded:
            return Quota(**base, state="payg")
        return Quota(**base, state="halted", haltReason="quota_exhausted")

    async def _used_many(self, keys: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """RU used per (account, period) in one query; a pair without a usage row has used none."""
        if not keys:
            return {}
        usage = account_period_usage.c
        query = select(usage.account, usage.period_id, usage.ru_used).where(
            or_(*(and_(usage.account == account, usage.period_id == period) for account, period in keys))
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {(str(account), int(period)): int(used) for account, period, used in rows}

    # Purchases --------------------------------------------------------------------------------------
    async def _require_account(self, address: str) -> None:
        if await self.mirror.account(address) is None:
            raise ApiError("NOT_FOUND", detail=f"no account {address} in the billing contract")

    @staticmethod
    def _event(row: dict[str, Any]) -> PurchaseEvent:
        return PurchaseEvent(
            kind=row["kind"],
            event=row["event"],
            amountMicro=row["amount_micro"],
            tierId=row["tier_id"],
            txHash=row["tx_hash"],
            eventIndex=row["event_index"],
            hyperblockNonce=row["hyperblock_nonce"],
            blockTsMs=row["block_ts_ms"],
            details=row["details"],
        )

    async def purchases(
        self, address: str, kinds: list[str] | None, window: TimeWindow, page: PageParams
    ) -> PurchasesPage:
        filters = {"account": address, "kinds": kinds, "from": window.from_ms, "to": window.to_ms}
        before = None
        if page.cursor is not None:
            position = self.cursors.open(page.cursor, PURCHASES_LISTING, filters)
            if not isinstance(position, int) or isinstance(position, bool) or position < 0:
                raise ApiError("CURSOR_INVALID", detail="the cursor is malformed")
            before = position
        await self._require_account(address)
        rows = await self.mirror.purchases(
            address,
            kinds=kinds,
            from_ms=window.from_ms,
            to_ms=window.to_ms,
            before_seq=before,
            limit=page.limit + 1,
        )
        more = len(rows) > page.limit
        rows = rows[: page.limit]
        next_cursor = self.cursors.mint(PURCHASES_LISTING, filters, rows[-1]["seq"]) if more else None
        return PurchasesPage(items=[self._event(r) for r in rows], nextCursor=next_cursor)

    async def purchases_csv(
        self, address: str, kinds: list[str] | None, window: TimeWindow
    ) -> AsyncIterator[str]:
        """Every matching row, newest first, read in chunks (the account is checked before streaming)."""
        await self._require_account(address)

        async def stream() -> AsyncIterator[str]:
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\r\n")
            writer.writerow(CSV_COLUMNS)
            before: int | None = None
            while True:
                rows = await self.mirror.purchases(
                    address,
                    kinds=kinds,
                    from_ms=window.from_ms,
                    to_ms=window.to_ms,
                    before_seq=before,
                    limit=CSV_CHUNK,
                )
                for row in rows:
                    writer.writerow(
                        (
                            row["block_ts_ms"],
                            row["kind"],
                            row["event"],
                            "" if row["amount_micro"] is None else row["amount_micro"],
                            "" if row["tier_id"] is None else row["tier_id"],
                            row["tx_hash"],
                            row["event_index"],
                            row["hyperblock_nonce"],
                            json.dumps(row["details"], separators=(",", ":"), sort_keys=True),
                        )
                    )
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
                if len(rows) < CSV_CHUNK:
                    return
                before = rows[-1]["seq"]

        return stream()


def wall_clock_ms() -> int:
    return int(time.time() * 1000)
