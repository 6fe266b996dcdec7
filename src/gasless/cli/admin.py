"""`gasless admin ...` (operator commands signed with the contract owner's key, a PEM file or a key in the
PKCS#11 token, sent through the gateways) and `gasless verify-proof` (check a usage proof against the
on-chain `usageSettled` event)."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import aiohttp
import typer

from gasless.chain.addresses import InvalidAddress, parse_address
from gasless.chain.gateway import GatewayClient
from gasless.cli.common import EXIT_FAILED, fail, invalid_settings, read_pem
from gasless.cli.output import CliConsole, key_value_table

admin_app = typer.Typer(
    help="Operator commands: the billing contract (signed with the owner key) and public incidents.",
    no_args_is_help=True,
)
console = CliConsole(stderr=True)
T = TypeVar("T")

ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
GatewayOption = Annotated[list[str] | None, typer.Option("--gateway", help="Gateway URL (repeatable).")]
ContractOption = Annotated[str | None, typer.Option("--contract", help="Billing contract address.")]
OwnerOption = Annotated[Path | None, typer.Option("--owner-pem", help="The contract owner's PEM file.")]
OwnerPkcs11Option = Annotated[
    str | None,
    typer.Option(
        "--owner-pkcs11",
        help="The contract owner's key in the PKCS#11 token, label:NAME or id:HEX; the token from "
        "GASLESS_PKCS11_MODULE, GASLESS_PKCS11_TOKEN_LABEL and GASLESS_PKCS11_PIN or GASLESS_PKCS11_PIN_FILE "
        "(or their --config fields).",
        show_default=False,
    ),
]
DatabaseOption = Annotated[str | None, typer.Option("--database-url", help="The service database.")]


@dataclass(frozen=True)
class OwnerChoice:
    """Where the owner key was asked for: `--owner-pem`, `--owner-pkcs11`, else the settings."""

    pem: Path | None = None
    pkcs11: str | None = None


def _settings(
    config: Path | None,
    gateways: list[str] | None,
    contract: str | None,
    database_url: str | None = None,
) -> Any:
    from gasless.core.settings import Settings

    overrides: dict[str, Any] = {}
    if gateways:
        overrides["gateway_urls"] = gateways
    if contract:
        overrides["contract_address"] = contract
    if database_url:
        overrides["database_url"] = database_url
    try:
        return Settings.load(config_file=config, **overrides)
    except ValueError as exc:
        invalid_settings(exc)


def _owner_signer(settings: Any, choice: OwnerChoice) -> Any:
    """The owner's key (an OwnerSigner) and the contract, checked before anything is sent (one line and
    exit 2 otherwise): `--owner-pem`, or `--owner-pkcs11`, else the settings' owner key
    (GASLESS_OWNER_KEY_FILE, or GASLESS_PKCS11_OWNER_KEY with GASLESS_SIGNER=pkcs11). A token's key is
    opened here: the caller closes it (`_with_owner`)."""
    from gasless.signer.owner import PemOwnerSigner

    _quiet_logs()
    if choice.pem is not None and choice.pkcs11 is not None:
        fail("give one of --owner-pem and --owner-pkcs11, not both")
    pem, ref = choice.pem, choice.pkcs11
    pem_source, ref_source = "--owner-pem", "--owner-pkcs11"
    if pem is None and ref is None:
        if settings.signer == "pkcs11" and settings.pkcs11_owner_key is not None:
            ref, ref_source = settings.pkcs11_owner_key, "GASLESS_PKCS11_OWNER_KEY"
        elif settings.owner_key_file is not None:
            pem, pem_source = settings.owner_key_file, "GASLESS_OWNER_KEY_FILE"
    missing = []
    if pem is None and ref is None:
        missing.append(
            "--owner-pem or --owner-pkcs11 (the contract owner's PEM or its key in the PKCS#11 token; or "
            "GASLESS_OWNER_KEY_FILE, or GASLESS_PKCS11_OWNER_KEY with GASLESS_SIGNER=pkcs11)"
        )
    if settings.network.contract_address is None:
        missing.append("--contract (the billing contract; or GASLESS_CONTRACT_ADDRESS)")
    if missing:
        fail(f"needs {' and '.join(missing)}")
    if pem is not None:
        return PemOwnerSigner(read_pem(pem, pem_source))
    assert ref is not None
    return _token_owner(settings, ref, ref_source)


def _quiet_logs() -> None:
    """The services' log lines (a token's signer, the settlement worker) on stderr, warnings only: stdout
    keeps the command's result alone. Left as it is when the process configured its logging already."""
    import structlog

    from gasless.core.logs import configure_logging

    if not structlog.is_configured():
        configure_logging(json_lines=False, level="WARNING")


