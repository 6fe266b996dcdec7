"""The tables of notices and notifications (migration 0015): the notice log, acknowledgements, notification
preferences and the mail outbox. Registered on the one `metadata` (gasless.db imports this module)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

from gasless.db.tables import metadata
from gasless.db.types import BigId, JsonDoc, UnixMs

# Notices (gasless.notices, migration 0015): one log, account notices (`account` set) and global ones (`account`
# NULL: tariff, RU schedule, sender-fee changes). `seq` is the one order of both; inserts are serialised (an
# advisory lock on PostgreSQL, the single writer on SQLite) so a reader never sees a later seq before an
# earlier one. `dedupe_key` makes every notice once, whichever host or retry writes it; `dispatched_at_ms` is
# set once its webhook deliveries and e-mails are queued (the notices outbox).
NOTICE_SEVERITIES = ("info", "warning", "critical")
notices = Table(
    "notices",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("account", String(62), nullable=True),
    Column("kind", String(40), nullable=False),
    Column("severity", String(8), nullable=False),
    Column("title", String(200), nullable=False),
    Column("body", Text, nullable=False),
    Column("data", JsonDoc, nullable=False),
    Column("dedupe_key", String(200), nullable=False),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("dispatched_at_ms", UnixMs, nullable=True),
    UniqueConstraint("dedupe_key"),
    CheckConstraint("severity IN ('info', 'warning', 'critical')", name="severity"),
)
Index(None, notices.c.account, notices.c.seq)
Index(None, notices.c.dispatched_at_ms, notices.c.seq)

# How far an account acknowledged the merged notice log (acknowledgement is a high-water mark).
notice_acks = Table(
    "notice_acks",
    metadata,
    Column("account", String(62), primary_key=True),
    Column("acked_seq", BigInteger, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)

# Notification preferences (gasless.notifications): thresholds, per-kind e-mail switches and the e-mail
# channel; `email_token_id` is the one verification link still open (single use: cleared when opened).
EMAIL_STATUSES = ("pending", "verified")
notification_prefs = Table(
    "notification_prefs",
    metadata,
    Column("account", String(62), primary_key=True),
    Column("thresholds", JsonDoc, nullable=False),
    Column("kinds", JsonDoc, nullable=False),
    Column("email_address", String(254), nullable=True),
    Column("email_status", String(8), nullable=True),
    Column("email_token_id", String(32), nullable=True),
    Column("email_token_expires_ms", UnixMs, nullable=True),
    Column("email_pending_since_ms", UnixMs, nullable=True),
    Column("email_verified_at_ms", UnixMs, nullable=True),
    Column("escrow_low", Boolean, nullable=False, server_default=false()),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint(
        "(email_address IS NULL AND email_status IS NULL)"
        " OR (email_address IS NOT NULL AND email_status IN ('pending', 'verified'))",
        name="email",
    ),
)

# E-mails to send (the mail outbox): claimed by one host's sender at a time, retried with backoff.
mail_outbox = Table(
    "mail_outbox",
    metadata,
    Column("mail_id", String(32), primary_key=True),
    Column("dedupe_key", String(200), nullable=False),
    Column("account", String(62), nullable=False),
    Column("to_address", String(254), nullable=False),
    Column("purpose", String(40), nullable=False),  # `verify`, or the notice kind
    Column("subject", String(200), nullable=False),
    Column("body", Text, nullable=False),
    Column("status", String(8), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("next_attempt_at_ms", UnixMs, nullable=False),
    Column("claimed_by", String(64), nullable=True),
    Column("claimed_until_ms", UnixMs, nullable=True),
    Column("last_error", String(200), nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("sent_at_ms", UnixMs, nullable=True),
    UniqueConstraint("dedupe_key"),
    CheckConstraint("status IN ('pending', 'sent', 'failed')", name="status"),
)
Index(None, mail_outbox.c.status, mail_outbox.c.next_attempt_at_ms)
