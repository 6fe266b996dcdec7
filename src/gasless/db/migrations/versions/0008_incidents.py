"""Incidents and their append-only updates (docs/incidents.md).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "'investigating', 'identified', 'monitoring', 'resolved'"
_APPEND_ONLY = "incident updates are append-only"
_PG_FUNCTION = "gasless_incident_updates_append_only"


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("impact", sa.String(16), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(40), nullable=True),
        sa.Column("open_key", sa.String(40), nullable=True),
        sa.Column("update_count", sa.Integer(), nullable=False),
        sa.Column("occurrences", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("created_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("resolved_at_ms", gtypes.UnixMs(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
        sa.UniqueConstraint("open_key", name="uq_incidents_open_key"),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name="ck_incidents_status"),
        sa.CheckConstraint("impact IN ('none', 'minor', 'major', 'critical')", name="ck_incidents_impact"),
        sa.CheckConstraint("source IN ('automatic', 'operator')", name="ck_incidents_source"),
        sa.CheckConstraint("shard IS NULL OR shard IN (0, 1, 2)", name="ck_incidents_shard"),
        sa.CheckConstraint(
            "(status = 'resolved' AND resolved_at_ms IS NOT NULL AND open_key IS NULL)"
            " OR (status <> 'resolved' AND resolved_at_ms IS NULL)",
            name="ck_incidents_resolved",
        ),
        sa.CheckConstraint(
            "open_key IS NULL OR (source = 'automatic' AND open_key = kind)", name="ck_incidents_open_key"
        ),
    )
    op.create_index("ix_incidents_created_at_ms_id", "incidents", ["created_at_ms", "id"])
    op.create_index("ix_incidents_updated_at_ms", "incidents", ["updated_at_ms"])
    op.create_table(
        "incident_updates",
        sa.Column("incident_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("incident_id", "seq", name="pk_incident_updates"),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name="fk_incident_updates_incident_id_incidents"
        ),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name="ck_incident_updates_status"),
        sa.CheckConstraint("seq >= 1", name="ck_incident_updates_seq"),
    )
    # Append-only in the database itself: whatever writes to it, an update is never changed or removed.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE FUNCTION {_PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{_APPEND_ONLY}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER incident_updates_append_only BEFORE UPDATE OR DELETE ON incident_updates"
            f" FOR EACH ROW EXECUTE FUNCTION {_PG_FUNCTION}()"
        )
    else:
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER incident_updates_no_{event.lower()} BEFORE {event} ON incident_updates"
                f" BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS incident_updates_append_only ON incident_updates")
        op.execute(f"DROP FUNCTION IF EXISTS {_PG_FUNCTION}()")
    else:
        for event in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS incident_updates_no_{event}")
    op.drop_table("incident_updates")
    op.drop_index("ix_incidents_updated_at_ms", table_name="incidents")
    op.drop_index("ix_incidents_created_at_ms_id", table_name="incidents")
    op.drop_table("incidents")