def _token_owner(settings: Any, ref: str, source: str) -> Any:
    """The owner key `ref` in the token the settings name, opened and checked (the token signs once)."""
    from gasless.signer.owner import Pkcs11OwnerSigner
    from gasless.signer.pkcs11 import Pkcs11Config
    from gasless.signer.pkcs11_keys import KeyRef
    from gasless.signer.pkcs11_library import Pkcs11Refused, Pkcs11Unavailable

    try:
        KeyRef.parse(ref)
    except ValueError as exc:
        fail(f"{source} {exc}")
    module, token = settings.pkcs11_module, settings.pkcs11_token_label
    missing = [
        what
        for what, value in (
            ("GASLESS_PKCS11_MODULE (the PKCS#11 library)", module),
            ("GASLESS_PKCS11_TOKEN_LABEL (the token's label)", token),
        )
        if value is None
    ]
    if missing:
        fail(f"{source} needs {' and '.join(missing)}")
    if not Path(module).is_file():
        fail(f"GASLESS_PKCS11_MODULE {module}: no such file (the PKCS#11 library)")
    pin = None
    if settings.pkcs11_pin is None and settings.pkcs11_pin_file is None:
        if not sys.stdin.isatty():
            fail(f"{source} needs the token's user PIN: GASLESS_PKCS11_PIN or GASLESS_PKCS11_PIN_FILE")
        pin = typer.prompt(f"user PIN of the token {token!r}", hide_input=True)
    try:
        return Pkcs11OwnerSigner.open(Pkcs11Config.for_owner(settings, ref, pin=pin))
    except Pkcs11Refused as exc:
        fail(f"{exc} ({source} {ref})")
    except Pkcs11Unavailable as exc:
        fail(f"{exc} ({source} {ref}, module {module})")


async def _with_owner(settings: Any, signer: Any, work: Callable[[Any], Awaitable[T]]) -> T:
    """`work` with the OwnerTransactor of `signer`; the signer closed at the end (a token's sessions)."""
    from gasless.settlement.owner_tx import OwnerTransactor

    try:
        async with aiohttp.ClientSession() as http:
            gateway = GatewayClient(
                http, settings.effective_gateway_urls, timeout_ms=settings.gateway_timeout_ms
            )
            owner = OwnerTransactor(
                gateway, signer, settings.network.contract_address, settings.network.chain_id
            )
            return await work(owner)
    finally:
        await signer.aclose()


def _owner_call(settings: Any, choice: OwnerChoice, function: str, args: list[Any], what: str) -> None:
    from gasless.settlement.owner_tx import OwnerCallError

    async def work(owner: Any) -> str:
        with console.status(f"{what}: signing and sending {function}"):
            tx_hash = await owner.send(function, args)
        with console.status(f"{what}: waiting for execution of {tx_hash}"):
            state, reason = await owner.outcome(tx_hash)
        if state != "success":
            raise OwnerCallError(f"{function} {state}: {reason or 'no reason given'} (tx {tx_hash})")
        return str(tx_hash)

    signer = _owner_signer(settings, choice)
    try:
        tx_hash = asyncio.run(_with_owner(settings, signer, work))
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - the operator gets the reason, not a traceback
        fail(f"{exc}", EXIT_FAILED, label=f"{what} failed")
    console.print(f"[green]{what}[/green]: executed in {tx_hash}")
    typer.echo(tx_hash)


