"""Rolling upgrades: the newest migration keeps the previous release serving (expand-then-contract).

The previous release is the commit before the newest migration was added (HEAD when that migration is not
committed yet): its tree is taken with `git archive` and installed (as a wheel) in a virtual environment of its
own from its own lock file, cached under the temporary directory between runs. On one PostgreSQL, host `a`
runs the previous release (its start migrates the database to that release's head), `gasless admin
migrate` of this release runs the newest migration under it, host `a` keeps relaying, host `b` starts on
this release, and relays go through both, each host serving what the other committed: none refused, none
lost (every one FINALIZED, read from both hosts).

Also here: a host of this release whose database a newer release migrated starts without migrating
(gasless.db.migrate), so a host of the previous release restarting mid-upgrade is never refused from now on.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from multiversx_sdk import Transaction, TransactionComputer, UserSecretKey
from process_kit import free_port, wait_until  # type: ignore[import-not-found]
from relay_kit import key_in_shard  # type: ignore[import-not-found]
from serve_kit import Host, serve_env, start_host, stop  # type: ignore[import-not-found]
from sqlalchemy import text

from gasless.chain.addresses import address_of, parse_address
from gasless.db import create_engine
from gasless.db.migrate import current_revision, head_revision, upgrade
from gasless.localnet.owner import owner_call, unpause
from gasless.relay.checks import presence_message

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "src" / "gasless" / "db" / "migrations" / "versions"
BUILD_BUDGET_S = 180.0  # longer than this, the suite skips the test unless ENABLE_ENV is set
ENABLE_ENV = "GASLESS_TEST_PREVIOUS_RELEASE"
_computer = TransactionComputer()


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def newest_migration() -> Path:
    head = head_revision()
    for path in VERSIONS.glob("*.py"):
        if re.search(rf'^revision: str = "{head}"', path.read_text(), re.MULTILINE):
            return path
    raise AssertionError(f"no migration file declares the head revision {head}")


def previous_release() -> str:
    """The commit before the newest migration was added; HEAD while that migration is not committed."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", str(newest_migration().relative_to(REPO)))
    if not added:
        return git("rev-parse", "HEAD")
    return git("rev-parse", f"{added.splitlines()[-1]}^")


@dataclass(frozen=True)
class Release:
    commit: str
    python: Path
    head: str  # its newest migration
    build_s: float  # what building it took (0: found built)


def usable(python: Path) -> bool:
    """The cached environment still imports its own gasless (a cache from another checkout or a half-cleaned
    temporary directory is rebuilt, never trusted)."""
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import gasless.cli, gasless.db.migrate"],
        capture_output=True, cwd=tempfile.gettempdir(), timeout=60,
    )  # fmt: skip
    return probe.returncode == 0


def build_release(commit: str) -> Release:
    """The previous release's tree (`git archive` of the commit: no worktree registered in this checkout) and a
    virtual environment with it installed as a wheel (its own lock; nothing points back at the tree), built
    once and kept under the temporary directory; a build beyond BUILD_BUDGET_S skips the test unless
    ENABLE_ENV."""
    root = Path(tempfile.gettempdir()) / f"gasless-release-{commit[:12]}"
    root.mkdir(exist_ok=True)
    tree, venv, ready = root / "tree", root / "venv", root / "ready.json"
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip(f"PREVIOUS RELEASE NOT BUILT: {uv} is missing (./dev sync installs it)")
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (pytest-xdist workers)
        if ready.exists():
            done = json.loads(ready.read_text())
            if done.get("commit") == commit and usable(python):
                return Release(commit, python, done["head"], 0.0)
            ready.unlink()
        started = time.monotonic()
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True, check=True, timeout=120
        )  # fmt: skip
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        requirements = root / "requirements.txt"
        steps = [
            [str(uv), "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes", "--quiet",
             "--project", str(tree), "-o", str(requirements)],
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(uv), "pip", "install", "--quiet", "--python", str(python), "-r", str(requirements), str(tree)],
        ]  # fmt: skip
        for step in steps:
            left = BUILD_BUDGET_S - (time.monotonic() - started)
            try:
                subprocess.run(step, capture_output=True, text=True, check=True, timeout=max(1.0, left))
            except subprocess.TimeoutExpired:
                if os.environ.get(ENABLE_ENV):
                    subprocess.run(step, capture_output=True, text=True, check=True)
                    continue
                pytest.skip(
                    f"PREVIOUS RELEASE NOT BUILT: building {commit[:12]}'s environment took more than "
                    f"{BUILD_BUDGET_S:.0f} s; set {ENABLE_ENV}=1 to build it anyway"
                )
            except subprocess.CalledProcessError as exc:
                raise AssertionError(f"{' '.join(step[:3])}: {exc.stderr[-2000:]}") from None
        assert usable(python), f"the previous release's environment does not import gasless ({python})"
        found = re.findall(
            r'^revision: str = "([^"]+)"',
            "\n".join(p.read_text() for p in (tree / VERSIONS.relative_to(REPO)).glob("*.py")),
            re.MULTILINE,
        )
        head = max(found)
        build_s = time.monotonic() - started
        ready.write_text(json.dumps({"commit": commit, "head": head, "buildSeconds": round(build_s, 1)}))
        return Release(commit, python, head, build_s)


