"""Notices, their acknowledgements, notification preferences and the mail outbox (issue 16).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("seq", gtypes.BigId, autoincrement=True, nullable=False),
        sa.Column("account", sa.String(62), nullable=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("severity", sa.String(8), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("data", gtypes.JsonDoc, nullable=False),
        sa.Column("dedupe_key", sa.String(200), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("dispatched_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("seq", name="pk_notices"),
        sa.UniqueConstraint("dedupe_key", name="uq_notices_dedupe_key"),
        sa.CheckConstraint("severity IN ('info', 'warning', 'critical')", name="ck_notices_severity"),
    )
    op.create_index("ix_notices_account_seq", "notices", ["account", "seq"])
    op.create_index("ix_notices_dispatched_at_ms_seq", "notices", ["dispatched_at_ms", "seq"])
    op.create_table(
        "notice_acks",
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("acked_seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("account", name="pk_notice_acks"),
    )
    op.create_table(
        "notification_prefs",
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("thresholds", gtypes.JsonDoc, nullable=False),
        sa.Column("kinds", gtypes.JsonDoc, nullable=False),
        sa.Column("email_address", sa.String(254), nullable=True),
        sa.Column("email_status", sa.String(8), nullable=True),
        sa.Column("email_token_id", sa.String(32), nullable=True),
        sa.Column("email_token_expires_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("email_pending_since_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("email_verified_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("escrow_low", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("account", name="pk_notification_prefs"),
        sa.CheckConstraint(
            "(email_address IS NULL AND email_status IS NULL)"
            " OR (email_address IS NOT NULL AND email_status IN ('pending', 'verified'))",
            name="ck_notification_prefs_email",
        ),
    )
    op.create_table(
        "mail_outbox",
        sa.Column("mail_id", sa.String(32), nullable=False),
        sa.Column("dedupe_key", sa.String(200), nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("to_address", sa.String(254), nullable=False),
        sa.Column("purpose", sa.String(40), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("claimed_until_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("sent_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("mail_id", name="pk_mail_outbox"),
        sa.UniqueConstraint("dedupe_key", name="uq_mail_outbox_dedupe_key"),
        sa.CheckConstraint("status IN ('pending', 'sent', 'failed')", name="ck_mail_outbox_status"),
    )
    op.create_index(
        "ix_mail_outbox_status_next_attempt_at_ms", "mail_outbox", ["status", "next_attempt_at_ms"]
    )


def downgrade() -> None:
    op.drop_index("ix_mail_outbox_status_next_attempt_at_ms", table_name="mail_outbox")
    op.drop_table("mail_outbox")
    op.drop_table("notification_prefs")
    op.drop_table("notice_acks")
    op.drop_index("ix_notices_dispatched_at_ms_seq", table_name="notices")
    op.drop_index("ix_notices_account_seq", table_name="notices")
    op.drop_table("notices")