def _address(value: str) -> Any:
    try:
        return parse_address(value)
    except InvalidAddress:
        console.print(f"[red]not an erd1 address:[/red] {value}")
        raise typer.Exit(2) from None


@admin_app.command()
def grant(
    account: Annotated[str, typer.Argument(help="The account (erd1...).")],
    tier: Annotated[int, typer.Argument(help="Tier id.", min=1)],
    months: Annotated[int, typer.Argument(help="1 to 12.", min=1, max=12)],
    config: ConfigOption = None,
    gateway: GatewayOption = None,
    contract: ContractOption = None,
    owner_pem: OwnerOption = None,
    owner_pkcs11: OwnerPkcs11Option = None,
) -> None:
    """Grant a plan block without payment (placed as a purchase would be)."""
    settings = _settings(config, gateway, contract)
    _owner_call(
        settings,
        OwnerChoice(owner_pem, owner_pkcs11),
        "grant",
        [_address(account), tier, months],
        f"grant tier {tier} x {months} to {account}",
    )


RELAYER_STATES = {"active": "Active", "draining": "Draining", "retired": "Retired"}


@admin_app.command("relayer-state")
def relayer_state(
    relayer: Annotated[str, typer.Argument(help="The relayer (erd1...).")],
    state: Annotated[str, typer.Argument(help="active, draining or retired (retired is final).")],
    config: ConfigOption = None,
    gateway: GatewayOption = None,
    contract: ContractOption = None,
    owner_pem: OwnerOption = None,
    owner_pkcs11: OwnerPkcs11Option = None,
) -> None:
    """Set a relayer's state in the contract (setRelayerState): the authority every host follows."""
    if state not in RELAYER_STATES:
        fail(f"state must be one of {', '.join(RELAYER_STATES)}, not {state!r}")
    settings = _settings(config, gateway, contract)
    _owner_call(
        settings,
        OwnerChoice(owner_pem, owner_pkcs11),
        "setRelayerState",
        [_address(relayer), RELAYER_STATES[state]],
        f"relayer {relayer} {state}",
    )


def _egld(atto: str | int | None) -> str:
    """An atto amount in EGLD, exact (no rounding): `0.05`, `1000`."""
    if atto is None:
        return "-"
    whole, frac = divmod(int(atto), 10**18)
    return f"{whole}.{frac:018d}".rstrip("0").rstrip(".")


def _duration(seconds: int | None, spend: str | None) -> str:
    if seconds is None:
        return "never (nothing spent)" if spend is not None else "unknown yet"
    if seconds <= 0:
        return "under the floor"
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    parts += [f"{hours}h"] if hours or days else []
    parts += [f"{minutes}m"] if not days else []
    return " ".join(parts) if parts and (days or hours or minutes) else f"{secs}s"


@admin_app.command("relayers")
def relayers_command(
    api: Annotated[
        str, typer.Option("--api", envvar="GASLESS_API_URL", help="Base URL of a gasless API host.")
    ] = "http://127.0.0.1:8080",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the relayers as one JSON line on stdout, and nothing else.")
    ] = False,
) -> None:
    """Every relayer with its funds, as the host's relayer pool sees them (read from its /readyz): state,
    assignable, balance, fees in flight, floor, EGLD spent per hour over the last hour, time to the floor."""
    from gasless.cli.endpoints import EndpointError, check_api
    from gasless.cli.output import print_records

    async def read() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            await check_api(http, api)
            async with http.get(f"{api.rstrip('/')}/readyz", timeout=aiohttp.ClientTimeout(total=15)) as got:
                return dict(await got.json())

    try:
        health = asyncio.run(read())
    except EndpointError as exc:
        fail(str(exc))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        fail(f"{api}/readyz: {type(exc).__name__}: {exc}", label="cannot read the relayers")
    entries = list(health.get("relayers") or [])
    if as_json:
        typer.echo(json.dumps(entries, separators=(",", ":")))
        return
    if not entries:
        fail(
            f"host {health.get('hostId')} has no relayer pool yet (status {health.get('status')})",
            EXIT_FAILED,
        )
    columns = (
        "relayer", "shard", "state", "assignable", "balance EGLD", "in flight EGLD", "floor EGLD",
        "spent EGLD/h", "time to floor",
    )  # fmt: skip
    rows = [
        (
            e["address"],
            e["shard"],
            e["state"],
            "yes" if e["assignable"] else "no",
            _egld(e["balanceAtto"]),
            _egld(e["inFlightAtto"]),
            _egld(e["floorAtto"]),
            _egld(e["spendAttoPerHour"]),
            _duration(e["secondsToFloor"], e["spendAttoPerHour"]),
        )
        for e in entries
    ]
    print_records(CliConsole(), f"relayers (host {health.get('hostId')})", columns, rows)


