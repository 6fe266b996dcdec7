"""`gasless relay`: the integrator's side from the command line (send one transfer, follow it; read status).

`send` exits 0 when the transaction is FINALIZED with outcome `success` (or, with `--no-follow`, when the
service accepted it), 1 when it ended otherwise (failed, DEAD, REJECTED, not final in time) and 2 when the
service refused it or could not be reached. The sender's nonce comes from `--nonce`, else `--gateway`, else
the API itself (`withNextNonce` on the assignment). Refusals go to stderr (`gasless.cli.common.refused`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gasless.cli.common import errors, one_line, read_pem, refused
from gasless.cli.endpoints import EndpointError, check_api, check_gateway
from gasless.cli.output import CliConsole, key_value_table, shown

if TYPE_CHECKING:
    from gasless.client import RelayProblem, UserKey

relay_app = typer.Typer(
    help="Relay transactions through a gasless API, as an integrator would.", no_args_is_help=True
)
out = CliConsole()

EXIT_OK, EXIT_NOT_SUCCESS, EXIT_REFUSED = 0, 1, 2
STATE_ORDER = ("COSIGNED", "BROADCAST", "EXECUTED", "FINALIZED")
TIMESTAMPS = ("receivedAtMs", "cosignedAtMs", "broadcastAtMs", "executedBlockTsMs", "finalizedAtMs")
STATE_TIME = dict(zip(STATE_ORDER, TIMESTAMPS[1:], strict=True))  # when the intent reached each state
INTENT_FORM = "`<erd1...>:<nonce>` (an intent id) or a 64-hex transaction hash"

DEFAULT_API = "http://127.0.0.1:8080"
Api = Annotated[str, typer.Option("--api", envvar="GASLESS_API_URL", help="Base URL of the gasless API.")]
Gateway = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        envvar="GASLESS_GATEWAY_URL",
        help="A gateway to read the sender's nonce from (default: the API reads it).",
    ),
]


def _problem(problem: RelayProblem) -> None:
    refused(problem.code, problem.status, problem.detail, problem.details, problem.request_id)


def _assignment_table(assignment: dict[str, Any]) -> Table:
    pin = assignment.get("pinNonce")
    return key_value_table(
        "assignment",
        [
            ("relayer", assignment.get("relayer")),
            ("shard", assignment.get("shard")),
            ("kind", assignment.get("kind")),
            ("pinNonce", "none (any nonce)" if pin is None else pin),
            ("expiresAtMs", assignment.get("expiresAtMs")),
            ("renewable", assignment.get("renewable")),
        ],
    )


def _intent_table(intent: dict[str, Any]) -> Table:
    rows: list[tuple[str, Any]] = [
        (key, intent.get(key))
        for key in (
            "id",
            "txHash",
            "state",
            "final",
            "outcome",
            "relayer",
            "receiver",
            "crossShard",
            "gasLimit",
            "gasPrice",
            *TIMESTAMPS,
        )
    ]
    rows += [
        (key, intent[key])
        for key in ("deadReason", "failure", "replacedBy", "rejection")
        if intent.get(key) is not None
    ]
    rows += [(f"latency.{key}", figure) for key, figure in (intent.get("latency") or {}).items()]
    return key_value_table("intent", rows)


class Progress:
    """`[1/4] COSIGNED +7 ms`, `[2/4] BROADCAST +11 ms`, ...: each state the intent reached, from the first,
    once, in order, with its time from the receipt (a state passed between two reads is printed too)."""

    def __init__(self) -> None:
        self.shown = 0  # states of STATE_ORDER printed so far

    def lines(self, intent: dict[str, Any]) -> list[str]:
        state = str(intent.get("state"))
        if state not in STATE_ORDER:
            reason = f" deadReason={intent['deadReason']}" if intent.get("deadReason") else ""
            return [f"{escape('[-]')} [bold]{escape(state)}[/bold]{escape(reason)}"]
        reached = STATE_ORDER.index(state) + 1
        lines = [self._line(STATE_ORDER[i], i, intent) for i in range(self.shown, reached)]
        self.shown = max(self.shown, reached)
        return lines

    @staticmethod
    def _line(state: str, index: int, intent: dict[str, Any]) -> str:
        received, at = intent.get("receivedAtMs"), intent.get(STATE_TIME[state])
        when = f" +{at - received} ms" if received is not None and at is not None else ""
        extra = f" outcome={intent['outcome']}" if state == "EXECUTED" and intent.get("outcome") else ""
        step = escape(f"[{index + 1}/{len(STATE_ORDER)}]")
        return f"{step} [bold]{state}[/bold]{escape(when + extra)}"


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
            if nonce is None and gateway is not None:
                nonce = await gateway_nonce(gateway, key.address, session=client.session)
            # Without --nonce or --gateway the API reads the nonce, in the same request as the assignment.
            assignment = await client.assign(key, with_next_nonce=nonce is None)
            if nonce is None:
                nonce = int(assignment["nextNonce"])
            out.print(f"sender {key.address} (shard {key.shard}), nonce {nonce}, chain {escape(chain_id)}")
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
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, KeyError) as exc:
            errors.print(f"[red]failed:[/red] {type(exc).__name__}: {escape(one_line(str(exc)))}")
            return EXIT_REFUSED
        result = sent.result
        billing = result.body.get("billing") or {}
        billed = "free" if billing.get("free") else f"{shown(billing.get('ru'))} RU"
        out.print(
            f"relay answer: [bold]{result.status}[/bold] state={result.state} txHash={result.tx_hash} "
            f"id={result.id} duplicate={shown(result.duplicate)} "
            f"billing={shown(billing.get('billingClass'))} ({billed})"
        )
        if len(sent.steps) > 1:
            out.print(f"  recovered: {' -> '.join(sent.steps)}")
        progress = Progress()
        for line in progress.lines(result.intent or {"state": result.state}):
            out.print(line)
        if not follow:
            return EXIT_OK
        last: dict[str, Any] | None = None
        try:
            with out.status(f"following {result.tx_hash} ...", spinner="dots") as status:
                async for intent in client.follow(result.tx_hash, timeout_s=timeout_s):
                    last = intent
                    for line in progress.lines(intent):
                        out.print(line)
                    status.update(f"{intent.get('state')}: waiting for the next state ...")
        except RelayProblem as problem:
            _problem(problem)
            return EXIT_REFUSED
        except TimeoutError:
            errors.print(f"[red]failed:[/red] {result.tx_hash} not final within {timeout_s} s")
            return EXIT_NOT_SUCCESS
        if last is None or not is_final(last):
            return EXIT_NOT_SUCCESS
        latency = last.get("latency") or {}
        if last.get("state") == "FINALIZED" and last.get("outcome") == "success":
            out.print(
                f"[green]FINALIZED[/green] outcome=success totalMs={shown(latency.get('totalMs'))} "
                f"inclusionMs={shown(latency.get('inclusionMs'))} "
                f"rounds={shown(latency.get('roundsToInclusion'))}"
            )
            return EXIT_OK
        errors.print(
            f"[red]failed:[/red] {result.tx_hash} ended {shown(last.get('state'))} "
            f"outcome={shown(last.get('outcome'))}"
            + (f" deadReason={last['deadReason']}" if last.get("deadReason") else "")
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
        int | None,
        typer.Option(
            "--nonce", help="Nonce (default: the sender's next, read by the API or from --gateway)."
        ),
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
    import re

    import aiohttp

    from gasless.client import RelayClient, RelayProblem
    from gasless.http.formats import INTENT_OR_HASH_PATTERN

    if not re.fullmatch(INTENT_OR_HASH_PATTERN, ident):
        errors.print(f"[red]error:[/red] ID {escape(repr(ident))} is not {escape(INTENT_FORM)}")
        return EXIT_REFUSED
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
    ident: Annotated[
        str,
        typer.Argument(metavar="ID", help="Intent id (<erd1...>:<nonce>) or transaction hash (64 hex)."),
    ],
    api: Api = DEFAULT_API,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Intent as JSON.")] = False,
) -> None:
    """Show one intent (`GET /v1/relay/{id}`)."""
    raise typer.Exit(asyncio.run(_status(api, ident, as_json)))
