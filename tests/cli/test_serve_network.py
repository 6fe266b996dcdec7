"""`gasless serve --network devnet|mainnet` refuses to start, with status 2 and one line naming every missing
setting, rather than serving with billing, x402, the mirror or settlement silently off
(`Settings.missing_for_production`, docs/deploy.md).

The refusals run real `gasless` processes. The passing case is checked on the settings alone: no test here
may start a host against devnet (its gateways point at a closed local port anyway, in case one did)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from multiversx_sdk import UserPEM, UserSecretKey
from process_kit import error_line, free_port, piped_env, run

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.core.settings import Settings

EXIT_USAGE = 2
SECRET = "devnet-master-secret-0123456789abcdef"
EVERY_SETTING = (
    "GASLESS_MASTER_SECRET",
    "GASLESS_CONTRACT_ADDRESS",
    "GASLESS_PAIR_ADDRESS",
    "GASLESS_WRAPPER_ADDRESS",
    "GASLESS_API_BASE_URL",
    "GASLESS_APP_ORIGIN",
    "GASLESS_RELAYER_KEY_FILES",
    "GASLESS_OWNER_KEY_FILE",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings checked in this process see only what each test sets."""
    for key in list(os.environ):
        if key.startswith("GASLESS_"):
            monkeypatch.delenv(key)


def contract_address() -> str:
    """A fresh smart-contract-shaped address (8 zero bytes, then random)."""
    return address_of(b"\x00" * 8 + os.urandom(24)).to_bech32()


def wallet(folder: Path, name: str, shard: int | None = None) -> Path:
    """A MultiversX wallet PEM in `folder`, its address in `shard` when given (3 shards)."""
    while True:
        key = UserSecretKey.generate()
        pubkey = key.generate_public_key().buffer
        if shard is None or shard_of_pubkey(pubkey, 3) == shard:
            break
    path = folder / f"{name}.pem"
    UserPEM(address_of(pubkey).to_bech32(), key).save(path)
    return path


def devnet_settings(folder: Path, relayer_shards: tuple[int, ...] = (0, 1, 2)) -> dict[str, str]:
    """Every setting a devnet host needs, by environment variable."""
    relayers = [wallet(folder, f"relayer-{i}-s{shard}", shard) for i, shard in enumerate(relayer_shards)]
    return {
        "GASLESS_MASTER_SECRET": SECRET,
        "GASLESS_CONTRACT_ADDRESS": contract_address(),
        "GASLESS_PAIR_ADDRESS": contract_address(),
        "GASLESS_WRAPPER_ADDRESS": contract_address(),
        "GASLESS_API_BASE_URL": "https://devnet-api.relay.test",
        "GASLESS_APP_ORIGIN": "https://devnet-app.relay.test",
        "GASLESS_RELAYER_KEY_FILES": ",".join(str(path) for path in relayers),
        "GASLESS_OWNER_KEY_FILE": str(wallet(folder, "owner")),
    }