def _pause(scope: str, paused: bool, settings: Any, choice: OwnerChoice) -> None:
    function = "setPaused" if scope == "contract" else "setDepositsPaused"
    _owner_call(settings, choice, function, [paused], f"{'pause' if paused else 'unpause'} {scope}")


ScopeArgument = Annotated[str, typer.Argument(help="contract or deposits.")]


def _scope(value: str) -> str:
    if value not in ("contract", "deposits"):
        console.print("[red]scope must be 'contract' or 'deposits'[/red]")
        raise typer.Exit(2)
    return value


@admin_app.command()
def pause(
    scope: ScopeArgument = "contract",
    config: ConfigOption = None,
    gateway: GatewayOption = None,
    contract: ContractOption = None,
    owner_pem: OwnerOption = None,
    owner_pkcs11: OwnerPkcs11Option = None,
) -> None:
    """Pause the contract (every user endpoint) or deposits only."""
    _pause(_scope(scope), True, _settings(config, gateway, contract), OwnerChoice(owner_pem, owner_pkcs11))


@admin_app.command()
def unpause(
    scope: ScopeArgument = "contract",
    config: ConfigOption = None,
    gateway: GatewayOption = None,
    contract: ContractOption = None,
    owner_pem: OwnerOption = None,
    owner_pkcs11: OwnerPkcs11Option = None,
) -> None:
    """Lift the contract pause or the deposits pause."""
    _pause(_scope(scope), False, _settings(config, gateway, contract), OwnerChoice(owner_pem, owner_pkcs11))


@admin_app.command("settle-now")
def settle_now(
    config: ConfigOption = None,
    gateway: GatewayOption = None,
    contract: ContractOption = None,
    owner_pem: OwnerOption = None,
    owner_pkcs11: OwnerPkcs11Option = None,
    database_url: DatabaseOption = None,
) -> None:
    """Build the next settlement batch from the billed, unsettled usage rows and submit settleUsage now."""
    from gasless.db import create_engine
    from gasless.settlement.repository import SettlementRepository
    from gasless.settlement.worker import SettlementWorker

    settings = _settings(config, gateway, contract, database_url)
    signer = _owner_signer(settings, OwnerChoice(owner_pem, owner_pkcs11))

    async def work(owner: Any) -> dict[str, Any] | None:
        engine = create_engine(settings.effective_database_url)
        try:
            repo = SettlementRepository(engine)
            worker = SettlementWorker(repo, owner.gateway, owner, interval_ms=settings.settlement_interval_ms)
            with console.status("building and submitting the batch"):
                batch_id = await worker.tick(force=True)
            if batch_id is None:
                return None
            batch = await repo.batch(batch_id)
            if batch is not None and batch["tx_hash"]:
                with console.status(f"waiting for settleUsage {batch['tx_hash']}"):
                    state, reason = await owner.outcome(batch["tx_hash"])
                batch["execution"] = state if not reason else f"{state}: {reason}"
            return batch
        finally:
            await engine.dispose()

    try:
        batch = asyncio.run(_with_owner(settings, signer, work))
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001
        fail(f"{exc}", EXIT_FAILED, label="settle-now failed")
    if batch is None or batch.get("execution") != "success":
        console.print(f"[red]the batch was not settled:[/red] {batch}")
        raise typer.Exit(1)
    names = ("batch_id", "row_count", "total_ru", "usage_root", "tx_hash", "state")
    console.print(key_value_table("settlement batch", [(name, batch[name]) for name in names]))
    typer.echo(
        json.dumps({k: batch[k] for k in ("batch_id", "usage_root", "row_count", "total_ru", "tx_hash")})
    )


