"""Structured logging: JSON lines in production, readable lines in a terminal. Configured once at start."""

from __future__ import annotations

import logging
import sys

import structlog

# Members that must never reach a log line, whatever a caller passes.
REDACTED_KEYS = frozenset(
    {
        "signature",
        "relayerSignature",
        "guardianSignature",
        "secret",
        "apiKey",
        "x-api-key",
        "authorization",
        "lease",
        "token",
        "master_secret",
        "password",
    }
)


def _redact(_: object, __: str, event_dict: dict[str, object]) -> dict[str, object]:
    for key in list(event_dict):
        if key in REDACTED_KEYS or key.lower() in REDACTED_KEYS:
            event_dict[key] = "[redacted]"
    return event_dict


def configure_logging(*, json_lines: bool, level: str = "INFO") -> None:
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def quiet_sdk_loggers() -> None:
    """multiversx-sdk logs an ERROR for every signature that fails to verify; for a public API that is a
    log line any client can produce at will, so those failures are reported as problems, not logs."""
    logging.getLogger("user_keys").setLevel(logging.CRITICAL)
