"""Reservations at the commit point and their settlement by the tracker, in the callers' transactions.

`reserve_many` runs inside the commit transaction (IntentRepository.commit) for one commit point or a
group-committed batch: one reservation per intent (its primary key is the intent's), so a duplicate
submission never reserves twice. The plan usage rows of the batch's (account, period) pairs are created if
missing and read under the write lock (SQLite) or `FOR UPDATE` (PostgreSQL), the intents are taken in
arrival order against their plan's cap, and the new totals written back: racing relays on any host never
overspend a plan. When the cap is spent, pay-as-you-go pays if the decision priced it (escrow and budget
permitting), else the intent is refused with QUOTA_EXHAUSTED and the caller undoes its part of the
transaction: the relayer signature is discarded and nothing was sent.

`settle` runs inside the tracker's batch transaction: EXECUTED -> reservation `settled` and a billed ledger
row (`success`/`failed`); DEAD -> reservation `released` (a plan's RU given back) and an unbilled `dead`
row; FINALIZED -> the row's `finalized_at_ms`.
"""

from __future__ import annotations

import functools
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, func, literal, null, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from gasless.billing.advice import Holdings, usdc
from gasless.billing.policy import CONTRACT_FAILURES
from gasless.core.errors import ApiError
from gasless.db import (
    account_period_usage,
    dialect_insert,
    intents,
    padded_to_power_of_two,
    reservations,
    usage_ledger,
)


@dataclass
class _Claim:
    """One intent of a batch: what it asks for and, once decided, its class and pay-as-you-go amount."""

    pk: int
    values: MutableMapping[str, Any]
    billing: dict[str, Any]
    klass: str
    ru: int
    period_id: int | None
    payg_micro: int = 0
    refusal: ApiError | None = field(default=None)


def _holdings(billing: dict[str, Any]) -> Holdings:
    account = str(billing["account"])
    stored = Holdings.from_json(account, billing.get("holdings"))
    if stored is not None:
        return stored
    # A decision stored without them (written by hand): the plan as the class says, no figures.
    plan = "" if billing.get("billingClass") in ("plan", "sponsor") else None
    return Holdings(account, plan, 0, 0, billing.get("paygPriceMicro") is not None, False)


def _plan_cap_spent(account: str, period_id: int, cap: int, billing: dict[str, Any]) -> ApiError:
    holdings = _holdings(billing)
    # A priced fallback was withheld only when pay-as-you-go is on and its price is above the account's cap.
    above_max = holdings.payg_enabled
    why = "its price is above the account's max_payg_price" if above_max else "it is off"
    return ApiError(
        "QUOTA_EXHAUSTED",
        detail=f"the plan's {cap} RU for this period are used up and pay-as-you-go cannot pay ({why}); "
        f"{holdings.sentence()}; {holdings.advice(price_above_max=above_max)}",
        details={
            **holdings.details(price_above_max=above_max),
            "reason": "PLAN_CAP",
            "account": account,
            "periodId": period_id,
            "includedRu": cap,
        },
    )


def _payg_short(billing: dict[str, Any], available: int, cost: int) -> ApiError:
    holdings = _holdings(billing)
    spent = "the plan's RU for this period are used up and " if billing.get("billingClass") != "payg" else ""
    sources = "escrow, credits and budget" if holdings.auto_topup else "escrow and budget"
    return ApiError(
        "QUOTA_EXHAUSTED",
        detail=f"{spent}pay-as-you-go cannot pay for this relay: it has {usdc(max(available, 0))} USDC left "
        f"to spend ({sources}) and the relay costs {usdc(cost)} USDC; {holdings.sentence()}; "
        f"{holdings.advice()}",
        details={**holdings.details(), "reason": "PAYG_ESCROW"},
    )


