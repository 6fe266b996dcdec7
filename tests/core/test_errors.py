"""The error catalogue is exactly the contract's tables, and renders as RFC 9457 problem documents."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gasless.core.errors import CATALOGUE, ApiError, catalogue_document, problem_document

ROOT = Path(__file__).resolve().parents[2]

# The contract's error tables, kept by hand apart from the service's catalogue: the relay, purchase and x402
# groups in tests/relay/conftest.py (CONTRACT_ERRORS: status, retryable, resign, details), the rest here
# (status, retryable, group, resign, details). The catalogue must be exactly these 91 codes.
OTHER_ERRORS: dict[str, tuple[int, bool, str, str | None, tuple[str, ...]]] = {
    "FREE_FLOW_BUSY": (409, True, "relay", "SAME_BYTES", ("reason",)),
    "FREE_FLOW_BARRED": (403, False, "relay", "NONE", ("untilMs",)),
    "FREE_FLOW_UNAVAILABLE": (503, True, "relay", "SAME_BYTES", ()),
    "UNAUTHENTICATED": (401, False, "platform", None, ()),
    "TOKEN_INVALID": (401, False, "platform", None, ()),
    "TOKEN_EXPIRED": (401, False, "platform", None, ()),
    "ORIGIN_NOT_ALLOWED": (403, False, "platform", None, ()),
    "CHALLENGE_INVALID": (401, False, "platform", None, ()),
    "API_KEY_INVALID": (401, False, "platform", None, ()),
    "API_KEY_SCOPE": (403, False, "platform", None, ()),
    "STREAM_TICKET_INVALID": (401, False, "platform", None, ()),
    "FORBIDDEN": (403, False, "platform", None, ()),
    "ADMIN_ONLY": (403, False, "platform", None, ()),
    "ACTION_SIGNATURE_INVALID": (403, False, "platform", None, ()),
    "ACCOUNT_SUSPENDED": (403, False, "platform", None, ()),
    "IDEMPOTENCY_KEY_REUSED": (422, False, "platform", None, ()),
    "IDEMPOTENCY_IN_PROGRESS": (409, True, "platform", None, ()),
    "LIMIT_REACHED": (409, False, "platform", None, ()),
    "WEBHOOK_URL_NOT_ALLOWED": (422, False, "platform", None, ()),
}


def _relay_tables() -> dict[str, tuple[int, bool, str | None, tuple[str, ...]]]:
    spec = importlib.util.spec_from_file_location("relay_tables", ROOT / "tests" / "relay" / "conftest.py")
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(ROOT / "tests" / "relay"))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "tests" / "relay"))
    return module.CONTRACT_ERRORS  # type: ignore[no-any-return]


def test_catalogue_matches_the_contract_tables() -> None:
    relay_tables = _relay_tables()
    assert set(relay_tables).isdisjoint(OTHER_ERRORS)
    assert set(CATALOGUE) == set(relay_tables) | set(OTHER_ERRORS) and len(CATALOGUE) == 91
    for code, (status, retryable, resign, details) in relay_tables.items():
        entry = CATALOGUE[code]
        assert (entry.status, entry.retryable, entry.resign) == (status, retryable, resign), code
        # The relay tables name the details members as the contract does (dotted paths for nested ones).
        assert set(details) == set(entry.details), code
    for code, (status, retryable, group, resign, details) in OTHER_ERRORS.items():
        entry = CATALOGUE[code]
        assert (entry.status, entry.retryable, entry.group, entry.resign) == (
            status,
            retryable,
            group,
            resign,
        )
        assert entry.details == details, code


def test_problem_document_members() -> None:
    error = ApiError(
        "GAS_PRICE_OUT_OF_RANGE", details={"limit": 2_000_000_000, "actual": 3_000_000_000, "bound": "max"}
    )
    doc = problem_document(error, docs_url="https://docs.example/", request_id="req-1")
    assert doc == {
        "type": "https://docs.example/errors/gas-price-out-of-range",
        "title": "Gas price out of range",
        "status": 422,
        "detail": "gas price outside minimum to twice the minimum",
        "code": "GAS_PRICE_OUT_OF_RANGE",
        "instance": "req-1",
        "retryable": False,
        "resign": "NONE",
        "details": {"limit": 2_000_000_000, "actual": 3_000_000_000, "bound": "max"},
    }


def test_429_carries_retry_after_except_quota_exhausted() -> None:
    limited = ApiError("RATE_LIMITED", details={"retryAfterMs": 1_500, "scope": "platform"})
    assert limited.headers["Retry-After"] == "2" and limited.details["retryAfterMs"] == 1_500
    quota = ApiError("QUOTA_EXHAUSTED", details={"reason": "period_cap"})
    assert "Retry-After" not in quota.headers and "retryAfterMs" not in quota.details
    with pytest.raises(ValueError):
        ApiError("NOT_A_CODE")


def test_platform_errors_have_no_resign_member() -> None:
    doc = problem_document(ApiError("NOT_FOUND"), docs_url="https://d", request_id="r")
    assert "resign" not in doc and doc["status"] == 404


def test_published_catalogue_is_current() -> None:
    published = json.loads((ROOT / "docs" / "errors.json").read_text())
    assert published == catalogue_document("https://docs.gasless.example")
