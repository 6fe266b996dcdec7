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

from gasless.cli.common import errors, fail, read_pem, refused
from gasless.cli.endpoints import EndpointError, check_api
from gasless.cli.output import CliConsole, key_value_table, print_records, shown
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
    """Exact: `10 USDC`, `2.5 USDC`, `0.000001 USDC` (never rounded through a float)."""
    from gasless.billing.advice import usdc

    return f"{usdc(int(micro))} USDC"


async def with_client(api: str, work: Callable[[Any], Awaitable[int]]) -> int:
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
            refused(problem.code, problem.status, problem.detail, problem.details, problem.request_id)
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
            f"{call} {result.tx_hash} ended {shown(last.get('state'))} "
            f"outcome={shown(last.get('outcome'))} {failure}"
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
    rows: list[tuple[str, Any]] = [("account", view.get("address"))]
    rows += [
        (name, plan[name])
        for name in ("tierId", "tierName", "startMs", "endMs", "includedRu", "ref")
        if plan.get(name) is not None
    ]
    rows.append(("credits", _usdc(view.get("creditsMicro", 0))))
    return key_value_table("plan", rows)


def holdings_table(view: dict[str, Any]) -> Table:
    """What the account holds and how pay-as-you-go is set."""
    payg = view.get("payg") or {}
    plan = view.get("runningPlan") or {}
    return key_value_table(
        "account",
        [
            ("account", view.get("address")),
            ("plan", plan.get("tierName") or "none"),
            ("credits", _usdc(view.get("creditsMicro", 0))),
            ("escrow", _usdc(view.get("escrowMicro", 0))),
            ("pay-as-you-go", "on" if payg.get("enabled") else "off"),
            ("auto top-up", "on" if payg.get("autoTopup") else "off"),
            ("budget", _usdc(payg.get("budgetMicro", 0)) if payg.get("budgetMicro") else "none"),
            (
                "max price per RU",
                f"{payg['maxPaygPriceMicro']} micro-USDC" if payg.get("maxPaygPriceMicro") else "none",
            ),
        ],
    )


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
        rows = [
            (
                tier.get("id"),
                tier.get("name"),
                _usdc(tier.get("priceMicroUsdc", 0)),
                f"{int(tier.get('periodMs') or 0) // 86_400_000} days"
                if int(tier.get("periodMs") or 0)
                else "-",
                tier.get("includedRu"),
                tier.get("rateClass"),
                tier.get("audience"),
                tier.get("available", tier.get("purchasable")),
            )
            for tier in document.get("tiers", [])
        ]
        columns = ("id", "name", "price", "period", "included RU", "rate class", "audience", "available")
        print_records(out, f"tiers ({document.get('schemaVersion')})", columns, rows)
        deposit = document.get("deposit") or {}
        most = int(deposit.get("maxMicroUsdc") or 0)
        out.print(
            f"deposits: at least {_usdc(deposit.get('minMicroUsdc', 0))}, "
            + (f"at most {_usdc(most)}" if most else "no maximum")
        )
        return EXIT_OK

    raise typer.Exit(asyncio.run(with_client(api, work)))


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

    raise typer.Exit(asyncio.run(with_client(api, work)))


ToEscrow = Annotated[
    bool,
    typer.Option(
        "--to-escrow",
        help="Then move the credited amount into the pay-as-you-go escrow and turn pay-as-you-go on "
        "(setPayg, free): credits pay for relays only from there.",
    ),
]


