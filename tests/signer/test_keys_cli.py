"""`gasless keys ...` against a real token (SoftHSM), run as the command: a wallet PEM moved into the token
prints its address and cannot be read out again; a key generated in the token lands in the shard asked
for; the token's keys are listed; every refusal is one line, exit status 2, the PIN never shown. And a host
whose pkcs11 settings are incomplete does not start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from multiversx_sdk import UserPEM, UserSecretKey
from process_kit import error_line, piped_env, run  # type: ignore[import-not-found]

from gasless.chain.addresses import address_of, parse_address, shard_of_pubkey


def wallet(tmp_path: Path, name: str = "relayer") -> tuple[Path, str]:
    key = UserSecretKey.generate()
    address = address_of(key.generate_public_key().buffer).to_bech32()
    path = tmp_path / f"{name}.pem"
    UserPEM(label=address, secret_key=key).save(path)
    return path, address


def keys(*args: str, env: dict[str, str]) -> Any:
    return run("keys", *args, env=env)


def test_a_pem_moved_into_the_token_prints_its_address_and_cannot_be_read_out(
    softhsm: Any, tmp_path: Path
) -> None:
    from pkcs11 import Attribute, ObjectClass
    from pkcs11.exceptions import AttributeReadOnly, AttributeSensitive

    pem, address = wallet(tmp_path)
    done = keys("import-pkcs11", "--pem", str(pem), "--label", "relayer-s0-a", env=softhsm.env())
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{address}\n"
    assert "imported" in done.stderr and "label:relayer-s0-a" in done.stderr
    # Again: nothing changes, the same address.
    again = keys("import-pkcs11", "--pem", str(pem), "--label", "relayer-s0-a", env=softhsm.env())
    assert again.returncode == 0 and again.stdout == f"{address}\n", again.stderr
    assert "already in the token" in again.stderr

    with softhsm.session(rw=True) as session:
        [private] = session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY})
        assert private[Attribute.LABEL] == "relayer-s0-a"
        assert private[Attribute.SENSITIVE] is True and private[Attribute.EXTRACTABLE] is False
        assert private[Attribute.SIGN] is True and private[Attribute.DERIVE] is False
        with pytest.raises(AttributeSensitive):
            private[Attribute.VALUE]  # the secret key is never read out of the token
        with pytest.raises(AttributeReadOnly):
            private[Attribute.EXTRACTABLE] = True  # nor made exportable (by a wrap)
        with pytest.raises(AttributeReadOnly):
            private[Attribute.SENSITIVE] = False  # nor made readable
        assert private[Attribute.SENSITIVE] is True and private[Attribute.EXTRACTABLE] is False

    listed = keys("list-pkcs11", "--json", env=softhsm.env())
    assert listed.returncode == 0, listed.stderr
    pubkey = bytes(UserPEM.from_file(pem).secret_key.generate_public_key().buffer)
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [
        {
            "label": "relayer-s0-a",
            "id": pubkey.hex(),  # the public key, when --id is not given
            "address": address,
            "shard": shard_of_pubkey(pubkey),
            "sensitive": True,
            "extractable": False,
        }
    ]


def test_a_key_generated_in_the_token_is_in_the_shard_asked_for(softhsm: Any) -> None:
    from pkcs11 import Attribute, ObjectClass

    for shard in (0, 1, 2):
        done = keys("generate-pkcs11", "--shard", str(shard), "--label", f"new-s{shard}", env=softhsm.env())
        assert done.returncode == 0, done.stderr
        assert shard_of_pubkey(parse_address(done.stdout.strip()).get_public_key()) == shard
        assert f"label:new-s{shard}" in done.stderr
    with softhsm.session() as session:
        privates = list(session.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY}))
        assert sorted(key[Attribute.LABEL] for key in privates) == ["new-s0", "new-s1", "new-s2"]
        for key in privates:  # made in the token: it never was readable anywhere
            assert key[Attribute.ALWAYS_SENSITIVE] is True and key[Attribute.NEVER_EXTRACTABLE] is True
    taken = keys("generate-pkcs11", "--shard", "1", "--label", "new-s1", env=softhsm.env())
    assert taken.returncode == 2
    assert error_line(taken).startswith("error: the token already holds a key labelled 'new-s1'")


def test_refusals_are_one_line_and_never_show_the_pin(softhsm: Any, tmp_path: Path) -> None:
    pem, _ = wallet(tmp_path)
    pin_file = tmp_path / "pin"
    pin_file.write_text(softhsm.pin + "\n")
    base = softhsm.env()
    del base["GASLESS_PKCS11_PIN"]
    # The PIN from a file works.
    done = keys("import-pkcs11", "--pem", str(pem), "--pin-file", str(pin_file), env=base)
    assert done.returncode == 0, done.stderr
    other, _ = wallet(tmp_path, "other")
    cases = [
        (
            ["import-pkcs11", "--pem", str(other)],
            {**base, "GASLESS_PKCS11_PIN": "wrong-pin-9876"},
            "error: logging in to the token 'gasless-relayers': the token refused the PIN (PinIncorrect)",
        ),
        (
            ["import-pkcs11", "--pem", str(other)],
            base,
            "error: needs the token's user PIN: GASLESS_PKCS11_PIN, or a file with --pin-file",
        ),
        (
            ["import-pkcs11", "--pem", str(other), "--token-label", "no-such-token"],
            {**base, "GASLESS_PKCS11_PIN": softhsm.pin},
            "error: no token labelled 'no-such-token' in the PKCS#11 module",
        ),
        (
            ["import-pkcs11", "--pem", str(other), "--module", str(tmp_path / "absent.so")],
            {**base, "GASLESS_PKCS11_PIN": softhsm.pin},
            f"error: --module {tmp_path / 'absent.so'}: no such file (the PKCS#11 library)",
        ),
        (
            ["import-pkcs11", "--pem", str(tmp_path / "absent.pem")],
            {**base, "GASLESS_PKCS11_PIN": softhsm.pin},
            f"error: --pem {tmp_path / 'absent.pem'}: no such file",
        ),
        (
            ["import-pkcs11", "--pem", str(pem), "--label", "another-label"],
            {**base, "GASLESS_PKCS11_PIN": softhsm.pin},
            "error: the token already holds another key labelled 'another-label' or with id",
        ),
        (
            ["list-pkcs11"],
            {k: v for k, v in base.items() if k != "GASLESS_PKCS11_MODULE"},
            "error: needs --module (or GASLESS_PKCS11_MODULE: the PKCS#11 library)",
        ),
    ]
    for args, env, expected in cases:
        result = keys(*args, env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        line = error_line(result)
        assert line.startswith(expected), (args, line)
        assert softhsm.pin not in line and "wrong-pin-9876" not in line


def test_a_host_with_incomplete_pkcs11_settings_does_not_start(tmp_path: Path) -> None:
    env = piped_env(
        GASLESS_SIGNER="pkcs11",
        GASLESS_PKCS11_MODULE=str(tmp_path / "absent.so"),
        GASLESS_PKCS11_PIN="1234",
        GASLESS_PKCS11_PIN_FILE=str(tmp_path / "pin"),
        GASLESS_PKCS11_RELAYER_KEYS="label:relayer-s0,id:xyz",
        GASLESS_DATA_DIR=str(tmp_path),
    )
    result = run("serve", "--port", "0", env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    line = error_line(result)
    assert line.startswith("invalid settings:"), line
    for part in (
        f"GASLESS_PKCS11_MODULE {tmp_path / 'absent.so'}: no such file",
        "GASLESS_PKCS11_TOKEN_LABEL (the token's label) is not set",
        "set one of GASLESS_PKCS11_PIN and GASLESS_PKCS11_PIN_FILE",
        "GASLESS_PKCS11_RELAYER_KEYS: 'id:xyz': an id is written id:HEX",
    ):
        assert part in line, line
    assert "1234" not in line
