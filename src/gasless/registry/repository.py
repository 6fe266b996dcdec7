"""SQL of the registry: the relayers' rows and state history, and per-relayer counts of recent intents."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db.tables import intents, relayer_state_history, relayers


class RegistryRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def rows(self) -> list[Any]:
        async with self.engine.connect() as conn:
            return list(
                (await conn.execute(select(relayers).order_by(relayers.c.shard, relayers.c.address))).all()
            )

    async def history(self, address: str | None = None) -> list[Any]:
        query = select(relayer_state_history).order_by(
            relayer_state_history.c.at_ms, relayer_state_history.c.id
        )
        if address is not None:
            query = query.where(relayer_state_history.c.relayer_address == address)
        async with self.engine.connect() as conn:
            return list((await conn.execute(query)).all())

    async def statistics(self, since_ms: int, excluded_senders: tuple[str, ...] = ()) -> dict[str, Any]:
        """relayer -> (relays, executed, failed, dead, last co-signature) since `since_ms`."""
        executed = intents.c.state.in_(("EXECUTED", "FINALIZED"))
        query = (
            select(
                intents.c.relayer,
                func.count(),
                func.sum(case((executed, 1), else_=0)),
                func.sum(case((executed & (intents.c.outcome == "fail"), 1), else_=0)),
                func.sum(case((intents.c.state == "DEAD", 1), else_=0)),
                func.max(intents.c.cosigned_at_ms),
            )
            .where(intents.c.cosigned_at_ms >= since_ms, intents.c.sender.not_in(excluded_senders))
            .group_by(intents.c.relayer)
        )
        async with self.engine.connect() as conn:
            return {row[0]: row for row in (await conn.execute(query)).all()}
