"""SQL of x402 payment records (the `x402_payments` table): the only state of the x402 flow.

A record is inserted before anything is co-signed; the primary key (the client's payment id) makes the
first writer win on either host. A failure to reach the database is `503 UPSTREAM_UNAVAILABLE` (nothing was
co-signed), never an internal error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.core.errors import ApiError
from gasless.db.engine import begin_write
from gasless.db.tables import x402_payments

T = TypeVar("T")


@dataclass(frozen=True)
class PaymentRow:
    payment_id: str
    kind: str
    payload_digest: str
    payer: str
    beneficiary: str
    amount_micro: int
    quote_id: str
    terms: dict[str, Any]
    state: str
    tx_hash: str | None
    intent_id: str | None
    result: dict[str, Any] | None
    host_id: str
    created_at_ms: int
    updated_at_ms: int


def _row(mapping: Any) -> PaymentRow:
    return PaymentRow(**{column.name: mapping[column.name] for column in x402_payments.columns})


def unreachable(exc: BaseException) -> ApiError:
    return ApiError(
        "UPSTREAM_UNAVAILABLE",
        detail="the payment database is unreachable; nothing was co-signed, retry with the same payment id",
        details={"retryAfterMs": 1_000},
    )


class PaymentRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def _guard(self, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except IntegrityError:
            raise
        except (SQLAlchemyError, OSError) as exc:
            raise unreachable(exc) from exc

    async def get(self, payment_id: str) -> PaymentRow | None:
        async def read() -> PaymentRow | None:
            async with self.engine.connect() as conn:
                row = (
                    await conn.execute(select(x402_payments).where(x402_payments.c.payment_id == payment_id))
                ).first()
            return _row(row._mapping) if row is not None else None

        return await self._guard(read)

    async def insert(self, values: dict[str, Any]) -> bool:
        """Write a new pending record; False when the id exists already (another request won)."""

        async def write() -> bool:
            try:
                async with begin_write(self.engine) as conn:
                    await conn.execute(x402_payments.insert().values(**values))
            except IntegrityError:
                return False
            return True

        return await self._guard(write)

    async def attach(self, payment_id: str, tx_hash: str, intent_id: str, now_ms: int) -> None:
        """The co-signed transaction of a pending payment."""

        async def write() -> None:
            async with begin_write(self.engine) as conn:
                await conn.execute(
                    update(x402_payments)
                    .where(x402_payments.c.payment_id == payment_id, x402_payments.c.state == "pending")
                    .values(tx_hash=tx_hash, intent_id=intent_id, updated_at_ms=now_ms)
                )

        await self._guard(write)

    async def finish(self, payment_id: str, state: str, result: dict[str, Any], now_ms: int) -> PaymentRow:
        """Make a pending record final (first writer wins; the stored record is returned either way)."""

        async def write() -> PaymentRow:
            async with begin_write(self.engine) as conn:
                await conn.execute(
                    update(x402_payments)
                    .where(x402_payments.c.payment_id == payment_id, x402_payments.c.state == "pending")
                    .values(state=state, result=result, updated_at_ms=now_ms)
                )
                row = (
                    await conn.execute(select(x402_payments).where(x402_payments.c.payment_id == payment_id))
                ).one()
            return _row(row._mapping)

        return await self._guard(write)

    async def forget(self, payment_id: str, payload_digest: str) -> None:
        """Drop a pending record that co-signed nothing (a transient refusal): the client may retry the id."""

        async def write() -> None:
            async with begin_write(self.engine) as conn:
                await conn.execute(
                    delete(x402_payments).where(
                        x402_payments.c.payment_id == payment_id,
                        x402_payments.c.payload_digest == payload_digest,
                        x402_payments.c.state == "pending",
                        x402_payments.c.tx_hash.is_(None),
                    )
                )

        await self._guard(write)
