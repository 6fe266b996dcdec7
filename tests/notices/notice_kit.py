"""Helpers of the notice tests (a module, not a conftest: see pyproject's pythonpath). Notice tests: real servers on a real localnet (the stream suite's `served`, `sse`), a real SMTP server
(`smtp`: the service's own mail catcher, aiosmtpd, on a free loopback port in its own thread), real webhook
receivers (`receiver_factory`), the operator's `gasless admin incident` commands, and helpers that relay
real transactions against a small plan tier."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import webhook_kit
from relay_kit import key_in_shard, load_conftest
from typer.testing import CliRunner

from gasless.cli import app as cli
from gasless.notifications.mail import CaughtMail, MailCatcher

streams_env = load_conftest("streams")
relay_env = load_conftest("relay")
env = relay_env.env
make_env = relay_env.make_env
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem
served = streams_env.served
sse = streams_env.sse
platform_problem = streams_env.platform_problem
receiver = webhook_kit.receiver
Receiver = webhook_kit.Receiver

MONTH_MS = 2_592_000_000
M = 1_000_000
# Fast workers: notices are scanned and dispatched every 50 ms, mails and webhooks retried quickly.
FAST = {
    "notices_poll_ms": 50,
    "mail_poll_ms": 50,
    "mail_retry_backoff_ms": [50, 50, 50],
    **webhook_kit.LOCAL_RECEIVERS,
}
_tiers = iter(range(60, 100))


class Smtp:
    """A real SMTP server (the service's mail catcher) on its own event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.catcher = MailCatcher()
        asyncio.run_coroutine_threadsafe(self.catcher.start(), self.loop).result(10)
        self.url = self.catcher.url

    def mails_to(self, address: str) -> list[CaughtMail]:
        return [m for m in list(self.catcher.mails) if address in m.envelope_to]

    def wait(self, address: str, count: int, timeout: float = 20.0) -> list[CaughtMail]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.mails_to(address)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"{len(self.mails_to(address))} mails to {address}, expected {count}")

    def wait_subject(self, address: str, fragment: str, timeout: float = 20.0) -> CaughtMail:
        """The first mail to `address` whose subject contains `fragment` (other mails may come meanwhile:
        a global notice, such as a tariff change made by another step of the test, is mailed too)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for mail in self.mails_to(address):
                if fragment in mail.subject:
                    return mail
            time.sleep(0.02)
        raise AssertionError(
            f"no mail to {address} about {fragment!r}: {[m.subject for m in self.mails_to(address)]}"
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.catcher.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def smtp() -> Iterator[Smtp]:
    server = Smtp()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[[], Any]]:
    """`receiver_factory()`: another real webhook endpoint (each lives until the test ends)."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(webhook_kit.serve_receiver())


def link_of(mail: CaughtMail) -> str:
    found = re.search(r"(http://\S+/notifications/verify\?token=\S+)", mail.text)
    assert found, mail.text
    return found.group(1)


def small_plan(env: Any, included_ru: int) -> Any:
    """A new account on a fresh tier of `included_ru` RU per period."""
    from relay_kit import Sender

    from gasless.chain.addresses import address_of

    tier = next(_tiers)
    env.owner("setTier", [tier, f"T{tier}".encode(), "Human", 3, 1 * M, included_ru, MONTH_MS, True, False])
    account = Sender(key_in_shard(1))
    env.owner("grant", [address_of(account.key.generate_public_key().buffer), tier, 1])
    return account


def relay_transfer(env: Any, sender: Any) -> str:
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    sender.nonce += 1
    return answer.json()["txHash"]  # type: ignore[no-any-return]


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not reached (last: {last!r})")


def notices(client: Any, account: Any, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    answer = client.get(f"/v1/account/{account.address}/notices", params=params, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def put_prefs(client: Any, account: Any, headers: dict[str, str], body: dict[str, Any]) -> Any:
    return client.put(f"/v1/account/{account.address}/notifications", json=body, headers=headers)


def add_webhook(
    client: Any, account: Any, headers: dict[str, str], url: str, types: list[str]
) -> dict[str, Any]:
    answer = client.post(
        f"/v1/account/{account.address}/webhooks", json={"url": url, "eventTypes": types}, headers=headers
    )
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


class Admin:
    """`gasless admin incident ...` against one database, run in-process."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.runner = CliRunner()

    def ok(self, *args: str) -> dict[str, Any]:
        result = self.runner.invoke(
            cli, ["admin", "incident", *args, "--json", "--database-url", self.database_url]
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def open(self, title: str, body: str, *extra: str) -> dict[str, Any]:
        return self.ok("open", "--title", title, "--body", body, *extra)

    def update(self, incident_id: str, status: str, body: str) -> dict[str, Any]:
        return self.ok("update", incident_id, "--status", status, "--body", body)
