"""An index on the reservations' billing class and creation time: the notice worker's pay-as-you-go scan
(every second on the leader: the accounts with pay-as-you-go reservations since its cursor) reads a range
of it instead of every reservation the database holds.

Expand-only: the previous release serves on it unchanged. On a large PostgreSQL database, build it
beforehand without blocking writes (`CREATE INDEX CONCURRENTLY IF NOT EXISTS
ix_reservations_billing_class_created_at_ms ON reservations (billing_class, created_at_ms)`,
docs/storage.md); this migration then finds it and does nothing.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_reservations_billing_class_created_at_ms"


def upgrade() -> None:
    op.create_index(NAME, "reservations", ["billing_class", "created_at_ms"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index(NAME, table_name="reservations", if_exists=True)