def reserve_many(
    conn: Connection, items: Sequence[tuple[int, MutableMapping[str, Any]]]
) -> dict[int, ApiError]:
    """Reserve for the intents `items` ((pk, commit values) whose `values["billing"]` is the entitlement
    decision's JSON), in order, in a fixed number of statements whatever their number. Returns the refused
    intents (pk -> problem) for the caller to remove; a plan that falls back to pay-as-you-go rewrites the
    stored billing (and `values["billing"]`)."""
    claims: list[_Claim] = []
    for pk, values in items:
        billing = values.get("billing")
        if not isinstance(billing, dict) or billing.get("account") is None or "ru" not in billing:
            continue
        period = billing.get("periodId")
        claims.append(
            _Claim(
                pk=pk,
                values=values,
                billing=billing,
                klass=str(billing["billingClass"]),
                ru=int(billing["ru"]),
                period_id=int(period) if period is not None else None,
            )
        )
    if not claims:
        return {}
    now = max(int(c.values["cosigned_at_ms"]) for c in claims)
    plan = [c for c in claims if c.klass in ("plan", "sponsor") and c.period_id is not None]
    if plan:
        keys = sorted({(str(c.billing["account"]), int(c.period_id or 0)) for c in plan})
        conn.execute(
            _new_usage_rows(conn.dialect.name),
            [{"account": a, "period_id": p, "ru_used": 0, "updated_at_ms": now} for a, p in keys],
        )
        padded = padded_to_power_of_two(keys)  # a repeated key reads its row once
        params = {
            name: value for i, (a, p) in enumerate(padded) for name, value in ((f"a{i}", a), (f"p{i}", p))
        }
        rows = conn.execute(_usage_rows(conn.dialect.name, len(padded)), params).all()
        used = {(r.account, int(r.period_id)): int(r.ru_used) for r in rows}
        before = dict(used)
        for claim in plan:
            key = (str(claim.billing["account"]), int(claim.period_id or 0))
            cap = int(claim.billing.get("includedRu") or 0)
            if used[key] + claim.ru <= cap:
                used[key] += claim.ru
            elif claim.billing.get("paygPriceMicro") is None:
                claim.refusal = _plan_cap_spent(key[0], key[1], cap, claim.billing)
            else:
                claim.klass, claim.period_id = "payg", None
        changed = [{"a": a, "p": p, "used": v} for (a, p), v in used.items() if v != before[(a, p)]]
        if changed:
            conn.execute(_SET_PERIOD_USAGE, [{**c, "now": now} for c in changed])
    payg = [c for c in claims if c.klass == "payg" and c.refusal is None]
    if payg:
        accounts = sorted({str(c.billing["account"]) for c in payg})
        rows = conn.execute(
            select(reservations.c.account, func.coalesce(func.sum(reservations.c.payg_micro), 0))
            .where(
                reservations.c.account.in_(accounts),
                reservations.c.billing_class == "payg",
                reservations.c.state != "released",
            )
            .group_by(reservations.c.account)
        )
        outstanding = {account: 0 for account in accounts}
        outstanding.update({r[0]: int(r[1]) for r in rows.all()})
        for claim in payg:
            account = str(claim.billing["account"])
            price = claim.billing.get("paygPriceMicro")
            if price is None:
                holdings = _holdings(claim.billing)
                claim.refusal = ApiError(
                    "QUOTA_EXHAUSTED",
                    detail=f"pay-as-you-go cannot pay; {holdings.sentence()}; {holdings.advice()}",
                    details={**holdings.details(), "reason": "PAYG_OFF"},
                )
                continue
            claim.payg_micro = claim.ru * int(price)
            cap = int(claim.billing.get("paygCapMicro") or 0)
            if outstanding[account] + claim.payg_micro > cap:
                claim.refusal = _payg_short(claim.billing, cap - outstanding[account], claim.payg_micro)
                continue
            outstanding[account] += claim.payg_micro
    held = [c for c in claims if c.refusal is None]
    for claim in held:
        if claim.klass != claim.billing["billingClass"]:
            billing = {
                **claim.billing,
                "billingClass": claim.klass,
                "periodId": claim.period_id,
                "free": False,
            }
            claim.values["billing"] = billing
            conn.execute(update(intents).where(intents.c.pk == claim.pk).values(billing=billing))
    if held:
        conn.execute(
            _INSERT_RESERVATIONS,
            [
                {
                    "intent_pk": c.pk,
                    "account": str(c.billing["account"]),
                    "billing_class": c.klass,
                    "ru": c.ru,
                    "payg_micro": c.payg_micro,
                    "period_id": c.period_id if c.klass != "payg" else None,
                    "api_key_id": c.billing.get("apiKeyId"),
                    "function": c.billing.get("function") if c.klass == "free" else None,
                    "state": "reserved",
                    "created_at_ms": int(c.values["cosigned_at_ms"]),
                    "updated_at_ms": int(c.values["cosigned_at_ms"]),
                }
                for c in held
            ],
        )
    return {c.pk: c.refusal for c in claims if c.refusal is not None}


