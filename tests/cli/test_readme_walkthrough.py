"""What a new user meets, against `gasless up` (localnet, the API, its metrics listener and the status site)
started once for the module in a directory laid out as `./dev up` leaves the repository (`.venv/bin/gasless`,
`var/localnet/wallets/`).

README.md's "Your first relayed transaction" is run as written: the commands of each of its `bash` blocks
(the plan path, then the credits path) are parsed out of the README and run one after the other. Each path
ends with a relayed transfer FINALIZED: the plan path's billed on the plan it bought, the credits path's
pay-as-you-go from the escrow its top-up filled. And a URL given for the wrong thing is named for what it
is (the status site, the metrics listener, the API as a gateway, a server that is no gasless endpoint), by
the CLI's option checks and by `gasless mcp` alike."""

from __future__ import annotations

import http.server
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from process_kit import (  # type: ignore[import-not-found]
    Spawned,
    answers,
    error_line,
    free_ports,
    piped_env,
    spawn,
)

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Your first relayed transaction"
RECEIVER = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"


def walkthrough() -> list[list[list[str]]]:
    """The section's `bash` blocks, each a list of commands (argv), continuations joined, comments dropped."""
    text = README.read_text(encoding="utf-8")
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = re.split(r"\n#{2,3} ", text.split(SECTION, 1)[1], maxsplit=1)[0]
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands = [shlex.split(line, comments=True) for line in joined.splitlines()]
        blocks.append([argv for argv in commands if argv])
    return blocks


@dataclass
class Embedded:
    """`gasless up` running in `root` (its data under `root/var`), with the URLs it serves."""

    root: Path
    up: Spawned
    api: str
    gateway: str
    metrics: str
    status_site: str

    def run(self, argv: list[str], stdin: int | None = None) -> subprocess.CompletedProcess[str]:
        """A command as a user types it in `root` (`.venv/bin/gasless ...`), the API from the environment."""
        env = piped_env(GASLESS_API_URL=self.api)  # the README's commands name no port: the API is this one
        return subprocess.run(
            argv,
            cwd=self.root,
            env=env,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    root = tmp_path_factory.mktemp("walkthrough")
    # The layout the README's commands assume: .venv/bin/gasless (this environment's) and ./var.
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "gasless").symlink_to(Path(sys.executable).parent / "gasless")
    api, gateway, metrics, site = free_ports(4)
    args = ["up", "--data-dir", str(root / "var"), "--port", str(api), "--localnet-port", str(gateway)]
    args += ["--metrics-port", str(metrics), "--status-port", str(site)]
    with spawn(*args, log=root / "up.log") as up:
        running = Embedded(
            root,
            up,
            f"http://127.0.0.1:{api}",
            f"http://127.0.0.1:{gateway}",
            f"http://127.0.0.1:{metrics}",
            f"http://127.0.0.1:{site}",
        )
        up.wait_for(lambda: answers(f"{running.api}/readyz"), "the API ready", timeout=120)
        up.wait_for(lambda: answers(f"{running.status_site}/healthz"), "the status site", timeout=60)
        yield running


def test_the_readme_walkthrough_reaches_finalized_on_a_plan_and_on_credits(embedded: Embedded) -> None:
    blocks = walkthrough()
    assert len(blocks) == 2, blocks  # the plan path, then the credits path
    for commands in blocks:
        assert commands and all(argv[0] == ".venv/bin/gasless" for argv in commands), commands
        assert commands[-1][1:3] == ["relay", "send"], commands
    for path, commands in zip(("plan", "payg"), blocks, strict=True):
        for argv in commands:
            done = embedded.run(argv)
            said = f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}"
            assert done.returncode == 0, said
        # The last command relayed a transfer to finality, billed as the path says.
        assert "FINALIZED outcome=success" in done.stdout, said
        assert f"billing={path} (" in done.stdout, said
    assert embedded.up.proc.poll() is None, embedded.up.output()


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>nothing here</html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[str]:
    """An HTTP server that is nothing of gasless's (answers 404 to everything)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_for_the_wrong_thing_is_named_for_what_it_is(embedded: Embedded, other_server: str) -> None:
    pem = "var/localnet/wallets/user-s0.pem"
    status = [".venv/bin/gasless", "relay", "status", "0" * 64, "--api"]
    expected = {
        embedded.status_site: "it is the gasless status site",
        embedded.metrics: "it is a metrics listener",
        embedded.gateway: "it is a MultiversX gateway (--api and --gateway swapped?)",
        other_server: "GET /healthz answered HTTP 404 (text/html): it is not a gasless endpoint",
    }
    for url, what in expected.items():
        line = error_line(done := embedded.run([*status, url]))
        assert done.returncode == 2 and f"--api {url} does not answer as a gasless API: {what}" in line, line
        assert "is it the gateway?" not in line, line
    send = [".venv/bin/gasless", "relay", "send", "--pem", pem, "--to", RECEIVER, "--gateway"]
    line = error_line(done := embedded.run([*send, embedded.api]))
    assert done.returncode == 2, line
    assert f"--gateway {embedded.api} does not answer as a MultiversX gateway: it is a gasless API" in line
    line = error_line(done := embedded.run([*send, embedded.status_site]))
    assert "it is the gasless status site" in line and "is it the gasless API?" not in line, line


def test_gasless_mcp_names_a_wrong_api_url_as_the_cli_does(embedded: Embedded, other_server: str) -> None:
    """`gasless mcp --api URL` starts whatever answers there, but its stderr line (the reason its tools'
    UPSTREAM_UNAVAILABLE gives too) names what the URL is, through the CLI's own check (gasless.client.endpoints).
    With stdin closed the server ends after its start, so each run is short."""
    mcp = [".venv/bin/gasless", "mcp", "--api"]
    expected = {
        embedded.status_site: "it is the gasless status site",
        embedded.metrics: "it is a metrics listener",
        embedded.gateway: "it is a MultiversX gateway",
        other_server: "GET /healthz answered HTTP 404 (text/html): it is not a gasless endpoint",
    }
    for url, what in expected.items():
        done = embedded.run([*mcp, url], stdin=subprocess.DEVNULL)
        said = f"{done.returncode}\n{done.stderr}"
        assert f"gasless mcp: --api {url} does not answer as a gasless API: {what}" in done.stderr, said
        # No `--gateway` option here, so no "swapped?" hint.
        assert "is it the gateway?" not in done.stderr and "swapped" not in done.stderr, said
    done = embedded.run([*mcp, embedded.api], stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "does not answer" not in done.stderr, done.stderr
