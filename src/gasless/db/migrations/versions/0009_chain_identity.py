"""The chain a database belongs to: chain id, genesis time, highest final hyperblock seen (docs/storage.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chain_identity",
        sa.Column("id", sa.SmallInteger(), nullable=False, autoincrement=False),
        sa.Column("chain_id", sa.String(32), nullable=False),
        sa.Column("start_time_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("final_nonce", sa.BigInteger(), nullable=False),
        sa.Column("final_hash", gtypes.Hash32(), nullable=False),
        sa.Column("recorded_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_chain_identity"),
        sa.CheckConstraint("id = 1", name="ck_chain_identity_single_row"),
        sa.CheckConstraint("final_nonce >= 0", name="ck_chain_identity_final_nonce"),
    )


def downgrade() -> None:
    op.drop_table("chain_identity")
