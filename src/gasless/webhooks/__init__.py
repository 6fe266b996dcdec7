"""Webhooks: registration (SSRF-checked URLs, sealed secrets), an outbox of events, signed deliveries."""

from gasless.webhooks.signing import SIGNATURE_HEADER, verify_signature

__all__ = ["SIGNATURE_HEADER", "verify_signature"]
