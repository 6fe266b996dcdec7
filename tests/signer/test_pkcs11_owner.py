"""The billing contract owner's key held in a PKCS#11 token (SoftHSM), on localnet, whose billing contract
executes an owner-only endpoint only when the owner signed it:

- the owner's wallet PEM moved into the token with `gasless keys import-pkcs11`: sensitive, not
  extractable, never read out again;
- a host with `GASLESS_SIGNER=pkcs11` and `GASLESS_PKCS11_OWNER_KEY` settles usage: its settlement worker's
  settleUsage, signed inside the token, executes on chain from the owner's address, and the usage proof
  verifies against its `usageSettled` event;
- `gasless admin ... --owner-pkcs11 label:NAME` signs contract calls in the token; another key of the token
  is refused by the contract (ERR_NOT_OWNER);
- an owner key that can be exported is refused by the host (never ready) and by `gasless admin`;
- malformed or misplaced owner key settings are refused before anything starts, in one line.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from process_kit import error_line, piped_env, run  # type: ignore[import-not-found]
from relay_kit import relay_settings, unthrottled_limits  # type: ignore[import-not-found]

from gasless.client.native_auth import make_native_auth_token
from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.settlement import usage_settled_events, verify_proof
from gasless.signer import Pkcs11OwnerSigner


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return value


def import_owner(softhsm: Any, owner: Any, label: str = "owner") -> str:
    """The owner's wallet PEM moved into the token by the command an operator runs; its key reference."""
    done = run("keys", "import-pkcs11", "--pem", str(owner.path), "--label", label, env=softhsm.env())
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{owner.address.to_bech32()}\n"
    assert f"GASLESS_PKCS11_OWNER_KEY=label:{label}" in done.stderr
    return f"label:{label}"


def gateway_tx(url: str, tx_hash: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/transaction/{tx_hash}?withResults=true", timeout=5) as answer:
        return json.loads(answer.read())["data"]["transaction"]  # type: ignore[no-any-return]


def bearer(env: Any, who: Any) -> dict[str, str]:
    block = env.client.get("/v1/network").json()["nativeAuth"]["blockHash"]
    token = make_native_auth_token(
        who.key, origin=env.settings.network.app_origin, block_hash=block, ttl_seconds=600
    )
    return {"Authorization": f"Bearer {token}"}


def test_the_owner_key_moved_into_the_token_cannot_be_read_out(softhsm: Any, unpaused_localnet: Any) -> None:
    from pkcs11 import Attribute, ObjectClass
    from pkcs11.exceptions import AttributeReadOnly, AttributeSensitive

    owner = unpaused_localnet.net.genesis.owner
    import_owner(softhsm, owner)
    with softhsm.session(rw=True) as session:
        [private] = session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.LABEL: "owner"})
        assert private[Attribute.SENSITIVE] is True and private[Attribute.EXTRACTABLE] is False
        assert private[Attribute.SIGN] is True
        with pytest.raises(AttributeSensitive):
            private[Attribute.VALUE]  # the owner's secret key is never read out of the token
        with pytest.raises(AttributeReadOnly):
            private[Attribute.EXTRACTABLE] = True  # nor made exportable (by a wrap)
        with pytest.raises(AttributeReadOnly):
            private[Attribute.SENSITIVE] = False  # nor made readable


def test_the_settlement_worker_settles_with_the_owner_key_in_the_token(
    softhsm: Any, relayer_wallets: list[Any], unpaused_localnet: Any, make_env: Any
) -> None:
    owner = unpaused_localnet.net.genesis.owner
    owner_ref = import_owner(softhsm, owner)
    relayers = softhsm.import_wallets(relayer_wallets)
    env = make_env(
        **softhsm.settings(*relayers, pkcs11_owner_key=owner_ref, settlement_interval_ms=3_600_000)
    )
    host = env.client.app.state.host
    # Nothing of the owner key in the process: the worker signs through the token's key.
    assert isinstance(host.owner_signer, Pkcs11OwnerSigner)
    assert host.settlement_worker is not None
    assert host.settlement_worker.owner.address.to_bech32() == owner.address.to_bech32()

    # A relay co-signed by a relayer key in the token, billed to the sender's plan.
    sender = env.new_sender(1)
    assignment = env.assign(sender)
    answer = env.relay(env.build(sender, assignment), assignment["lease"])
    assert answer.status_code in (200, 202), answer.text
    tx_hash = answer.json()["txHash"]
    assert env.wait_state(tx_hash, ("FINALIZED",))["outcome"] == "success"
    proof_url = f"/v1/usage/{tx_hash}/proof"
    wait_for(
        lambda: env.client.get(proof_url, headers=bearer(env, sender)).status_code == 409, "its usage row"
    )

    host.settlement_worker.settle_now()
    proof = wait_for(
        lambda: (r := env.client.get(proof_url, headers=bearer(env, sender))).status_code == 200 and r.json(),
        "the settled batch's proof",
    )
    settlement = gateway_tx(env.localnet.url, proof["settlement"]["txHash"])
    # settleUsage is an owner-only endpoint: it executed, sent by the owner, with the token's signature.
    assert settlement["status"] == "success", settlement
    assert settlement["sender"] == owner.address.to_bech32()
    assert settlement["receiver"] == env.contract
    [event] = usage_settled_events(settlement, env.contract)
    assert event["row_count"] == 1 and event["usage_root"] == proof["usageRoot"]
    assert verify_proof(proof, event)
    assert host.owner_signer.unavailable() is None


