"""Storage: async engines for SQLite/PostgreSQL, portable column types, Core tables and migrations."""

from __future__ import annotations

from gasless.db import notice_tables as notice_tables  # registers its tables on the metadata
from gasless.db.engine import (
    begin_write,
    create_engine,
    dialect_insert,
    in_constants,
    padded_to_power_of_two,
    ping,
    run_read,
    run_write,
)
from gasless.db.migrate import current_revision, downgrade, head_revision, is_up_to_date, upgrade
from gasless.db.tables import (
    account_period_usage,
    api_keys,
    chain_identity,
    incident_updates,
    incidents,
    intent_keys,
    intents,
    metadata,
    rejections,
    relayer_state_history,
    relayers,
    reservations,
    service_meta,
    settlement_batches,
    signer_fences,
    usage_ledger,
)
from gasless.db.types import Atto, Hash32, JsonDoc, Micro, UnixMs

__all__ = [
    "Atto",
    "account_period_usage",
    "api_keys",
    "chain_identity",
    "Hash32",
    "incident_updates",
    "incidents",
    "JsonDoc",
    "Micro",
    "UnixMs",
    "begin_write",
    "create_engine",
    "current_revision",
    "dialect_insert",
    "in_constants",
    "padded_to_power_of_two",
    "downgrade",
    "head_revision",
    "is_up_to_date",
    "metadata",
    "ping",
    "run_read",
    "run_write",
    "intent_keys",
    "intents",
    "rejections",
    "reservations",
    "settlement_batches",
    "signer_fences",
    "usage_ledger",
    "relayer_state_history",
    "relayers",
    "service_meta",
    "upgrade",
]
