"""The service's tables (SQLAlchemy Core). Every schema change here needs an Alembic revision."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

from gasless.db.types import Atto, BigId, Hash32, JsonDoc, Micro, UnixMs

# Deterministic constraint names keep migrations (and SQLite batch rebuilds) stable.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RELAYER_STATES = ("active", "draining", "retired")
_STATE_SQL = ", ".join(f"'{state}'" for state in RELAYER_STATES)

metadata = MetaData(naming_convention=NAMING_CONVENTION)

relayers = Table(
    "relayers",
    metadata,
    Column("address", String(62), primary_key=True),  # bech32 erd1...
    Column("shard", SmallInteger, nullable=False),
    Column("state", String(16), nullable=False),
    Column("funded", Boolean, nullable=False, server_default=false()),
    # Python-side default: the SQLite text form is zero-padded, which a server default would not be.
    Column("balance_atto", Atto, nullable=False, default=0),
    Column("balance_checked_at_ms", UnixMs, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint(f"state IN ({_STATE_SQL})", name="state"),
    CheckConstraint("shard >= 0", name="shard"),
)

relayer_state_history = Table(
    "relayer_state_history",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("relayer_address", String(62), ForeignKey("relayers.address"), nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("at_ms", UnixMs, nullable=False),
    CheckConstraint(f"from_state IS NULL OR from_state IN ({_STATE_SQL})", name="from_state"),
    CheckConstraint(f"to_state IN ({_STATE_SQL})", name="to_state"),
)
Index(None, relayer_state_history.c.relayer_address, relayer_state_history.c.at_ms)

service_meta = Table(
    "service_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", JsonDoc, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)

INTENT_STATES = ("COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED", "DEAD")
_INTENT_STATE_SQL = ", ".join(f"'{state}'" for state in INTENT_STATES)

# One row per co-signed transaction (the commit point writes it). A (sender, nonce) slot can hold a
# replacement chain: slot_seq 0 is the first intent, each accepted replacement takes the next number, and
# the unique key makes two racing submissions for the same slot impossible on every host.
intents = Table(
    "intents",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("sender", String(62), nullable=False),
    Column("nonce", BigInteger, nullable=False),
    Column("slot_seq", SmallInteger, nullable=False),
    Column("tx_hash", Hash32, nullable=False),
    Column("bytes_sha256", Hash32, nullable=False),  # SHA-256 of the canonical signing bytes
    Column("state", String(16), nullable=False),
    Column("seq", Integer, nullable=False),  # bumps on every change: the per-intent event id
    Column("sender_shard", SmallInteger, nullable=False),
    Column("receiver", String(62), nullable=False),
    Column("relayer", String(62), nullable=False),
    Column("cross_shard", Boolean, nullable=False),
    Column("gas_limit", BigInteger, nullable=False),
    Column("gas_price", BigInteger, nullable=False),
    Column("value_atto", Atto, nullable=False),
    Column("lease_kind", String(16), nullable=False),
    Column("billing", JsonDoc, nullable=False),
    Column("intent_key", String(128), nullable=True),
    Column("tx", JsonDoc, nullable=False),  # the co-signed wire transaction, ready to (re)broadcast
    Column("host_id", String(8), nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("received_at_ms", UnixMs, nullable=True),  # null when restored by orphan recovery
    Column("cosigned_at_ms", UnixMs, nullable=False),
    Column("broadcast_at_ms", UnixMs, nullable=True),
    Column("executed_block_ts_ms", UnixMs, nullable=True),
    Column("finalized_at_ms", UnixMs, nullable=True),
    Column("outcome", String(16), nullable=True),  # chain status once executed: success | fail
    Column("dead_reason", Text, nullable=True),
    Column("failure", String(64), nullable=True),  # the contract's error of a failed execution
    Column("first_ack_gateway", String(255), nullable=True),  # the gateway that acknowledged first
    Column("replaced_by", Hash32, nullable=True),
    Column("last_sent_at_ms", UnixMs, nullable=True),
    Column("send_attempts", Integer, nullable=False, default=0),
    Column("updated_at_ms", UnixMs, nullable=False),
    UniqueConstraint("tx_hash"),
    UniqueConstraint("sender", "nonce", "slot_seq"),
    UniqueConstraint("sender", "nonce", "bytes_sha256"),
    CheckConstraint(f"state IN ({_INTENT_STATE_SQL})", name="state"),
    CheckConstraint("nonce >= 0", name="nonce"),
)
Index(None, intents.c.state, intents.c.updated_at_ms)
Index(None, intents.c.sender, intents.c.state)
Index(None, intents.c.cosigned_at_ms)  # the status page's availability by day (status/repository.py)

# Logical idempotency keys (`Idempotency-Key` / `intentKey`), per sender, kept 86 400 000 ms.
intent_keys = Table(
    "intent_keys",
    metadata,
    Column("sender", String(62), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("intent_pk", BigId, ForeignKey("intents.pk"), nullable=False),
    Column("expires_at_ms", UnixMs, nullable=False),
)
Index(None, intent_keys.c.expires_at_ms)

# Submissions refused before the commit point (state REJECTED), kept 30 days; nothing was sent.
rejections = Table(
    "rejections",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("sender", String(62), nullable=False),
    Column("nonce", BigInteger, nullable=False),
    Column("tx_hash", Hash32, nullable=True),
    Column("code", String(48), nullable=False),
    Column("status", SmallInteger, nullable=False),
    Column("detail", Text, nullable=True),
    Column("host_id", String(8), nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("received_at_ms", UnixMs, nullable=False),
)
Index(None, rejections.c.sender, rejections.c.nonce)
Index(None, rejections.c.tx_hash)
Index(None, rejections.c.received_at_ms)

# Signer fencing: one live holder per signer identity; the token grows on every takeover.
signer_fences = Table(
    "signer_fences",
    metadata,
    Column("signer_id", String(64), primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("expires_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)

# Sponsor API keys: only an HMAC of the key is stored (purpose key bound to env + chainId). An active key
# holds one of the account's slots 0..9 in its environment; the unique key makes the per-account limit hold
# under concurrent creation on every host. Revocation frees the slot (NULL never conflicts).
API_KEY_ENVIRONMENTS = ("live", "test")
_API_KEY_ENV_SQL = ", ".join(f"'{env}'" for env in API_KEY_ENVIRONMENTS)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(16), primary_key=True),
    Column("account", String(62), nullable=False),
    Column("env", String(8), nullable=False),
    Column("slot", SmallInteger, nullable=True),
    Column("label", String(64), nullable=False),
    Column("policy", JsonDoc, nullable=False),
    Column("secret_hmac", Hash32, nullable=False),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    Column("revoked_at_ms", UnixMs, nullable=True),
    UniqueConstraint("account", "env", "slot"),
    CheckConstraint(f"env IN ({_API_KEY_ENV_SQL})", name="env"),
    CheckConstraint(
        "(slot IS NOT NULL AND revoked_at_ms IS NULL) OR (slot IS NULL AND revoked_at_ms IS NOT NULL)",
        name="slot_active",
    ),
    CheckConstraint("slot IS NULL OR slot >= 0", name="slot"),
)
Index(None, api_keys.c.account, api_keys.c.env)

# Webhooks of an account (at most 10, counted under a per-account lock). Signing secrets are stored sealed
# (AES-GCM under the `webhook-seal` purpose key, the webhook id as associated data); after a rotation the
# previous secret keeps signing until `previous_expires_at_ms`.
webhooks = Table(
    "webhooks",
    metadata,
    Column("webhook_id", String(32), primary_key=True),
    Column("account", String(62), nullable=False),
    Column("env", String(8), nullable=False),
    Column("url", Text, nullable=False),
    Column("event_types", JsonDoc, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("description", String(128), nullable=True),
    Column("secret_sealed", Text, nullable=False),
    Column("previous_secret_sealed", Text, nullable=True),
    Column("previous_expires_at_ms", UnixMs, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)
Index(None, webhooks.c.account, webhooks.c.env)

# The outbox and delivery log in one: a row is written when the event happens (one per subscribed webhook,
# unique per (webhook, event)), claimed by a delivery worker for one attempt at a time, and kept 30 days.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", String(32), primary_key=True),
    Column("webhook_id", String(32), nullable=False),
    Column("account", String(62), nullable=False),
    Column("event_id", String(96), nullable=False),
    Column("event_type", String(48), nullable=False),
    Column("payload", JsonDoc, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("next_attempt_at_ms", UnixMs, nullable=False),
    Column("claimed_by", String(64), nullable=True),
    Column("claimed_until_ms", UnixMs, nullable=True),
    Column("last_status_code", Integer, nullable=True),
    Column("last_latency_ms", Integer, nullable=True),
    Column("last_error", String(200), nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    Column("completed_at_ms", UnixMs, nullable=True),
    UniqueConstraint("webhook_id", "event_id"),
    CheckConstraint("status IN ('pending', 'succeeded', 'failed')", name="status"),
)
Index(None, webhook_deliveries.c.status, webhook_deliveries.c.next_attempt_at_ms)
Index(None, webhook_deliveries.c.webhook_id, webhook_deliveries.c.created_at_ms)
Index(None, webhook_deliveries.c.created_at_ms)

# Generic Idempotency-Key records of POST writes, per (scope, operation, SHA-256 of the key), kept
# 86 400 000 ms. The stored response is sealed (AES-GCM, `idempotency-seal` purpose key).
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("scope", String(62), primary_key=True),
    Column("operation", String(48), primary_key=True),
    Column("key_digest", Hash32, primary_key=True),
    Column("request_digest", Hash32, nullable=False),
    Column("state", String(8), nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("response_sealed", Text, nullable=True),
    Column("locked_until_ms", UnixMs, nullable=False),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("expires_at_ms", UnixMs, nullable=False),
    CheckConstraint("state IN ('running', 'done')", name="state"),
)
Index(None, idempotency_keys.c.expires_at_ms)

# x402 payments (docs/x402.md), keyed by the client's payment identifier and shared by every host: written
# before anything is co-signed, so a replay on either host finds it. `payload_digest` is the SHA-256 of the
# payment payload's canonical JSON (same id + another payload: PAYMENT_INVALID). `result` holds the final
# answer (a X402PurchaseResult, or the PAYMENT_FAILED problem's members) once `state` is final.
X402_STATES = ("pending", "success", "failed")
x402_payments = Table(
    "x402_payments",
    metadata,
    Column("payment_id", String(128), primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("payload_digest", Hash32, nullable=False),
    Column("payer", String(62), nullable=False),
    Column("beneficiary", String(62), nullable=False),
    Column("amount_micro", Micro, nullable=False),
    Column("quote_id", Hash32, nullable=False),
    Column("terms", JsonDoc, nullable=False),
    Column("state", String(8), nullable=False),
    Column("tx_hash", Hash32, nullable=True),
    Column("intent_id", String(84), nullable=True),
    Column("result", JsonDoc, nullable=True),
    Column("host_id", String(8), nullable=False),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint("state IN ('pending', 'success', 'failed')", name="state"),
    CheckConstraint("kind IN ('topup', 'purchase')", name="kind"),
)
Index(None, x402_payments.c.payer, x402_payments.c.created_at_ms)

# Billing --------------------------------------------------------------------------------------------------
BILLING_CLASSES = ("plan", "payg", "sponsor", "free")
_CLASS_SQL = ", ".join(f"'{name}'" for name in BILLING_CLASSES)

# One reservation per co-signed intent, made in the commit transaction (the billing seam of
# IntentRepository.commit): `reserved` until the chain settles the intent, then `settled` (executed: a
# billed ledger row) or `released` (dead: never billed).
reservations = Table(
    "reservations",
    metadata,
    Column("intent_pk", BigId, ForeignKey("intents.pk"), primary_key=True),
    Column("account", String(62), nullable=False),
    Column("billing_class", String(8), nullable=False),
    Column("ru", Integer, nullable=False),
    Column("payg_micro", Micro, nullable=False),
    Column("period_id", BigInteger, nullable=True),
    Column("api_key_id", String(16), nullable=True),
    Column("state", String(10), nullable=False),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    # The contract function a free relay called: the per-account free limits count flag calls only.
    Column("function", String(32), nullable=True),
    CheckConstraint(f"billing_class IN ({_CLASS_SQL})", name="billing_class"),
    CheckConstraint("state IN ('reserved', 'settled', 'released')", name="state"),
    CheckConstraint("ru >= 0 AND payg_micro >= 0", name="amounts"),
)
Index(None, reservations.c.account, reservations.c.state)
# The notice worker's pay-as-you-go scan, every second (notices/repository.py, payg_reserved).
Index(None, reservations.c.billing_class, reservations.c.created_at_ms)

# RU drawn from a plan block per account and period (reserved + settled; a release gives it back). The
# plan cap is enforced by one conditional UPDATE in the commit transaction, so racing relays on any host
# never overspend a plan.
account_period_usage = Table(
    "account_period_usage",
    metadata,
    Column("account", String(62), primary_key=True),
    Column("period_id", BigInteger, primary_key=True),
    Column("ru_used", BigInteger, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint("ru_used >= 0", name="ru_used"),
)

# settleUsage batches: built from ledger rows, submitted by the owner key, committed once the
# `usageSettled` event is final.
settlement_batches = Table(
    "settlement_batches",
    metadata,
    Column("batch_id", BigInteger, primary_key=True, autoincrement=False),
    Column("usage_root", Hash32, nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("total_ru", BigInteger, nullable=False),
    Column("state", String(10), nullable=False),
    Column("tx_hash", Hash32, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("submitted_at_ms", UnixMs, nullable=True),
    Column("committed_at_ms", UnixMs, nullable=True),
    CheckConstraint("state IN ('built', 'submitted', 'committed', 'failed')", name="state"),
)

# The usage ledger (docs/billing.md, "The ledger row"): one row per terminal intent, keyed by transaction
# hash. Executed intents are `success`/`failed` and billed; dead ones `dead` and never billed (billing
# members null).
usage_ledger = Table(
    "usage_ledger",
    metadata,
    Column("tx_hash", Hash32, primary_key=True),
    Column("intent_pk", BigId, ForeignKey("intents.pk"), nullable=False),
    Column("account", String(62), nullable=True),  # who paid, or would have paid for a dead intent
    Column("sender", String(62), nullable=False),
    Column("nonce", BigInteger, nullable=False),
    Column("receiver", String(62), nullable=False),
    Column("function", String(255), nullable=True),
    Column("sender_shard", SmallInteger, nullable=False),
    Column("relayer", String(62), nullable=False),
    Column("status", String(8), nullable=False),
    Column("billed", Boolean, nullable=False),
    Column("billing_class", String(8), nullable=True),
    Column("ru", Integer, nullable=True),
    Column("payg_micro", Micro, nullable=True),
    Column("period_id", BigInteger, nullable=True),
    Column("api_key_id", String(16), nullable=True),
    Column("gas_limit", BigInteger, nullable=False),
    Column("gas_price", BigInteger, nullable=False),
    Column("received_at_ms", UnixMs, nullable=True),
    Column("cosigned_at_ms", UnixMs, nullable=False),
    Column("broadcast_at_ms", UnixMs, nullable=True),
    Column("executed_block_ts_ms", UnixMs, nullable=True),
    Column("finalized_at_ms", UnixMs, nullable=True),
    Column("terminal_at_ms", UnixMs, nullable=False),  # executedBlockTsMs, else the terminal time
    Column("dead_reason", Text, nullable=True),
    Column("failure_code", String(32), nullable=True),  # the catalogue code of a failed execution
    Column("route", String(8), nullable=True),  # `compat` for the starter-kit facade; null: the native API
    # Counted into the latency rollups (usage/rollups.py) exactly once, in the transaction that merged it.
    Column("rolled_up", Boolean, nullable=False, server_default=false()),
    Column("first_ack_gateway", String(255), nullable=True),
    Column("batch_id", BigInteger, ForeignKey("settlement_batches.batch_id"), nullable=True),
    Column("leaf_index", Integer, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    UniqueConstraint("intent_pk"),
    CheckConstraint("status IN ('success', 'failed', 'dead')", name="status"),
    CheckConstraint(f"billing_class IS NULL OR billing_class IN ({_CLASS_SQL})", name="billing_class"),
    CheckConstraint(
        "billed OR (billing_class IS NULL AND ru IS NULL AND payg_micro IS NULL AND period_id IS NULL)",
        name="unbilled",
    ),
    CheckConstraint("NOT billed OR status <> 'dead'", name="dead_unbilled"),
)
Index(None, usage_ledger.c.account, usage_ledger.c.terminal_at_ms)
Index(None, usage_ledger.c.batch_id)
Index(None, usage_ledger.c.sender, usage_ledger.c.nonce)
Index(None, usage_ledger.c.rolled_up, usage_ledger.c.terminal_at_ms)

# The billing contract mirror (gasless.mirror, migration 0007): finalised contract events applied in
# hyperblock order; the follower's cursor is the `mirror.cursor` row of service_meta, written in the same
# transaction as the events it covers.
mirror_accounts = Table(
    "mirror_accounts",
    metadata,
    Column("address", String(62), primary_key=True),
    Column("credits_micro", Micro, nullable=False),
    Column("escrow_micro", Micro, nullable=False),
    Column("running", JsonDoc, nullable=True),  # the running plan block, as the contract's view gives it
    Column("queued", JsonDoc, nullable=True),
    Column("auto_renew", Boolean, nullable=False),
    Column("payg", JsonDoc, nullable=False),
    Column("suspended", Boolean, nullable=False),
    Column("created_ms", UnixMs, nullable=False),
    Column("sender_count", Integer, nullable=False),
    Column("hyperblock_nonce", BigInteger, nullable=False),  # the event that last refreshed the row
    Column("updated_at_ms", UnixMs, nullable=False),
)

mirror_senders = Table(
    "mirror_senders",
    metadata,
    Column("sender", String(62), primary_key=True),  # a sender belongs to at most one account
    Column("account", String(62), nullable=False),
    Column("seq", BigInteger, nullable=False),  # event order: oldest authorisation first
    Column("added_at_ms", UnixMs, nullable=False),
    Column("tx_hash", Hash32, nullable=False),
)
Index(None, mirror_senders.c.account, mirror_senders.c.seq)

PURCHASE_KINDS = (
    "deposit",
    "plan_purchase",
    "renewal",
    "renewal_skipped",
    "escrow_move",
    "payg_settlement",
    "sender_fee",
    "grant",
)
_PURCHASE_KIND_SQL = ", ".join(f"'{kind}'" for kind in PURCHASE_KINDS)

# The purchase timeline: one row per finalised contract event of a PurchaseKind. `seq` orders events
# globally (hyperblock nonce, transaction position, event position), so the timeline never reorders.
mirror_purchases = Table(
    "mirror_purchases",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("account", String(62), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("event", String(32), nullable=False),
    Column("amount_micro", Micro, nullable=True),
    Column("tier_id", Integer, nullable=True),
    Column("details", JsonDoc, nullable=False),
    Column("tx_hash", Hash32, nullable=False),
    Column("event_index", Integer, nullable=False),
    Column("hyperblock_nonce", BigInteger, nullable=False),
    Column("block_ts_ms", UnixMs, nullable=False),
    UniqueConstraint("tx_hash", "event_index"),
    CheckConstraint(f"kind IN ({_PURCHASE_KIND_SQL})", name="kind"),
)
Index(None, mirror_purchases.c.account, mirror_purchases.c.block_ts_ms)

# Latency rollups (docs/usage.md, "Latency"): mergeable HdrHistograms of the latency figures of terminal
# intents, per minute ('m', kept 48 h) and per hour ('h', kept 90 days), per dimension and key (`all`,
# `shard`, `relayer`, `gateway`, and the account-scoped `acct_shard`, `acct_relayer`, `acct_sender`,
# `acct_gateway` keyed `<account>|<value>`), per figure (`added`, `inclusion`, `finality`, `total`).
latency_rollups = Table(
    "latency_rollups",
    metadata,
    Column("granularity", String(1), primary_key=True),
    Column("bucket_ms", BigInteger, primary_key=True, autoincrement=False),
    Column("dimension", String(16), primary_key=True),
    Column("key", String(140), primary_key=True),
    Column("metric", String(16), primary_key=True),
    Column("count", BigInteger, nullable=False),
    Column("histogram", Text, nullable=False),  # the histogram's own compressed base64 encoding
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint("granularity IN ('m', 'h')", name="granularity"),
)
Index(
    None,
    latency_rollups.c.dimension,
    latency_rollups.c.key,
    latency_rollups.c.granularity,
    latency_rollups.c.bucket_ms,
)

# Contract-wide views (config, pause, tiers, rateClasses, tariffHistory, relayers) as read at start-up
# and re-read when an event says they changed.
mirror_views = Table(
    "mirror_views",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value", JsonDoc, nullable=False),
    Column("hyperblock_nonce", BigInteger, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
)

# `usageSettled` events as mirrored: the on-chain roots usage proofs verify against.
mirror_settlements = Table(
    "mirror_settlements",
    metadata,
    Column("batch_id", BigInteger, primary_key=True, autoincrement=False),
    Column("usage_root", Hash32, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("total_ru", BigInteger, nullable=False),
    Column("tx_hash", Hash32, nullable=False),
    Column("hyperblock_nonce", BigInteger, nullable=False),
    Column("block_ts_ms", UnixMs, nullable=False),
)

# Incidents (docs/incidents.md) ------------------------------------------------------------------------------
INCIDENT_STATUSES = ("investigating", "identified", "monitoring", "resolved")
INCIDENT_IMPACTS = ("none", "minor", "major", "critical")
INCIDENT_SOURCES = ("automatic", "operator")
_INCIDENT_STATUS_SQL = ", ".join(f"'{status}'" for status in INCIDENT_STATUSES)
_INCIDENT_IMPACT_SQL = ", ".join(f"'{impact}'" for impact in INCIDENT_IMPACTS)
_INCIDENT_SOURCE_SQL = ", ".join(f"'{source}'" for source in INCIDENT_SOURCES)

# One row per incident. `open_key` is the automatic incident's `kind` while it is open and NULL otherwise:
# its unique constraint makes "at most one open automatic incident per kind" hold across every host.
# `update_count` numbers the appended updates (a row lock on the incident orders concurrent appends);
# `last_seen_at_ms` and `occurrences` are what the raising hosts recorded (automatic incidents only).
incidents = Table(
    "incidents",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("title", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("impact", String(16), nullable=False),
    Column("shard", SmallInteger, nullable=True),
    Column("source", String(16), nullable=False),
    Column("kind", String(40), nullable=True),
    Column("open_key", String(40), nullable=True),
    Column("update_count", Integer, nullable=False),
    Column("occurrences", BigInteger, nullable=False),
    Column("last_seen_at_ms", UnixMs, nullable=True),
    Column("created_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    Column("resolved_at_ms", UnixMs, nullable=True),
    UniqueConstraint("open_key"),
    CheckConstraint(f"status IN ({_INCIDENT_STATUS_SQL})", name="status"),
    CheckConstraint(f"impact IN ({_INCIDENT_IMPACT_SQL})", name="impact"),
    CheckConstraint(f"source IN ({_INCIDENT_SOURCE_SQL})", name="source"),
    CheckConstraint("shard IS NULL OR shard IN (0, 1, 2)", name="shard"),
    CheckConstraint(
        "(status = 'resolved' AND resolved_at_ms IS NOT NULL AND open_key IS NULL)"
        " OR (status <> 'resolved' AND resolved_at_ms IS NULL)",
        name="resolved",
    ),
    CheckConstraint("open_key IS NULL OR (source = 'automatic' AND open_key = kind)", name="open_key"),
)
Index(None, incidents.c.created_at_ms, incidents.c.id)
Index(None, incidents.c.updated_at_ms)

# The history of an incident: appended, never changed (database triggers refuse UPDATE and DELETE).
incident_updates = Table(
    "incident_updates",
    metadata,
    Column("incident_id", String(32), ForeignKey("incidents.id"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("status", String(16), nullable=False),
    Column("body", Text, nullable=False),
    Column("at_ms", UnixMs, nullable=False),
    CheckConstraint(f"status IN ({_INCIDENT_STATUS_SQL})", name="status"),
    CheckConstraint("seq >= 1", name="seq"),
)

# The chain this database belongs to (gasless.chain.identity, migration 0009): one row, written at the first
# start; the highest final hyperblock seen advances while a host runs.
chain_identity = Table(
    "chain_identity",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("chain_id", String(32), nullable=False),  # erd_chain_id
    Column("start_time_ms", UnixMs, nullable=False),  # erd_start_time (seconds on the wire) in ms
    Column("final_nonce", BigInteger, nullable=False),  # highest final hyperblock seen
    Column("final_hash", Hash32, nullable=False),
    Column("recorded_at_ms", UnixMs, nullable=False),
    Column("updated_at_ms", UnixMs, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
    CheckConstraint("final_nonce >= 0", name="final_nonce"),
)