@pytest.fixture(scope="module")
def release() -> Release:
    if not (os.environ.get("GASLESS_TEST_POSTGRES_URL") and os.environ.get("GASLESS_TEST_REDIS_URL")):
        pytest.skip(
            "rolling upgrade suite skipped: needs GASLESS_TEST_POSTGRES_URL and GASLESS_TEST_REDIS_URL"
        )
    try:
        commit = previous_release()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"PREVIOUS RELEASE NOT BUILT: not a git checkout with its history ({exc})")
    built = build_release(commit)
    print(f"previous release {commit[:12]} (head {built.head}), environment built in {built.build_s:.1f} s")
    return built


@contextlib.contextmanager
def serving(
    python: Path, name: str, localnet: Any, database_url: str, redis_url: str, tmp: Path, label: str = ""
) -> Iterator[Host]:
    """`gasless serve` of the release installed for `python`, as host `name`, until ready; stopped after."""
    port = free_port()
    # Nothing of this checkout's environment (its settings, a PYTHONPATH to its sources) reaches the host.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GASLESS_", "PYTHON"))}
    env = serve_env(
        localnet.net.info,
        localnet.urls,
        host_id=name,
        port=port,
        data_dir=tmp / f"data-{label or name}",
        database_url=database_url,
        redis_url=redis_url,
        base=base,
    )
    host = start_host(env, name, port, tmp / f"host-{label or name}.log", python=python, cwd=tmp, timeout=60)
    try:
        yield host
    finally:
        stop(host.proc)


@dataclass
class Sender:
    key: UserSecretKey
    nonce: int = 0
    lease: dict[str, Any] | None = None

    @property
    def address(self) -> str:
        return address_of(self.key.generate_public_key().buffer).to_bech32()


def relay(host: Host, sender: Sender) -> str:
    """One transfer through `host` (a lease from whichever host gave it: they share the master secret)."""
    if sender.lease is None:
        now = int(time.time() * 1000)
        signature = sender.key.sign(presence_message("localnet", sender.address, now)).hex()
        answer = host.post(
            "/v1/relay/assign",
            {"sender": sender.address, "proof": {"kind": "key", "serverTimeMs": now, "signature": signature}},
        )
        assert answer.status_code == 200, f"assign on {host.host_id}: {answer.text}"
        sender.lease = answer.json()
    tx = Transaction(
        sender=address_of(sender.key.generate_public_key().buffer),
        receiver=address_of(key_in_shard(1).generate_public_key().buffer),
        gas_limit=100_000,
        chain_id="localnet",
        nonce=sender.nonce,
        version=2,
        relayer=parse_address(sender.lease["relayer"]),
    )
    tx.signature = sender.key.sign(_computer.compute_bytes_for_signing(tx))
    answer = host.post("/v1/relay", {"tx": tx.to_dictionary(), "lease": sender.lease["lease"]})
    assert answer.status_code in (200, 202), (
        f"relay on {host.host_id} ({sender.address}:{sender.nonce}): {answer.text}"
    )
    sender.nonce += 1
    return str(answer.json()["txHash"])