def test_admin_signs_with_the_owner_key_in_the_token(
    softhsm: Any, relayer_wallets: list[Any], make_env: Any
) -> None:
    env = make_env()  # a host (PEM relayers) for the mirror's view of what the contract did
    owner = env.localnet.net.genesis.owner
    owner_ref = import_owner(softhsm, owner)
    # A funded key of the token that is not the owner's (a relayer's): the contract refuses its calls.
    [stranger] = softhsm.import_wallets(relayer_wallets[:1])
    common = ["--gateway", env.localnet.url, "--contract", env.contract]
    someone = env.new_sender(1, plan=False)

    granted = run(
        "admin", "grant", someone.address, "2", "3", *common, "--owner-pkcs11", owner_ref, env=softhsm.env()
    )
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert re.fullmatch(r"[0-9a-f]{64}\n", granted.stdout), granted.stdout  # the hash alone on stdout
    tx_hash = granted.stdout.strip()
    assert gateway_tx(env.localnet.url, tx_hash)["sender"] == owner.address.to_bech32()
    env.wait_mirror()
    account = env.client.get(f"/v1/account/{someone.address}").json()
    assert account["runningPlan"]["tierId"] == 2 and account["runningPlan"]["months"] == 3

    # The token's key named by the settings alone (GASLESS_SIGNER=pkcs11), as on a host.
    settings_env = softhsm.env(
        GASLESS_SIGNER="pkcs11",
        GASLESS_PKCS11_RELAYER_KEYS=stranger,
        GASLESS_PKCS11_OWNER_KEY=owner_ref,
    )
    paused = run("admin", "pause", "deposits", *common, env=settings_env)
    assert paused.returncode == 0, paused.stdout + paused.stderr
    env.wait_mirror()
    mirror = env.client.app.state.host.mirror_repo
    assert asyncio.run(mirror.view("pause")) == {"paused": False, "depositsPaused": True}
    unpaused = run("admin", "unpause", "deposits", *common, env=settings_env)
    assert unpaused.returncode == 0, unpaused.stdout + unpaused.stderr

    refused = run("admin", "pause", "deposits", *common, "--owner-pkcs11", stranger, env=softhsm.env())
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "ERR_NOT_OWNER" in error_line(refused)

    both = run(
        "admin", "pause", "deposits", *common, "--owner-pkcs11", owner_ref, "--owner-pem", str(owner.path),
        env=softhsm.env(),
    )  # fmt: skip
    assert both.returncode == 2
    assert error_line(both) == "error: give one of --owner-pem and --owner-pkcs11, not both"


