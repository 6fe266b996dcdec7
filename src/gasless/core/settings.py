"""Service settings: validated once, then passed in. No module-level instance.

Sources, highest first: explicit keyword arguments, `GASLESS_*` environment variables, an optional TOML
file (`GASLESS_CONFIG` or `Settings.load(config_file=...)`), then the network profile's defaults.
What differs between networks comes from the profile (docs/deploy.md, section 1).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ProfileName = Literal["mainnet", "devnet", "localnet"]
KeyEnvironment = Literal["live", "test"]
HostId = Literal["a", "b"]
# `gasless serve --workers N`: at most this many API worker processes per host. Worker k's boot epoch is
# congruent to k modulo it, so the workers of one host never issue the same stream event id prefix.
MAX_WORKERS = 16

LOCALNET_CHAIN_ID = "localnet"
LOCALNET_PAYMENT_TOKEN = "USDC-c0ffee"
# Shards of every profile's network, metachain aside (mainnet, devnet and localnet all have 3).
NUM_SHARDS = 3
# Set while `Settings.load(defer_production_check=True)` builds settings: a production profile without a
# master secret loads, and the caller lists it with everything else `missing_for_production` finds.
_DEFER_PRODUCTION_CHECK: ContextVar[bool] = ContextVar("gasless_defer_production_check", default=False)


@dataclass(frozen=True)
class NetworkProfile:
    """What differs between the networks the service can serve (docs/deploy.md, section 1)."""

    name: ProfileName
    chain_id: str
    payment_token: str
    key_env: KeyEnvironment
    api_base_url: str
    app_origin: str
    # Contract, pair and wrapper addresses are deployment facts: mainnet/devnet take them from
    # configuration; localnet derives them from its deterministic genesis.
    contract_address: str | None = None
    pair_address: str | None = None
    wrapper_address: str | None = None
    default_gateway_urls: tuple[str, ...] = ()
    num_shards: int = NUM_SHARDS


PROFILES: dict[str, NetworkProfile] = {
    "mainnet": NetworkProfile(
        name="mainnet",
        chain_id="1",
        payment_token="USDC-c76f1f",
        key_env="live",
        api_base_url="https://api.gasless.example",
        app_origin="https://app.gasless.example",
        default_gateway_urls=("https://gateway.multiversx.com",),
    ),
    "devnet": NetworkProfile(
        name="devnet",
        chain_id="D",
        payment_token="USDC-350c4e",
        key_env="test",
        api_base_url="https://devnet-api.gasless.example",
        app_origin="https://devnet-app.gasless.example",
        default_gateway_urls=("https://devnet-gateway.multiversx.com",),
    ),
    "localnet": NetworkProfile(
        name="localnet",
        chain_id=LOCALNET_CHAIN_ID,
        payment_token=LOCALNET_PAYMENT_TOKEN,
        key_env="test",
        api_base_url="http://127.0.0.1:8080",
        app_origin="http://127.0.0.1:8080",
        default_gateway_urls=("http://127.0.0.1:7950",),
    ),
}


class Settings(BaseSettings):
    """All configuration of one API host."""

    model_config = SettingsConfigDict(env_prefix="GASLESS_", extra="forbid", frozen=True)

    profile: ProfileName = "localnet"
    host_id: HostId = "a"
    # Set by `gasless serve --workers N` on each of its worker processes (0..N-1); None: the host is one
    # process. A worker is a host of its own to the signer fence, intent ownership and singleton presence
    # (`instance_id`); clients see the host's id (stream event ids, /healthz).
    worker: int | None = Field(default=None, ge=0, lt=MAX_WORKERS)
    # One master secret per environment (live/test); purpose keys are derived from it by HKDF.
    master_secret: SecretStr | None = None
    gateway_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    database_url: str = ""
    redis_url: str | None = None
    # Prefix of this deployment's Redis keys (several deployments may share one Redis).
    redis_prefix: str = Field(default="gasless", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    data_dir: Path = Path("var")

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    # The admin listener (Prometheus `/metrics`, `/healthz`); loopback by default, 0 turns it off.
    metrics_port: int = Field(default=9108, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # An event loop later than this in running what is due is logged with where it was (loop_watch.py);
    # 0 turns the watch off.
    loop_stall_ms: int = Field(default=100, ge=0, le=60_000)
    access_log: bool = True
    # Appends the code of every problem this host renders to this file (the test suite's error-coverage
    # guard reads it across every process it started); unset in production.
    problem_record_file: Path | None = None

    # Overrides of the profile (a deployment's own hosts and addresses).
    chain_id: str | None = None
    payment_token: str | None = None
    api_base_url: str | None = None
    app_origin: str | None = None
    contract_address: str | None = None
    pair_address: str | None = None
    wrapper_address: str | None = None

    docs_url: str = "https://docs.gasless.example"
    status_url: str = "https://status.gasless.example"
    site_url: str = "https://gasless.example"

    # Gateway client behaviour.
    gateway_timeout_ms: int = Field(default=5_000, ge=100, le=120_000)

    # Relay core.
    relayer_key_files: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    # Key custody (docs/keys.md), the relayer keys' and the billing contract owner's: `pem` signs in
    # process with `relayer_key_files` and `owner_key_file`; `pkcs11` signs inside a PKCS#11 token (an HSM,
    # SoftHSM, a cloud KMS's PKCS#11 library) with the keys named in `pkcs11_relayer_keys` and
    # `pkcs11_owner_key` (`label:NAME` or `id:HEX`), logged in with the PIN (`pkcs11_pin` or the first line
    # of `pkcs11_pin_file`), one session per relayer signing thread (`pkcs11_sessions`).
    signer: Literal["pem", "pkcs11"] = "pem"
    pkcs11_module: Path | None = None
    pkcs11_token_label: str | None = Field(default=None, min_length=1, max_length=32)
    pkcs11_pin: SecretStr | None = None
    pkcs11_pin_file: Path | None = None
    pkcs11_relayer_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    pkcs11_sessions: int = Field(default=4, ge=1, le=64)
    # The billing contract owner's key in the token (with `signer = "pkcs11"`; `owner_key_file` with pem).
    pkcs11_owner_key: str | None = None
    relayer_min_balance_atto: int = Field(default=50_000_000_000_000_000, ge=0)  # 0.05 EGLD
    relayer_refresh_ms: int = Field(default=5_000, ge=100)
    latency_rollup_ms: int = Field(default=5_000, ge=50, description="the latency rollup worker's period")
    latency_rollup_offload_rows: int = Field(
        default=100,
        ge=0,
        description="a rollup batch of at least this many rows is merged in a child process (0: always)",
    )
    latency_rollup_enabled: bool = Field(
        default=True, description="off only to measure its cost (bench/relay.py)"
    )
    status_feed_dir: Path | None = Field(
        default=None,
        description="where the feed publisher writes the status feeds (default <data_dir>/status-feed)",
    )
    status_feed_ms: int = Field(default=60_000, ge=100, description="the status feed publication period")
    probe_enabled: bool = Field(default=False, description="run the synthetic probe (on in `gasless up`)")
    probe_interval_ms: int = Field(
        default=60_000, ge=100, description="one probe transfer per shard this often"
    )
    probe_key_files: list[Path] = Field(
        default_factory=list, description="the probe accounts' PEMs, one per shard (each needs a plan)"
    )
    signer_deadline_ms: int = Field(default=250, ge=10, le=10_000)
    signer_fence_ttl_ms: int = Field(default=10_000, ge=1_000, le=600_000)
    simulate: Literal["always", "contract_calls", "never"] = "contract_calls"
    max_clock_offset_ms: int = Field(default=5_000, ge=100)
    # Billing (docs/billing.md): the platform-wide admission budget in RU, the platform's free-flow budget,
    # and the accounts allow-listed for deployments/upgrades.
    billing_platform_ru_per_second: float = Field(default=2_000, gt=0)
    billing_platform_ru_burst: int = Field(default=6_000, ge=25)
    billing_free_flow_platform_per_day: int = Field(default=50_000, ge=0)
    # The free-flow limits (docs/billing.md: 10 per 24 h and 30 per 30 days per account; platform 20/s,
    # burst 100); settable so tests and operators can reach or tighten them.
    billing_free_flow_per_day: int = Field(default=10, ge=0)
    billing_free_flow_per_30_days: int = Field(default=30, ge=0)
    billing_free_flow_platform_per_second: float = Field(default=20, gt=0)
    billing_free_flow_platform_burst: int = Field(default=100, ge=1)
    billing_deploy_allowlist: list[str] = Field(default_factory=list)
    # Accounts whose relays may carry more than 4 096 bytes of data (up to what the body limit allows).
    billing_data_allowlist: list[str] = Field(default_factory=list)
    # Automatic incidents (docs/incidents.md): the `platform_admission` incident is raised when the budget
    # above binds and resolved once it has not bound for `incident_quiet_ms`; the watcher of each host runs
    # every `incident_poll_ms` (at most one raise or touch per tick).
    incident_quiet_ms: int = Field(default=300_000, ge=100, le=86_400_000)
    incident_poll_ms: int = Field(default=1_000, ge=50, le=60_000)
    # Benchmark only (bench/relay.py --unbilled): every relay free and unaccounted. Never on a real host.
    bench_unbilled: bool = False
    native_auth_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Webhooks (docs/webhooks.md). `webhook_local_receiver_cidrs` is for tests and localnet ONLY: it lets
    # webhooks reach addresses in these networks, over plain http and any port. Empty (the default) means
    # public https on port 443 only.
    webhook_local_receiver_cidrs: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_timeout_ms: int = Field(default=10_000, ge=100, le=60_000)
    webhook_retry_backoff_ms: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: [
            10_000,
            60_000,
            300_000,
            1_800_000,
            3_600_000,
            10_800_000,
            21_600_000,
            43_200_000,
        ],
        min_length=0,
        max_length=20,
    )
    webhook_poll_ms: int = Field(default=1_000, ge=10, le=60_000)

    # Account stream (`GET /v1/stream`, docs/streams.md): keep-alive comment interval (15 000 ms; a proxy
    # with a shorter idle timeout needs less) and the coalescing window (4 to 10 Hz: 100 to 250 ms).
    stream_keepalive_ms: int = Field(default=15_000, ge=50, le=60_000)
    stream_coalesce_ms: int = Field(default=200, ge=100, le=250)

    # Notices and e-mail (gasless.notices, gasless.notifications, docs/notices.md). Without `smtp_url` no mail
    # is sent (notices, webhooks and streams still work; mails stay queued until a server is configured).
    # `smtp_url`: smtp://[user:password@]host[:port] (STARTTLS when offered) or smtps://... (TLS at once).
    smtp_url: SecretStr | None = None
    mail_from: str = Field(default="gasless notices <notices@gasless.invalid>", min_length=3, max_length=200)
    mail_retry_backoff_ms: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: [5_000, 30_000, 120_000, 600_000, 1_800_000], min_length=1, max_length=20
    )
    mail_poll_ms: int = Field(default=1_000, ge=10, le=60_000)
    notices_poll_ms: int = Field(default=1_000, ge=10, le=60_000)
    email_link_ttl_ms: int = Field(default=86_400_000, ge=1_000, le=604_800_000)

    # Billing contract mirror and settlement (gasless.mirror, gasless.settlement). `owner_key_file` is the
    # contract owner's PEM (the pem signer's; `pkcs11_owner_key` with pkcs11): without the owner key this
    # host never submits settleUsage batches (the mirror still runs).
    mirror_poll_ms: int = Field(default=300, ge=20, le=60_000)
    mirror_start_hyperblock: int = Field(default=0, ge=0)  # where a fresh mirror starts (the deployment)
    owner_key_file: Path | None = None
    settlement_interval_ms: int = Field(default=3_600_000, ge=1_000, le=3_600_000)
    settlement_max_rows: int = Field(default=50_000, ge=1, le=1_000_000)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("GASLESS_CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    @classmethod
    def load(
        cls, config_file: Path | None = None, *, defer_production_check: bool = False, **overrides: Any
    ) -> Settings:
        """Settings from the environment, an optional TOML file, and explicit overrides (which win).

        `defer_production_check`: a mainnet or devnet profile without a master secret loads instead of
        being refused alone; the caller must then refuse what `missing_for_production()` lists (it names
        the master secret with every other missing setting, in one message)."""
        token = _DEFER_PRODUCTION_CHECK.set(defer_production_check)
        try:
            if config_file is None:
                return cls(**overrides)
            if not config_file.is_file():
                raise ValueError(f"config file not found: {config_file}")
            file_source = TomlConfigSettingsSource(cls, toml_file=config_file)
            merged = {**file_source(), **overrides}
            return cls(**merged)
        finally:
            _DEFER_PRODUCTION_CHECK.reset(token)

    @field_validator(
        "relayer_key_files",
        "pkcs11_relayer_keys",
        "native_auth_origins",
        "webhook_local_receiver_cidrs",
        "webhook_retry_backoff_ms",
        "mail_retry_backoff_ms",
        mode="before",
    )
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("gateway_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        # GASLESS_GATEWAY_URLS may be a JSON list or a comma-separated string.
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("gateway_urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"gateway URL must be http(s): {url!r}")
        return [url.rstrip("/") for url in value]

    @field_validator("webhook_local_receiver_cidrs")
    @classmethod
    def _check_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)  # ValueError names the bad entry
        return value

    @model_validator(mode="after")
    def _check_signer(self) -> Settings:
        """A pkcs11 signer's settings, checked before anything starts (the token itself is opened by the
        host: docs/keys.md)."""
        if self.signer != "pkcs11":
            if self.pkcs11_owner_key is not None:
                raise ValueError(
                    "GASLESS_PKCS11_OWNER_KEY is for GASLESS_SIGNER=pkcs11 (the owner key in the token): "
                    "with the pem signer the owner key is GASLESS_OWNER_KEY_FILE"
                )
            return self
        from gasless.signer.pkcs11_keys import KeyRef

        problems = []
        if self.pkcs11_module is None:
            problems.append("GASLESS_PKCS11_MODULE (the PKCS#11 library, a .so file) is not set")
        elif not self.pkcs11_module.is_file():
            problems.append(f"GASLESS_PKCS11_MODULE {self.pkcs11_module}: no such file")
        if self.pkcs11_token_label is None:
            problems.append("GASLESS_PKCS11_TOKEN_LABEL (the token's label) is not set")
        if (self.pkcs11_pin is None) == (self.pkcs11_pin_file is None):
            problems.append(
                "set one of GASLESS_PKCS11_PIN and GASLESS_PKCS11_PIN_FILE (the token's user PIN)"
            )
        elif self.pkcs11_pin_file is not None and not os.access(self.pkcs11_pin_file, os.R_OK):
            problems.append(f"GASLESS_PKCS11_PIN_FILE {self.pkcs11_pin_file}: no such file or not readable")
        if not self.pkcs11_relayer_keys:
            problems.append("GASLESS_PKCS11_RELAYER_KEYS (the relayer keys, label:NAME or id:HEX) is empty")
        for ref in self.pkcs11_relayer_keys:
            try:
                KeyRef.parse(ref)
            except ValueError as exc:
                problems.append(f"GASLESS_PKCS11_RELAYER_KEYS: {exc}")
        if self.relayer_key_files:
            problems.append(
                "GASLESS_RELAYER_KEY_FILES is for the pem signer: with GASLESS_SIGNER=pkcs11 the relayer keys "
                "are the token's (GASLESS_PKCS11_RELAYER_KEYS)"
            )
        if self.pkcs11_owner_key is not None:
            try:
                owner = KeyRef.parse(self.pkcs11_owner_key)
            except ValueError as exc:
                problems.append(f"GASLESS_PKCS11_OWNER_KEY (the contract owner's key): {exc}")
            else:
                relayers = set()
                for ref in self.pkcs11_relayer_keys:
                    with contextlib.suppress(ValueError):  # reported above
                        relayers.add(KeyRef.parse(ref))
                if owner in relayers:
                    problems.append(
                        f"GASLESS_PKCS11_OWNER_KEY {owner} is also a relayer key: the contract owner's key "
                        "must be a key of its own"
                    )
        if self.owner_key_file is not None:
            problems.append(
                "GASLESS_OWNER_KEY_FILE is for the pem signer: with GASLESS_SIGNER=pkcs11 the owner key is "
                "the token's (GASLESS_PKCS11_OWNER_KEY; gasless keys import-pkcs11 moves the PEM's key in)"
            )
        if problems:
            raise ValueError(f"GASLESS_SIGNER=pkcs11: {'; '.join(problems)}")
        return self

    @model_validator(mode="after")
    def _check_production_needs(self) -> Settings:
        if self.profile != "localnet" and self.master_secret is None and not _DEFER_PRODUCTION_CHECK.get():
            raise ValueError(f"profile {self.profile} needs GASLESS_MASTER_SECRET")
        if self.master_secret is not None and len(self.master_secret.get_secret_value()) < 32:
            raise ValueError("master secret must be at least 32 characters")
        return self

    # Derived values: the profile with this deployment's overrides applied.
    @property
    def network(self) -> NetworkProfile:
        base = PROFILES[self.profile]
        return NetworkProfile(
            name=base.name,
            chain_id=self.chain_id or base.chain_id,
            payment_token=self.payment_token or base.payment_token,
            key_env=base.key_env,
            api_base_url=(self.api_base_url or base.api_base_url).rstrip("/"),
            app_origin=self.app_origin or base.app_origin,
            contract_address=self.contract_address or base.contract_address,
            pair_address=self.pair_address or base.pair_address,
            wrapper_address=self.wrapper_address or base.wrapper_address,
            default_gateway_urls=base.default_gateway_urls,
            num_shards=base.num_shards,
        )

    def missing_for_production(self) -> list[tuple[str, str]]:
        """What a mainnet or devnet host still lacks once the profile's defaults apply: (environment
        variable, what it is and what is wrong), in a fixed order; empty when nothing is (and always on
        localnet, which derives its deployment from its genesis). `gasless serve` refuses to start with all
        of them in one message, rather than serving with billing, x402, the mirror or settlement off.

        A value the profile supplies counts as set, but for placeholder URLs (hosts under the reserved
        `.example` domain, as the profiles' own): a deployment names its own API and app."""
        if self.profile == "localnet":
            return []
        from gasless.chain.addresses import is_address

        network = self.network
        missing: list[tuple[str, str]] = []
        if self.master_secret is None:
            missing.append(
                (
                    "GASLESS_MASTER_SECRET",
                    f"the master secret of the {network.key_env} keys, at least 32 characters, the same on "
                    "every host",
                )
            )
        for env, value, what in (
            (
                "GASLESS_CONTRACT_ADDRESS",
                network.contract_address,
                "the billing contract's erd1 address, which billing, x402, purchases, the mirror and "
                "settlement need",
            ),
            ("GASLESS_PAIR_ADDRESS", network.pair_address, "the USDC/WEGLD exchange pair's erd1 address"),
            ("GASLESS_WRAPPER_ADDRESS", network.wrapper_address, "the WEGLD wrapper's erd1 address"),
        ):
            if not value:
                missing.append((env, what))
            elif not is_address(value):
                missing.append((env, f"{what}: {value!r} is not an erd1 address"))
        for env, url, what in (
            ("GASLESS_API_BASE_URL", network.api_base_url, "this API's public base URL"),
            ("GASLESS_APP_ORIGIN", network.app_origin, "the web app's origin"),
        ):
            if _placeholder_url(url):
                missing.append((env, f"{what}, not the placeholder {url}"))
        # A token's relayer keys are checked when the host opens it (a shard without one: not ready).
        relayers = self._relayer_problems(network.num_shards) if self.signer == "pem" else ""
        if relayers:
            missing.append(
                (
                    "GASLESS_RELAYER_KEY_FILES",
                    "the relayer wallet PEM files, comma-separated, at least one per shard 0 to "
                    f"{network.num_shards - 1}: {relayers}",
                )
            )
        owner = "the billing contract owner's wallet PEM file, which submits the settlement batches"
        if self.signer == "pkcs11":
            # Its form was checked with the other pkcs11 settings; the token is opened by the host.
            if self.pkcs11_owner_key is None:
                missing.append(
                    (
                        "GASLESS_PKCS11_OWNER_KEY",
                        "the billing contract owner's key in the PKCS#11 token (label:NAME or id:HEX), which "
                        "signs the settlement batches",
                    )
                )
        elif self.owner_key_file is None:
            missing.append(("GASLESS_OWNER_KEY_FILE", owner))
        else:
            _, problem = _wallet_pubkey(self.owner_key_file)
            if problem is not None:
                missing.append(("GASLESS_OWNER_KEY_FILE", f"{owner}: {problem}"))
        return missing

    def _relayer_problems(self, num_shards: int) -> str:
        """What is wrong with the relayer key files ('' when nothing): the shards without a relayer and the
        files that are not wallet PEMs. A file's shard is its address's (the first key of the file, as the
        signer reads it)."""
        from gasless.chain.addresses import shard_of_pubkey

        covered: set[int] = set()
        unusable: list[str] = []
        for path in self.relayer_key_files:
            pubkey, problem = _wallet_pubkey(path)
            if pubkey is None:
                unusable.append(str(problem))
                continue
            covered.add(shard_of_pubkey(pubkey, num_shards))
        problems = []
        without = [shard for shard in range(num_shards) if shard not in covered]
        if without:
            names = ", ".join(str(shard) for shard in without)
            problems.append(f"no relayer for shard{'s' if len(without) > 1 else ''} {names}")
        problems.extend(unusable)
        return "; ".join(problems)

    @property
    def instance_id(self) -> str:
        """This process's identity among every process sharing the database: the host's id, or for worker k
        of a multi-process host `<hostId>.<k>` (the signer fence's identity, the owner of the intents it
        commits, its singleton presence lock)."""
        return self.host_id if self.worker is None else f"{self.host_id}.{self.worker}"

    @property
    def effective_gateway_urls(self) -> list[str]:
        return list(self.gateway_urls) or list(self.network.default_gateway_urls)

    @property
    def effective_status_feed_dir(self) -> Path:
        return self.status_feed_dir or self.data_dir / "status-feed"

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{(self.data_dir / 'gasless.db').as_posix()}"

    @property
    def key_env(self) -> str:
        return self.network.key_env

    @property
    def effective_native_auth_origins(self) -> list[str]:
        return list(self.native_auth_origins) or [self.network.app_origin]


def _placeholder_url(url: str) -> bool:
    """A URL whose host is under `.example` (reserved for examples, RFC 2606): a profile's stand-in."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    return host == "example" or host.endswith(".example")


def _wallet_pubkey(path: Path) -> tuple[bytes, None] | tuple[None, str]:
    """The public key of the wallet PEM at `path` (its first key, as the signer reads it), or what is
    wrong with the file."""
    from multiversx_sdk import UserPEM

    try:
        key = UserPEM.from_file(Path(path)).secret_key
        return bytes(key.generate_public_key().buffer), None
    except FileNotFoundError:
        return None, f"{path}: no such file"
    except IsADirectoryError:
        return None, f"{path}: is a directory, not a PEM file"
    except PermissionError:
        return None, f"{path}: not readable (permission denied)"
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    except Exception:  # noqa: BLE001 - the SDK raises ValueError, IndexError, binascii.Error, ...
        return None, f"{path}: not a MultiversX wallet PEM"
