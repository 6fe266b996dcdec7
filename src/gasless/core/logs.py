"""Structured logging: JSON lines in production, readable lines in a terminal. Configured once at start.

Every line, ours (structlog) or a library's (stdlib `logging`: uvicorn, SQLAlchemy, aiohttp), goes through
the same processors: the request context (`request_id`, `host_id`), a timestamp, and redaction last before
rendering. Redaction masks by member name (a `signature`, `lease`, `authorization`... member is masked
whatever its value) and by value pattern (Ed25519 signatures as hex, leases and native-auth tokens, API
keys, bearer credentials, passwords in URLs, and the configured secrets themselves) anywhere in any
string, including the message and a formatted traceback.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import structlog

MASK = "[redacted]"

# Member names whose values never reach a log line (compared lower-case, `-` read as `_`).
REDACTED_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "cookie",
        "set_cookie",
        "x_api_key",
        "api_key",
        "apikey",
        "lease",
        "token",
        "bearer",
        "password",
        "passwd",
        "secret",
        "master_secret",
        "signature",
        "relayersignature",
        "relayer_signature",
        "guardiansignature",
        "guardian_signature",
        "private_key",
        "secret_key",
        "pem",
    }
)
# ...and names containing one of these.
_REDACTED_KEY_PARTS = ("secret", "password", "signature", "authorization", "api_key", "apikey")

_KEY_WORDS = r"(?:relayer|guardian)?signature|lease|token|secret|password|authorization|x-api-key|api[_-]?key"
_VALUE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # `name=value`, `"name": "value"` inside free text (a repr of a dict, a query string, an error).
    (
        re.compile(
            rf"""(["']?\b(?:{_KEY_WORDS})["']?\s*[:=]\s*["']?)((?:bearer|basic)\s+)?([^"'\s,;&}}\]]+)""",
            re.IGNORECASE,
        ),
        rf"\1{MASK}",
    ),
    # Credentials after an auth scheme.
    (re.compile(r"\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE), rf"\1 {MASK}"),
    # API keys: gls_live_... / gls_test_...
    (re.compile(r"\bgls_(?:live|test)_[A-Za-z0-9_-]+"), MASK),
    # Leases (two base64url parts) and native-auth tokens (three parts).
    (re.compile(r"[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}(?:\.[A-Za-z0-9_-]+)?"), MASK),
    # Ed25519 signatures and any longer hex blob (a signed payload); 64-hex hashes stay readable.
    (re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{128,}(?![0-9A-Fa-f])"), MASK),
    # The password of a URL (database, Redis).
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+@"), rf"\1{MASK}@"),
)

# Any of the patterns, in one search: nearly every string logged (a route, a level, a host id) matches none,
# and one search costs a fraction of a substitution per pattern (docs/performance.md: the access-log line).
_ANY_VALUE_PATTERN = re.compile(
    "|".join(
        f"(?i:{pattern.pattern})" if pattern.flags & re.IGNORECASE else f"(?:{pattern.pattern})"
        for pattern, _ in _VALUE_PATTERNS
    )
)


@functools.lru_cache(maxsize=4096)  # member names: a small set, none of them secret
def sensitive_key(name: str) -> bool:
    key = name.lower().replace("-", "_")
    return key in REDACTED_KEYS or any(part in key for part in _REDACTED_KEY_PARTS) or key.endswith("_token")


# Strings found clean are remembered, up to this many: most of a line's strings (its event, the level, the
# logger's name, a route, a method, the host id) recur on every line, and a look-up costs a fraction of the
# search. Only strings short enough to be labels, and never one that needed masking.
_CLEAN_CACHE_SIZE = 1024
_CLEAN_CACHE_MAX_LEN = 64


class Redactor:
    """A structlog processor masking secrets by member name and by value; `secrets` are masked verbatim."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is masked whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)
        self._clean: set[str] = set()

    def text(self, value: str) -> str:
        if value in self._clean:
            return value
        original = value
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        if _ANY_VALUE_PATTERN.search(value) is None:
            if value is original and len(value) <= _CLEAN_CACHE_MAX_LEN:
                if len(self._clean) >= _CLEAN_CACHE_SIZE:
                    self._clean.clear()  # request ids and timestamps churn it; the labels come back at once
                self._clean.add(value)
            return value  # no pattern matches: no substitution would change anything
        for pattern, replacement in _VALUE_PATTERNS:
            value = pattern.sub(replacement, value)
        return value

    def value(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if depth > 8:
            return value
        if isinstance(value, Mapping):
            return {
                k: MASK if isinstance(k, str) and sensitive_key(k) else self.value(v, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.value(v, depth + 1) for v in value]
        if isinstance(value, (bytes, bytearray)):
            return self.text(bytes(value).hex())
        if isinstance(value, (int, float, bool)) or value is None:
            return value
        return self.text(str(value))

    def __call__(self, _: object, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        for key in list(event_dict):
            if sensitive_key(key):
                event_dict[key] = MASK
            else:
                event_dict[key] = self.value(event_dict[key])
        return event_dict


def configure_logging(
    *,
    json_lines: bool,
    level: str = "INFO",
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
) -> Redactor:
    """Route structlog and stdlib logging through one pipeline ending in redaction, then the renderer.

    `secrets` are values masked wherever they appear (the master secret). Returns the redactor in use.
    """
    redactor = Redactor(secrets)
    out = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    # One stdlib handler renders every line, ours and the libraries'. Exceptions become text before
    # redaction, so a traceback is redacted too; redaction is the last step before rendering.
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redactor,
            renderer,
        ],
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        # Not cached: a reconfiguration (another level, another stream) reaches loggers already in use.
        cache_logger_on_first_use=False,
    )
    # A line never shows where it was logged from, nor the thread or process: the logging HOWTO's
    # "Optimization" switches spare every record a stack walk (structlog's findCaller) and three lookups.
    # About a fifth of the access line's cost at the maximum load (docs/performance.md).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Libraries that install their own handlers would print around the pipeline: send them through it.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
    return redactor


def quiet_sdk_loggers() -> None:
    """multiversx-sdk logs an ERROR for every signature that fails to verify; for a public API that is a
    log line any client can produce at will, so those failures are reported as problems, not logs."""
    logging.getLogger("user_keys").setLevel(logging.CRITICAL)
