"""SQL of the relay core. Every state change is a guarded UPDATE that also bumps the intent's `seq`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, case, delete, func, or_, select, update
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.billing.reservations import reserve_many, settle
from gasless.core.errors import ApiError
from gasless.db import (
    begin_write,
    dialect_insert,
    in_constants,
    intent_keys,
    intents,
    padded_to_power_of_two,
    rejections,
    run_read,
    run_write,
)

IN_FLIGHT = ("COSIGNED", "BROADCAST", "EXECUTED")
ACK_CHUNK = 64  # acknowledgements written by one UPDATE at most (one prepared statement for each size)
MAX_COMMIT_BATCH = 128  # commit points written together at most (one transaction, a few statements)
UNSETTLED = ("COSIGNED", "BROADCAST")
# The columns an UPDATE may write. Every other column is set once, by the commit point's insert and its
# transaction, and never changes after it (tests/relay/test_round_settlement.py compares whole rows).
CHANGING = (
    "pk",
    "state",
    "seq",
    "updated_at_ms",
    "broadcast_at_ms",
    "executed_block_ts_ms",
    "finalized_at_ms",
    "outcome",
    "dead_reason",
    "failure",
    "first_ack_gateway",
    "replaced_by",
    "last_sent_at_ms",
    "send_attempts",
)


@dataclass(frozen=True)
class SenderView:
    """What the checks need about one sender from our own records, read in one query."""

    at_nonce: list[Rec]  # every intent ever stored for (sender, nonce), any state
    in_flight_count: int  # the sender's intents not yet final and not dead
    highest_in_flight_nonce: int | None
    free_in_flight: list[Rec]  # those of them billed as free flow (nonce and tx_hash only)
    key_row: Rec | None  # the logical idempotency key's intent, when a key was given and is live


class Rec(SimpleNamespace):
    """A stored row as a plain mutable record (rows are immutable tuples; the tracker updates copies)."""

    def _replace(self, **changes: Any) -> Rec:
        return Rec(**{**vars(self), **changes})


def rec(row: Row[Any] | None) -> Rec | None:
    return None if row is None else Rec(**row._mapping)


def recs(rows: Sequence[Row[Any]]) -> list[Rec]:
    return [Rec(**row._mapping) for row in rows]


class CommitConflict(Exception):
    """The commit lost a race: another submission took the slot, the bytes or the key first."""


class IntentRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # The hot path's statements, built once: constructing a SQLAlchemy statement per request (one
        # coercion per column) cost more than executing it.
        # The checks never look at the stored wire transaction: leaving its JSON out makes the read of a
        # busy sender (up to 64 rows in flight) several times cheaper.
        view_columns = [column for column in intents.c if column.name != "tx"]
        self._row_without_tx = view_columns
        self._changing = [intents.c[name] for name in CHANGING]
        self._rows_by_pk = select(*view_columns).where(intents.c.pk.in_(bindparam("pks", expanding=True)))
        self._slot_rows = select(*view_columns).where(
            intents.c.sender == bindparam("sender"), intents.c.nonce == bindparam("nonce")
        )
        # The sender's other intents in flight are counted and compared, never answered: SQL counts them and
        # names the highest nonce, and lists only the free-flow ones (the free-flow gate names one). A busy
        # sender has dozens in flight; fetching them as rows (and decoding each one's billing JSON) was most
        # of the relay's read.
        in_flight_of_sender = (
            intents.c.sender == bindparam("sender"),
            in_constants(intents.c.state, IN_FLIGHT),
        )
        free_flow = intents.c.billing["billingClass"].as_string() == "free"
        # It also counts the rows at the relayed nonce, any state: usually none (a new nonce), and then the
        # read of those rows is skipped.
        at_nonce = (
            select(func.count())
            .select_from(intents)
            .where(intents.c.sender == bindparam("sender"), intents.c.nonce == bindparam("nonce"))
            .scalar_subquery()
        )
        self._in_flight_summary = select(
            func.count(), func.max(intents.c.nonce), func.count(case((free_flow, 1))), at_nonce
        ).where(*in_flight_of_sender)
        self._free_in_flight = select(intents.c.nonce, intents.c.tx_hash).where(
            *in_flight_of_sender, free_flow
        )
        self._key_row = (
            select(*view_columns)
            .join(intent_keys, intent_keys.c.intent_pk == intents.c.pk)
            .where(
                intent_keys.c.sender == bindparam("sender"),
                intent_keys.c.key == bindparam("key"),
                intent_keys.c.expires_at_ms > bindparam("now_ms"),
            )
        )
        self._insert_intent = intents.insert().returning(intents.c.pk)
        self._insert_intents = (
            dialect_insert(engine)(intents)
            .on_conflict_do_nothing()
            .returning(intents.c.pk, intents.c.tx_hash)
        )
        self._ack_statements: dict[int, Any] = {}  # record_acks' UPDATE by the number of rows it writes
        self._delete_intents = delete(intents).where(intents.c.pk.in_(bindparam("pks", expanding=True)))
        # Group commit: commit points waiting for the writer, and the writer task itself.
        self._waiting: list[tuple[MutableMapping[str, Any], asyncio.Future[int]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def sender_view(self, sender: str, nonce: int, key: str | None, now_ms: int) -> SenderView:
        def read(conn: Connection) -> SenderView:
            count, highest, free_count, at_nonce_count = conn.execute(
                self._in_flight_summary, {"sender": sender, "nonce": nonce}
            ).one()
            at_nonce = (
                conn.execute(self._slot_rows, {"sender": sender, "nonce": nonce}).all()
                if at_nonce_count
                else []
            )
            free = conn.execute(self._free_in_flight, {"sender": sender}).all() if free_count else []
            key_row = None
            if key is not None:
                key_row = conn.execute(
                    self._key_row, {"sender": sender, "key": key, "now_ms": now_ms}
                ).first()
            return SenderView(
                at_nonce=recs(at_nonce),
                in_flight_count=int(count),
                highest_in_flight_nonce=None if highest is None else int(highest),
                free_in_flight=[Rec(nonce=int(r[0]), tx_hash=r[1]) for r in free],
                key_row=rec(key_row),
            )

        return await run_read(self.engine, read)

    async def commit(self, values: MutableMapping[str, Any], key: str | None, key_ttl_ms: int) -> int:
        """The commit point: the intent (COSIGNED, with the relayer signature), its key and its reservation,
        durable before this returns. Keyless commit points that arrive while a write is under way are
        group-committed by one writer: one transaction and a fixed number of statements for the whole
        group, each intent's outcome (pk, CommitConflict, QUOTA_EXHAUSTED) exactly as if written alone."""
        if key is not None:
            return await self._commit_one(values, key, key_ttl_ms)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((values, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting())
        # Shielded: a caller that goes away does not undo a commit already under way.
        return await asyncio.shield(future)

    async def _write_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_COMMIT_BATCH], self._waiting[MAX_COMMIT_BATCH:]
            if len(batch) == 1:
                values, future = batch[0]
                try:
                    pk = await self._commit_one(values, None, 0)
                except BaseException as exc:  # noqa: BLE001 - handed to the one waiting caller
                    if not future.done():
                        future.set_exception(exc)
                else:
                    future.set_result(pk)
                continue
            try:
                outcomes = await self._commit_group([values for values, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - the group rolled back: every caller hears why
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def _commit_group(self, group: list[MutableMapping[str, Any]]) -> list[int | BaseException]:
        """Several keyless commit points in one transaction: one multi-row INSERT (a row that meets a
        unique constraint is skipped: CommitConflict), the reservations in a fixed number of statements,
        and a DELETE of the rows whose reservation was refused (their part of the transaction undone)."""

        def write(conn: Connection) -> tuple[list[int | BaseException], dict[int, ApiError]]:
            inserted = conn.execute(self._insert_intents, group).all()
            pk_of = {str(tx_hash): int(pk) for pk, tx_hash in inserted}
            outcomes: list[int | BaseException] = []
            claimed: list[tuple[int, MutableMapping[str, Any]]] = []
            for values in group:
                pk = pk_of.pop(str(values["tx_hash"]), None)  # pop: the same bytes twice, one insert
                if pk is None:
                    outcomes.append(CommitConflict("another submission took the slot or the bytes first"))
                else:
                    outcomes.append(pk)
                    claimed.append((pk, values))
            refused = reserve_many(conn, claimed)
            if refused:
                conn.execute(self._delete_intents, {"pks": list(refused)})
            return outcomes, refused

        outcomes, refused = await run_write(self.engine, write)
        return [
            refused.get(outcome, outcome) if isinstance(outcome, int) else outcome for outcome in outcomes
        ]

    async def _commit_one(self, values: MutableMapping[str, Any], key: str | None, key_ttl_ms: int) -> int:
        """One commit point in its own transaction (with the logical idempotency key, when given)."""

        def write(conn: Connection) -> int:
            pk = int(conn.execute(self._insert_intent, dict(values)).scalar_one())
            if key is not None:
                self._claim_key(conn, values["sender"], key, pk, values["cosigned_at_ms"], key_ttl_ms)
            # Billing seam: the reservation joins the commit transaction (made once, with the intent). It
            # may refuse (QUOTA_EXHAUSTED: raised, so the transaction rolls back) or rewrite
            # `values["billing"]` (a plan whose cap is spent falling back to pay-as-you-go).
            refused = reserve_many(conn, [(pk, values)])
            if refused:
                raise refused[pk]
            return pk

        try:
            return await run_write(self.engine, write)
        except IntegrityError as exc:
            raise CommitConflict(str(exc.orig)) from exc

    def _claim_key(self, conn: Connection, sender: str, key: str, pk: int, now_ms: int, ttl_ms: int) -> None:
        # A key may be reused once its intent died or the key expired; otherwise the insert conflicts.
        dead_or_expired = (
            select(intent_keys.c.key)
            .join(intents, intents.c.pk == intent_keys.c.intent_pk)
            .where(
                intent_keys.c.sender == sender,
                intent_keys.c.key == key,
                or_(intents.c.state == "DEAD", intent_keys.c.expires_at_ms <= now_ms),
            )
        )
        if conn.execute(dead_or_expired).first() is not None:
            conn.execute(delete(intent_keys).where(intent_keys.c.sender == sender, intent_keys.c.key == key))
        conn.execute(
            intent_keys.insert().values(sender=sender, key=key, intent_pk=pk, expires_at_ms=now_ms + ttl_ms)
        )

    async def by_hash(self, tx_hash: str) -> Rec | None:
        async with self.engine.connect() as conn:
            return rec((await conn.execute(select(intents).where(intents.c.tx_hash == tx_hash))).first())

    async def by_pk(self, pk: int) -> Rec | None:
        async with self.engine.connect() as conn:
            return rec((await conn.execute(select(intents).where(intents.c.pk == pk))).first())

    async def by_slot(self, sender: str, nonce: int) -> Rec | None:
        """The intent that speaks for a (sender, nonce) slot: a live one first, else the latest replacement."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(intents)
                    .where(intents.c.sender == sender, intents.c.nonce == nonce)
                    .order_by(intents.c.slot_seq.desc())
                )
            ).all()
        records = recs(rows)
        for r in records:
            if r.state in ("EXECUTED", "FINALIZED"):
                return r
        for r in records:
            if r.state != "DEAD":
                return r
        return records[0] if records else None

    async def rejection_by_hash(self, tx_hash: str) -> Row[Any] | None:
        async with self.engine.connect() as conn:
            return (
                await conn.execute(
                    select(rejections).where(rejections.c.tx_hash == tx_hash).order_by(rejections.c.pk.desc())
                )
            ).first()

    async def rejection_by_slot(self, sender: str, nonce: int) -> Row[Any] | None:
        async with self.engine.connect() as conn:
            return (
                await conn.execute(
                    select(rejections)
                    .where(rejections.c.sender == sender, rejections.c.nonce == nonce)
                    .order_by(rejections.c.pk.desc())
                )
            ).first()

    async def record_rejection(self, values: Mapping[str, Any]) -> None:
        async with begin_write(self.engine) as conn:
            await conn.execute(rejections.insert().values(**values))

    async def in_flight(self, limit: int = 10_000) -> list[Rec]:
        async with self.engine.connect() as conn:
            return list(
                (
                    await conn.execute(
                        select(intents)
                        .where(intents.c.state.in_(IN_FLIGHT))
                        .order_by(intents.c.pk)
                        .limit(limit)
                    )
                ).all()
            )

    async def in_flight_stamps(self) -> dict[int, int]:
        """pk -> seq of every in-flight intent: how the tracker notices what other hosts committed or moved."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(select(intents.c.pk, intents.c.seq).where(intents.c.state.in_(IN_FLIGHT)))
            ).all()
        return {int(pk): int(seq) for pk, seq in rows}

    async def by_pks(self, pks: Sequence[int]) -> list[Rec]:
        out: list[Rec] = []
        async with self.engine.connect() as conn:
            for start in range(0, len(pks), 500):
                chunk = list(pks[start : start + 500])
                out.extend(recs((await conn.execute(select(intents).where(intents.c.pk.in_(chunk)))).all()))
        return out

    async def unbroadcast(self) -> list[Rec]:
        """Co-signed rows no gateway acknowledged: what orphan recovery re-broadcasts at start-up."""
        async with self.engine.connect() as conn:
            return list(
                (
                    await conn.execute(
                        select(intents).where(intents.c.state == "COSIGNED").order_by(intents.c.pk)
                    )
                ).all()
            )

    async def transition(
        self, pk: int, from_states: Sequence[str], values: Mapping[str, Any], now_ms: int
    ) -> Rec | None:
        """Apply `values` when the row is still in one of `from_states`; the updated row, or None."""
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(intents)
                .where(intents.c.pk == pk, intents.c.state.in_(tuple(from_states)))
                .values(**values, seq=intents.c.seq + 1, updated_at_ms=now_ms)
                .returning(*intents.c)
            )
            return rec(result.first())

    async def transition_many(
        self,
        changes: Sequence[tuple[ColumnElement[bool], Mapping[str, Any]]],
        now_ms: int,
        held: Mapping[int, Rec] | None = None,
    ) -> list[Rec]:
        """Several guarded UPDATEs (`where`, `values`), in order, in one transaction; the rows they changed,
        without the wire transaction (`tx`).

        The tracker writes a round this way, in parts of a bounded size (`relay/jobs.ROUND_PART_INTENTS`):
        one write a part, not one per intent. The updates return only the columns an update can write
        (`CHANGING`): a row the caller already holds (`held`: pk -> its last known row) is completed from it
        after the write; any other is read whole in the same transaction. Returning and decoding every
        column (the billing document above all) inside the write held SQLite's one writer, and every commit
        point behind it, about a third longer.
        """
        if not changes:
            return []
        holding = dict(held or {})  # a snapshot: the write runs in another thread

        def write(conn: Connection) -> tuple[list[Row[Any]], dict[int, Row[Any]]]:
            moved: list[Row[Any]] = []
            for where, values in changes:
                result = conn.execute(
                    update(intents)
                    .where(where)
                    .values(**values, seq=intents.c.seq + 1, updated_at_ms=now_ms)
                    .returning(*self._changing)
                )
                moved.extend(result.all())
            settle(conn, moved, now_ms)  # billing: in the same write as the moves
            unknown = [int(row.pk) for row in moved if int(row.pk) not in holding]
            whole = (
                {int(row.pk): row for row in conn.execute(self._rows_by_pk, {"pks": unknown}).all()}
                if unknown
                else {}
            )
            return moved, whole

        moved, whole = await run_write(self.engine, write)
        changed: list[Rec] = []
        for row in moved:
            pk = int(row.pk)
            fresh = whole.get(pk)
            if fresh is not None:
                # Read after the last update of the transaction: one that moved a row twice (executed, then
                # final) reports each move as its own update returned it.
                changed.append(Rec(**{**fresh._mapping, **row._mapping}))
            else:
                changed.append(holding[pk]._replace(**row._mapping))
        return changed

    async def record_acks(
        self, acks: Mapping[int, int], gateways: Mapping[int, str] | None = None
    ) -> tuple[list[Rec], list[int]]:
        """First acknowledgements (pk -> ack ms, and pk -> the acknowledging gateway) in one write: co-signed
        rows become BROADCAST; rows already past COSIGNED only count the send. Returns the rows that became
        BROADCAST (without `tx`) and the other pks."""
        pks = list(acks)
        gateways = gateways or {}
        chunks = []
        for start in range(0, len(pks), ACK_CHUNK):
            # Padded (`pk IN (a, b, b)` writes b once): seven statements to build and compile instead of
            # 64, each the first time its size came up under load.
            chunk = padded_to_power_of_two(pks[start : start + ACK_CHUNK])
            params: dict[str, Any] = {}
            for i, pk in enumerate(chunk):
                params[f"pk{i}"], params[f"at{i}"], params[f"gw{i}"] = pk, acks[pk], gateways.get(pk)
            chunks.append((self._ack_statement(len(chunk)), params))

        def write(conn: Connection) -> tuple[list[Rec], list[int]]:
            broadcast = [
                row for statement, params in chunks for row in recs(conn.execute(statement, params).all())
            ]
            done = {int(row.pk) for row in broadcast}
            others = [pk for pk in pks if pk not in done]
            if others:
                conn.execute(
                    update(intents)
                    .where(intents.c.pk.in_(others))
                    .values(
                        last_sent_at_ms=case({pk: acks[pk] for pk in others}, value=intents.c.pk),
                        send_attempts=intents.c.send_attempts + 1,
                    )
                )
            return broadcast, others

        return await run_write(self.engine, write)

    def _ack_statement(self, size: int) -> Any:
        """The UPDATE that turns `size` co-signed rows BROADCAST, built once for each size: a statement built per
        write (a CASE of literal values) was compiled again every time, most of the acknowledgement's cost."""
        statement = self._ack_statements.get(size)
        if statement is None:
            # Typed parameters: PostgreSQL cannot infer a CASE's type from untyped parameters alone.
            at_type, gw_type = intents.c.broadcast_at_ms.type, intents.c.first_ack_gateway.type
            at = case(
                *(
                    (intents.c.pk == bindparam(f"pk{i}"), bindparam(f"at{i}", type_=at_type))
                    for i in range(size)
                )
            )
            gateway = case(
                *(
                    (intents.c.pk == bindparam(f"pk{i}"), bindparam(f"gw{i}", type_=gw_type))
                    for i in range(size)
                )
            )
            statement = (
                update(intents)
                .where(
                    intents.c.pk.in_([bindparam(f"pk{i}") for i in range(size)]),
                    intents.c.state == "COSIGNED",
                )
                .values(
                    state="BROADCAST",
                    broadcast_at_ms=at,
                    first_ack_gateway=gateway,
                    last_sent_at_ms=at,
                    send_attempts=intents.c.send_attempts + 1,
                    seq=intents.c.seq + 1,
                    updated_at_ms=at,
                )
                .returning(*self._row_without_tx)
            )
            self._ack_statements[size] = statement
        return statement

    async def note_sent(self, pk: int, now_ms: int) -> None:
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(intents)
                .where(intents.c.pk == pk)
                .values(last_sent_at_ms=now_ms, send_attempts=intents.c.send_attempts + 1)
            )

    async def slot_rivals(self, sender: str, nonce: int, exclude_pk: int) -> list[Rec]:
        async with self.engine.connect() as conn:
            return recs(
                (
                    await conn.execute(
                        select(intents).where(
                            intents.c.sender == sender,
                            intents.c.nonce == nonce,
                            intents.c.pk != exclude_pk,
                            intents.c.state.in_(IN_FLIGHT),
                        )
                    )
                ).all()
            )

    async def purge(self, now_ms: int, rejection_retention_ms: int) -> tuple[int, int]:
        async with begin_write(self.engine) as conn:
            rejected = await conn.execute(
                delete(rejections).where(rejections.c.received_at_ms < now_ms - rejection_retention_ms)
            )
            keys = await conn.execute(delete(intent_keys).where(intent_keys.c.expires_at_ms <= now_ms))
        return rejected.rowcount or 0, keys.rowcount or 0

    async def count_in_flight(self, sender: str) -> int:
        async with self.engine.connect() as conn:
            return int(
                (
                    await conn.execute(
                        select(func.count())
                        .select_from(intents)
                        .where(and_(intents.c.sender == sender, intents.c.state.in_(IN_FLIGHT)))
                    )
                ).scalar_one()
            )
