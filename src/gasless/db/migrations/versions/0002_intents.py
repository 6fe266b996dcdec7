"""Relay core: intents, logical idempotency keys, rejected submissions, signer fences.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gasless.db import types as gtypes

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = "'COSIGNED', 'BROADCAST', 'EXECUTED', 'FINALIZED', 'DEAD'"


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _big_id() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "intents",
        sa.Column("pk", _big_id(), autoincrement=True, nullable=False),
        sa.Column("sender", sa.String(62), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=False),
        sa.Column("slot_seq", sa.SmallInteger(), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=False),
        sa.Column("bytes_sha256", gtypes.Hash32(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("sender_shard", sa.SmallInteger(), nullable=False),
        sa.Column("receiver", sa.String(62), nullable=False),
        sa.Column("relayer", sa.String(62), nullable=False),
        sa.Column("cross_shard", sa.Boolean(), nullable=False),
        sa.Column("gas_limit", sa.BigInteger(), nullable=False),
        sa.Column("gas_price", sa.BigInteger(), nullable=False),
        sa.Column("value_atto", gtypes.Atto(), nullable=False),
        sa.Column("lease_kind", sa.String(16), nullable=False),
        sa.Column("billing", _json(), nullable=False),
        sa.Column("intent_key", sa.String(128), nullable=True),
        sa.Column("tx", _json(), nullable=False),
        sa.Column("host_id", sa.String(8), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("received_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("cosigned_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("broadcast_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("executed_block_ts_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("finalized_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("dead_reason", sa.Text(), nullable=True),
        sa.Column("replaced_by", gtypes.Hash32(), nullable=True),
        sa.Column("last_sent_at_ms", gtypes.UnixMs(), nullable=True),
        sa.Column("send_attempts", sa.Integer(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_intents")),
        sa.UniqueConstraint("tx_hash", name=op.f("uq_intents_tx_hash")),
        sa.UniqueConstraint("sender", "nonce", "slot_seq", name=op.f("uq_intents_sender_nonce_slot_seq")),
        sa.UniqueConstraint(
            "sender", "nonce", "bytes_sha256", name=op.f("uq_intents_sender_nonce_bytes_sha256")
        ),
        sa.CheckConstraint(f"state IN ({_STATES})", name=op.f("ck_intents_state")),
        sa.CheckConstraint("nonce >= 0", name=op.f("ck_intents_nonce")),
    )
    op.create_index(op.f("ix_intents_state_updated_at_ms"), "intents", ["state", "updated_at_ms"])
    op.create_index(op.f("ix_intents_sender_state"), "intents", ["sender", "state"])
    op.create_table(
        "intent_keys",
        sa.Column("sender", sa.String(62), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("intent_pk", _big_id(), nullable=False),
        sa.Column("expires_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("sender", "key", name=op.f("pk_intent_keys")),
        sa.ForeignKeyConstraint(["intent_pk"], ["intents.pk"], name=op.f("fk_intent_keys_intent_pk_intents")),
    )
    op.create_index(op.f("ix_intent_keys_expires_at_ms"), "intent_keys", ["expires_at_ms"])
    op.create_table(
        "rejections",
        sa.Column("pk", _big_id(), autoincrement=True, nullable=False),
        sa.Column("sender", sa.String(62), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=False),
        sa.Column("tx_hash", gtypes.Hash32(), nullable=True),
        sa.Column("code", sa.String(48), nullable=False),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("host_id", sa.String(8), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("received_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_rejections")),
    )
    op.create_index(op.f("ix_rejections_sender_nonce"), "rejections", ["sender", "nonce"])
    op.create_index(op.f("ix_rejections_tx_hash"), "rejections", ["tx_hash"])
    op.create_index(op.f("ix_rejections_received_at_ms"), "rejections", ["received_at_ms"])
    op.create_table(
        "signer_fences",
        sa.Column("signer_id", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at_ms", gtypes.UnixMs(), nullable=False),
        sa.Column("updated_at_ms", gtypes.UnixMs(), nullable=False),
        sa.PrimaryKeyConstraint("signer_id", name=op.f("pk_signer_fences")),
    )


def downgrade() -> None:
    op.drop_table("signer_fences")
    op.drop_index(op.f("ix_rejections_received_at_ms"), table_name="rejections")
    op.drop_index(op.f("ix_rejections_tx_hash"), table_name="rejections")
    op.drop_index(op.f("ix_rejections_sender_nonce"), table_name="rejections")
    op.drop_table("rejections")
    op.drop_index(op.f("ix_intent_keys_expires_at_ms"), table_name="intent_keys")
    op.drop_table("intent_keys")
    op.drop_index(op.f("ix_intents_sender_state"), table_name="intents")
    op.drop_index(op.f("ix_intents_state_updated_at_ms"), table_name="intents")
    op.drop_table("intents")
