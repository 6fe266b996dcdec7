"""The MCP server through clients nobody here wrote: the official TypeScript SDK (`@modelcontextprotocol/sdk`
1.x, the one most MCP hosts ship, and its successor `@modelcontextprotocol/client` 2.x) and the MCP
Inspector's CLI, over both transports (a served host's `/mcp`, and `gasless mcp` over stdio).

The packages are pinned in `tests/mcp/js/package.json` and its lock file, and installed by `./dev test`
(`npm ci --prefix tests/mcp/js`); without the Node.js its `engines` asks for (>= 20) or the installed
packages, these tests are skipped, saying why. The Inspector 2.x declares Node.js >= 22.19; its CLI passes
these tests on Node.js 20.0.0 and 20.20.2, as long as no proxy variable makes it load undici 8, which does
not load on Node.js 20: the clients run without them (every target is on 127.0.0.1).

`js/mcp_client.mjs` (each SDK) and `js/inspector_cli.mjs` (one Inspector CLI invocation per call) list, call
every tool with valid and invalid arguments and read every resource; the checks: no call fails in the
client (the SDK 1.x and the Inspector validate any structured content against the tool's output schema,
errors included), every error is `isError` with an RFC 9457 problem document as its text (for the
Inspector: exit status 5, a tool error), the Inspector finds nothing to report in the tool schemas
(`--strict`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from gasless.core.errors import CATALOGUE

JS = Path(__file__).resolve().parent / "js"
NODE_MODULES = JS / "node_modules"
# The oldest Node.js the clients run on, from `engines` in package.json (">=20"; its "//" notes say why).
MIN_NODE = int(re.fullmatch(r">=(\d+)", json.loads((JS / "package.json").read_text())["engines"]["node"])[1])
INSPECTOR = (
    NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
)
RUN_TIMEOUT_S = 180
PROXY_VARIABLES = {"http_proxy", "https_proxy"}  # in either case


def js_unavailable() -> str | None:
    """Why the TypeScript clients cannot run here (None when they can)."""
    node = shutil.which("node")
    if node is None:
        return "no node (apt-get install nodejs npm; ./dev test then installs the clients)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < MIN_NODE:
        return f"node {version or '?'} is older than {MIN_NODE} (tests/mcp/js/package.json: engines)"
    pinned = json.loads((JS / "package.json").read_text())["dependencies"]
    for name, wanted in pinned.items():
        manifest = NODE_MODULES / name / "package.json"
        found = json.loads(manifest.read_text())["version"] if manifest.exists() else None
        if found != wanted:
            return f"{name} {wanted} is not installed (npm ci --prefix tests/mcp/js; ./dev test does it)"
    return None


@pytest.fixture(scope="module")
def node() -> str:
    reason = js_unavailable()
    if reason is not None:
        pytest.skip(f"MCP TYPESCRIPT CLIENT TESTS SKIPPED: {reason}")
    return str(shutil.which("node"))


def run(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a Node program in a process group of its own; whatever it started (the stdio server) is killed
    with it when it is done or times out. Without the proxy variables: every target is on 127.0.0.1, and
    with one set, the Inspector's CLI loads undici 8, which does not load on Node.js 20."""
    env = {name: value for name, value in os.environ.items() if name.lower() not in PROXY_VARIABLES}
    env |= {"MCP_CATALOG_PATH": str(tmp_path / "inspector-catalog.json"), "NO_COLOR": "1"}
    process = subprocess.Popen(
        command,
        cwd=JS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def target(kind: str, served: Any) -> list[str]:
    """What a client connects to: the host's `/mcp`, or the command of `gasless mcp`."""
    if kind == "http":
        return [f"{served.url}/mcp"]
    return [sys.executable, "-m", "gasless.cli", "mcp", "--api", served.url]


def relay_body(tx: Any, lease: str) -> dict[str, Any]:
    return {"tx": tx.to_dictionary(), "lease": lease}


def plan(served: Any, env: Any) -> dict[str, Any]:
    """Every tool with valid arguments, then with invalid ones (`expect`: a code, or "ok"), and the resources."""
    sender, asker = env.new_sender(), env.new_sender()
    answer = requests.post(
        f"{served.url}/v1/relay/assign",
        json={"sender": sender.address, "proof": env.proof(sender)},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    assignment = answer.json()
    first, second = (env.build(sender, assignment, nonce=n) for n in (0, 1))
    forged = env.build(sender, assignment, nonce=2)
    forged.signature = b"\x02" * 64
    lease = assignment["lease"]
    proof = env.proof(asker)
    calls = [
        ("validate", "validate_transaction", {"request": relay_body(first, lease)}, "ok"),
        ("quote", "quote", {"request": {"tx": first.to_dictionary()}}, "ok"),
        ("assign", "assign_relayer", {"request": {"sender": asker.address, "proof": proof}}, "ok"),
        (
            "batch",
            "relay_batch",
            {"requests": [relay_body(first, lease), relay_body(second, lease), relay_body(forged, lease)]},
            "ok",
        ),
        ("intent", "get_intent", {"id": f"{sender.address}:0"}, "ok"),
        ("network", "get_network", {}, "ok"),
        (
            "validate: not an object",
            "validate_transaction",
            {"request": "not an object"},
            "MALFORMED_REQUEST",
        ),
        ("validate: no request", "validate_transaction", {}, "MALFORMED_REQUEST"),
        ("validate: no tx", "validate_transaction", {"request": {"tx": "no"}}, "MALFORMED_REQUEST"),
        ("batch: none", "relay_batch", {"requests": []}, "MALFORMED_REQUEST"),
        ("batch: 17", "relay_batch", {"requests": [relay_body(first, lease)] * 17}, "MALFORMED_REQUEST"),
        ("batch: not a list", "relay_batch", {"requests": "no"}, "MALFORMED_REQUEST"),
        (
            "assign: forged proof",
            "assign_relayer",
            {"request": {"sender": asker.address, "proof": {**proof, "signature": "00" * 64}}},
            "ASSIGN_PROOF_INVALID",
        ),
        ("assign: bad sender", "assign_relayer", {"request": {"sender": "erd1no"}}, "MALFORMED_REQUEST"),
        ("quote: no chain", "quote", {"request": {"tx": {"nonce": 1}}}, "MALFORMED_REQUEST"),
        ("intent: unknown", "get_intent", {"id": "ab" * 32}, "NOT_FOUND"),
        ("intent: a number", "get_intent", {"id": 7}, "MALFORMED_REQUEST"),
        ("unknown tool", "relay_everything", {}, "NOT_FOUND"),
    ]
    return {
        "calls": [
            {"label": label, "tool": tool, "arguments": arguments, "expect": expect}
            for label, tool, arguments, expect in calls
        ],
        "resources": ["relay://pricing", "relay://errors"],
        "sender": sender.address,
    }


@pytest.mark.parametrize("sdk", ["v1", "v2"])
@pytest.mark.parametrize("kind", ["http", "stdio"])
def test_the_typescript_sdk_accepts_every_answer(
    node: str, api: Any, kind: str, sdk: str, tmp_path: Path
) -> None:
    served, env = api
    steps = plan(served, env)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(steps))
    done = run([node, "mcp_client.mjs", sdk, str(plan_file), *target(kind, served)], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout)
    assert seen["transportErrors"] == [], seen["transportErrors"]
    assert {tool["name"] for tool in seen["tools"]} == {
        "validate_transaction",
        "relay_batch",
        "assign_relayer",
        "quote",
        "get_intent",
        "get_network",
    }
    assert all(tool["outputSchema"]["type"] == "object" for tool in seen["tools"])
    outcomes = {
        call["label"]: checked(call, call.get("result"), call.get("thrown")) for call in seen["calls"]
    }
    check_outcomes(outcomes, steps)
    reads = {read["uri"]: read for read in seen["reads"]}
    check_reads(reads, served)


def checked(call: dict[str, Any], result: dict[str, Any] | None, refused: Any) -> dict[str, Any]:
    """What one tool call answered (its text, a JSON document), once checked against what it expects: valid
    arguments, a result whose structured content is that text; invalid ones, a tool error (`isError`)
    whose text is the problem document of the expected code and no structured content."""
    label = call["label"]
    assert refused is None, f"{label}: the client refused the answer: {refused}"
    assert result is not None, label
    text = json.loads(result["content"][0]["text"])
    if call["expect"] == "ok":
        assert not result.get("isError"), f"{label}: {text}"
        assert result["structuredContent"] == text, label
    else:
        assert result.get("isError") is True, f"{label}: {result}"
        assert "structuredContent" not in result, f"{label}: an error carries no structured content"
        assert text["code"] == call["expect"], f"{label}: {text}"
        assert text["status"] == CATALOGUE[text["code"]].status, f"{label}: {text}"
        assert isinstance(text["instance"], str) and text["instance"], f"{label}: {text}"
    return text


def check_outcomes(outcomes: dict[str, Any], steps: dict[str, Any]) -> None:
    batch = outcomes["batch"]
    assert (batch["relayed"], batch["refused"]) == (2, 1)
    assert batch["results"][2]["problem"]["code"] == "SENDER_SIGNATURE_INVALID"
    assert batch["results"][2]["problem"]["instance"]
    assert outcomes["intent"]["id"] == f"{steps['sender']}:0"
    assert outcomes["batch: 17"]["details"] == {"field": "requests", "limit": 16, "actual": 17}
    assert outcomes["validate: not an object"]["details"]["field"] == "request"


def check_reads(reads: dict[str, Any], served: Any) -> None:
    """Every resource read: `relay://pricing` byte for byte what `GET /v1/pricing` answers, and the catalogue."""
    for uri, read in reads.items():
        assert "thrown" not in read, f"{uri}: {read['thrown']}"
    assert reads["relay://pricing"]["contents"][0]["text"].encode() == (
        requests.get(f"{served.url}/v1/pricing", timeout=10).content
    )
    assert json.loads(reads["relay://errors"]["contents"][0]["text"])["errors"]


def inspector(node: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run([node, str(INSPECTOR), "--cli", *args, "--format", "json"], tmp_path)


@pytest.mark.parametrize("kind", ["http", "stdio"])
def test_the_inspector_finds_nothing_to_report_in_the_tool_schemas(
    node: str, api: Any, kind: str, tmp_path: Path
) -> None:
    """`tools/list --strict`: every finding (error or warning) is reported in full; there is none."""
    served, _ = api
    done = inspector(node, [*target(kind, served), "--method", "tools/list", "--strict"], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    envelope = json.loads(done.stdout)
    assert len(envelope["result"]["tools"]) == 6
    assert "schemaFindings" not in envelope, envelope.get("schemaFindings")
    assert "Warning:" not in done.stderr and "Error:" not in done.stderr, done.stderr[-4000:]


def test_the_inspector_takes_a_tool_error_as_a_tool_error(node: str, api: Any, tmp_path: Path) -> None:
    """Inspector 2.x validates structured content even on an error: an error carries none, so it shows the
    problem document and exits with its tool-error status (5), not with an output-schema complaint."""
    served, _ = api
    args = ["--method", "tools/call", "--tool-name", "get_intent", "--tool-arg", f"id={'ab' * 32}"]
    done = inspector(node, [f"{served.url}/mcp", *args], tmp_path)
    assert done.returncode == 5, (done.stdout, done.stderr[-4000:])
    result = json.loads(done.stdout.splitlines()[0])["result"]
    assert result["isError"] is True and "structuredContent" not in result
    assert json.loads(result["content"][0]["text"])["code"] == "NOT_FOUND"
    assert "output schema" not in done.stdout + done.stderr


# Invocations at once: over stdio each starts a `gasless mcp` (~1.5 s of CPU, most of an invocation's cost), so
# more than the cores gains nothing.
INSPECTOR_CONCURRENCY = max(2, os.cpu_count() or 2)
# The Inspector refuses a tool its `tools/list` does not hold before asking the server (`tool_not_found`).
REFUSED_BY_THE_INSPECTOR = {"unknown tool"}


def inspector_stage(call: dict[str, Any]) -> int:
    """When a call may run: the valid calls that read the transactions `relay_batch` relays go first, the
    relay with the invalid calls next (none depends on the chain), `get_intent` of what it relayed last."""
    if call["expect"] != "ok":
        return 1
    return {"relay_batch": 1, "get_intent": 2}.get(call["tool"], 0)


@pytest.mark.parametrize("kind", ["http", "stdio"])
def test_the_inspector_cli_accepts_every_answer(node: str, api: Any, kind: str, tmp_path: Path) -> None:
    """The TypeScript SDK test's calls (every tool with valid and invalid arguments) and every resource
    (`resources/list`, then each one read), each an Inspector CLI invocation (`js/inspector_cli.mjs`): no
    invocation fails in the client (the Inspector 2.x validates structured content against the output
    schema), a valid call exits 0, an invalid one is a tool error (exit status 5) with the problem document."""
    served, env = api
    steps = plan(served, env)
    calls = [call for call in steps["calls"] if call["label"] not in REFUSED_BY_THE_INSPECTOR]
    stages: list[list[dict[str, Any]]] = [[{"label": "resources", "method": "resources/list"}], [], []]
    stages[0] += [{"label": uri, "method": "resources/read", "uri": uri} for uri in steps["resources"]]
    for call in calls:
        stages[inspector_stage(call)].append({**call, "method": "tools/call"})
    plan_file, report_file = tmp_path / "plan.json", tmp_path / "report.json"
    plan_file.write_text(json.dumps({"concurrency": INSPECTOR_CONCURRENCY, "stages": stages}))
    done = run([node, "inspector_cli.mjs", str(plan_file), str(report_file), *target(kind, served)], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Warning:" not in done.stderr and "Error:" not in done.stderr, done.stderr[-4000:]
    seen = {step["label"]: step for step in json.loads(report_file.read_text())["steps"]}
    assert len(seen) == sum(map(len, stages))
    envelopes = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(envelopes) == len(seen) and all(set(e) == {"output"} for e in envelopes), done.stdout[-4000:]
    outcomes = {}
    for call in calls:
        step = seen[call["label"]]
        outcomes[call["label"]] = checked(
            call, step["result"], step.get("error") if step["exitCode"] != 5 else None
        )
        if call["expect"] == "ok":
            assert step["exitCode"] == 0, step
        else:
            assert (step["exitCode"], step["error"]["code"]) == (5, "tool_is_error"), step
    check_outcomes(outcomes, steps)
    assert seen["resources"]["exitCode"] == 0, seen["resources"]
    listed = {resource["uri"] for resource in seen["resources"]["result"]["resources"]}
    assert listed == set(steps["resources"])
    for uri in listed:
        assert seen[uri]["exitCode"] == 0, seen[uri]
    check_reads({uri: seen[uri]["result"] for uri in listed}, served)
