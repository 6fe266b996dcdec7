"""`gasless up` started again on the same data directory resumes (the chain and the database agree), and
`--fresh` starts over; a database that does not belong to the chain is refused. Real processes, real HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from gasless.chain.addresses import address_of
from gasless.client import RelayClient, RelayProblem, Transfer, UserKey, gateway_nonce
from gasless.localnet.genesis import load_or_create_wallet
from gasless.localnet.owner import owner_call


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Up:
    """One `gasless up` process."""

    proc: subprocess.Popen[bytes]
    api: str
    gateway: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gasless up exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if requests.get(f"{self.api}/readyz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or too busy starting to answer in 2 s
                pass
            time.sleep(0.05)
        raise AssertionError(f"gasless up not ready within {timeout} s:\n{self.output()}")

    def stop(self) -> None:
        """Ctrl-C: everything stops, and the chain is saved."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(60) == 130, self.output()  # stopped by SIGINT (docs/operations.md)

    def gateway_get(self, path: str) -> dict[str, Any]:
        return requests.get(f"{self.gateway}{path}", timeout=5).json()  # type: ignore[no-any-return]


@pytest.fixture
def gasless_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    """Start `gasless up` on free ports (metrics off); every process is reaped at the end."""
    started: list[Up] = []

    def start(data_dir: Path, *extra: str) -> Up:
        api, localnet = free_port(), free_port()
        log = tmp_path / f"up-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "gasless.cli", "up",
                    "--port", str(api), "--localnet-port", str(localnet), "--metrics-port", "0",
                    "--data-dir", str(data_dir), "--round-ms", "100", *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "200"},
            )  # fmt: skip
        started.append(Up(proc, f"http://127.0.0.1:{api}", f"http://127.0.0.1:{localnet}", log))
        return started[-1]

    yield start
    for up in started:
        if up.proc.poll() is None:
            up.proc.kill()
        up.proc.wait(30)


async def relay_transfer(up: Up, user: UserKey, *, grant_plan_with: Any = None) -> dict[str, Any]:
    """Relay one transfer from `user` at its account nonce and follow it to FINALIZED."""
    if grant_plan_with is not None:
        contract = up.gateway_get("/localnet/info")["data"]["contract"]
        await owner_call(up.gateway, grant_plan_with, contract, "grant", [address_of(user.public_key), 3, 1])
    async with RelayClient(up.api) as client:
        nonce = await gateway_nonce(up.gateway, user.address, session=client.session)
        sent = await client.send(user, Transfer(user.address, nonce=nonce, data="resume"))
        assert sent.status in (200, 202), sent.result.body
        states = [intent async for intent in client.follow(sent.id, timeout_s=60)]
    final = states[-1]
    assert final["state"] == "FINALIZED" and final["outcome"] == "success", states
    assert final["id"] == f"{user.address}:{nonce}" and final["txHash"] == sent.tx_hash
    return final


async def read_intent(up: Up, ident: str) -> dict[str, Any]:
    async with RelayClient(up.api) as client:
        return await client.intent(ident)


def test_a_second_up_resumes_and_fresh_starts_over(tmp_path: Path, gasless_up: Callable[..., Up]) -> None:
    data_dir = tmp_path / "var"
    first = gasless_up(data_dir)
    first.wait_ready()
    wallets = data_dir / "localnet" / "wallets"
    user = UserKey.from_pem(wallets / "user-s1.pem")
    owner = load_or_create_wallet(wallets, "owner")
    old = asyncio.run(relay_transfer(first, user, grant_plan_with=owner))
    start_time = first.gateway_get("/network/config")["data"]["config"]["erd_start_time"]
    genesis = first.gateway_get("/hyperblock/by-nonce/0")["data"]["hyperblock"]["hash"]
    first.stop()

    # Again on the same data directory: the chain and the database resume together.
    second = gasless_up(data_dir)
    second.wait_ready()
    assert second.gateway_get("/localnet/info")["data"]["resumed"] is True
    assert second.gateway_get("/network/config")["data"]["config"]["erd_start_time"] == start_time
    assert asyncio.run(read_intent(second, old["id"])) == old  # still FINALIZED, unchanged
    on_chain = second.gateway_get(f"/transaction/{old['txHash']}")["data"]["transaction"]
    assert on_chain["status"] == "success" and on_chain["hyperblockNonce"] > 0
    # The same sender goes on at the next nonce (its plan, granted on chain before, is still there).
    new = asyncio.run(relay_transfer(second, user))
    assert new["id"] == f"{user.address}:{int(old['id'].rsplit(':', 1)[1]) + 1}"
    second.stop()

    # The chain alone starts over, the database stays: refused, with one line saying what to do.
    for path in (data_dir / "localnet" / "chain").iterdir():
        path.unlink()
    refused = gasless_up(data_dir)
    assert refused.proc.wait(90) == 2, refused.output()
    lines = [line for line in refused.output().splitlines() if line.startswith("cannot start:")]
    assert len(lines) == 1, refused.output()
    assert f"erd_start_time {start_time}" in lines[0] and "gasless up --fresh" in lines[0]

    # --fresh: a new chain and a new database.
    fresh = gasless_up(data_dir, "--fresh")
    fresh.wait_ready()
    assert fresh.gateway_get("/localnet/info")["data"]["resumed"] is False
    assert fresh.gateway_get("/network/config")["data"]["config"]["erd_start_time"] > start_time
    assert fresh.gateway_get("/hyperblock/by-nonce/0")["data"]["hyperblock"]["hash"] != genesis
    assert fresh.gateway_get(f"/address/{user.address}/nonce")["data"]["nonce"] == 0
    assert fresh.gateway_get(f"/transaction/{old['txHash']}")["error"] == "transaction not found"
    for ident in (old["id"], old["txHash"]):
        with pytest.raises(RelayProblem) as missing:
            asyncio.run(read_intent(fresh, ident))
        assert missing.value.status == 404 and missing.value.code == "NOT_FOUND"
    assert asyncio.run(relay_transfer(fresh, user, grant_plan_with=owner))["id"] == f"{user.address}:0"
    fresh.stop()


