"""`gasless relay`: the integrator's side from the command line (send one transfer, follow it; read status).

`send` exits 0 when the transaction is FINALIZED with outcome `success` (or, with `--no-follow`, when the
service accepted it), 1 when it ended otherwise (failed, DEAD, REJECTED, not final in time) and 2 when the
service refused it or could not be reached.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gasless.cli.common import errors, one_line, read_pem
from gasless.cli.endpoints import EndpointError, check_api, check_gateway
from gasless.cli.output import CliConsole

if TYPE_CHECKING:
    from gasless.client import RelayProblem, UserKey

relay_app = typer.Typer(
    help="Relay transactions through a gasless API, as an integrator would.", no_args_is_help=True
)
out = CliConsole()

EXIT_OK, EXIT_NOT_SUCCESS, EXIT_REFUSED = 0, 1, 2
STATE_ORDER = ("COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED")
TIMESTAMPS = ("receivedAtMs", "cosignedAtMs", "broadcastAtMs", "executedBlockTsMs", "finalizedAtMs")

DEFAULT_API = "http://127.0.0.1:8080"
Api = Annotated[str, typer.Option("--api", envvar="GASLESS_API_URL", help="Base URL of the gasless API.")]
Gateway = Annotated[
    str | None,
    typer.Option(
        "--gateway", envvar="GASLESS_GATEWAY_URL", help="Gateway URL to read the sender's nonce from."
    ),
]


def _problem(problem: RelayProblem) -> None:
    out.print(f"[red]refused:[/red] {problem.status} [bold]{problem.code}[/bold] {escape(problem.detail)}")
    if problem.details:
        out.print(f"  details: {json.dumps(problem.details, separators=(',', ':'))[:2000]}")
    if problem.request_id:
        out.print(f"  request id: {problem.request_id}")


def _assignment_table(assignment: dict[str, Any]) -> Table:
    table = Table(title="assignment", show_header=False)
    for key in ("relayer", "shard", "kind", "pinNonce", "expiresAtMs", "renewable"):
        table.add_row(key, str(assignment.get(key)))
    return table


def _intent_table(intent: dict[str, Any]) -> Table:
    table = Table(title=f"intent {intent.get('id')}", show_header=False)
    for key in ("txHash", "state", "final", "outcome", "relayer", "receiver", "crossShard", *TIMESTAMPS):
        table.add_row(key, str(intent.get(key)))
    for key in ("deadReason", "replacedBy", "rejection"):
        if intent.get(key) is not None:
            table.add_row(key, json.dumps(intent[key]) if isinstance(intent[key], dict) else str(intent[key]))
    for key, figure in (intent.get("latency") or {}).items():
        table.add_row(f"latency.{key}", str(figure))
    return table


def _state_line(intent: dict[str, Any]) -> str:
    """`[3/4] EXECUTED outcome=success  cosigned +7 ms, broadcast +11 ms, executed +99 ms` (from receipt)."""
    state = str(intent.get("state"))
    step = f"[{STATE_ORDER.index(state) + 1}/{len(STATE_ORDER)}]" if state in STATE_ORDER else "[-]"
    received = intent.get("receivedAtMs")
    stamps = []
    for name in TIMESTAMPS[1:]:
        value = intent.get(name)
        if value is not None:
            label = name.removesuffix("AtMs").removesuffix("BlockTsMs")
            stamps.append(f"{label} +{value - received} ms" if received is not None else f"{label} {value}")
    extra = f" outcome={intent['outcome']}" if intent.get("outcome") else ""
    if intent.get("deadReason"):
        extra += f" deadReason={intent['deadReason']}"
    return f"{escape(step)} [bold]{state}[/bold]{escape(extra)}  {', '.join(stamps)}"


async def _send(
    *,
    api: str,
    gateway: str | None,
    key: UserKey,
    to: str,
    value: int,
    data: str,
    gas_limit: int | None,
    gas_price: int | None,
    nonce: int | None,
    intent_key: str | None,
    api_key: str | None,
    follow: bool,
    timeout_s: float,
) -> int:
    import aiohttp

    from gasless.chain.addresses import InvalidAddress, parse_address
    from gasless.client import RelayClient, RelayProblem, Transfer, gateway_nonce, is_final

    try:
        parse_address(to)
    except InvalidAddress:
        errors.print(f"[red]error:[/red] --to is not an erd1 address: {escape(to)}")
        return EXIT_REFUSED
    if nonce is None and gateway is None:
        errors.print("[red]error:[/red] --gateway (to read the account nonce) or --nonce is required")
        return EXIT_REFUSED
    async with RelayClient(api) as client:
        try:
            health = await check_api(client.session, api)
            if gateway is not None:
                await check_gateway(client.session, gateway)
        except EndpointError as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            return EXIT_REFUSED
        chain_id = health["chainId"]
        try:
            if nonce is None:
                assert gateway is not None
                nonce = await gateway_nonce(gateway, key.address, session=client.session)
            out.print(f"sender {key.address} (shard {key.shard}), nonce {nonce}, chain {chain_id}")
            assignment = await client.assign(key)
            out.print(_assignment_table(assignment))
            builder = Transfer(
                receiver=to, nonce=nonce, value=value, data=data, gas_limit=gas_limit, gas_price=gas_price
            )
            sent = await client.send(
                key, builder, assignment=assignment, intent_key=intent_key, api_key=api_key
            )
        except RelayProblem as problem:
            _problem(problem)
            return EXIT_REFUSED
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            errors.print(f"[red]failed:[/red] {type(exc).__name__}: {escape(one_line(str(exc)))}")
            return EXIT_REFUSED
        result = sent.result
        out.print(
            f"relay answer: [bold]{result.status}[/bold] state={result.state} txHash={result.tx_hash} "
            f"id={result.id} duplicate={str(result.duplicate).lower()}"
        )
        if len(sent.steps) > 1:
            out.print(f"  recovered: {' -> '.join(sent.steps)}")
        if not follow:
            return EXIT_OK
        last: dict[str, Any] | None = None
        try:
            with out.status(f"following {result.tx_hash} ...", spinner="dots") as status:
                async for intent in client.follow(result.tx_hash, timeout_s=timeout_s):
                    last = intent
                    out.print(_state_line(intent))
                    status.update(f"{intent.get('state')}: waiting for the next state ...")
        except RelayProblem as problem:
            _problem(problem)
            return EXIT_REFUSED
        except TimeoutError:
            out.print(f"[red]not final within {timeout_s} s[/red]")
            return EXIT_NOT_SUCCESS
        if last is None or not is_final(last):
            return EXIT_NOT_SUCCESS
        latency = last.get("latency") or {}
        if last.get("state") == "FINALIZED" and last.get("outcome") == "success":
            out.print(
                f"[green]FINALIZED[/green] outcome=success totalMs={latency.get('totalMs')} "
                f"inclusionMs={latency.get('inclusionMs')} rounds={latency.get('roundsToInclusion')}"
            )
            return EXIT_OK
        out.print(
            f"[red]{last.get('state')}[/red] outcome={last.get('outcome')} {last.get('deadReason') or ''}"
        )
        return EXIT_NOT_SUCCESS


@relay_app.command("send")
def send(
    pem: Annotated[Path, typer.Option("--pem", help="The sender's PEM file.")],
    to: Annotated[str, typer.Option("--to", help="Receiver (erd1...).")],
    api: Api = DEFAULT_API,
    gateway: Gateway = None,
    value: Annotated[int, typer.Option("--value", help="Amount in atto (10^-18 EGLD).", min=0)] = 0,
    data: Annotated[str, typer.Option("--data", help="Data field (text).")] = "",
    gas_limit: Annotated[
        int | None, typer.Option("--gas-limit", help="Gas limit (default: the movement gas).")
    ] = None,
    gas_price: Annotated[
        int | None, typer.Option("--gas-price", help="Gas price (default: minimum).")
    ] = None,
    nonce: Annotated[
        int | None, typer.Option("--nonce", help="Nonce (default: read from --gateway).")
    ] = None,
    intent_key: Annotated[
        str | None, typer.Option("--intent-key", help="Logical idempotency key (16-128 chars).")
    ] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="Sponsor API key (X-Api-Key).")] = None,
    follow: Annotated[
        bool, typer.Option("--follow/--no-follow", help="Follow the intent to finality.")
    ] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for finality.")] = 300.0,
) -> None:
    """Assign, sign once, relay one transfer and follow it until it is final."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    code = asyncio.run(
        _send(
            api=api,
            gateway=gateway,
            key=key,
            to=to,
            value=value,
            data=data,
            gas_limit=gas_limit,
            gas_price=gas_price,
            nonce=nonce,
            intent_key=intent_key,
            api_key=api_key,
            follow=follow,
            timeout_s=timeout,
        )
    )
    raise typer.Exit(code)


async def _status(api: str, ident: str, as_json: bool) -> int:
    import aiohttp

    from gasless.client import RelayClient, RelayProblem

    async with RelayClient(api) as client:
        try:
            await check_api(client.session, api)
        except EndpointError as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            return EXIT_REFUSED
        try:
            intent = await client.intent(ident)
        except RelayProblem as problem:
            _problem(problem)
            return EXIT_REFUSED
        except (aiohttp.ClientError, TimeoutError) as exc:
            errors.print(f"[red]failed:[/red] {type(exc).__name__}: {escape(one_line(str(exc)))}")
            return EXIT_REFUSED
    if as_json:
        out.print_json(json.dumps(intent))
    else:
        out.print(_intent_table(intent))
    return EXIT_OK


@relay_app.command("status")
def status(
    ident: Annotated[str, typer.Argument(help="Intent id (<sender>:<nonce>) or transaction hash.")],
    api: Api = DEFAULT_API,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Intent as JSON.")] = False,
) -> None:
    """Show one intent (`GET /v1/relay/{id}`)."""
    raise typer.Exit(asyncio.run(_status(api, ident, as_json)))
