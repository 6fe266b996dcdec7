"""The contract function of a free relay's reservation (the per-account free limits count flag calls only);
the contract's error of a failed execution on the intent, and its catalogue code on the usage row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("function", sa.String(32), nullable=True))
    with op.batch_alter_table("intents") as batch:
        batch.add_column(sa.Column("failure", sa.String(64), nullable=True))
    with op.batch_alter_table("usage_ledger") as batch:
        batch.add_column(sa.Column("failure_code", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_ledger") as batch:
        batch.drop_column("failure_code")
    with op.batch_alter_table("intents") as batch:
        batch.drop_column("failure")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("function")
