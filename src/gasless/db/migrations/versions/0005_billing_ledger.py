"""Billing: reservations made at the commit point, per-period RU counters, the usage ledger, settlement
batches.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLASSES = "'plan', 'payg', 'sponsor', 'free'"


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("intent_pk", gtypes.BigId, nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("billing_class", sa.String(8), nullable=False),
        sa.Column("ru", sa.Integer(), nullable=False),
        sa.Column("payg_micro", gtypes.Micro(), nullable=False),
        sa.Column("period_id", sa.BigInteger(), nullable=True),
        sa.Column("api_key_id", sa.String(16), nullable=True),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.ForeignKeyConstraint(["intent_pk"], ["intents.pk"], name="fk_reservations_intent_pk_intents"),
        sa.PrimaryKeyConstraint("intent_pk", name="pk_reservations"),
        sa.CheckConstraint(f"billing_class IN ({_CLASSES})", name="ck_reservations_billing_class"),
        sa.CheckConstraint("state IN ('reserved', 'settled', 'released')", name="ck_reservations_state"),
        sa.CheckConstraint("ru >= 0 AND payg_micro >= 0", name="ck_reservations_amounts"),
    )
    op.create_index("ix_reservations_account_state", "reservations", ["account", "state"])
    op.create_table(
        "account_period_usage",
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("period_id", sa.BigInteger(), nullable=False),
        sa.Column("ru_used", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("account", "period_id", name="pk_account_period_usage"),
        sa.CheckConstraint("ru_used >= 0", name="ck_account_period_usage_ru_used"),
    )
    op.create_table(
        "settlement_batches",
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("usage_root", gtypes.Hash32(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("total_ru", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("submitted_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("committed_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name="pk_settlement_batches"),
        sa.CheckConstraint(
            "state IN ('built', 'submitted', 'committed', 'failed')", name="ck_settlement_batches_state"
        ),
    )
    op.create_table(
        "usage_ledger",
        sa.Column("tx_hash", gtypes.Hash32(), nullable=False),
        sa.Column("intent_pk", gtypes.BigId, nullable=False),
        sa.Column("account", sa.String(62), nullable=True),
        sa.Column("sender", sa.String(62), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=False),
        sa.Column("receiver", sa.String(62), nullable=False),
        sa.Column("function", sa.String(255), nullable=True),
        sa.Column("sender_shard", sa.SmallInteger(), nullable=False),
        sa.Column("relayer", sa.String(62), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("billed", sa.Boolean(), nullable=False),
        sa.Column("billing_class", sa.String(8), nullable=True),
        sa.Column("ru", sa.Integer(), nullable=True),
        sa.Column("payg_micro", gtypes.Micro(), nullable=True),
        sa.Column("period_id", sa.BigInteger(), nullable=True),
        sa.Column("api_key_id", sa.String(16), nullable=True),
        sa.Column("gas_limit", sa.BigInteger(), nullable=False),
        sa.Column("gas_price", sa.BigInteger(), nullable=False),
        sa.Column("received_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("cosigned_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("broadcast_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("executed_block_ts_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("finalized_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("terminal_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("dead_reason", sa.Text(), nullable=True),
        sa.Column("first_ack_gateway", sa.String(255), nullable=True),
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("leaf_index", sa.Integer(), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.ForeignKeyConstraint(["intent_pk"], ["intents.pk"], name="fk_usage_ledger_intent_pk_intents"),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["settlement_batches.batch_id"], name="fk_usage_ledger_batch_id_settlement_batches"
        ),
        sa.PrimaryKeyConstraint("tx_hash", name="pk_usage_ledger"),
        sa.UniqueConstraint("intent_pk", name="uq_usage_ledger_intent_pk"),
        sa.CheckConstraint("status IN ('success', 'failed', 'dead')", name="ck_usage_ledger_status"),
        sa.CheckConstraint(
            f"billing_class IS NULL OR billing_class IN ({_CLASSES})", name="ck_usage_ledger_billing_class"
        ),
        sa.CheckConstraint(
            "billed OR (billing_class IS NULL AND ru IS NULL AND payg_micro IS NULL AND period_id IS NULL)",
            name="ck_usage_ledger_unbilled",
        ),
        sa.CheckConstraint("NOT billed OR status <> 'dead'", name="ck_usage_ledger_dead_unbilled"),
    )
    op.create_index("ix_usage_ledger_account_terminal_at_ms", "usage_ledger", ["account", "terminal_at_ms"])
    op.create_index("ix_usage_ledger_batch_id", "usage_ledger", ["batch_id"])
    op.create_index("ix_usage_ledger_sender_nonce", "usage_ledger", ["sender", "nonce"])


def downgrade() -> None:
    op.drop_index("ix_usage_ledger_sender_nonce", table_name="usage_ledger")
    op.drop_index("ix_usage_ledger_batch_id", table_name="usage_ledger")
    op.drop_index("ix_usage_ledger_account_terminal_at_ms", table_name="usage_ledger")
    op.drop_table("usage_ledger")
    op.drop_table("settlement_batches")
    op.drop_table("account_period_usage")
    op.drop_index("ix_reservations_account_state", table_name="reservations")
    op.drop_table("reservations")