def settled_on(hosts: list[Host], hashes: list[str], states: tuple[str, ...] = ("FINALIZED",)) -> None:
    """Every relay in one of `states` (executed with outcome success) as each host reads it; polled within
    the read limits."""
    for host in hosts:
        left = set(hashes)
        seen: dict[str, Any] = {}

        def settled(host: Host = host, left: set[str] = left, seen: dict[str, Any] = seen) -> bool:
            for tx_hash in sorted(left):
                answer = host.get(f"/v1/relay/{tx_hash}")
                if answer.status_code == 429:
                    time.sleep(int(answer.headers.get("Retry-After", "1")))
                    return False
                doc = answer.json()
                seen[tx_hash] = doc.get("state")
                if doc.get("state") in states:
                    assert doc["outcome"] == "success", doc
                    left.discard(tx_hash)
            time.sleep(0.2)
            return not left

        try:
            wait_until(
                settled,
                f"{len(hashes)} relays {'/'.join(states)} as host {host.host_id} reads them",
                60,
                proc=host.proc,
                log=host.log_path,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; not there: {[(h, seen.get(h)) for h in sorted(left)]}") from None


async def revision_of(url: str) -> str | None:
    engine = create_engine(url)
    try:
        return await current_revision(engine)
    finally:
        await engine.dispose()


@pytest.mark.postgres
@pytest.mark.redis
def test_the_previous_release_keeps_serving_next_to_this_one_across_the_newest_migration(
    release: Release, localnet: Any, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    from process_kit import piped_env, run  # type: ignore[import-not-found]

    asyncio.run(unpause(localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"]))
    senders = [Sender(key_in_shard(shard)) for shard in (0, 1, 2)]
    for sender in senders:
        asyncio.run(
            owner_call(
                localnet.url, localnet.net.genesis.owner, localnet.net.info["contract"], "grant",
                [address_of(sender.key.generate_public_key().buffer), 3, 1],
            )
        )  # fmt: skip
    assert release.head != head_revision(), "the previous release must be one migration behind"
    hashes: list[str] = []
    new = Path(sys.executable)
    with contextlib.ExitStack() as stack:
        previous = stack.enter_context(
            serving(release.python, "a", localnet, postgres_url, redis_url, tmp_path)
        )
        # The previous release migrated the database to its own head.
        assert asyncio.run(revision_of(postgres_url)) == release.head
        hashes += [relay(previous, sender) for sender in senders]
        # This release's migration runs under it...
        migrated = run(
            "admin", "migrate", "--database-url", postgres_url, env=piped_env(GASLESS_PROFILE="localnet")
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr
        assert json.loads(migrated.stdout.splitlines()[-1])["to"] == head_revision()
        # ... and it keeps relaying; host b starts on this release, and relays go through both.
        hashes += [relay(previous, sender) for sender in senders]
        b = stack.enter_context(serving(new, "b", localnet, postgres_url, redis_url, tmp_path))
        for round_ in range(4):
            for i, sender in enumerate(senders):
                hashes.append(relay((previous, b)[(round_ + i) % 2], sender))
        # Every relay executed, as both hosts read it. (The previous release follows its own intents to
        # EXECUTED; it reads finality from a member the real proxy, and localnet since, give only on another
        # lookup path, so its intents wait there until a host of this release finishes them, below.)
        settled_on([previous, b], hashes, ("EXECUTED", "FINALIZED"))
        for host in (previous, b):
            ready = host.get("/readyz")
            assert ready.status_code == 200, f"{host.host_id}: {ready.text}"
        # The rolling step: a stops (b adopts its intents in flight) and comes back on this release.
        previous.proc.send_signal(signal.SIGTERM)
        assert previous.proc.wait(30) in (0, 143)
        a = stack.enter_context(
            serving(new, "a", localnet, postgres_url, redis_url, tmp_path, label="a-upgraded")
        )
        for round_ in range(2):
            for i, sender in enumerate(senders):
                hashes.append(relay((a, b)[(round_ + i) % 2], sender))
        settled_on([a, b], hashes)
    assert asyncio.run(revision_of(postgres_url)) == head_revision()


async def test_a_host_whose_database_a_newer_release_migrated_starts_without_migrating(
    sqlite_url: str,
) -> None:
    await upgrade(sqlite_url)
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        await upgrade(sqlite_url)  # a revision this release does not know: left as it is, no error
        assert await current_revision(engine) == "9999"
    finally:
        await engine.dispose()
