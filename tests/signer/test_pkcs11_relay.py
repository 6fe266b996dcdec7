"""Relays co-signed inside a PKCS#11 token (SoftHSM), through the HTTP API on localnet, with real
signatures: the localnet executes a relayed transaction only with a valid relayer signature.

- keys moved into the token with `gasless keys import-pkcs11` co-sign relays that reach FINALIZED;
- the token removed under load: only clean refusals (503 SIGNER_UNAVAILABLE, retryable), `/readyz` says so,
  and every relay answered 200/202 reaches FINALIZED; the token back, the same host signs again (a machine
  that starves the process past the signer's deadline may add 503 SIGNER_TIMEOUT, retryable too, in any
  phase: the load sends the same bytes again);
- a token that does not answer before the deadline: 503 SIGNER_TIMEOUT, nothing sent, the late signature
  discarded, the same bytes accepted afterwards;
- a configuration the signer refuses (a key that can be exported, a wrong PIN) or cannot use yet (a key
  not in the token): the host never becomes ready and `/readyz` says why, the PIN never shown.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from process_kit import run  # type: ignore[import-not-found]
from relay_kit import relay_settings, unthrottled_limits  # type: ignore[import-not-found]

from gasless.hosting.app import create_app


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
    return value


def signer_check(env: Any) -> str:
    return str(env.client.get("/readyz").json()["checks"].get("signer"))


def relay_to_final(env: Any, shard: int) -> tuple[dict[str, Any], dict[str, Any]]:
    sender = env.new_sender(shard)
    assignment = env.assign(sender)
    response = env.relay(env.build(sender, assignment), assignment["lease"])
    assert response.status_code in (200, 202), response.text
    return env.wait_state(response.json()["txHash"], ("FINALIZED",)), assignment


def test_keys_imported_with_the_cli_cosign_relays_that_finalize(
    softhsm: Any, relayer_wallets: list[Any], make_env: Any
) -> None:
    refs = []
    for wallet in relayer_wallets:
        result = run(
            "keys", "import-pkcs11", "--pem", str(wallet.path), "--label", wallet.name, env=softhsm.env()
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == wallet.address.to_bech32()
        refs.append(f"label:{wallet.name}")
    env = make_env(**softhsm.settings(*refs))
    assert signer_check(env) == "ok"
    in_token = {wallet.address.to_bech32() for wallet in relayer_wallets}
    assert {relayer.bech32 for relayer in env.client.app.state.host.signer.relayers()} == in_token
    for shard in (0, 1, 2):
        final, assignment = relay_to_final(env, shard)
        assert assignment["relayer"] in in_token and assignment["shard"] == shard
        assert final["final"] is True and final["outcome"] == "success", final


class Load:
    """Senders relaying in their own threads (each with one lease, assigned first), phase by phase: 3 relays
    accepted before the token is removed; while it is away, relays until one is refused, then an assignment
    (refused too); once it is back, 3 accepted (the refused relay's same bytes first). Every answer is
    kept."""

    PER_PHASE = 3

    def __init__(self, env: Any, senders: list[Any]) -> None:
        self.env = env
        self.senders = senders
        self.answers: list[
            tuple[str, str, str, int, dict[str, Any]]
        ] = []  # (sender, step, phase, status, body)
        self.accepted: list[str] = []
        self.done: dict[str, int] = {}
        self.errors: list[BaseException] = []
        self.removed, self.restored = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._leases = {sender.address: env.assign(sender) for sender in senders}
        self._threads = [threading.Thread(target=self._drive, args=(s,), daemon=True) for s in senders]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        self.removed.set()
        self.restored.set()
        for thread in self._threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self._threads), "a sender did not finish"
        assert not self.errors, self.errors

    def finished(self, phase: str) -> bool:
        with self._lock:
            return sum(1 for name in self.done if name.endswith(f"/{phase}")) == len(self.senders)

    def _drive(self, sender: Any) -> None:
        try:
            self._relays(sender, "before")
            self.removed.wait()
            self._until_refused(sender)
            self.restored.wait()
            self._relays(sender, "after")
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.errors.append(exc)

    def _relays(self, sender: Any, phase: str) -> None:
        accepted = attempts = 0
        while accepted < self.PER_PHASE:
            attempts += 1
            assert attempts <= 3 * self.PER_PHASE, f"{sender.address}: relays refused in phase {phase}"
            accepted += self._attempt(sender, phase) is None
        with self._lock:
            self.done[f"{sender.address}/{phase}"] = accepted

    def _until_refused(self, sender: Any) -> None:
        """Relays until one is refused for the token (a timeout on a starved machine is sent again)."""
        for _ in range(20):
            if self._attempt(sender, "removed") == "SIGNER_UNAVAILABLE":
                break
        proof = self.env.proof(sender)
        response = self.env.client.post("/v1/relay/assign", json={"sender": sender.address, "proof": proof})
        self._note("assign", "removed", response, sender)
        with self._lock:
            self.done[f"{sender.address}/removed"] = 1

    def _attempt(self, sender: Any, phase: str) -> str | None:
        """One relay: None when accepted, else the refusal's code."""
        assignment = self._leases[sender.address]
        if sender.address not in self._pending:
            self._pending[sender.address] = self.env.build(sender, assignment)
        # A refused relay is sent again with the same bytes.
        response = self.env.relay(self._pending[sender.address], assignment["lease"])
        self._note("relay", phase, response, sender)
        if response.status_code not in (200, 202):
            return str(response.json()["code"])
        with self._lock:
            self.accepted.append(response.json()["txHash"])
        del self._pending[sender.address]
        sender.nonce += 1
        return None

    def _note(self, step: str, phase: str, response: Any, sender: Any) -> None:
        with self._lock:
            self.answers.append((sender.address, step, phase, response.status_code, response.json()))


def test_the_token_removed_under_load_gives_clean_refusals_and_loses_no_relay(
    softhsm: Any, relayer_wallets: list[Any], make_env: Any, tmp_path: Path
) -> None:
    env = make_env(**softhsm.settings(*softhsm.import_wallets(relayer_wallets)))
    load = Load(env, [env.new_sender(shard) for shard in (0, 1, 2, 1)])
    load.start()
    try:
        wait_for(lambda: load.finished("before"), "relays before the token is removed", 60)
        backup = tmp_path / "tokens-backup"
        shutil.copytree(softhsm.tokens, backup)
        shutil.rmtree(softhsm.tokens)  # the token is gone
        load.removed.set()
        wait_for(lambda: load.finished("removed"), "a refusal for every sender")
        ready = env.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["signer"] == "unavailable", ready.text
        shutil.copytree(backup, softhsm.tokens)  # and back
        wait_for(lambda: signer_check(env) == "ok", "the signer recovers with the token")
        load.restored.set()
    finally:
        load.join()
    refusals = [answer for answer in load.answers if answer[3] not in (200, 202)]
    for _, step, phase, _, body in refusals:
        assert body["code"] in ("SIGNER_UNAVAILABLE", "SIGNER_TIMEOUT") and body["status"] == 503, (
            step,
            body,
        )
        assert body["retryable"] is True and body["resign"] == "SAME_BYTES", body
        # The token's refusal only while it is away; a deadline missed on a starved machine in any phase.
        assert body["code"] == "SIGNER_TIMEOUT" or phase == "removed", (phase, step, body)
    for sender in load.senders:
        refused = {
            step
            for who, step, _, _, body in refusals
            if who == sender.address and body["code"] == "SIGNER_UNAVAILABLE"
        }
        assert refused == {"relay", "assign"}, (sender.address, refused)
    assert len(load.accepted) == len(load.senders) * 2 * Load.PER_PHASE
    for tx_hash in load.accepted:
        final = env.wait_state(tx_hash, ("FINALIZED",), timeout=30)
        assert final["outcome"] == "success", final


def test_a_token_slower_than_the_deadline_is_a_timeout_and_its_signature_is_discarded(
    softhsm: Any, relayer_wallets: list[Any], make_env: Any, problem: Any, nothing_sent: Any
) -> None:
    env = make_env(**softhsm.settings(*softhsm.import_wallets(relayer_wallets), pkcs11_sessions=1))
    token_signer = env.client.app.state.host.signer.inner
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    tx = env.build(sender, assignment)
    made = token_signer.signatures
    # The module held by something else (a re-initialisation under way): no call gets in until it ends.
    with token_signer.module.gate.alone(5.0) as alone:
        assert alone
        problem(env.relay(tx, assignment["lease"]), "SIGNER_TIMEOUT")
        problem(env.relay(tx, assignment["lease"]), "SIGNER_TIMEOUT")
    # The first signature is made once the module is free, and thrown away; the second was never made.
    wait_for(lambda: token_signer.signatures == made + 1, "the late signature")
    nothing_sent(env, tx, "SIGNER_TIMEOUT")
    response = env.relay(tx, assignment["lease"])
    assert response.status_code in (200, 202), response.text
    assert env.wait_state(response.json()["txHash"], ("FINALIZED",))["outcome"] == "success"


def _exportable_key(softhsm: Any) -> list[str]:
    """A key pair whose private key can be read out of the token."""
    from nacl.signing import SigningKey
    from pkcs11 import Attribute, KeyType, ObjectClass

    from gasless.signer.pkcs11_keys import ED25519_OID

    seed = bytes(range(32))
    common = {
        Attribute.KEY_TYPE: KeyType.EC_EDWARDS,
        Attribute.TOKEN: True,
        Attribute.LABEL: "exportable",
        Attribute.EC_PARAMS: ED25519_OID,
    }
    with softhsm.session(rw=True) as session:
        session.create_object(
            {
                **common,
                Attribute.CLASS: ObjectClass.PRIVATE_KEY,
                Attribute.VALUE: seed,
                Attribute.SENSITIVE: False,
                Attribute.EXTRACTABLE: True,
                Attribute.SIGN: True,
            }
        )
        session.create_object(
            {
                **common,
                Attribute.CLASS: ObjectClass.PUBLIC_KEY,
                Attribute.EC_POINT: b"\x04\x20" + bytes(SigningKey(seed).verify_key),
            }
        )
    return ["label:exportable"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("exportable", "signer: label:exportable can be read out of the token"),
        ("wrong pin", "signer: logging in to the token 'gasless-relayers': the token refused the PIN"),
        ("missing key", "signer: no private key label:absent in the token"),
    ],
)
def test_a_signer_it_cannot_use_keeps_the_host_unready_and_says_why(
    softhsm: Any,
    relayer_wallets: list[Any],
    unpaused_localnet: Any,
    tmp_path: Path,
    problem: Any,
    case: str,
    reason: str,
) -> None:
    refs = softhsm.import_wallets(relayer_wallets)
    overrides = softhsm.settings(*refs)
    if case == "exportable":
        overrides["pkcs11_relayer_keys"] = refs + _exportable_key(softhsm)
    elif case == "wrong pin":
        overrides["pkcs11_pin"] = "not-the-pin-1234"
    else:
        overrides["pkcs11_relayer_keys"] = [*refs, "label:absent"]
    settings = relay_settings(tmp_path, unpaused_localnet, **overrides)
    with TestClient(create_app(settings, route_limits=unthrottled_limits())) as client:
        ready = wait_for(
            lambda: (r := client.get("/readyz")).json()["checks"]["restore"].startswith("signer:") and r,
            "the signer's reason in /readyz",
        )
        assert ready.status_code == 503
        assert ready.json()["checks"]["restore"].startswith(reason), ready.text
        assert softhsm.pin not in ready.text and "not-the-pin-1234" not in ready.text
        refused = client.post("/v1/relay/assign", json={"sender": relayer_wallets[0].address.to_bech32()})
        problem(refused, "UPSTREAM_UNAVAILABLE")
