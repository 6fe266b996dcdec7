"""Signer tests against a real PKCS#11 token: Debian's SoftHSM 2 (Ed25519 through OpenSSL), a token
initialised by each test in its own temporary directory (`SOFTHSM2_CONF` naming a configuration whose token
directory is the test's). Skipped loudly when SoftHSM is not installed (`./dev test` installs it where it
can). The relay suite's fixtures (`make_env`, `unpaused_localnet`, `problem`, `nothing_sent`) come from
tests/relay."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from process_kit import piped_env  # type: ignore[import-not-found]
from relay_kit import load_conftest  # type: ignore[import-not-found]

relay_env = load_conftest("relay")
make_env = relay_env.make_env
unpaused_localnet = relay_env.unpaused_localnet
problem = relay_env.problem
nothing_sent = relay_env.nothing_sent

SOFTHSM_UTIL = shutil.which("softhsm2-util")
MODULE_PATHS = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)
TOKEN_LABEL = "gasless-relayers"
PIN = "relayer-pin-4711"
SO_PIN = "security-officer-0815"


@dataclass
class SoftHsm:
    module: Path
    conf: Path
    tokens: Path
    label: str = TOKEN_LABEL
    pin: str = PIN

    def env(self, **extra: str) -> dict[str, str]:
        """A `gasless` command's environment with this token (the PIN in GASLESS_PKCS11_PIN)."""
        return piped_env(
            SOFTHSM2_CONF=str(self.conf),
            GASLESS_PKCS11_MODULE=str(self.module),
            GASLESS_PKCS11_TOKEN_LABEL=self.label,
            GASLESS_PKCS11_PIN=self.pin,
            **extra,
        )

    def settings(self, *refs: str, **extra: Any) -> dict[str, Any]:
        """The host's settings for a pkcs11 signer with the keys `refs` (label:NAME or id:HEX)."""
        return {
            "signer": "pkcs11",
            "relayer_key_files": [],
            "pkcs11_module": self.module,
            "pkcs11_token_label": self.label,
            "pkcs11_pin": self.pin,
            "pkcs11_relayer_keys": list(refs),
            **extra,
        }

    def session(self, *, rw: bool = False) -> Any:
        from gasless.signer.pkcs11_library import token_session

        return token_session(self.module, self.label, self.pin, rw=rw)

    def import_wallets(self, wallets: list[Any]) -> list[str]:
        """The wallets' keys in the token (in process, as `gasless keys import-pkcs11` does), each labelled
        by its wallet's name; their key references."""
        from gasless.signer.pkcs11_keys import import_key

        with self.session(rw=True) as session:
            for wallet in wallets:
                key = wallet.secret_key
                import_key(
                    session,
                    bytes(key.buffer),
                    label=wallet.name,
                    key_id=bytes(key.generate_public_key().buffer),
                )
        return [f"label:{wallet.name}" for wallet in wallets]

    def version(self) -> str:
        return subprocess.run(
            [str(SOFTHSM_UTIL), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()


def softhsm_module() -> Path | None:
    return next((Path(p) for p in MODULE_PATHS if Path(p).is_file()), None)


@pytest.fixture
def softhsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsm:
    """A fresh SoftHSM token (label TOKEN_LABEL, user PIN PIN) in this test's own token directory; the test
    process uses it too (SOFTHSM2_CONF)."""
    module = softhsm_module()
    if SOFTHSM_UTIL is None or module is None:
        pytest.skip(
            "PKCS#11 TESTS SKIPPED: no SoftHSM 2 (apt-get install softhsm2; ./dev test installs it where it "
            "can)"
        )
    tokens = tmp_path / "softhsm-tokens"
    tokens.mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n"
        "slots.removable = false\n"
    )
    monkeypatch.setenv("SOFTHSM2_CONF", str(conf))
    subprocess.run(
        [SOFTHSM_UTIL, "--init-token", "--free", "--label", TOKEN_LABEL, "--so-pin", SO_PIN, "--pin", PIN],
        check=True,
        capture_output=True,
        env={**os.environ, "SOFTHSM2_CONF": str(conf)},
    )
    return SoftHsm(module=module, conf=conf, tokens=tokens)


@pytest.fixture(autouse=True)
def every_module_released() -> Iterator[None]:
    """Torn down last: by then every signer and session the test opened was closed, and the PKCS#11
    module finalised (the next test's token directory is read afresh)."""
    yield
    from gasless.signer import pkcs11_library

    # A host stopped while it was opening the token closes it once that call returns (signer.custody).
    deadline = time.monotonic() + 10
    while pkcs11_library._MODULES and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pkcs11_library._MODULES, f"PKCS#11 modules still loaded: {list(pkcs11_library._MODULES)}"


@pytest.fixture
def relayer_wallets(unpaused_localnet: Any) -> list[Any]:
    """The first relayer wallet of each shard of the localnet (registered and funded at its genesis)."""
    seen: dict[int, Any] = {}
    for wallet in unpaused_localnet.net.genesis.relayers:
        seen.setdefault(wallet.shard, wallet)
    return [seen[shard] for shard in sorted(seen)]