def _exportable_owner(softhsm: Any) -> str:
    """An Ed25519 key pair in the token whose private key can be read out."""
    from nacl.signing import SigningKey
    from pkcs11 import Attribute, KeyType, ObjectClass

    from gasless.signer.pkcs11_keys import ED25519_OID

    seed = bytes(range(32))
    common = {
        Attribute.KEY_TYPE: KeyType.EC_EDWARDS,
        Attribute.TOKEN: True,
        Attribute.LABEL: "exportable-owner",
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
    return "label:exportable-owner"


def test_an_owner_key_that_can_be_exported_is_refused(
    softhsm: Any, relayer_wallets: list[Any], unpaused_localnet: Any, tmp_path: Path
) -> None:
    exportable = _exportable_owner(softhsm)
    reason = (
        "owner key: label:exportable-owner can be read out of the token (CKA_SENSITIVE False, "
        "CKA_EXTRACTABLE True)"
    )
    settings = relay_settings(
        tmp_path,
        unpaused_localnet,
        **softhsm.settings(*softhsm.import_wallets(relayer_wallets), pkcs11_owner_key=exportable),
    )
    with TestClient(create_app(settings, route_limits=unthrottled_limits())) as client:
        ready = wait_for(
            lambda: (r := client.get("/readyz")).json()["checks"]["restore"].startswith("owner key:") and r,
            "the owner key's reason in /readyz",
        )
        assert ready.status_code == 503
        assert ready.json()["checks"]["restore"].startswith(reason), ready.text
        assert client.app.state.host.settlement_worker is None
        assert softhsm.pin not in ready.text

    contract = unpaused_localnet.net.info["contract"]
    refused = run(
        "admin", "pause", "deposits", "--gateway", unpaused_localnet.url, "--contract", contract,
        "--owner-pkcs11", exportable, env=softhsm.env(),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert error_line(refused).startswith(f"error: {reason[len('owner key: ') :]}")


def pkcs11_settings(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A pkcs11 signer's settings whose form is valid (the module only needs to be a file here)."""
    module = tmp_path / "module.so"
    module.write_bytes(b"")
    return {
        "signer": "pkcs11",
        "pkcs11_module": module,
        "pkcs11_token_label": "gasless-relayers",
        "pkcs11_pin": "1234",
        "pkcs11_relayer_keys": ["label:relayer-s0", "label:relayer-s1", "label:relayer-s2"],
        **extra,
    }


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"pkcs11_owner_key": "id:xyz"},
            "GASLESS_PKCS11_OWNER_KEY (the contract owner's key): 'id:xyz': an id is written id:HEX",
        ),
        ({"pkcs11_owner_key": "label:"}, "GASLESS_PKCS11_OWNER_KEY (the contract owner's key): 'label:'"),
        (
            {"pkcs11_owner_key": "relayer-s1"},
            "GASLESS_PKCS11_OWNER_KEY label:relayer-s1 is also a relayer key",
        ),
        (
            {"pkcs11_owner_key": "label:owner", "owner_key_file": Path("owner.pem")},
            "GASLESS_OWNER_KEY_FILE is for the pem signer: with GASLESS_SIGNER=pkcs11 the owner key is the "
            "token's (GASLESS_PKCS11_OWNER_KEY",
        ),
    ],
)
def test_bad_owner_key_settings_are_refused(tmp_path: Path, extra: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match="GASLESS_SIGNER=pkcs11: ") as refused:
        Settings(**pkcs11_settings(tmp_path, **extra))
    assert expected in str(refused.value), refused.value
    assert "1234" not in str(refused.value)


def test_an_owner_key_in_a_token_without_the_pkcs11_signer_is_refused() -> None:
    with pytest.raises(ValueError, match="GASLESS_PKCS11_OWNER_KEY is for GASLESS_SIGNER=pkcs11"):
        Settings(pkcs11_owner_key="label:owner")


def test_production_settings_name_the_owner_key_of_the_custody_in_use(tmp_path: Path) -> None:
    production = {"profile": "devnet", "master_secret": "x" * 32}
    token = Settings(**production, **pkcs11_settings(tmp_path))
    assert "GASLESS_PKCS11_OWNER_KEY" in dict(token.missing_for_production())
    assert "GASLESS_OWNER_KEY_FILE" not in dict(token.missing_for_production())
    named = Settings(**production, **pkcs11_settings(tmp_path, pkcs11_owner_key="label:owner"))
    assert "GASLESS_PKCS11_OWNER_KEY" not in dict(named.missing_for_production())
    pem = Settings(**production)
    assert "GASLESS_OWNER_KEY_FILE" in dict(pem.missing_for_production())


def test_a_host_with_a_malformed_owner_key_does_not_start(tmp_path: Path) -> None:
    module = tmp_path / "module.so"
    module.write_bytes(b"")
    env = piped_env(
        GASLESS_SIGNER="pkcs11",
        GASLESS_PKCS11_MODULE=str(module),
        GASLESS_PKCS11_TOKEN_LABEL="gasless-relayers",
        GASLESS_PKCS11_PIN="1234",
        GASLESS_PKCS11_RELAYER_KEYS="label:relayer-s0",
        GASLESS_PKCS11_OWNER_KEY="id:owner",
        GASLESS_DATA_DIR=str(tmp_path),
    )
    result = run("serve", "--port", "0", env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    line = error_line(result)
    assert line.startswith("invalid settings:"), line
    assert "GASLESS_PKCS11_OWNER_KEY (the contract owner's key): 'id:owner': an id is written id:HEX" in line
    assert "1234" not in line