# The commit point's statements are built once: building one per commit (and its cache key, to find the
# compiled form) cost more than running it on SQLite.
@functools.cache
def _new_usage_rows(dialect: str) -> Any:
    """Creates the plan usage rows of (account, period) pairs that have none yet."""
    return (
        (postgresql if dialect == "postgresql" else sqlite)
        .insert(account_period_usage)
        .on_conflict_do_nothing()
    )


_INSERT_RESERVATIONS = reservations.insert()


@functools.cache
def _usage_rows(dialect: str, size: int) -> Any:
    """The plan usage rows of `size` (account, period) pairs, locked on PostgreSQL; built once per size (a
    power of two). A `tuple_(...).in_(keys)` is an expanding parameter that SQLAlchemy renders again on every
    execution: on the commit point that rendering cost more than the query (py-spy, docs/performance.md)."""
    usage = account_period_usage.c
    query = select(usage.account, usage.period_id, usage.ru_used).where(
        or_(
            *(
                and_(usage.account == bindparam(f"a{i}"), usage.period_id == bindparam(f"p{i}"))
                for i in range(size)
            )
        )
    )
    return query.with_for_update() if dialect == "postgresql" else query


_SET_PERIOD_USAGE = (
    update(account_period_usage)
    .where(
        account_period_usage.c.account == bindparam("a"),
        account_period_usage.c.period_id == bindparam("p"),
    )
    .values(ru_used=bindparam("used"), updated_at_ms=bindparam("now"))
)


@functools.cache
def _insert_ledger_rows(insert: Any) -> Any:
    """The ledger rows of the intents a round executed or killed, built in SQL from the intent and its held
    reservation (`pks`; `now`), for the dialect's `insert`. Each row's 30 values built and bound in Python
    made the ledger insert about a third of a round's time in SQLite's one write lock; in one statement the
    round costs the writer about a fifth less (docs/performance.md). Runs before the reservations move: a
    row is billed when its intent executed and a reservation was held. A row is written once per intent
    (another host's tracker may have written it first)."""
    i, r = intents.c, reservations.c
    now = bindparam("now", type_=usage_ledger.c.created_at_ms.type)
    executed = i.state.in_(("EXECUTED", "FINALIZED"))
    billed = and_(executed, r.intent_pk.is_not(None))

    def if_billed(column: Any) -> Any:
        return case((billed, column), else_=null())

    failure_codes = case(
        *((i.failure == message, literal(code)) for message, code in CONTRACT_FAILURES.items()), else_=null()
    )
    columns = {
        "tx_hash": i.tx_hash,
        "intent_pk": i.pk,
        "account": i.billing["account"].as_string(),
        "sender": i.sender,
        "nonce": i.nonce,
        "receiver": i.receiver,
        "function": i.billing["function"].as_string(),
        "sender_shard": i.sender_shard,
        "relayer": i.relayer,
        "status": case((executed, case((i.outcome == "success", "success"), else_="failed")), else_="dead"),
        "billed": billed,
        "billing_class": if_billed(r.billing_class),
        "ru": if_billed(r.ru),
        "payg_micro": if_billed(r.payg_micro),
        "period_id": if_billed(r.period_id),
        "api_key_id": i.billing["apiKeyId"].as_string(),
        "gas_limit": i.gas_limit,
        "gas_price": i.gas_price,
        "received_at_ms": i.received_at_ms,
        "cosigned_at_ms": i.cosigned_at_ms,
        "broadcast_at_ms": i.broadcast_at_ms,
        "executed_block_ts_ms": i.executed_block_ts_ms,
        "finalized_at_ms": i.finalized_at_ms,
        "terminal_at_ms": func.coalesce(
            func.nullif(i.executed_block_ts_ms, 0), func.nullif(i.updated_at_ms, 0), now
        ),
        "dead_reason": i.dead_reason,
        "failure_code": failure_codes,
        "route": i.billing["route"].as_string(),
        "first_ack_gateway": i.first_ack_gateway,
        "created_at_ms": now,
    }
    rows = (
        select(*(value.label(name) for name, value in columns.items()))
        .select_from(intents.outerjoin(reservations, and_(r.intent_pk == i.pk, r.state == "reserved")))
        .where(i.pk.in_(bindparam("pks", expanding=True)))
    )
    return insert(usage_ledger).from_select(list(columns), rows).on_conflict_do_nothing()


