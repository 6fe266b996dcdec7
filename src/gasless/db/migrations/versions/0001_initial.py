"""Initial schema: relayers, their state history, service metadata.

Revision ID: 0001
Revises:
Create Date: 2025-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gasless.db import types as gtypes

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = "'active', 'draining', 'retired'"


def upgrade() -> None:
    op.create_table(
        "relayers",
        sa.Column("address", sa.String(62), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("funded", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("balance_atto", gtypes.Atto(), nullable=False),
        sa.Column("balance_checked_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_relayers")),
        sa.CheckConstraint(f"state IN ({_STATES})", name=op.f("ck_relayers_state")),
        sa.CheckConstraint("shard >= 0", name=op.f("ck_relayers_shard")),
    )
    op.create_table(
        "relayer_state_history",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("relayer_address", sa.String(62), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_relayer_state_history")),
        sa.ForeignKeyConstraint(
            ["relayer_address"],
            ["relayers.address"],
            name=op.f("fk_relayer_state_history_relayer_address_relayers"),
        ),
        sa.CheckConstraint(
            f"from_state IS NULL OR from_state IN ({_STATES})",
            name=op.f("ck_relayer_state_history_from_state"),
        ),
        sa.CheckConstraint(f"to_state IN ({_STATES})", name=op.f("ck_relayer_state_history_to_state")),
    )
    op.create_index(
        op.f("ix_relayer_state_history_relayer_address_at_ms"),
        "relayer_state_history",
        ["relayer_address", "at_ms"],
    )
    op.create_table(
        "service_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_service_meta")),
    )


def downgrade() -> None:
    op.drop_table("service_meta")
    op.drop_index(op.f("ix_relayer_state_history_relayer_address_at_ms"), table_name="relayer_state_history")
    op.drop_table("relayer_state_history")
    op.drop_table("relayers")
