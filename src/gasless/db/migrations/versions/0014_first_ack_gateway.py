"""The gateway that acknowledged an intent first (latency rollups by gateway, the usage row's acknowledgement).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("intents") as batch:
        batch.add_column(sa.Column("first_ack_gateway", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("intents") as batch:
        batch.drop_column("first_ack_gateway")