def deposit(
    pem: Pem,
    amount: Annotated[float, typer.Option("--amount", min=0.000001, help="USDC to deposit (e.g. 10).")],
    beneficiary: Annotated[
        str | None, typer.Option("--for", help="Credit another account (depositFor).")
    ] = None,
    to_escrow: ToEscrow = False,
    api: Api = DEFAULT_API,
    timeout: Timeout = 120.0,
) -> None:
    """Deposit USDC as credits: prepare, sign once, relay (free), wait for the credits."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    credited = beneficiary or key.address
    if to_escrow and credited != key.address:
        fail("--to-escrow moves the signer's own credits: it cannot go with --for another account")

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
        added = int(view.get("creditsMicro") or 0) - before
        if to_escrow:
            view = await move_to_escrow(client, key, added, timeout)
            out.print(holdings_table(view))
        elif credited == key.address:
            escrow_hint(view, pem, added)
        return EXIT_OK

    raise typer.Exit(asyncio.run(with_client(api, work)))


def escrow_hint(view: dict[str, Any], pem: Path, amount_micro: int) -> None:
    """The next command, when credits alone do not let the account relay (no plan, and the escrow does not
    pay: pay-as-you-go off, or no auto top-up)."""
    from gasless.billing.advice import usdc

    payg = view.get("payg") or {}
    if view.get("runningPlan") or (payg.get("enabled") and payg.get("autoTopup")) or amount_micro <= 0:
        return
    out.print(
        "credits pay for relays only from the pay-as-you-go escrow; to move these there, run: "
        f"gasless flags --pem {escape(str(pem))} --payg --payg-budget {usdc(amount_micro)}"
    )


async def account_view(client: Any, address: str) -> dict[str, Any]:
    """`GET /v1/account/{address}`, or {} when the address has no account."""
    from gasless.client import RelayProblem

    try:
        _, view, _ = await client.request("GET", f"/v1/account/{address}")
    except RelayProblem as problem:
        if problem.status == 404:
            return {}
        raise
    return dict(view)


async def _credits(client: Any, address: str) -> int:
    return int((await account_view(client, address)).get("creditsMicro") or 0)


def _payg_settled(
    want: dict[str, Any], escrow_before: int, *, escrow_moves: bool = True
) -> Callable[[dict[str, Any]], bool]:
    """The account mirror shows `setPayg` with the arguments `want` (and, with `escrow_moves`, the moved
    budget in the escrow)."""

    def done(view: dict[str, Any]) -> bool:
        payg = view.get("payg") or {}
        same = (
            bool(payg.get("enabled")) == want["enabled"]
            and int(payg.get("budgetMicro") or 0) == want["budgetMicroUsdc"]
            and bool(payg.get("autoTopup")) == want["autoTopup"]
            and int(payg.get("maxPaygPriceMicro") or 0) == want["maxPaygPriceMicroUsdc"]
        )
        moved = want["budgetMicroUsdc"] if want["enabled"] and escrow_moves else 0
        return same and (moved == 0 or int(view.get("escrowMicro") or 0) != escrow_before)

    return done


async def move_to_escrow(client: Any, key: Any, amount_micro: int, timeout_s: float) -> dict[str, Any]:
    """`setPayg(true, amount, auto_topup, max_payg_price)` keeping the account's other pay-as-you-go
    settings: moves `amount_micro` of credits into the escrow and turns pay-as-you-go on. The account view
    once mirrored."""
    view = await account_view(client, key.address)
    current = view.get("payg") or {}
    want = {
        "enabled": True,
        "budgetMicroUsdc": amount_micro,
        "autoTopup": bool(current.get("autoTopup")),
        "maxPaygPriceMicroUsdc": int(current.get("maxPaygPriceMicro") or 0),
    }
    out.print(f"moving {_usdc(amount_micro)} of credits into the pay-as-you-go escrow")
    await _run_all(client, key, "/v1/flags/prepare", {"address": key.address, "payg": want}, timeout_s)
    escrow_before = int(view.get("escrowMicro") or 0)
    return await wait_account(
        client, key.address, _payg_settled(want, escrow_before), "the escrow", timeout_s
    )


async def _run_all(client: Any, key: Any, path: str, body: dict[str, Any], timeout_s: float) -> int:
    _, prepared, _ = await client.request("POST", path, json=body)
    transactions = prepared.get("transactions", [prepared])
    lease = prepared["assignment"]["lease"]
    for one in transactions:  # in order: one free transaction in flight per sender
        price = "free" if one["free"] else f"{one['ru']} RU"
        fee = f", fee ceiling {_usdc(one['feeMicroUsdc'])}" if one.get("feeMicroUsdc") else ""
        call = one["contractCall"]
        args = ", ".join(shown(arg) for arg in call["args"])
        out.print(f"{escape(call['function'])}({escape(args)}): {price}{fee}")
        await relay_prepared(client, key, one, lease, timeout_s)
    return EXIT_OK


def flags(
    pem: Pem,
    auto_renew: Annotated[
        bool | None,
        typer.Option("--auto-renew/--no-auto-renew", help="setAutoRenew: renew the plan when it ends."),
    ] = None,
    payg: Annotated[
        bool | None, typer.Option("--payg/--no-payg", help="setPayg: turn pay-as-you-go on or off.")
    ] = None,
    payg_budget: Annotated[
        float | None,
        typer.Option(
            "--payg-budget",
            min=0,
            help="USDC of credits this call moves into the pay-as-you-go escrow (with pay-as-you-go on), and "
            "the most pay-as-you-go may spend (0: no cap). Not given: nothing is moved and there is no cap.",
        ),
    ] = None,
    payg_auto_topup: Annotated[
        bool | None,
        typer.Option(
            "--payg-auto-topup/--no-payg-auto-topup",
            help="Let pay-as-you-go refill the escrow from credits as relays are settled.",
        ),
    ] = None,
    payg_max_price: Annotated[
        int | None, typer.Option("--payg-max-price", min=0, help="Max micro-USDC per RU (0: no cap).")
    ] = None,
    release_escrow: Annotated[
        bool, typer.Option("--release-escrow", help="releaseEscrow: the escrow back to credits.")
    ] = False,
    renew: Annotated[bool, typer.Option("--renew", help="Renew the running plan now.")] = False,
    api: Api = DEFAULT_API,
    timeout: Timeout = 120.0,
) -> None:
    """Change only the flags given (the others are kept): one transaction per change, each signed once."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    payg_given = any(option is not None for option in (payg, payg_budget, payg_auto_topup, payg_max_price))

    async def work(client: Any) -> int:
        view = await account_view(client, key.address)
        body: dict[str, Any] = {"address": key.address, "releaseEscrow": release_escrow, "renew": renew}
        if auto_renew is not None:
            body["autoRenew"] = auto_renew
        want: dict[str, Any] | None = None
        if payg_given:
            current = view.get("payg") or {}
            want = {
                "enabled": payg if payg is not None else bool(current.get("enabled")),
                "budgetMicroUsdc": round((payg_budget or 0) * USDC),
                "autoTopup": (
                    payg_auto_topup if payg_auto_topup is not None else bool(current.get("autoTopup"))
                ),
                "maxPaygPriceMicroUsdc": (
                    payg_max_price
                    if payg_max_price is not None
                    else int(current.get("maxPaygPriceMicro") or 0)
                ),
            }
            body["payg"] = want
            moved = want["budgetMicroUsdc"] if want["enabled"] else 0
            out.print(
                f"pay-as-you-go {'on' if want['enabled'] else 'off'}"
                + (f", moves {_usdc(moved)} of credits into the escrow" if moved else ", moves no credits")
                + f", auto top-up {'on' if want['autoTopup'] else 'off'}"
                + (" (kept)" if payg_auto_topup is None else "")
                + f", max price per RU {want['maxPaygPriceMicroUsdc'] or 'none'}"
                + (" (kept)" if payg_max_price is None else "")
            )
        await _run_all(client, key, "/v1/flags/prepare", body, timeout)
        escrow_before = int(view.get("escrowMicro") or 0)

        def done(v: dict[str, Any]) -> bool:
            if auto_renew is not None and bool(v.get("autoRenew")) != auto_renew:
                return False
            if release_escrow and int(v.get("escrowMicro") or 0) != 0:
                return False
            # releaseEscrow runs after setPayg: the escrow ends at 0 whatever setPayg moved.
            return want is None or _payg_settled(want, escrow_before, escrow_moves=not release_escrow)(v)

        out.print(holdings_table(await wait_account(client, key.address, done, "the flags", timeout)))
        return EXIT_OK

    raise typer.Exit(asyncio.run(with_client(api, work)))


def _senders(pem: Path, addresses: list[str], api: str, timeout: float, member: str) -> None:
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    body = {"account": key.address, member: addresses}
    raise typer.Exit(
        asyncio.run(with_client(api, lambda c: _run_all(c, key, "/v1/senders/prepare", body, timeout)))
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