def serve(tmp_path: Path, *args: str, **settings: str) -> str:
    """`gasless serve ARGS` with `settings`: it must refuse with status 2 and one line, which is returned.
    Nothing may start: the gateways are a closed local port, the data directory stays empty."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    env = piped_env(
        GASLESS_DATA_DIR=str(data_dir),
        GASLESS_GATEWAY_URLS=f"http://127.0.0.1:{free_port()}",
        GASLESS_METRICS_PORT="0",
        **settings,
    )
    result = run("serve", "--port", str(free_port()), *args, env=env, timeout=60)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    assert result.stdout == "", result.stdout
    assert list(data_dir.iterdir()) == []  # refused before anything started
    return error_line(result)


def named(line: str) -> set[str]:
    """The settings a refusal names, by environment variable."""
    return set(re.findall(r"GASLESS_[A-Z][A-Z_]*", line))


def test_devnet_with_nothing_set_lists_every_missing_setting_at_once(tmp_path: Path) -> None:
    line = serve(tmp_path, "--network", "devnet")
    assert line.startswith("cannot start: the devnet profile needs 8 settings"), line
    assert named(line) == set(EVERY_SETTING), line
    assert "no relayer for shards 0, 1, 2" in line, line
    # What the profile supplies is not asked for: its chain, its token, its gateway.
    for supplied in ("GASLESS_CHAIN_ID", "GASLESS_PAYMENT_TOKEN", "GASLESS_GATEWAY_URLS"):
        assert supplied not in line, line


def test_gasless_profile_still_selects_the_network(tmp_path: Path) -> None:
    line = serve(tmp_path, GASLESS_PROFILE="mainnet")
    assert line.startswith("cannot start: the mainnet profile needs 8 settings"), line
    assert named(line) == set(EVERY_SETTING), line
    assert "https://api.gasless.example" in line, line  # the placeholder it replaces


def test_network_option_overrides_gasless_profile(tmp_path: Path) -> None:
    line = serve(tmp_path, "--network", "devnet", GASLESS_PROFILE="mainnet")
    assert line.startswith("cannot start: the devnet profile"), line


@pytest.mark.parametrize(
    "unset",
    [
        ("GASLESS_MASTER_SECRET", "GASLESS_APP_ORIGIN"),
        ("GASLESS_PAIR_ADDRESS", "GASLESS_OWNER_KEY_FILE"),
        ("GASLESS_CONTRACT_ADDRESS", "GASLESS_RELAYER_KEY_FILES"),
        ("GASLESS_WRAPPER_ADDRESS", "GASLESS_API_BASE_URL"),
    ],
)
def test_all_set_but_two_lists_exactly_those_two(unset: tuple[str, str], tmp_path: Path) -> None:
    settings = {k: v for k, v in devnet_settings(tmp_path).items() if k not in unset}
    line = serve(tmp_path, "--network", "devnet", **settings)
    assert line.startswith("cannot start: the devnet profile needs 2 settings"), line
    assert named(line) == set(unset), line


def test_the_same_from_a_config_file(tmp_path: Path) -> None:
    """`--config` TOML keys are the field names; the master secret stays in the environment."""
    settings = devnet_settings(tmp_path)
    lines = ['profile = "devnet"']
    for env, value in settings.items():
        field = env.removeprefix("GASLESS_").lower()
        if env == "GASLESS_RELAYER_KEY_FILES":
            lines.append(f"{field} = [{', '.join(repr(p) for p in value.split(','))}]")
        elif env not in ("GASLESS_MASTER_SECRET", "GASLESS_WRAPPER_ADDRESS"):
            lines.append(f'{field} = "{value}"')
    config = tmp_path / "devnet.toml"
    config.write_text("\n".join(lines) + "\n")
    line = serve(tmp_path, "--config", str(config), GASLESS_MASTER_SECRET=SECRET)
    assert line.startswith("cannot start: the devnet profile needs 1 setting "), line
    assert named(line) == {"GASLESS_WRAPPER_ADDRESS"}, line


def test_a_relayer_set_missing_a_shard_names_that_shard(tmp_path: Path) -> None:
    settings = devnet_settings(tmp_path, relayer_shards=(0, 0, 2))
    line = serve(tmp_path, "--network", "devnet", **settings)
    assert named(line) == {"GASLESS_RELAYER_KEY_FILES"}, line
    assert "no relayer for shard 1" in line and "shards" not in line, line


def test_unusable_files_and_addresses_are_named(tmp_path: Path) -> None:
    settings = devnet_settings(tmp_path, relayer_shards=(0, 1))
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("hello, I am not a key\n")
    settings["GASLESS_RELAYER_KEY_FILES"] += f",{garbled}"  # meant for shard 2
    settings["GASLESS_OWNER_KEY_FILE"] = str(tmp_path / "nope.pem")
    settings["GASLESS_PAIR_ADDRESS"] = "<the pair, erd1...>"  # an example's placeholder left as it was
    line = serve(tmp_path, "--network", "devnet", **settings)
    assert named(line) == {
        "GASLESS_RELAYER_KEY_FILES",
        "GASLESS_OWNER_KEY_FILE",
        "GASLESS_PAIR_ADDRESS",
    }, line
    assert "no relayer for shard 2" in line and f"{garbled}: not a MultiversX wallet PEM" in line, line
    assert f"{tmp_path / 'nope.pem'}: no such file" in line, line
    assert "'<the pair, erd1...>' is not an erd1 address" in line, line


# The check itself: what passes (no host is started) ---------------------------------------------------------
@pytest.mark.parametrize("profile", ["devnet", "mainnet"])
def test_a_fully_configured_network_passes(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for env, value in devnet_settings(tmp_path, relayer_shards=(0, 1, 1, 2)).items():
        monkeypatch.setenv(env, value)
    settings = Settings.load(profile=profile, defer_production_check=True)
    assert settings.missing_for_production() == []
    assert settings.network.chain_id == {"devnet": "D", "mainnet": "1"}[profile]  # the profile's own


def test_the_check_reads_the_profile_defaults() -> None:
    """The master secret set, nothing else: the rest is listed in a fixed order, by variable."""
    settings = Settings.load(profile="devnet", master_secret=SECRET, defer_production_check=True)
    assert [env for env, _ in settings.missing_for_production()] == list(EVERY_SETTING[1:])


def test_localnet_needs_nothing_more() -> None:
    assert Settings().missing_for_production() == []
    assert Settings.load(defer_production_check=True).missing_for_production() == []


def test_without_deferring_a_missing_master_secret_is_still_refused_alone() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="needs GASLESS_MASTER_SECRET"):
        Settings.load(profile="devnet")
    settings = Settings.load(profile="devnet", defer_production_check=True)
    assert settings.missing_for_production()[0][0] == "GASLESS_MASTER_SECRET"
