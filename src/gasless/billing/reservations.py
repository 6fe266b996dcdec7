"""Reservations at the commit point and their settlement by the tracker, in the callers' transactions.

`reserve` runs inside the commit transaction (IntentRepository.commit): one reservation per intent (its
primary key is the intent's), so a duplicate submission never reserves twice. A plan's period cap is taken
by one conditional UPDATE of `account_period_usage` (`ru_used + ru <= cap`), inserting the period's row
when it does not exist yet; racing relays on any host therefore never overspend a plan. When the cap is
spent, pay-as-you-go pays if the decision priced it (escrow and budget permitting), else QUOTA_EXHAUSTED
rolls the whole commit back: the relayer signature is discarded and nothing was sent.

`settle` runs inside the tracker's batch transaction: EXECUTED -> reservation `settled` and a billed ledger
row (`success`/`failed`); DEAD -> reservation `released` (a plan's RU given back) and an unbilled `dead`
row; FINALIZED -> the row's `finalized_at_ms`.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from gasless.db import account_period_usage, intents, reservations, usage_ledger
from gasless.errors import ApiError


def _insert(conn: AsyncConnection, table: Any) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


async def _take_plan_ru(
    conn: AsyncConnection, account: str, period_id: int, ru: int, cap: int, now: int
) -> bool:
    taken = await conn.execute(
        update(account_period_usage)
        .where(
            account_period_usage.c.account == account,
            account_period_usage.c.period_id == period_id,
            account_period_usage.c.ru_used + ru <= cap,
        )
        .values(ru_used=account_period_usage.c.ru_used + ru, updated_at_ms=now)
    )
    if taken.rowcount == 1:
        return True
    if ru > cap:
        return False
    inserted = await conn.execute(
        _insert(conn, account_period_usage)
        .values(account=account, period_id=period_id, ru_used=ru, updated_at_ms=now)
        .on_conflict_do_nothing()
    )
    if inserted.rowcount == 1:
        return True
    # Another transaction created the row between the two statements: one more conditional UPDATE.
    again = await conn.execute(
        update(account_period_usage)
        .where(
            account_period_usage.c.account == account,
            account_period_usage.c.period_id == period_id,
            account_period_usage.c.ru_used + ru <= cap,
        )
        .values(ru_used=account_period_usage.c.ru_used + ru, updated_at_ms=now)
    )
    return again.rowcount == 1


async def _payg_outstanding(conn: AsyncConnection, account: str) -> int:
    """Pay-as-you-go amounts reserved or settled and not yet given back (until settlement debits escrow)."""
    value = (
        await conn.execute(
            select(func.coalesce(func.sum(reservations.c.payg_micro), 0)).where(
                reservations.c.account == account,
                reservations.c.billing_class == "payg",
                reservations.c.state != "released",
            )
        )
    ).scalar_one()
    return int(value)


async def reserve(conn: AsyncConnection, pk: int, values: MutableMapping[str, Any], now: int) -> None:
    """Reserve for the intent `pk` (its `values["billing"]` is the entitlement decision's JSON). A plan that
    falls back to pay-as-you-go rewrites the stored billing (and `values["billing"]`)."""
    billing = values.get("billing")
    if not isinstance(billing, dict) or billing.get("account") is None or "ru" not in billing:
        return
    account = str(billing["account"])
    klass = str(billing["billingClass"])
    ru = int(billing["ru"])
    period_id = billing.get("periodId")
    payg_micro = 0
    if klass in ("plan", "sponsor") and period_id is not None:
        cap = int(billing.get("includedRu") or 0)
        if not await _take_plan_ru(conn, account, int(period_id), ru, cap, now):
            if billing.get("paygPriceMicro") is None:
                raise ApiError(
                    "QUOTA_EXHAUSTED",
                    detail=f"the plan's {cap} RU for this period are used up; buy more or enable "
                    "pay-as-you-go",
                    details={
                        "reason": "PLAN_CAP",
                        "account": account,
                        "periodId": int(period_id),
                        "includedRu": cap,
                    },
                )
            klass, period_id = "payg", None
    if klass == "payg":
        price = billing.get("paygPriceMicro")
        if price is None:
            raise ApiError(
                "QUOTA_EXHAUSTED", detail="pay-as-you-go cannot pay", details={"reason": "PAYG_OFF"}
            )
        payg_micro = ru * int(price)
        available = int(billing.get("paygCapMicro") or 0)
        if await _payg_outstanding(conn, account) + payg_micro > available:
            raise ApiError(
                "QUOTA_EXHAUSTED",
                detail="the plan is spent and the pay-as-you-go escrow (or budget) does not cover this "
                "transaction; top up the escrow",
                details={"reason": "PAYG_ESCROW", "account": account},
            )
    if klass != billing["billingClass"]:
        billing = {**billing, "billingClass": klass, "periodId": period_id, "free": False}
        values["billing"] = billing
        await conn.execute(update(intents).where(intents.c.pk == pk).values(billing=billing))
    await conn.execute(
        reservations.insert().values(
            intent_pk=pk,
            account=account,
            billing_class=klass,
            ru=ru,
            payg_micro=payg_micro,
            period_id=int(period_id) if period_id is not None and klass != "payg" else None,
            api_key_id=billing.get("apiKeyId"),
            state="reserved",
            created_at_ms=now,
            updated_at_ms=now,
        )
    )


def _ledger_values(row: Any, reservation: Any | None, now: int) -> dict[str, Any]:
    billing = row.billing if isinstance(row.billing, dict) else {}
    executed = row.state in ("EXECUTED", "FINALIZED")
    billed = executed and reservation is not None
    status = ("success" if row.outcome == "success" else "failed") if executed else "dead"
    return {
        "tx_hash": row.tx_hash,
        "intent_pk": int(row.pk),
        "account": billing.get("account"),
        "sender": row.sender,
        "nonce": int(row.nonce),
        "receiver": row.receiver,
        "function": billing.get("function"),
        "sender_shard": int(row.sender_shard),
        "relayer": row.relayer,
        "status": status,
        "billed": billed,
        "billing_class": reservation.billing_class if billed else None,
        "ru": int(reservation.ru) if billed else None,
        "payg_micro": int(reservation.payg_micro) if billed else None,
        "period_id": reservation.period_id if billed else None,
        "api_key_id": billing.get("apiKeyId"),
        "gas_limit": int(row.gas_limit),
        "gas_price": int(row.gas_price),
        "received_at_ms": row.received_at_ms,
        "cosigned_at_ms": int(row.cosigned_at_ms),
        "broadcast_at_ms": row.broadcast_at_ms,
        "executed_block_ts_ms": row.executed_block_ts_ms,
        "finalized_at_ms": row.finalized_at_ms,
        "terminal_at_ms": int(row.executed_block_ts_ms or row.updated_at_ms or now),
        "dead_reason": row.dead_reason,
        "first_ack_gateway": None,
        "created_at_ms": now,
    }


async def settle(conn: AsyncConnection, changed: Sequence[Any], now: int) -> None:
    """Settle the reservations of the intents a tracker round moved (same transaction as the moves)."""
    executed = [r for r in changed if r.state == "EXECUTED"]
    dead = [r for r in changed if r.state == "DEAD"]
    final = [r for r in changed if r.state == "FINALIZED"]
    pks = [int(r.pk) for r in executed + dead]
    held: dict[int, Any] = {}
    if pks:
        rows = (
            await conn.execute(
                select(reservations).where(
                    reservations.c.intent_pk.in_(pks), reservations.c.state == "reserved"
                )
            )
        ).all()
        held = {int(r.intent_pk): r for r in rows}
    for row in executed:
        reservation = held.get(int(row.pk))
        if reservation is not None:
            await conn.execute(
                update(reservations)
                .where(reservations.c.intent_pk == int(row.pk), reservations.c.state == "reserved")
                .values(state="settled", updated_at_ms=now)
            )
        await _write_row(conn, _ledger_values(row, reservation, now))
    for row in dead:
        reservation = held.get(int(row.pk))
        if reservation is not None:
            released = await conn.execute(
                update(reservations)
                .where(reservations.c.intent_pk == int(row.pk), reservations.c.state == "reserved")
                .values(state="released", updated_at_ms=now)
            )
            if released.rowcount == 1 and reservation.period_id is not None:
                await conn.execute(
                    update(account_period_usage)
                    .where(
                        account_period_usage.c.account == reservation.account,
                        account_period_usage.c.period_id == reservation.period_id,
                    )
                    .values(
                        ru_used=func.max(account_period_usage.c.ru_used - int(reservation.ru), 0)
                        if conn.dialect.name == "sqlite"
                        else func.greatest(account_period_usage.c.ru_used - int(reservation.ru), 0),
                        updated_at_ms=now,
                    )
                )
        await _write_row(conn, _ledger_values(row, None, now))
    if final:
        for row in final:
            await conn.execute(
                update(usage_ledger)
                .where(
                    and_(usage_ledger.c.intent_pk == int(row.pk), usage_ledger.c.finalized_at_ms.is_(None))
                )
                .values(finalized_at_ms=row.finalized_at_ms)
            )


async def _write_row(conn: AsyncConnection, values: dict[str, Any]) -> None:
    # A row is written once per intent (another host's tracker may have written it first).
    await conn.execute(_insert(conn, usage_ledger).values(**values).on_conflict_do_nothing())
