"""Incident tests: an API host without a network (the incident routes need only the database), the relay
suite's app on a real localnet (`make_env`, `problem`) for the platform budget, the stream suite's real
server and SSE reader (`served`, `sse`), and `admin`, the operator's `gasless admin incident` commands."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from relay_kit import MASTER_SECRET, load_conftest, unthrottled_limits
from typer.testing import CliRunner

from gasless.cli import app as cli
from gasless.core.settings import Settings
from gasless.hosting.app import create_app

relay_env = load_conftest("relay")
streams_env = load_conftest("streams")
env = relay_env.env
make_env = relay_env.make_env
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem
auth = streams_env.auth
served = streams_env.served
sse = streams_env.sse


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """A host serving the incident routes; nothing answers on its gateway port, so it never becomes ready
    (the incident routes need only the database)."""

    def __init__(self, client: TestClient, database_url: str) -> None:
        self.client = client
        self.database_url = database_url

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, **kwargs)

    def incidents(self, **params: Any) -> dict[str, Any]:
        response = self.client.get("/v1/incidents", params=params)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    database_url = f"sqlite+aiosqlite:///{(tmp_path / 'api.db').as_posix()}"
    settings = Settings(
        profile="localnet",
        host_id="a",
        master_secret=MASTER_SECRET,
        data_dir=tmp_path,
        database_url=database_url,
        gateway_urls=[f"http://127.0.0.1:{_free_port()}"],
    )
    with TestClient(create_app(settings, route_limits=unthrottled_limits())) as client:
        yield Api(client, database_url)


class Admin:
    """`gasless admin incident ...` against one database, run in-process."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.runner = CliRunner()

    def run(self, *args: str) -> Any:
        return self.runner.invoke(cli, ["admin", "incident", *args, "--database-url", self.database_url])

    def ok(self, *args: str) -> dict[str, Any]:
        """Run a command that succeeds and prints the incident as JSON (`--json`: its one stdout line)."""
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        (line,) = result.stdout.strip().splitlines()
        return json.loads(line)  # type: ignore[no-any-return]

    def open(self, title: str, body: str = "We are looking into it.", *extra: str) -> dict[str, Any]:
        return self.ok("open", "--title", title, "--body", body, *extra)

    def update(self, incident_id: str, status: str, body: str) -> dict[str, Any]:
        return self.ok("update", incident_id, "--status", status, "--body", body)


@pytest.fixture
def admin(api: Api) -> Admin:
    return Admin(api.database_url)


@pytest.fixture
def admin_for() -> type[Admin]:
    """`admin_for(database_url)`: the operator's commands against another host's database."""
    return Admin
