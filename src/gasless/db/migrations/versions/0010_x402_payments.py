"""x402 payments keyed by the client's payment identifier, written before anything is co-signed.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "x402_payments",
        sa.Column("payment_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("payload_digest", gtypes.Hash32(), nullable=False),
        sa.Column("payer", sa.String(62), nullable=False),
        sa.Column("beneficiary", sa.String(62), nullable=False),
        sa.Column("amount_micro", gtypes.Micro(), nullable=False),
        sa.Column("quote_id", gtypes.Hash32(), nullable=False),
        sa.Column("terms", gtypes.JsonDoc, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=True),
        sa.Column("intent_id", sa.String(84), nullable=True),
        sa.Column("result", gtypes.JsonDoc, nullable=True),
        sa.Column("host_id", sa.String(8), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("payment_id", name="pk_x402_payments"),
        sa.CheckConstraint("state IN ('pending', 'success', 'failed')", name="ck_x402_payments_state"),
        sa.CheckConstraint("kind IN ('topup', 'purchase')", name="ck_x402_payments_kind"),
    )
    op.create_index("ix_x402_payments_payer_created_at_ms", "x402_payments", ["payer", "created_at_ms"])


def downgrade() -> None:
    op.drop_index("ix_x402_payments_payer_created_at_ms", table_name="x402_payments")
    op.drop_table("x402_payments")