@admin_app.command()
def status(
    config: ConfigOption = None,
    database_url: DatabaseOption = None,
) -> None:
    """The mirror's cursor and the last settlement batch (read from the service database)."""
    from gasless.db import create_engine
    from gasless.mirror.repository import MirrorRepository

    settings = _settings(config, None, None, database_url)

    async def read() -> dict[str, Any]:
        engine = create_engine(settings.effective_database_url)
        try:
            return await MirrorRepository(engine).status()
        finally:
            await engine.dispose()

    info = asyncio.run(read())
    cursor = info["cursor"] or {}
    last = info["lastBatch"]
    rows = [
        ("mirror cursor (hyperblock)", cursor.get("hyperblockNonce", "none yet")),
        ("mirrored accounts", info["accounts"]),
        ("purchase events", info["purchases"]),
        ("last batch", "none" if last is None else f"{last['batch_id']} ({last['state']})"),
    ]
    console.print(key_value_table("gasless billing status", rows))
    typer.echo(json.dumps(info, default=str))


def verify_proof_command(
    source: Annotated[str, typer.Argument(help="A UsageProof JSON file, or its URL.")],
    gateway: Annotated[str, typer.Option("--gateway", help="Gateway to read the usageSettled event from.")],
    contract: ContractOption = None,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="GASLESS_API_KEY")] = None,
) -> None:
    """Check a usage proof against the `usageSettled` event of its batch, read from a gateway."""
    from gasless.settlement.proofs import ProofInvalid, usage_settled_events, verify_proof

    try:
        if source.startswith(("http://", "https://")):
            request = urllib.request.Request(source, headers={"X-Api-Key": api_key} if api_key else {})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    proof = json.loads(answer.read())
            except OSError as exc:  # URLError, HTTPError, timeouts
                fail(f"{source}: {exc}", EXIT_FAILED, label="cannot fetch the proof")
        else:
            proof = json.loads(Path(source).read_text())
    except OSError as exc:
        fail(f"{source}: {exc.strerror or exc}", label="cannot read the proof")
    except ValueError as exc:  # JSON (and UnicodeDecodeError)
        fail(f"{source}: not JSON ({exc})", label="cannot read the proof")

    async def fetch() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            client = GatewayClient(http, [gateway])
            tx = await client.transaction(proof["settlement"]["txHash"])
        if tx is None:
            return []
        return usage_settled_events(tx, contract)

    events = asyncio.run(fetch())
    matching = [e for e in events if int(e["batch_id"]) == int(proof["batchId"])]
    if not matching:
        console.print(
            f"[red]no usageSettled event for batch {proof['batchId']} in {proof['settlement']['txHash']}[/red]"
        )
        raise typer.Exit(1)
    try:
        verify_proof(proof, matching[0])
    except (ProofInvalid, ValueError, KeyError) as exc:
        console.print(f"[red]proof INVALID:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(
        f"[green]proof valid[/green]: {proof['txHash']} is leaf {proof['leafIndex']} of batch {proof['batchId']}, "
        f"root {matching[0]['usage_root']} (tx {proof['settlement']['txHash']})"
    )
    typer.echo("valid")


def register(app: typer.Typer) -> None:
    """Add `gasless admin ...` (with `gasless admin incident ...`) and `gasless verify-proof`."""
    from gasless.cli.backup import register as register_backup
    from gasless.cli.incidents import incident_app

    admin_app.add_typer(incident_app, name="incident")
    register_backup(admin_app)  # backup, restore, restore-report, migrate (gasless.cli.backup)
    app.add_typer(admin_app, name="admin")
    app.command("verify-proof")(verify_proof_command)
