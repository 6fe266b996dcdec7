"""The service's tables (SQLAlchemy Core). Every schema change here needs an Alembic revision."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    false,
)

from gasless.db.types import Atto, BigId, JsonDoc, UnixMs

# Deterministic constraint names keep migrations (and SQLite batch rebuilds) stable.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RELAYER_STATES = ("active", "draining", "retired")
_STATE_SQL = ", ".join(f"'{state}'" for state in RELAYER_STATES)

metadata = MetaData(naming_convention=NAMING_CONVENTION)

relayers = Table(
    "relayers",
    metadata,
    Column("address", String(62), primary_key=True),  # bech32 erd1...
    Column("shard", SmallInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("funded", Boolean, nullable=False, server_default=false()),
    # Python-side default: the SQLite text form is zero-padded, which a server default would not be.
    Column("balance_atto", Atto, nullable=False, default=0),
    Column("balance_checked_at_ms", UnixMs, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint(f"state IN ({_STATE_SQL})", name="state"),
    CheckConstraint("shard >= 0", name="shard"),
)

relayer_state_history = Table(
    "relayer_state_history",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("relayer_address", String(62), ForeignKey("relayers.address"), nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("at_ms", UnixMs, nullable=False),
    CheckConstraint(f"from_state IS NULL OR from_state IN ({_STATE_SQL})", name="from_state"),
    CheckConstraint(f"to_state IN ({_STATE_SQL})", name="to_state"),
)
Index(None, relayer_state_history.c.relayer_address, relayer_state_history.c.at_ms)

service_meta = Table(
    "service_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", JsonDoc, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)
