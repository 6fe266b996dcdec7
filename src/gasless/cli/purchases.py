"""`gasless pricing | buy | deposit | flags | senders`: the purchase builders from the command line.

Each command asks the service to build the unsigned call(s) (`POST /v1/.../prepare`), signs each once with
the wallet PEM, relays it, and follows it to finality with a progress line; `buy` and `deposit` then wait
until the contract's event is mirrored (the account shows the plan or the credits). Exit 0: done; 1: a
transaction failed or did not finish in time; 2: the service refused or could not be reached.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gasless.cli.common import errors, one_line, read_pem
from gasless.cli.endpoints import EndpointError, check_api
from gasless.cli.output import CliConsole
from gasless.cli.relay import DEFAULT_API, Api

out = CliConsole()
senders_app = typer.Typer(
    help="Authorise senders to relay on your account, or remove them.", no_args_is_help=True
)

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
USDC = 1_000_000

Pem = Annotated[Path, typer.Option("--pem", help="The wallet PEM that signs (the account or payer).")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds to wait for each transaction.")]


class Failed(Exception):
    """A transaction ended other than FINALIZED/success, or did not finish in time."""


class Unknown(Exception):
    """The command names something the service does not have (a tier): nothing was done."""


def _usdc(micro: Any) -> str:
    return f"{int(micro) / USDC:.6f} USDC"


async def _with_client(api: str, work: Callable[[Any], Awaitable[int]]) -> int:
    import aiohttp

    from gasless.client import RelayClient, RelayProblem

    async with RelayClient(api) as client:
        try:
            await check_api(client.session, api)
            return await work(client)
        except EndpointError as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            return EXIT_REFUSED
        except RelayProblem as problem:
            errors.print(
                f"[red]refused:[/red] {escape(problem.code)} ({problem.status}): {escape(one_line(problem.detail))}"
            )
            return EXIT_REFUSED
        except Failed as exc:
            errors.print(f"[red]failed:[/red] {escape(str(exc))}")
            return EXIT_FAILED
        except Unknown as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            return EXIT_REFUSED
        except (aiohttp.ClientError, OSError) as exc:
            errors.print(f"[red]error:[/red] --api {escape(api)} does not answer ({type(exc).__name__})")
            return EXIT_REFUSED


async def relay_prepared(
    client: Any, key: Any, prepared: dict[str, Any], lease: str, timeout_s: float
) -> dict[str, Any]:
    """Sign the prepared transaction once, relay it, follow it to FINALIZED (success, else Failed)."""
    from gasless.chain.codec import tx_from_wire

    tx = tx_from_wire({**prepared["transaction"], "signature": "00" * 64})
    key.sign_transaction(tx)
    call = prepared["contractCall"]["function"]
    result = await client.relay(tx, lease)
    billing = result.body.get("billing", {})
    paid = "free" if billing.get("free") else f"{billing.get('ru')} RU on {billing.get('billingClass')}"
    out.print(f"{call}: relayed ({paid}) txHash={result.tx_hash}")
    last: dict[str, Any] = {}
    with out.status(f"{call}: waiting for finality ...", spinner="dots") as status:
        try:
            async for intent in client.follow(result.tx_hash, timeout_s=timeout_s):
                last = intent
                status.update(f"{call}: {intent.get('state')} ...")
        except TimeoutError as exc:
            raise Failed(f"{call} {result.tx_hash} not final within {timeout_s:.0f} s") from exc
    if last.get("state") != "FINALIZED" or last.get("outcome") != "success":
        failure = (last.get("failure") or {}).get("code") or last.get("deadReason") or ""
        raise Failed(
            f"{call} {result.tx_hash} ended {last.get('state')} outcome={last.get('outcome')} {failure}"
        )
    out.print(f"[green]{call}: FINALIZED[/green] outcome=success")
    return last


async def wait_account(
    client: Any, address: str, done: Callable[[dict[str, Any]], bool], what: str, timeout_s: float
) -> dict[str, Any]:
    """Until the account mirror shows `done` (the contract's event was mirrored)."""
    from gasless.client import RelayProblem

    deadline = time.monotonic() + timeout_s
    with out.status(f"waiting for {what} in the account mirror ...", spinner="dots"):
        while True:
            try:
                _, view, _ = await client.request("GET", f"/v1/account/{address}")
            except RelayProblem as problem:
                if problem.status != 404:
                    raise
                view = {}
            if view and done(view):
                return dict(view)
            if time.monotonic() > deadline:
                raise Failed(f"{what} not mirrored within {timeout_s:.0f} s")
            await asyncio.sleep(0.3)


async def _tier(client: Any, tier: str) -> dict[str, Any]:
    _, pricing, _ = await client.request("GET", "/v1/pricing")
    for entry in pricing.get("tiers", []):
        if str(entry["id"]) == tier or str(entry["name"]).lower() == tier.lower():
            return dict(entry)
    names = ", ".join(str(t["name"]) for t in pricing.get("tiers", []))
    raise Unknown(f"--tier: no tier {tier!r}; tiers: {names}")


def _plan_table(view: dict[str, Any]) -> Table:
    plan = view.get("runningPlan") or {}
    table = Table(title=f"account {view.get('address', '')}", show_header=False)
    for name in ("tierId", "tierName", "startMs", "endMs", "includedRu", "ref"):
        if plan.get(name) is not None:
            table.add_row(name, str(plan[name]))
    table.add_row("credits", _usdc(view.get("creditsMicro", 0)))
    return table


# Commands -------------------------------------------------------------------------------------------------
def pricing(
    api: Api = DEFAULT_API,
    audience: Annotated[str | None, typer.Option("--audience", help="human or agent")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole pricing document.")] = False,
) -> None:
    """Show the prices: tiers, deposit bounds, the RU schedule (GET /v1/pricing)."""

    async def work(client: Any) -> int:
        path = "/v1/pricing" + (f"?audience={audience}" if audience else "")
        _, document, _ = await client.request("GET", path)
        if as_json:
            out.print_json(json.dumps(document))
            return EXIT_OK
        table = Table(title=f"tiers ({document.get('schemaVersion')})")
        for column in ("id", "name", "price", "period", "included RU", "rate class", "audience", "available"):
            table.add_column(column)
        for tier in document.get("tiers", []):
            table.add_row(
                str(tier.get("id")),
                str(tier.get("name")),
                _usdc(tier.get("priceMicroUsdc", 0)),
                f"{int(tier.get('periodMs') or 0) // 86_400_000} days"
                if int(tier.get("periodMs") or 0)
                else "-",
                str(tier.get("includedRu")),
                str(tier.get("rateClass")),
                str(tier.get("audience")),
                str(tier.get("available", tier.get("purchasable"))),
            )
        out.print(table)
        deposit = document.get("deposit") or {}
        out.print(
            f"deposits: {_usdc(deposit.get('minMicroUsdc', 0))} to {_usdc(deposit.get('maxMicroUsdc', 0))} (0: unlimited)"
        )
        return EXIT_OK

    raise typer.Exit(asyncio.run(_with_client(api, work)))


def buy(
    pem: Pem,
    tier: Annotated[str, typer.Option("--tier", help="A tier of `gasless pricing`, by name or id.")],
    months: Annotated[int, typer.Option("--months", min=1, max=12, help="Months to buy.")] = 1,
    pay_with: Annotated[str, typer.Option("--pay-with", help="auto, credits or usdc")] = "auto",
    api: Api = DEFAULT_API,
    timeout: Timeout = 120.0,
) -> None:
    """Buy a plan: prepare, sign once, relay (free), and wait for the plan in the account mirror."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))

    async def work(client: Any) -> int:
        chosen = await _tier(client, tier)
        body = {"payer": key.address, "tierId": int(chosen["id"]), "months": months, "payWith": pay_with}
        _, prepared, _ = await client.request("POST", "/v1/subscribe/prepare", json=body)
        quote = prepared["quote"]
        out.print(
            f"{chosen['name']} x {months}: {_usdc(quote['priceMicroUsdc'])} by {prepared['payWith']} "
            f"({prepared['contractCall']['function']}), quote {quote['quoteId']}"
        )
        await relay_prepared(client, key, prepared, prepared["assignment"]["lease"], timeout)
        view = await wait_account(
            client,
            key.address,
            lambda v: (
                (v.get("runningPlan") or {}).get("ref") == quote["quoteId"]
                or (v.get("queuedPlan") or {}).get("ref") == quote["quoteId"]
            ),
            "the plan",
            timeout,
        )
        out.print(_plan_table(view))
        return EXIT_OK

    raise typer.Exit(asyncio.run(_with_client(api, work)))


def deposit(
    pem: Pem,
    amount: Annotated[float, typer.Option("--amount", min=0.000001, help="USDC to deposit (e.g. 10).")],
    beneficiary: Annotated[
        str | None, typer.Option("--for", help="Credit another account (depositFor).")
    ] = None,
    api: Api = DEFAULT_API,
    timeout: Timeout = 120.0,
) -> None:
    """Deposit USDC as credits: prepare, sign once, relay (free), wait for the credits."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    credited = beneficiary or key.address

    async def work(client: Any) -> int:
        before = await _credits(client, credited)
        body: dict[str, Any] = {"payer": key.address, "amountMicroUsdc": round(amount * USDC)}
        if beneficiary:
            body["beneficiary"] = beneficiary
        _, prepared, _ = await client.request("POST", "/v1/deposit/prepare", json=body)
        await relay_prepared(client, key, prepared, prepared["assignment"]["lease"], timeout)
        view = await wait_account(
            client, credited, lambda v: int(v.get("creditsMicro") or 0) > before, "the credits", timeout
        )
        out.print(f"{credited}: credits {_usdc(view.get('creditsMicro', 0))}")
        return EXIT_OK

    raise typer.Exit(asyncio.run(_with_client(api, work)))


async def _credits(client: Any, address: str) -> int:
    from gasless.client import RelayProblem

    try:
        _, view, _ = await client.request("GET", f"/v1/account/{address}")
    except RelayProblem as problem:
        if problem.status == 404:
            return 0
        raise
    return int(view.get("creditsMicro") or 0)


async def _run_all(client: Any, key: Any, path: str, body: dict[str, Any], timeout_s: float) -> int:
    _, prepared, _ = await client.request("POST", path, json=body)
    transactions = prepared.get("transactions", [prepared])
    lease = prepared["assignment"]["lease"]
    for one in transactions:  # in order: one free transaction in flight per sender
        price = "free" if one["free"] else f"{one['ru']} RU"
        fee = f", fee ceiling {_usdc(one['feeMicroUsdc'])}" if one.get("feeMicroUsdc") else ""
        out.print(
            f"{one['contractCall']['function']}({', '.join(map(str, one['contractCall']['args']))}): {price}{fee}"
        )
        await relay_prepared(client, key, one, lease, timeout_s)
    return EXIT_OK


def flags(
    pem: Pem,
    auto_renew: Annotated[
        bool | None, typer.Option("--auto-renew/--no-auto-renew", help="setAutoRenew")
    ] = None,
    payg: Annotated[bool | None, typer.Option("--payg/--no-payg", help="setPayg: enable or disable")] = None,
    payg_budget: Annotated[
        float, typer.Option("--payg-budget", help="pay-as-you-go budget, USDC (0: none)")
    ] = 0.0,
    payg_auto_topup: Annotated[
        bool, typer.Option("--payg-auto-topup", help="move credits to escrow as needed")
    ] = False,
    payg_max_price: Annotated[
        int, typer.Option("--payg-max-price", help="max micro-USDC per RU (0: no cap)")
    ] = 0,
    release_escrow: Annotated[
        bool, typer.Option("--release-escrow", help="releaseEscrow: escrow back to credits")
    ] = False,
    renew: Annotated[bool, typer.Option("--renew", help="renew the running plan now")] = False,
    api: Api = DEFAULT_API,
    timeout: Timeout = 120.0,
) -> None:
    """Change the account's flags: one transaction per change, each signed once and relayed in turn."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    body: dict[str, Any] = {"address": key.address, "releaseEscrow": release_escrow, "renew": renew}
    if auto_renew is not None:
        body["autoRenew"] = auto_renew
    if payg is not None:
        body["payg"] = {
            "enabled": payg,
            "budgetMicroUsdc": round(payg_budget * USDC),
            "autoTopup": payg_auto_topup,
            "maxPaygPriceMicroUsdc": payg_max_price,
        }
    raise typer.Exit(
        asyncio.run(_with_client(api, lambda c: _run_all(c, key, "/v1/flags/prepare", body, timeout)))
    )


def _senders(pem: Path, addresses: list[str], api: str, timeout: float, member: str) -> None:
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    body = {"account": key.address, member: addresses}
    raise typer.Exit(
        asyncio.run(_with_client(api, lambda c: _run_all(c, key, "/v1/senders/prepare", body, timeout)))
    )


Addresses = Annotated[list[str], typer.Argument(help="erd1... addresses")]


@senders_app.command("add")
def senders_add(pem: Pem, addresses: Addresses, api: Api = DEFAULT_API, timeout: Timeout = 120.0) -> None:
    """addSenders: billed as a relay, plus the per-sender fee (at most the quoted ceiling)."""
    _senders(pem, addresses, api, timeout, "add")


@senders_app.command("remove")
def senders_remove(pem: Pem, addresses: Addresses, api: Api = DEFAULT_API, timeout: Timeout = 120.0) -> None:
    """removeSenders: free."""
    _senders(pem, addresses, api, timeout, "remove")


def register(app: typer.Typer) -> None:
    app.command(name="pricing")(pricing)
    app.command(name="buy")(buy)
    app.command(name="deposit")(deposit)
    app.command(name="flags")(flags)
    app.add_typer(senders_app, name="senders")
