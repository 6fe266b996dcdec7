"""The Prometheus rules of deploy/prometheus/: `promtool check rules` and the rules' unit tests
(`promtool test rules deploy/prometheus/tests/*.yml`), and a real Prometheus server scraping the two hosts of
`gasless up --hosts 2`, whose alerts fire in its own API (`/api/v1/alerts`) when a relayer is drained under
its floor and when the gateway goes silent (localnet's faults API; the alerts' `for` shortened, see HELD_FOR). Every alert has its runbook section in
docs/operations.md. Skipped, loudly, without Debian's `prometheus` package (`apt-get install prometheus`)
or without PostgreSQL and Redis (the server test)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from process_kit import free_port, piped_env, port_pair, reap, run, wait_until  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "gasless-rules.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
MISSING = "Prometheus rule tests SKIPPED: no {} (apt-get install prometheus)"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(MISSING.format(name))
    return path


def alerts_in(rules: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(rules.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass_and_cover_every_alert() -> None:
    tests = sorted((RULES_DIR / "tests").glob("*.yml"))
    assert tests
    done = subprocess.run(
        [tool("promtool"), "test", "rules", *map(str, tests)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {
        case["alertname"]
        for path in tests
        for group in yaml.safe_load(path.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert {rule["alert"] for rule in alerts_in(RULES)} == tested  # each alert seen firing in a unit test


def test_every_alert_has_a_runbook_in_the_operations_guide() -> None:
    text = OPERATIONS.read_text()
    assert text.count("## Alerts and runbooks") == 1
    section = text.split("## Alerts and runbooks", 1)[1]
    for rule in alerts_in(RULES):
        name = rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}"
        heading = re.search(rf"^### {name}\n(.*?)(?=^##|\Z)", section, re.S | re.M)
        assert heading is not None, f"no runbook section for {name}"
        body = heading.group(1)
        for part in ("**Means**", "**Check**", "**Do**"):
            assert part in body, f"{name}: the runbook has no {part}"


# A real Prometheus server --------------------------------------------------------------------------------
def wait_for(check: Any, what: str, timeout: float, proc: subprocess.Popen[Any] | None = None) -> Any:
    """`wait_until` polling every 0.25 s; an answer not yet in its shape (ValueError, KeyError) is not yet."""
    errors = (requests.RequestException, ValueError, KeyError)
    return wait_until(check, what, timeout, proc=proc, interval=0.25, errors=errors)


def firing(prometheus: str, alertname: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{prometheus}/api/v1/alerts", timeout=5).json()
    return [
        alert
        for alert in answer["data"]["alerts"]
        if alert["labels"]["alertname"] == alertname and alert["state"] == "firing"
    ]


def redis_cleanup(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
    finally:
        client.close()


# How long an alert's condition holds before it fires, in the server test. The committed durations (`for:
# 1m` and longer) are what promtool's unit tests check, in simulated time; this test checks that the
# expressions, as committed, fire on the series real hosts export, and waiting out a minute of real time
# there would prove nothing more.
HELD_FOR = "5s"


def held_for(document: dict[str, Any], duration: str) -> dict[str, Any]:
    """The rules `document` with every alert's `for` set to `duration` and nothing else changed."""
    groups = [
        {**group, "rules": [{**rule, "for": duration} if "for" in rule else rule for rule in group["rules"]]}
        for group in document["groups"]
    ]
    return {**document, "groups": groups}


