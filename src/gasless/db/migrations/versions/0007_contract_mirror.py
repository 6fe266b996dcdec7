"""The billing contract mirror: accounts, authorised senders, the purchase timeline, contract views and
mirrored `usageSettled` events.

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from gasless.db import types as gtypes

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = (
    "'deposit', 'plan_purchase', 'renewal', 'renewal_skipped', 'escrow_move', 'payg_settlement', "
    "'sender_fee', 'grant'"
)


def upgrade() -> None:
    op.create_table(
        "mirror_accounts",
        sa.Column("address", sa.String(62), nullable=False),
        sa.Column("credits_micro", gtypes.Micro(), nullable=False),
        sa.Column("escrow_micro", gtypes.Micro(), nullable=False),
        sa.Column("running", gtypes.JsonDoc, nullable=True),
        sa.Column("queued", gtypes.JsonDoc, nullable=True),
        sa.Column("auto_renew", sa.Boolean(), nullable=False),
        sa.Column("payg", gtypes.JsonDoc, nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("created_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("sender_count", sa.Integer(), nullable=False),
        sa.Column("hyperblock_nonce", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("address", name="pk_mirror_accounts"),
    )
    op.create_table(
        "mirror_senders",
        sa.Column("sender", sa.String(62), nullable=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("added_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=False),
        sa.PrimaryKeyConstraint("sender", name="pk_mirror_senders"),
    )
    op.create_index("ix_mirror_senders_account_seq", "mirror_senders", ["account", "seq"])
    op.create_table(
        "mirror_purchases",
        sa.Column("seq", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("account", sa.String(62), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("amount_micro", gtypes.Micro(), nullable=True),
        sa.Column("tier_id", sa.Integer(), nullable=True),
        sa.Column("details", gtypes.JsonDoc, nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=False),
        sa.Column("event_index", sa.Integer(), nullable=False),
        sa.Column("hyperblock_nonce", sa.BigInteger(), nullable=False),
        sa.Column("block_ts_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_mirror_purchases"),
        sa.UniqueConstraint("tx_hash", "event_index", name="uq_mirror_purchases_tx_hash_event_index"),
        sa.CheckConstraint(f"kind IN ({_KINDS})", name="ck_mirror_purchases_kind"),
    )
    op.create_index("ix_mirror_purchases_account_block_ts_ms", "mirror_purchases", ["account", "block_ts_ms"])
    op.create_table(
        "mirror_views",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("value", gtypes.JsonDoc, nullable=False),
        sa.Column("hyperblock_nonce", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_mirror_views"),
    )
    op.create_table(
        "mirror_settlements",
        sa.Column("batch_id", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("usage_root", gtypes.Hash32(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("total_ru", sa.BigInteger(), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=False),
        sa.Column("hyperblock_nonce", sa.BigInteger(), nullable=False),
        sa.Column("block_ts_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name="pk_mirror_settlements"),
    )


def downgrade() -> None:
    op.drop_table("mirror_settlements")
    op.drop_table("mirror_views")
    op.drop_index("ix_mirror_purchases_account_block_ts_ms", table_name="mirror_purchases")
    op.drop_table("mirror_purchases")
    op.drop_index("ix_mirror_senders_account_seq", table_name="mirror_senders")
    op.drop_table("mirror_senders")
    op.drop_table("mirror_accounts")
