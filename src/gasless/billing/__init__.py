"""Billing: RU schedule, rate classes, entitlement, reservations, usage ledger, settlement."""
