"""The error catalogue is exactly the spec's tables, and renders as RFC 9457 problem documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gasless.errors import CATALOGUE, ApiError, catalogue_document, problem_document

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT.parent / "shared" / "spec" / "interface-spec.md"


def spec_rows() -> list[dict[str, str]]:
    text = SPEC.read_text()
    section = text[text.index("### Relay group") : text.index("### Error use by condition")]
    parts = re.split(r"### (\w+) group", section)
    rows = []
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if line.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        for line in lines[2:]:
            cells = (c.strip() for c in line.strip("|").split("|"))
            rows.append({"group": name.lower(), **dict(zip(header, cells, strict=False))})
    return rows


@pytest.mark.skipif(not SPEC.exists(), reason="the spec is not beside the repository (../shared)")
def test_catalogue_matches_the_spec_tables() -> None:
    rows = spec_rows()
    assert len(rows) == len(CATALOGUE) == 91
    for row in rows:
        spec = CATALOGUE[row["Code"]]
        assert spec.status == int(row["HTTP"]), row["Code"]
        assert spec.retryable == (row["Retry"] == "yes"), row["Code"]
        assert spec.group == row["group"]
        assert spec.resign == row.get("Resign"), row["Code"]
        listed = row.get("Details", "").split(",")
        assert spec.details == tuple(d.strip().split(" ")[0].strip("`") for d in listed if d.strip()), row[
            "Code"
        ]


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