def test_fresh_never_drops_a_postgres_database_that_holds_gasless_data(
    tmp_path: Path, postgres_url: str
) -> None:
    from gasless.db import upgrade

    asyncio.run(upgrade(postgres_url))  # a database gasless already wrote to
    data_dir = tmp_path / "var"
    result = subprocess.run(
        [
            sys.executable, "-m", "gasless.cli", "up", "--fresh", "--database-url", postgres_url,
            "--data-dir", str(data_dir), "--port", str(free_port()), "--localnet-port", str(free_port()),
            "--metrics-port", "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("cannot start:")]
    assert len(lines) == 1 and "never drops" in lines[0] and "empty database" in lines[0], result.stderr
    assert not (data_dir / "localnet").exists()  # refused before anything started


def test_up_runs_a_mail_catcher_that_keeps_the_mails(tmp_path: Path, gasless_up: Callable[..., Up]) -> None:
    """A newcomer sees the service's mails: `gasless up` starts a real SMTP server, points the hosts at it and
    keeps every mail in <data-dir>/mail (a Maildir); the verification link in it works."""
    import mailbox
    import re

    from gasless.client.native_auth import make_native_auth_token

    data_dir = tmp_path / "var"
    up = gasless_up(data_dir, "--mail-port", str(free_port()))
    up.wait_ready()
    wallets = data_dir / "localnet" / "wallets"
    user = UserKey.from_pem(wallets / "user-s1.pem")
    owner = load_or_create_wallet(wallets, "owner")
    contract = up.gateway_get("/localnet/info")["data"]["contract"]
    asyncio.run(owner_call(up.gateway, owner, contract, "grant", [address_of(user.public_key), 3, 1]))
    block = requests.get(f"{up.api}/v1/network", timeout=5).json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(user.secret_key, origin=up.api, block_hash=block, ttl_seconds=600)
    headers = {"Authorization": f"Bearer {token}"}
    path = f"{up.api}/v1/account/{user.address}/notifications"

    def saved() -> Any:  # the account is mirrored a moment after the grant is final
        answer = requests.put(
            path, json={"email": {"address": "newcomer@example.com"}}, headers=headers, timeout=5
        )
        return answer if answer.status_code == 200 else None

    answer = wait_for(saved, "the preferences saved")
    assert answer.json()["email"]["status"] == "pending"
    maildir = mailbox.Maildir(str(data_dir / "mail"), create=False)
    mails = wait_for(lambda: list(maildir), "a mail in the Maildir")
    (mail,) = mails
    assert mail["To"] == "newcomer@example.com" and "Confirm" in mail["Subject"]
    link = re.search(r"(http://\S+/notifications/verify\?token=\S+)", mail.get_payload(decode=True).decode())
    assert link and link.group(1).startswith(up.api), mail
    assert requests.get(link.group(1), timeout=5).json()["status"] == "verified"
    assert requests.get(path, headers=headers, timeout=5).json()["email"]["status"] == "verified"
    assert "mail caught for newcomer@example.com" in up.output()
    up.stop()


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not reached")
