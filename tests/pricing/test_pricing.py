"""GET /v1/pricing and /v1/pricing/tariff-history against the billing contract on a real localnet."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from pricing_schema import SCHEMA_FILE, render  # type: ignore[import-not-found]  # noqa: E402

NOTICE_MS = 172_800_000  # SENDER_FEE_NOTICE_MS


def test_the_published_schema_is_the_served_model() -> None:
    assert SCHEMA_FILE.read_text() == render(), (
        "docs/schemas/pricing-v1.json is stale: run tools/pricing_schema.py"
    )


def test_the_document_is_the_contract_s_configuration(env: Any) -> None:
    answer = env.client.get("/v1/pricing")
    assert answer.status_code == 200, answer.text
    document = answer.json()
    jsonschema.validate(document, json.loads(SCHEMA_FILE.read_text()))
    assert document["schemaVersion"] == "pricing-v1" and document["chainId"] == "localnet"
    # localnet's seeded configuration (gasless.localnet.contracts.seed), as the contract's views give it.
    names = [(t["name"], t["audience"], t["available"], t["rateClass"]) for t in document["tiers"]]
    assert names == [
        ("Starter", "human", True, 1),
        ("Builder", "human", True, 2),
        ("Growth", "human", True, 3),
        ("Scale", "human", True, 4),
        ("Enterprise", "human", False, 5),
        ("Agent Pro", "agent", True, 3),
        ("Agent Fleet", "agent", True, 5),
        ("Agent Metered", "agent", True, 6),
    ]
    starter = document["tiers"][0]
    assert starter["priceMicroUsdc"] == "9000000" and starter["includedRu"] == "30000"
    assert starter["periodMs"] == 2_592_000_000 and starter["payg"] is False
    assert document["tiers"][-1]["payg"] is True and document["tiers"][-1]["periodMs"] == 0
    assert document["deposit"] == {"minMicroUsdc": "1000000", "maxMicroUsdc": "10000000000"}
    assert document["ruPriceMicroUsdc"] == "200"
    assert document["senderFee"] == {"ru": "50", "microUsdc": "10000"}
    classes = document["rateClasses"]
    assert classes["policyVersion"] == document["policyVersion"] >= 1
    assert classes["classes"][0] == {
        "id": 1,
        "ruPerSecond": "1",
        "ruBurst": "15",
        "gasPerSecondPerShard": "20000000",
        "gasBurstPerShard": "200000000",
        "maxGasLimit": "100000000",
        "ruPerHour": "300",
    }
    assert [c["id"] for c in classes["classes"]] == [1, 2, 3, 4, 5, 6]
    schedule = document["ruSchedule"]
    assert schedule["version"] == "ru-v1" and schedule["feeRelevantFields"] == ["gasLimit"]
    assert schedule["steps"][0] == {"maxGasLimit": "100000", "ru": "1"}
    assert schedule["steps"][-1] == {"maxGasLimit": "600000000", "ru": "25"}
    how = document["howToBuy"]
    assert "depositAndSubscribe" in how["freeOperations"] and "addSenders" not in how["freeOperations"]
    assert how["contract"] == env.contract and how["paymentToken"] == env.settings.network.payment_token


def test_audience_filters_tiers_and_caching_revalidates(env: Any, problem: Any) -> None:
    agent = env.client.get("/v1/pricing", params={"audience": "agent"})
    assert agent.status_code == 200
    assert {t["audience"] for t in agent.json()["tiers"]} == {"agent"} and len(agent.json()["tiers"]) == 3
    human = env.client.get("/v1/pricing?audience=human").json()
    assert {t["audience"] for t in human["tiers"]} == {"human"} and len(human["tiers"]) == 5
    problem(env.client.get("/v1/pricing?audience=robot"), "MALFORMED_REQUEST")
    first = env.client.get("/v1/pricing")
    max_age = int(first.headers["Cache-Control"].split("max-age=")[1])
    assert first.headers["Cache-Control"].startswith("public") and max_age * 1000 <= 6_000
    again = env.client.get("/v1/pricing", headers={"If-None-Match": first.headers["ETag"]})
    assert (
        again.status_code == 304 and again.content == b"" and again.headers["ETag"] == first.headers["ETag"]
    )
    assert "RateLimit-Limit" in first.headers


def _pricing_at_version(env: Any, version: int) -> dict[str, Any]:
    """The document once it reflects policy version `version` (its 3 s cache has turned over)."""
    deadline = time.monotonic() + 15
    while True:
        document = env.client.get("/v1/pricing").json()
        if document["policyVersion"] >= version:
            return document  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"pricing stuck at policy version {document['policyVersion']}"
        time.sleep(0.1)


def test_a_sender_fee_increase_is_published_only_once_in_force(env: Any) -> None:
    before = env.client.get("/v1/pricing").json()
    env.owner("setSenderFeeRu", [80])  # an increase: pending for 172 800 000 ms
    env.wait_mirror()
    history = env.client.get("/v1/pricing/tariff-history?limit=1").json()["items"][0]
    assert history["kind"] == "SenderFeeRu" and history["value"] == "80"
    assert history["effectiveMs"] - history["timestampMs"] == NOTICE_MS
    pending = _pricing_at_version(env, history["policyVersion"])
    assert pending["senderFee"] == before["senderFee"] == {"ru": "50", "microUsdc": "10000"}
    # A decrease applies at once (and cancels the pending increase).
    env.owner("setSenderFeeRu", [40])
    lowered = _pricing_at_version(env, history["policyVersion"] + 1)
    assert lowered["senderFee"] == {"ru": "40", "microUsdc": "8000"}


def test_tariff_history_pages_newest_first(env: Any, problem: Any) -> None:
    env.wait_mirror()
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 7}
        if cursor is not None:
            params["cursor"] = cursor
        page = env.client.get("/v1/pricing/tariff-history", params=params)
        assert page.status_code == 200, page.text
        seen += page.json()["items"]
        cursor = page.json()["nextCursor"]
        if cursor is None:
            break
    seqs = [entry["seq"] for entry in seen]
    assert seqs == sorted(seqs, reverse=True) and seqs[-1] == 1 and len(set(seqs)) == len(seqs)
    kinds = {entry["kind"] for entry in seen}
    assert {"TierPrice", "RateClassRuPerSec", "DepositMin", "RuPrice", "SenderFeeRu"} <= kinds
    problem(env.client.get("/v1/pricing/tariff-history?cursor=abc.def"), "CURSOR_INVALID")
    problem(env.client.get("/v1/pricing/tariff-history?limit=0"), "MALFORMED_REQUEST")
