"""The usage reads: pages of usage rows, one row with its settlement, and the period summary.

Collaborators come in explicitly: the repository, the cursor codec, the contract mirror (authorised senders,
the running plan for the default period) and the round duration (roundsToInclusion).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gasless.billing.entitlement import PERIOD_MS, period_of
from gasless.chain.addresses import shard_of
from gasless.core.errors import ApiError
from gasless.http.pages import PageParams
from gasless.relay.intents import latency
from gasless.usage.repository import REJECTION_RETENTION_MS, UsageFilters, UsageRepository
from gasless.usage.rollups import RollupRepository, merged, percentile
from gasless.usage.schemas import (
    GatewayAck,
    LatencyPercentiles,
    SettlementBatch,
    UsageBucket,
    UsageRow,
    UsageRowsPage,
    UsageSummary,
    UsageTop,
    UsageTotals,
)

LISTING = "usage"
BUCKET_MS = {"hour": 3_600_000, "day": 86_400_000}
TOP_N = 10


def ledger_row(row: Any, round_ms: int) -> UsageRow:
    billed = bool(row.billed)
    dead = row.status == "dead"
    return UsageRow(
        txHash=row.tx_hash,
        id=f"{row.sender}:{row.nonce}",
        sender=row.sender,
        nonce=int(row.nonce),
        receiver=row.receiver,
        function=row.function,
        relayer=row.relayer,
        senderShard=int(row.sender_shard),
        status=row.status,
        state="DEAD" if dead else ("FINALIZED" if row.finalized_at_ms is not None else "EXECUTED"),
        inFlight=False,
        billed=billed,
        billingClass=row.billing_class if billed else None,
        ru=int(row.ru) if billed and row.ru is not None else None,
        paygMicro=int(row.payg_micro) if billed and row.payg_micro is not None else None,
        periodId=int(row.period_id) if billed and row.period_id is not None else None,
        apiKeyId=row.api_key_id if billed else None,
        gasLimit=int(row.gas_limit),
        gasPrice=int(row.gas_price),
        receivedAtMs=row.received_at_ms,
        cosignedAtMs=row.cosigned_at_ms,
        broadcastAtMs=row.broadcast_at_ms,
        executedBlockTsMs=row.executed_block_ts_ms,
        finalizedAtMs=row.finalized_at_ms,
        terminalAtMs=int(row.terminal_at_ms),
        latency=latency(
            received=row.received_at_ms,
            cosigned=row.cosigned_at_ms,
            broadcast=row.broadcast_at_ms,
            executed=row.executed_block_ts_ms,
            finalized=row.finalized_at_ms,
            round_ms=round_ms,
        ),
        deadReason=row.dead_reason if dead else None,
        failureCode=getattr(row, "failure_code", None),
        route=getattr(row, "route", None) or "native",
        batchId=row.batch_id,
    )


def in_flight_row(row: Any, round_ms: int) -> UsageRow:
    billing = row.billing if isinstance(row.billing, dict) else {}
    return UsageRow(
        txHash=row.tx_hash,
        id=f"{row.sender}:{row.nonce}",
        sender=row.sender,
        nonce=int(row.nonce),
        receiver=row.receiver,
        function=billing.get("function"),
        route=billing.get("route") if billing.get("route") in ("compat", "probe") else "native",
        relayer=row.relayer,
        senderShard=int(row.sender_shard),
        status=None,
        state=row.state,
        inFlight=True,
        billed=False,
        billingClass=None,
        ru=None,
        paygMicro=None,
        periodId=None,
        apiKeyId=None,
        gasLimit=int(row.gas_limit),
        gasPrice=int(row.gas_price),
        receivedAtMs=row.received_at_ms,
        cosignedAtMs=row.cosigned_at_ms,
        broadcastAtMs=row.broadcast_at_ms,
        executedBlockTsMs=None,
        finalizedAtMs=None,
        terminalAtMs=None,
        latency=latency(
            received=row.received_at_ms,
            cosigned=row.cosigned_at_ms,
            broadcast=row.broadcast_at_ms,
            executed=None,
            finalized=None,
            round_ms=round_ms,
        ),
    )


def rejected_row(row: Any, round_ms: int) -> UsageRow:
    return UsageRow(
        txHash=row.tx_hash,
        id=f"{row.sender}:{row.nonce}",
        sender=row.sender,
        nonce=int(row.nonce),
        receiver=None,
        function=None,
        relayer=None,
        senderShard=shard_of(row.sender),
        status=None,
        state="REJECTED",
        inFlight=False,
        billed=False,
        billingClass=None,
        ru=None,
        paygMicro=None,
        periodId=None,
        apiKeyId=None,
        gasLimit=None,
        gasPrice=None,
        receivedAtMs=row.received_at_ms,
        cosignedAtMs=None,
        broadcastAtMs=None,
        executedBlockTsMs=None,
        finalizedAtMs=None,
        terminalAtMs=int(row.received_at_ms),
        latency=latency(
            received=row.received_at_ms,
            cosigned=None,
            broadcast=None,
            executed=None,
            finalized=None,
            round_ms=round_ms,
        ),
        rejectCode=row.code,
    )


def intent_account(row: Any) -> str | None:
    billing = row.billing if isinstance(row.billing, dict) else {}
    account = billing.get("account")
    return str(account) if account is not None else None


class UsageService:
    def __init__(
        self,
        repo: UsageRepository,
        cursors: Any,
        mirror: Any,
        round_ms: Callable[[], int],
        *,
        rollups: RollupRepository | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.repo = repo
        self.cursors = cursors
        self.mirror = mirror
        self.round_ms = round_ms
        self.rollups = rollups  # the series' inclusion percentiles (never from raw rows)
        self.clock = clock

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _senders_of(self, account: str) -> list[str]:
        """The addresses whose REJECTED submissions the account sees: itself and its authorised senders
        (a rejection happens before the paying account is known)."""
        senders = [account]
        if self.mirror is not None:
            senders += [s for s in await self.mirror.senders(account) if s != account]
        return senders

    def _rejections_apply(self, filters: UsageFilters) -> bool:
        if not filters.include_in_flight:
            return False
        if filters.states is not None and "REJECTED" not in filters.states:
            return False
        return not (
            filters.relayer is not None
            or filters.statuses is not None
            or filters.min_inclusion_ms is not None
            or filters.billing_filtered
        )

    def _in_flight_applies(self, filters: UsageFilters) -> bool:
        if not filters.include_in_flight:
            return False
        if filters.states is not None and not {"COSIGNED", "BROADCAST"} & set(filters.states):
            return False
        return not (
            filters.statuses is not None or filters.min_inclusion_ms is not None or filters.billing_filtered
        )

    def _keeps_in_flight(self, filters: UsageFilters, row: Any) -> bool:
        account = intent_account(row)
        if not (account == filters.account or (account is None and row.sender == filters.account)):
            return False
        if filters.states is not None and row.state not in filters.states:
            return False
        if filters.relayer is not None and row.relayer != filters.relayer:
            return False
        if filters.shards is not None and int(row.sender_shard) not in filters.shards:
            return False
        if filters.q is not None:
            billing = row.billing if isinstance(row.billing, dict) else {}
            fields = (row.sender, row.receiver, str(billing.get("function") or ""))
            if not (
                str(row.tx_hash).startswith(filters.q.lower()) or any(f.startswith(filters.q) for f in fields)
            ):
                return False
        return True

    async def page(self, filters: UsageFilters, params: PageParams) -> UsageRowsPage:
        binding = filters.binding()
        phase, after_flight, after_terminal = "f", None, None
        if params.cursor is not None:
            position = self.cursors.open(params.cursor, LISTING, binding)
            phase, key = _parse_position(position)
            if phase == "f":
                after_flight = key
            else:
                after_terminal = key
        round_ms = self.round_ms()
        items: list[UsageRow] = []
        limit = params.limit
        if phase == "f":
            if self._in_flight_applies(filters):
                rows = [
                    r for r in await self.repo.in_flight(filters.sender) if self._keeps_in_flight(filters, r)
                ]
                rows.sort(key=lambda r: (int(r.cosigned_at_ms), int(r.pk)), reverse=True)
                if after_flight is not None:
                    rows = [r for r in rows if (int(r.cosigned_at_ms), int(r.pk)) < tuple(after_flight)]
                if len(rows) > limit:
                    page = rows[:limit]
                    last = page[-1]
                    cursor = self.cursors.mint(
                        LISTING, binding, {"ph": "f", "k": [int(last.cosigned_at_ms), int(last.pk)]}
                    )
                    return UsageRowsPage(items=[in_flight_row(r, round_ms) for r in page], nextCursor=cursor)
                items = [in_flight_row(r, round_ms) for r in rows]
            phase = "t"
        want = limit - len(items)
        if want == 0:
            cursor = self.cursors.mint(LISTING, binding, {"ph": "t", "k": None})
            return UsageRowsPage(items=items, nextCursor=cursor)
        merged = await self.repo.ledger_page(filters, after_terminal, want + 1)
        if self._rejections_apply(filters):
            senders = await self._senders_of(filters.account)
            if filters.sender is not None:
                senders = [s for s in senders if s == filters.sender]
            if filters.shards is not None:
                senders = [s for s in senders if shard_of(s) in filters.shards]
            if senders:
                since = self._now_ms() - REJECTION_RETENTION_MS
                merged += await self.repo.rejection_page(filters, senders, since, after_terminal, want + 1)
        merged.sort(key=lambda pair: pair[0], reverse=True)
        more = len(merged) > want
        chosen = merged[:want]
        for key, row in chosen:
            items.append(ledger_row(row, round_ms) if key[2] == 1 else rejected_row(row, round_ms))
        cursor = None
        if more:
            cursor = self.cursors.mint(LISTING, binding, {"ph": "t", "k": list(chosen[-1][0])})
        return UsageRowsPage(items=items, nextCursor=cursor)

    async def row(self, tx_hash: str) -> tuple[str, UsageRow] | None:
        """The row of `tx_hash` and the account it belongs to (for the caller's access check), or None."""
        round_ms = self.round_ms()
        found = await self.repo.ledger_row(tx_hash)
        if found is None:
            intent = await self.repo.intent_by_hash(tx_hash)
            if intent is None:
                return None
            if intent.state in ("COSIGNED", "BROADCAST"):
                detail = in_flight_row(intent, round_ms).model_copy(
                    update={
                        "acknowledgements": _acks(
                            getattr(intent, "first_ack_gateway", None), intent.broadcast_at_ms
                        )
                    }
                )
                return str(intent_account(intent) or intent.sender), detail
            # It left flight between the two reads; its ledger row committed with that move.
            found = await self.repo.ledger_row(tx_hash)
            if found is None:
                return None
        settlement = None
        if found.batch_id is not None:
            batch = await self.repo.batch(int(found.batch_id))
            if batch is not None:
                settlement = SettlementBatch(
                    batchId=int(batch.batch_id),
                    state=batch.state,
                    usageRoot=batch.usage_root,
                    rowCount=int(batch.row_count),
                    totalRu=int(batch.total_ru),
                    leafIndex=found.leaf_index,
                    txHash=batch.tx_hash,
                    createdAtMs=int(batch.created_at_ms),
                    submittedAtMs=batch.submitted_at_ms,
                    committedAtMs=batch.committed_at_ms,
                )
        detail = ledger_row(found, round_ms).model_copy(
            update={
                "settlement": settlement,
                "acknowledgements": _acks(found.first_ack_gateway, found.broadcast_at_ms),
            }
        )
        return str(found.account or found.sender), detail

    async def default_period(self, account: str) -> int:
        """The running plan's current period; without one, the 30-day window containing now (from epoch)."""
        now = self._now_ms()
        view = await self.mirror.account(account) if self.mirror is not None else None
        running = getattr(view, "running", None) if view is not None else None
        if running is not None:
            period = period_of(int(running.start_ms), int(running.end_ms), now)
            if period is not None:
                return period
        return now - now % PERIOD_MS

    async def _inclusion(
        self, account: str, from_ms: int, to_ms: int, step: int
    ) -> dict[int, LatencyPercentiles]:
        """Per series bucket: inclusion percentiles merged from the account's 1-hour rollups."""
        if self.rollups is None:
            return {}
        rows = await self.rollups.read(
            "acct_shard",
            granularity="h",
            from_ms=from_ms,
            to_ms=to_ms,
            key_prefix=f"{account}|",
            metrics=("inclusion",),
        )
        grouped: dict[int, list[str]] = defaultdict(list)
        for row in rows:
            grouped[row.bucket_ms // step * step].append(row.histogram)
        result = {}
        for start, encoded in grouped.items():
            histogram = merged(encoded)
            result[start] = LatencyPercentiles(
                p50Ms=percentile(histogram, 50),
                p95Ms=percentile(histogram, 95),
                p99Ms=percentile(histogram, 99),
            )
        return result

    async def summary(self, account: str, period_id: int | None, bucket: str) -> UsageSummary:
        if period_id is None:
            period_id = await self.default_period(account)
        end = period_id + PERIOD_MS
        rows = await self.repo.period_rows(account, period_id, end)
        rejected = await self.repo.rejected_count(await self._senders_of(account), period_id, end)
        step = BUCKET_MS[bucket]
        by_status: dict[str, int] = {"success": 0, "failed": 0, "dead": 0, "rejected": rejected}
        by_class: dict[str, int] = defaultdict(int)
        totals = {"ru": 0, "payg": 0, "tx": 0, "fail": 0}
        buckets: dict[int, dict[str, Any]] = {}
        senders: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        receivers: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for row in rows:
            by_status[row.status] += 1
            start = int(row.terminal_at_ms) // step * step
            slot = buckets.setdefault(start, {"ru": 0, "payg": 0, "tx": 0, "fail": 0})
            if not row.billed:
                continue
            ru, payg = int(row.ru or 0), int(row.payg_micro or 0)
            failed = row.status == "failed"
            for target in (totals, slot):
                target["ru"] += ru
                target["payg"] += payg
                target["tx"] += 1
                target["fail"] += int(failed)
            by_class[str(row.billing_class)] += ru
            for table, address in ((senders, row.sender), (receivers, row.receiver)):
                table[address][0] += ru
                table[address][1] += 1
        inclusion = await self._inclusion(account, period_id, end, step)
        return UsageSummary(
            account=account,
            periodId=period_id,
            periodEndMs=end,
            bucket=bucket,  # type: ignore[arg-type]
            totals=UsageTotals(
                ru=totals["ru"],
                paygMicro=totals["payg"],
                txCount=totals["tx"],
                failCount=totals["fail"],
                txCountByStatus=by_status,
                ruByClass=dict(by_class),
            ),
            series=[
                UsageBucket(
                    startMs=start,
                    ru=slot["ru"],
                    paygMicro=slot["payg"],
                    txCount=slot["tx"],
                    failCount=slot["fail"],
                    inclusion=inclusion.get(start, EMPTY_PERCENTILES),
                )
                for start, slot in sorted(buckets.items())
            ],
            topSenders=_top(senders),
            topReceivers=_top(receivers),
        )


EMPTY_PERCENTILES = LatencyPercentiles(p50Ms=None, p95Ms=None, p99Ms=None)


def _top(table: dict[str, list[int]]) -> list[UsageTop]:
    ranked = sorted(table.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    return [UsageTop(address=address, ru=ru, txCount=count) for address, (ru, count) in ranked[:TOP_N]]


def _acks(gateway: str | None, broadcast_at_ms: int | None) -> list[GatewayAck]:
    """What the service keeps of acknowledgements: the first one (its time, and its gateway if recorded)."""
    if broadcast_at_ms is None:
        return []
    return [GatewayAck(gateway=gateway, atMs=int(broadcast_at_ms), first=True)]


def _parse_position(position: Any) -> tuple[str, Any]:
    invalid = ApiError("CURSOR_INVALID", detail="the cursor is malformed; use a page's nextCursor as given")
    if not isinstance(position, dict) or position.get("ph") not in ("f", "t"):
        raise invalid
    key = position.get("k")
    if position["ph"] == "f":
        if not (isinstance(key, list) and len(key) == 2 and all(isinstance(v, int) for v in key)):
            raise invalid
        return "f", key
    if key is None:
        return "t", None
    if not (
        isinstance(key, list)
        and len(key) == 4
        and isinstance(key[0], int)
        and isinstance(key[1], str)
        and isinstance(key[2], int)
        and isinstance(key[3], int)
    ):
        raise invalid
    return "t", tuple(key)