def test_alerts_fire_in_a_real_prometheus_scraping_two_hosts(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    prometheus_bin = tool("prometheus")
    api = port_pair()
    metrics, localnet_port, prometheus_port = port_pair(api), free_port(), free_port()
    gateway = f"http://127.0.0.1:{localnet_port}"
    prefix = f"gasless-prom-{uuid.uuid4().hex[:8]}"  # this test's Redis keys, deleted at the end
    env = piped_env(GASLESS_RELAYER_REFRESH_MS="500", GASLESS_REDIS_PREFIX=prefix, COLUMNS="200")
    up_log, prom_log = tmp_path / "up.log", tmp_path / "prometheus.log"
    config, rules = tmp_path / "prometheus.yml", tmp_path / "gasless-rules.yml"
    rules.write_text(json.dumps(held_for(yaml.safe_load(RULES.read_text()), HELD_FOR)))
    config.write_text(
        json.dumps(  # JSON is YAML: the config of this run, with the rules file as committed but for `for`
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "gasless",
                        "static_configs": [{"targets": [f"127.0.0.1:{metrics}", f"127.0.0.1:{metrics + 1}"]}],
                    }
                ],
            }
        )
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with up_log.open("wb") as out:
            up = subprocess.Popen(
                [
                    *_gasless(), "up", "--hosts", "2",
                    "--port", str(api), "--metrics-port", str(metrics), "--localnet-port", str(localnet_port),
                    "--database-url", postgres_url, "--redis-url", redis_url,
                    "--data-dir", str(tmp_path / "var"), "--round-ms", "100",
                ],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        procs.append(up)
        with prom_log.open("wb") as out:
            prometheus = subprocess.Popen(
                [
                    prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        procs.append(prometheus)
        prom = f"http://127.0.0.1:{prometheus_port}"
        hosts = [f"http://127.0.0.1:{api}", f"http://127.0.0.1:{api + 1}"]
        for base in hosts:
            wait_for(lambda b=base: requests.get(f"{b}/readyz", timeout=2).status_code == 200, base, 120, up)
        wait_for(lambda: requests.get(f"{prom}/-/ready", timeout=2).ok, "prometheus ready", 60, prometheus)

        def targets_up() -> bool:
            answer = requests.get(f"{prom}/api/v1/targets", timeout=5).json()
            active = answer["data"]["activeTargets"]
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_for(targets_up, "both hosts scraped", 60, prometheus)
        assert firing(prom, "GaslessRelayerBelowFloor") == []

        # 1. A relayer drained under its floor.
        info = requests.get(f"{gateway}/localnet/info", timeout=5).json()["data"]
        drained = info["relayers"][0]["address"]
        health = requests.get(f"{hosts[0]}/readyz", timeout=5).json()
        floor = int(next(r for r in health["relayers"] if r["address"] == drained)["floorAtto"])
        set_to = requests.post(
            f"{gateway}/localnet/balance", json={"address": drained, "egldAtto": floor - 1}, timeout=5
        )
        assert set_to.json()["data"]["balance"] == str(floor - 1), set_to.text

        def unassignable_on_both() -> bool:
            entries = [requests.get(f"{h}/readyz", timeout=5).json()["relayers"] for h in hosts]
            return all(
                not next(r for r in found if r["address"] == drained)["assignable"] for found in entries
            )

        wait_for(unassignable_on_both, "both hosts seeing the relayer under its floor", 30)
        # The operator's table shows it: whole addresses, its floor, no time left.
        table = run("admin", "relayers", "--api", hosts[1], env=env)
        assert table.returncode == 0, table.stdout + table.stderr
        line = next(row for row in table.stdout.splitlines() if drained in row)
        assert " no " in line and "under the floor" in line, table.stdout
        assert len([row for row in table.stdout.splitlines() if "erd1" in row]) == len(info["relayers"])

        # 2. The gateway silent: every request answered 503.
        requests.post(
            f"{gateway}/localnet/faults", json={"gateway": {"down": True}}, timeout=5
        ).raise_for_status()
        deadline = 90  # HELD_FOR, with a margin for a loaded machine
        below = wait_for(lambda: firing(prom, "GaslessRelayerBelowFloor"), "relayer alert firing", deadline)
        assert [(a["labels"]["relayer"], a["labels"]["severity"]) for a in below] == [(drained, "warning")]
        silent = wait_for(
            lambda: len(found := firing(prom, "GaslessGatewaysUnreachable")) == 2 and found,
            "gateway alert firing on both hosts",
            deadline,
        )
        assert sorted(a["labels"]["instance"] for a in silent) == [
            f"127.0.0.1:{metrics}",
            f"127.0.0.1:{metrics + 1}",
        ]
        assert all(a["annotations"]["runbook"].startswith("docs/operations.md#") for a in below + silent)
        # The shard keeps its other relayer: no shard-wide alert.
        assert firing(prom, "GaslessShardWithoutRelayer") == []
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(2)  # SIGINT: `gasless up` stops its hosts and localnet
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            reap(proc)
        redis_cleanup(redis_url, prefix)


def _gasless() -> list[str]:
    import sys

    return [sys.executable, "-m", "gasless.cli"]
