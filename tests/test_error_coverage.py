"""The error-coverage guard's own parts: the recorder sees what the service renders, and the not-yet list
names catalogue codes only. The guard itself runs at the end of a full run (`tests/conftest.py`)."""

from __future__ import annotations

import os
from pathlib import Path

from error_coverage import NOT_YET_ANSWERED, RECORD_ENV, answered, findings  # type: ignore[import-not-found]
from fastapi.testclient import TestClient

from gasless.core.errors import CATALOGUE
from gasless.core.settings import Settings
from gasless.hosting.app import create_app


def test_the_suite_records_what_every_host_renders() -> None:
    # Set for the whole run, so subprocess hosts inherit it and in-process Settings read it.
    assert os.environ.get(RECORD_ENV)


def test_the_recorder_sees_rendered_problems_only(tmp_path: Path) -> None:
    record = tmp_path / "answered.txt"
    settings = Settings(data_dir=tmp_path, gateway_urls=["http://127.0.0.1:9"], problem_record_file=record)
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/nothing-here").json()["code"] == "NOT_FOUND"
        assert client.post("/v1/relay", content=b"[").json()["code"] == "MALFORMED_REQUEST"
        assert client.post("/v1/relay", content=b"x" * 140_000).json()["code"] == "PAYLOAD_TOO_LARGE"
    assert record.read_text().splitlines() == [
        "NOT_FOUND 404",
        "MALFORMED_REQUEST 400",
        "PAYLOAD_TOO_LARGE 413",
    ]
    assert answered(record) == {"NOT_FOUND": {404}, "MALFORMED_REQUEST": {400}, "PAYLOAD_TOO_LARGE": {413}}
    assert any("never answered" in line for line in findings(record))


def test_problems_inside_a_200_do_not_count(tmp_path: Path) -> None:
    """`POST /v1/validate` lists problems in a 200 body and MCP tool errors are problems inside a 200: the
    guard counts error responses only, and a status other than the catalogue's is a finding."""
    record = tmp_path / "answered.txt"
    settings = Settings(data_dir=tmp_path, gateway_urls=["http://127.0.0.1:9"], problem_record_file=record)
    with TestClient(create_app(settings)) as client:
        client.post("/v1/validate", json={"tx": {"nonce": 0}})
    assert all(line.split()[1].isdigit() for line in record.read_text().splitlines())
    record.write_text("NO_ENTITLEMENT - mcp\nNOT_FOUND 404\nNOT_FOUND 500\n")
    assert answered(record) == {"NOT_FOUND": {404, 500}}
    lines = findings(record)
    assert any("NOT_FOUND answered [500]" in line for line in lines), lines
    assert any("never answered" in line and "NO_ENTITLEMENT" in line for line in lines), lines


def test_the_not_yet_list_names_catalogue_codes() -> None:
    assert set(NOT_YET_ANSWERED) <= set(CATALOGUE)
