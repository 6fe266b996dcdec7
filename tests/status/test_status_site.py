"""The status site in a real browser: Debian's chromium driven by Playwright (nothing downloaded; skipped
loudly when the browser is absent). A served API on localnet publishes the feeds; `gasless status-site`
runs as its own process on them. The page renders the components, an open incident with its update
history, the 90-day availability bars and the latency charts; with the API stopped it still serves the last
feeds and shows their age (and says when they are stale). A screenshot is kept under test-artifacts/."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from process_kit import answers, free_port, run, spawn  # type: ignore[import-not-found]
from relay_kit import ServedApi  # type: ignore[import-not-found]
from test_client_flow import Served, key_in_shard  # type: ignore[import-not-found]

from gasless.client import RelayClient, Transfer
from gasless.hosting.app import create_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _browser_or_skip() -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            "BROWSER TEST SKIPPED: no chromium (apt install chromium; ./dev test installs it where it can)"
        )
    from playwright.sync_api import sync_playwright

    return sync_playwright


def _wait(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not reached"
        time.sleep(0.1)
    return value


async def _traffic(served: Served, count: int) -> None:
    """Transfers relayed to finality (measured figures for the page)."""
    key = await served.new_sender(1)
    async with RelayClient(served.url) as client:
        for nonce in range(count):
            sent = await client.send(key, Transfer(key_in_shard(1).address, nonce=nonce))
            async for intent in client.follow(sent.tx_hash, timeout_s=30):
                if intent.get("state") == "FINALIZED":
                    break


def test_the_status_page_in_a_browser_with_and_without_the_api(
    make_env: Any, tmp_path: Path, unpaused_localnet: Any
) -> None:
    sync_playwright = _browser_or_skip()
    feed = tmp_path / "feeds"
    settings = make_env.__globals__["relay_settings"](
        tmp_path, unpaused_localnet, status_feed_dir=feed, status_feed_ms=200
    )
    api = ServedApi(create_app(settings)).start()
    stopped = False
    try:
        asyncio.run(_traffic(Served(api.url, settings, unpaused_localnet, api), 3))
        # An open incident with two updates, declared as the operator does (in the service database).
        database = ["--database-url", settings.effective_database_url]
        opened = run(
            "admin", "incident", "open", "--title", "Slow inclusion on shard 1", "--body", "Investigating",
            "--shard", "1", "--json", *database,
        )  # fmt: skip
        assert opened.returncode == 0, opened.stdout + opened.stderr
        incident_id = json.loads(opened.stdout)["id"]
        updated = run(
            "admin", "incident", "update", incident_id, "--status", "identified", "--body", "A gateway is slow",
            *database,
        )  # fmt: skip
        assert updated.returncode == 0, updated.stdout + updated.stderr

        def published() -> Any:
            path = feed / "status.json"
            if not path.exists():
                return None
            status = json.loads(path.read_text())
            incident = bool(status["openIncidents"]) and len(status["openIncidents"][0]["updates"]) == 2
            # The latency figures reach the feed once the rollups merged the relays (every 5 s), which
            # may be a publication after the incident's.
            measured = any(e["shard"] == 1 and e["samples"] == 3 for e in status.get("latency", []))
            return status if incident and measured else None

        _wait(published, "the feeds with the incident and the relays' latency")
        site_port = free_port()
        with spawn(
            "status-site", "--feed-dir", str(feed), "--port", str(site_port), log=tmp_path / "site.log"
        ) as site:
            url = f"http://127.0.0.1:{site_port}"
            site.wait_for(lambda: answers(f"{url}/healthz"), "the status site")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
                )
                try:
                    page = browser.new_page(viewport={"width": 1100, "height": 1600})
                    page.goto(url)
                    assert page.locator("h1").inner_text() == "gasless status"
                    assert page.locator("tr.component").count() == 7
                    shard1 = page.locator('tr.component[data-id="relaying-shard-1"]')
                    assert (
                        shard1.get_attribute("data-status") == "degraded"
                    )  # the open incident names shard 1
                    article = page.locator(f'article.incident[data-id="{incident_id}"]')
                    assert "Slow inclusion on shard 1" in article.inner_text()
                    assert article.locator("li").count() == 2 and "A gateway is slow" in article.inner_text()
                    assert page.locator("svg.availability rect.day").count() == 90
                    assert page.locator("figure.latency").count() == 6
                    assert "3 samples" in page.locator('figure.latency[data-shard="1"]').first.inner_text()
                    assert page.locator('svg.availability rect.day[data-pct="100.0"]').count() == 1
                    assert "Published" in page.locator("p.age").inner_text()
                    # Feed discovery, and every column explained (the float's label on hover and below).
                    discovery = page.locator('head link[rel="alternate"][type="application/atom+xml"]')
                    assert discovery.get_attribute("href") == "/feed/incidents.atom"
                    assert "never a balance" in (page.locator("th.float").get_attribute("title") or "")
                    assert "Relayer float" in page.locator("table.components caption").inner_text()
                    for name in ("incidents.atom", "status.json", "incidents.json", "telemetry.json"):
                        assert page.locator(f'p.feeds a[href="/feed/{name}"]').count() == 1
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / "status-site.png"), full_page=True)

                    # The API stops: the site serves the last feeds, and says how old they are.
                    api.stop()
                    stopped = True
                    assert not answers(f"{api.url}/healthz")
                    first_age = int(
                        requests.get(f"{url}/feed/status.json", timeout=5).headers["X-Feed-Age-Ms"]
                    )
                    _wait(
                        lambda: (
                            int(requests.get(f"{url}/feed/status.json", timeout=5).headers["X-Feed-Age-Ms"])
                            > first_age
                        ),
                        "the feed ageing",
                    )
                    page.reload()
                    assert page.locator("tr.component").count() == 7 and "Published" in page.inner_text(
                        "p.age"
                    )
                    # Feeds last published long ago (as after a long outage): the page says they are stale.
                    status = json.loads((feed / "status.json").read_text())
                    status["generatedAtMs"] -= 600_000
                    status["latency"][0]["samples"] = 1  # one measured relay: "1 sample", not "1 samples"
                    (feed / "status.json").write_text(json.dumps(status))
                    page.reload()
                    assert "out of date" in page.inner_text("p.age") and "10 min" in page.inner_text("p.age")
                    shard = status["latency"][0]["shard"]
                    caption = page.locator(f'figure.latency[data-shard="{shard}"] figcaption').first
                    assert caption.inner_text().endswith("(1 sample)"), caption.inner_text()
                    atom = requests.get(f"{url}/feed/incidents.atom", timeout=5)
                    assert atom.status_code == 200 and "Slow inclusion on shard 1" in atom.text
                    assert atom.headers["content-type"].startswith("application/atom+xml")
                    for name in ("status.json", "incidents.json", "telemetry.json"):
                        assert requests.get(f"{url}/feed/{name}", timeout=5).status_code == 200
                finally:
                    browser.close()
    finally:
        if not stopped:
            api.stop()
