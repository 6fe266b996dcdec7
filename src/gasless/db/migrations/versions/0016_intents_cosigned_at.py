"""An index on the intents' co-signature time: the status page's availability (its first activity and its
recent days) reads a range of it instead of every intent the database holds.

Expand-only: the previous release serves on it unchanged. On a large PostgreSQL database, build it
beforehand without blocking writes (`CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_intents_cosigned_at_ms ON
intents (cosigned_at_ms)`, docs/operations.md); this migration then finds it and does nothing.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_intents_cosigned_at_ms", "intents", ["cosigned_at_ms"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_intents_cosigned_at_ms", table_name="intents", if_exists=True)
