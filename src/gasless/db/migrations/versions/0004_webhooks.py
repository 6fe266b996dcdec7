"""Webhooks, their outbox/delivery log, and generic Idempotency-Key records.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gasless.db import types as gtypes

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("webhook_id", sa.String(32), nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("env", sa.String(8), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_types", _json(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(128), nullable=True),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("previous_secret_sealed", sa.Text(), nullable=True),
        sa.Column("previous_expires_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("webhook_id", name=op.f("pk_webhooks")),
    )
    op.create_index(op.f("ix_webhooks_account_env"), "webhooks", ["account", "env"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.String(32), nullable=False),
        sa.Column("webhook_id", sa.String(32), nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("event_id", sa.String(96), nullable=False),
        sa.Column("event_type", sa.String(48), nullable=False),
        sa.Column("payload", _json(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("claimed_until_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_latency_ms", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("completed_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("delivery_id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("webhook_id", "event_id", name=op.f("uq_webhook_deliveries_webhook_id_event_id")),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')", name=op.f("ck_webhook_deliveries_status")
        ),
    )
    op.create_index(
        op.f("ix_webhook_deliveries_status_next_attempt_at_ms"),
        "webhook_deliveries",
        ["status", "next_attempt_at_ms"],
    )
    op.create_index(
        op.f("ix_webhook_deliveries_webhook_id_created_at_ms"),
        "webhook_deliveries",
        ["webhook_id", "created_at_ms"],
    )
    op.create_index(op.f("ix_webhook_deliveries_created_at_ms"), "webhook_deliveries", ["created_at_ms"])
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(62), nullable=False),
        sa.Column("operation", sa.String(48), nullable=False),
        sa.Column("key_digest", gtypes.Hash32(), nullable=False),
        sa.Column("request_digest", gtypes.Hash32(), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response_sealed", sa.Text(), nullable=True),
        sa.Column("locked_until_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("expires_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "operation", "key_digest", name=op.f("pk_idempotency_keys")),
        sa.CheckConstraint("state IN ('running', 'done')", name=op.f("ck_idempotency_keys_state")),
    )
    op.create_index(op.f("ix_idempotency_keys_expires_at_ms"), "idempotency_keys", ["expires_at_ms"])


def downgrade() -> None:
    op.drop_index(op.f("ix_idempotency_keys_expires_at_ms"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index(op.f("ix_webhook_deliveries_created_at_ms"), table_name="webhook_deliveries")
    op.drop_index(op.f("ix_webhook_deliveries_webhook_id_created_at_ms"), table_name="webhook_deliveries")
    op.drop_index(op.f("ix_webhook_deliveries_status_next_attempt_at_ms"), table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index(op.f("ix_webhooks_account_env"), table_name="webhooks")
    op.drop_table("webhooks")
