"""`gasless keys ...`: relayer keys and the billing contract owner's key in a PKCS#11 token (docs/keys.md).

`import-pkcs11` moves a wallet PEM's key (a relayer's or the contract owner's) into the token (a sensitive,
unextractable Ed25519 private key and its public key); `generate-pkcs11` makes a new key inside the token,
in the shard asked for; `list-pkcs11` shows the token's Ed25519 keys. The token comes from `--module`,
`--token-label` and the PIN, each else from its `GASLESS_PKCS11_*` variable or the `--config` TOML file
(`pkcs11_module`, ...): the PIN from `GASLESS_PKCS11_PIN` or a file (`--pin-file`), else asked for on a
terminal; never an option's value, which the shell's history and `ps` would show. The new key's address
goes to stdout, alone on its line; what was done goes to stderr. Exit 0 done, 1 the token failed while
working, 2 nothing done (an option, a file, the token, its PIN or its keys refused as given).
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gasless.cli.common import EXIT_FAILED, fail, read_pem
from gasless.cli.output import CliConsole, print_records

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pkcs11 import Session

keys_app = typer.Typer(
    help="Relayer and contract owner keys in a PKCS#11 token (HSM, SoftHSM, cloud KMS): import, generate, "
    "list.",
    no_args_is_help=True,
)
console = CliConsole(stderr=True)  # what was done, errors
out = CliConsole()  # results

ModuleOption = Annotated[
    Path | None,
    typer.Option(
        "--module", help="The PKCS#11 library (.so); else GASLESS_PKCS11_MODULE.", show_default=False
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token-label", help="The token's label; else GASLESS_PKCS11_TOKEN_LABEL.", show_default=False
    ),
]
PinFileOption = Annotated[
    Path | None,
    typer.Option(
        "--pin-file",
        help="A file whose first line is the token's user PIN; else GASLESS_PKCS11_PIN_FILE, else "
        "GASLESS_PKCS11_PIN, else asked for on a terminal.",
        show_default=False,
    ),
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="TOML settings file (its pkcs11_* fields).")
]
LabelOption = Annotated[
    str | None, typer.Option("--label", help="CKA_LABEL of the new key (default: its erd1 address).")
]
IdOption = Annotated[
    str | None, typer.Option("--id", help="CKA_ID of the new key, in hex (default: its 32-byte public key).")
]


def _from_config(config: Path | None) -> dict[str, Any]:
    if config is None:
        return {}
    try:
        return tomllib.loads(config.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"--config {config}: cannot be read ({exc.strerror or exc})")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        fail(f"--config {config}: not a TOML file ({exc})")


def _setting(given: Any, env: str, config: dict[str, Any], field: str) -> Any:
    if given is not None:
        return given
    value = os.environ.get(env) or config.get(field)
    return value if value not in ("", None) else None


@contextmanager
def _token(
    module: Path | None, token_label: str | None, pin_file: Path | None, config: Path | None, *, rw: bool
) -> Iterator[Session]:
    """A logged-in session on the token, or one line saying what is missing or refused (2)."""
    from gasless.signer.pkcs11_library import Pkcs11Refused, Pkcs11Unavailable, read_pin, token_session

    values = _from_config(config)
    module_path = _setting(module, "GASLESS_PKCS11_MODULE", values, "pkcs11_module")
    label = _setting(token_label, "GASLESS_PKCS11_TOKEN_LABEL", values, "pkcs11_token_label")
    missing = [
        what
        for what, value in (
            ("--module (or GASLESS_PKCS11_MODULE: the PKCS#11 library)", module_path),
            ("--token-label (or GASLESS_PKCS11_TOKEN_LABEL)", label),
        )
        if value is None
    ]
    if missing:
        fail(f"needs {' and '.join(missing)}")
    module_path = Path(module_path)
    if not module_path.is_file():
        source = "--module" if module is not None else "GASLESS_PKCS11_MODULE"
        fail(f"{source} {module_path}: no such file (the PKCS#11 library)")
    pin_path = _setting(pin_file, "GASLESS_PKCS11_PIN_FILE", values, "pkcs11_pin_file")
    pin = None if pin_path is not None else os.environ.get("GASLESS_PKCS11_PIN") or values.get("pkcs11_pin")
    if pin is None and pin_path is None:
        if not sys.stdin.isatty():
            fail("needs the token's user PIN: GASLESS_PKCS11_PIN, or a file with --pin-file")
        pin = typer.prompt(f"user PIN of the token {label!r}", hide_input=True)
    stack = ExitStack()
    try:
        pin = read_pin(pin, Path(pin_path) if pin_path is not None else None)
        session = stack.enter_context(token_session(module_path, str(label), pin, rw=rw))
    except Pkcs11Refused as exc:
        fail(str(exc))
    except Pkcs11Unavailable as exc:
        fail(f"{exc} (module {module_path})")
    with stack:
        yield session


def _key_id(given: str | None, pubkey: bytes) -> bytes:
    if given is None:
        return pubkey
    digits = given.removeprefix("0x")
    try:
        key_id = bytes.fromhex(digits)
    except ValueError:
        fail(f"--id {given}: not hex")
    if not key_id:
        fail("--id: empty")
    return key_id


def _report(what: str, key: Any, token_label: str) -> None:
    console.print(
        f"{escape(what)} {key.address} (shard {key.shard}) in the token {escape(repr(token_label))} as "
        f"label {escape(repr(key.label))}, id {key.key_id.hex()}: sensitive, not extractable"
    )
    console.print(
        f"its signer setting: GASLESS_PKCS11_RELAYER_KEYS=...,label:{escape(key.label)} for a relayer, or "
        f"GASLESS_PKCS11_OWNER_KEY=label:{escape(key.label)} for the billing contract owner"
    )
    typer.echo(key.address)


@keys_app.command("import-pkcs11")
def import_pkcs11(
    pem: Annotated[
        Path,
        typer.Option(
            "--pem", help="The wallet PEM file: a relayer's or the contract owner's.", show_default=False
        ),
    ],
    label: LabelOption = None,
    key_id: IdOption = None,
    module: ModuleOption = None,
    token_label: TokenOption = None,
    pin_file: PinFileOption = None,
    config: ConfigOption = None,
) -> None:
    """Move a key from its wallet PEM into the token and print its address: a relayer's, or the billing
    contract owner's (then named by GASLESS_PKCS11_OWNER_KEY).

    The private key is created sensitive and not extractable (only the token signs with it from then on);
    the public key beside it. Once the hosts sign through the token, keep the PEM offline or destroy it.
    Run again with the same PEM, label and id: nothing changes, the address is printed."""
    from pkcs11.exceptions import PKCS11Error

    from gasless.chain.addresses import address_of
    from gasless.signer.base import SignerUnavailable
    from gasless.signer.pkcs11_keys import KeyTaken, import_key

    secret = read_pem(pem, "--pem")
    pubkey = bytes(secret.generate_public_key().buffer)
    name = label or address_of(pubkey).to_bech32()
    with _token(module, token_label, pin_file, config, rw=True) as session:
        try:
            imported = import_key(session, bytes(secret.buffer), label=name, key_id=_key_id(key_id, pubkey))
        except KeyTaken as exc:
            fail(str(exc))
        except SignerUnavailable as exc:
            fail(str(exc), EXIT_FAILED)
        except PKCS11Error as exc:
            fail(f"the token failed: {type(exc).__name__}", EXIT_FAILED)
        token = str(session.token.label)
    _report("imported" if imported.created else "already in the token:", imported.key, token)


@keys_app.command("generate-pkcs11")
def generate_pkcs11(
    shard: Annotated[
        int, typer.Option("--shard", help="The shard of the new relayer (0, 1 or 2).", min=0, max=2)
    ],
    label: Annotated[str, typer.Option("--label", help="CKA_LABEL of the new key.", show_default=False)],
    key_id: Annotated[
        str | None, typer.Option("--id", help="CKA_ID of the new key, in hex (default: a random 8 bytes).")
    ] = None,
    module: ModuleOption = None,
    token_label: TokenOption = None,
    pin_file: PinFileOption = None,
    config: ConfigOption = None,
) -> None:
    """Generate a relayer key inside the token (it never exists anywhere else) and print its address.

    Key pairs whose address is in another shard are destroyed and generated again."""
    from pkcs11.exceptions import PKCS11Error

    from gasless.signer.base import SignerUnavailable
    from gasless.signer.pkcs11_keys import generate_key, key_taken

    wanted = _key_id(key_id, b"") if key_id is not None else os.urandom(8)
    with _token(module, token_label, pin_file, config, rw=True) as session:
        if key_taken(session, label, wanted):
            fail(f"the token already holds a key labelled {label!r} or with id {wanted.hex()}")
        try:
            key = generate_key(session, shard=shard, label=label, key_id=wanted)
        except SignerUnavailable as exc:
            fail(str(exc), EXIT_FAILED)
        except PKCS11Error as exc:
            fail(f"the token failed: {type(exc).__name__}", EXIT_FAILED)
        token = str(session.token.label)
    _report("generated", key, token)


@keys_app.command("list-pkcs11")
def list_pkcs11(
    module: ModuleOption = None,
    token_label: TokenOption = None,
    pin_file: PinFileOption = None,
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON line per key on stdout, and nothing else.")
    ] = False,
) -> None:
    """List the token's Ed25519 key pairs: label, id, address, shard, sensitive, extractable.

    A relayer key must be sensitive and not extractable."""
    from gasless.signer.pkcs11_keys import list_keys

    with _token(module, token_label, pin_file, config, rw=False) as session:
        keys = list_keys(session)
        token = str(session.token.label)
    if as_json:
        for key in keys:
            record = {
                "label": key.label,
                "id": key.key_id.hex(),
                "address": key.address,
                "shard": key.shard,
                "sensitive": key.sensitive,
                "extractable": key.extractable,
            }
            typer.echo(json.dumps(record, separators=(",", ":")))
        return
    rows = [
        [key.label, key.key_id.hex(), key.address, key.shard, key.sensitive, key.extractable] for key in keys
    ]
    print_records(
        out,
        f"Ed25519 keys in the token {token!r}",
        ["label", "id", "address", "shard", "sensitive", "extractable"],
        rows,
    )


def register(app: typer.Typer) -> None:
    """Add `gasless keys ...` (its panel in `gasless --help`: gasless.cli.main.PANELS)."""
    app.add_typer(keys_app, name="keys")
