"""Latency rollups (mergeable histograms per minute and hour) and the usage rows' `rolled_up` mark.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_ledger") as batch:
        batch.add_column(sa.Column("rolled_up", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index(
        "ix_usage_ledger_rolled_up_terminal_at_ms", "usage_ledger", ["rolled_up", "terminal_at_ms"]
    )
    op.create_table(
        "latency_rollups",
        sa.Column("granularity", sa.String(1), nullable=False),
        sa.Column("bucket_ms", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("dimension", sa.String(16), nullable=False),
        sa.Column("key", sa.String(140), nullable=False),
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("histogram", sa.Text(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint(
            "granularity", "bucket_ms", "dimension", "key", "metric", name="pk_latency_rollups"
        ),
        sa.CheckConstraint("granularity IN ('m', 'h')", name="ck_latency_rollups_granularity"),
    )
    op.create_index(
        "ix_latency_rollups_dimension_key_granularity_bucket_ms",
        "latency_rollups",
        ["dimension", "key", "granularity", "bucket_ms"],
    )


def downgrade() -> None:
    op.drop_index("ix_latency_rollups_dimension_key_granularity_bucket_ms", table_name="latency_rollups")
    op.drop_table("latency_rollups")
    op.drop_index("ix_usage_ledger_rolled_up_terminal_at_ms", table_name="usage_ledger")
    with op.batch_alter_table("usage_ledger") as batch:
        batch.drop_column("rolled_up")