def settle(conn: Connection, changed: Sequence[Any], now: int) -> None:
    """Settle the reservations of the intents a tracker round moved (same transaction as the moves), in a
    fixed number of statements whatever the round's size. `changed` needs only each row's pk, state and
    finalized_at_ms."""
    executed = [int(r.pk) for r in changed if r.state == "EXECUTED"]
    dead = [int(r.pk) for r in changed if r.state == "DEAD"]
    final = [r for r in changed if r.state == "FINALIZED"]
    if executed or dead:
        # Before the moves: the ledger rows are built from the reservations still held.
        conn.execute(_insert_ledger_rows(dialect_insert(conn)), {"pks": executed + dead, "now": now})
    if executed:
        conn.execute(_MOVE_RESERVED, {"pks": executed, "state": "settled", "now": now})
    if dead:
        released = conn.execute(
            _MOVE_RESERVED.returning(reservations.c.account, reservations.c.period_id, reservations.c.ru),
            {"pks": dead, "state": "released", "now": now},
        ).all()
        # A released plan reservation gives its RU back to the period (never below zero).
        give_back: dict[tuple[str, int], int] = {}
        for account, period_id, ru in released:
            if period_id is not None:
                key = (str(account), int(period_id))
                give_back[key] = give_back.get(key, 0) + int(ru)
        if give_back:
            floor = func.max if conn.dialect.name == "sqlite" else func.greatest
            conn.execute(
                update(account_period_usage)
                .where(
                    account_period_usage.c.account == bindparam("a"),
                    account_period_usage.c.period_id == bindparam("p"),
                )
                .values(
                    ru_used=floor(account_period_usage.c.ru_used - bindparam("ru"), 0),
                    updated_at_ms=bindparam("now"),
                ),
                [{"a": a, "p": p, "ru": ru, "now": now} for (a, p), ru in give_back.items()],
            )
    # One statement per finalization time (a tracker round stamps all of its rows with one), not one per
    # row: on PostgreSQL the executemany was a statement per relay on the server (bench/statements.py).
    by_time: dict[int, list[int]] = {}
    for row in final:
        by_time.setdefault(int(row.finalized_at_ms), []).append(int(row.pk))
    for finalized_at, pks in by_time.items():
        conn.execute(_FINALIZE_LEDGER, {"pks": padded_to_power_of_two(pks), "f": finalized_at})


_MOVE_RESERVED = (
    update(reservations)
    .where(reservations.c.intent_pk.in_(bindparam("pks", expanding=True)), reservations.c.state == "reserved")
    .values(state=bindparam("state"), updated_at_ms=bindparam("now"))
)
_FINALIZE_LEDGER = (
    update(usage_ledger)
    .where(
        usage_ledger.c.intent_pk.in_(bindparam("pks", expanding=True)),
        usage_ledger.c.finalized_at_ms.is_(None),
    )
    .values(finalized_at_ms=bindparam("f"))
)
