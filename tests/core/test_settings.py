"""Settings: profiles, sources (env, TOML, overrides) and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gasless.core.settings import Settings

SECRET = "s" * 40


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("GASLESS_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    "profile, chain_id, token, key_env",
    [
        ("mainnet", "1", "USDC-c76f1f", "live"),
        ("devnet", "D", "USDC-350c4e", "test"),
        ("localnet", "localnet", "USDC-c0ffee", "test"),
    ],
)
def test_profiles_fix_what_differs_between_networks(
    profile: str, chain_id: str, token: str, key_env: str
) -> None:
    settings = Settings(profile=profile, master_secret=SECRET)
    assert settings.network.chain_id == chain_id
    assert settings.network.payment_token == token
    assert settings.network.key_env == key_env


def test_environment_variables_and_gateway_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GASLESS_PROFILE", "devnet")
    monkeypatch.setenv("GASLESS_MASTER_SECRET", SECRET)
    monkeypatch.setenv("GASLESS_HOST_ID", "b")
    monkeypatch.setenv("GASLESS_GATEWAY_URLS", "http://g1:1/, http://g2:2")
    monkeypatch.setenv("GASLESS_CONTRACT_ADDRESS", "erd1qqqqqqqqqqqqqpgq")
    settings = Settings()
    assert settings.host_id == "b"
    assert settings.effective_gateway_urls == ["http://g1:1", "http://g2:2"]
    assert settings.network.contract_address == "erd1qqqqqqqqqqqqqpgq"
    assert settings.master_secret is not None and settings.master_secret.get_secret_value() == SECRET
    assert SECRET not in repr(settings)


def test_toml_file_with_overrides_winning(tmp_path: Path) -> None:
    config = tmp_path / "gasless.toml"
    config.write_text(f'profile = "mainnet"\nmaster_secret = "{SECRET}"\nhost_id = "b"\napi_port = 9000\n')
    settings = Settings.load(config_file=config, api_port=9100)
    assert (settings.profile, settings.host_id, settings.api_port) == ("mainnet", "b", 9100)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"profile": "mainnet"}, "needs GASLESS_MASTER_SECRET"),
        ({"master_secret": "short"}, "at least 32 characters"),
        ({"host_id": "c"}, "host_id"),
        ({"gateway_urls": ["ftp://x"]}, "http(s)"),
        ({"unknown_setting": 1}, "unknown_setting"),
    ],
)
def test_invalid_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(**kwargs)
    assert message in str(err.value)


def test_default_database_lives_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.effective_database_url == f"sqlite+aiosqlite:///{tmp_path.as_posix()}/gasless.db"
