"""Sponsor API keys (HMAC only, per-account slots).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gasless.db import types as gtypes

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("env", sa.String(8), nullable=False),
        sa.Column("slot", sa.SmallInteger(), nullable=True),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("policy", _json(), nullable=False),
        sa.Column("secret_hmac", gtypes.Hash32(), nullable=False),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("revoked_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("account", "env", "slot", name=op.f("uq_api_keys_account_env_slot")),
        sa.CheckConstraint("env IN ('live', 'test')", name=op.f("ck_api_keys_env")),
        sa.CheckConstraint(
            "(slot IS NOT NULL AND revoked_at_ms IS NULL) OR (slot IS NULL AND revoked_at_ms IS NOT NULL)",
            name=op.f("ck_api_keys_slot_active"),
        ),
        sa.CheckConstraint("slot IS NULL OR slot >= 0", name=op.f("ck_api_keys_slot")),
    )
    op.create_index(op.f("ix_api_keys_account_env"), "api_keys", ["account", "env"])


def downgrade() -> None:
    op.drop_index(op.f("ix_api_keys_account_env"), table_name="api_keys")
    op.drop_table("api_keys")
