"""`gasless x402 topup|purchase`: pay the service over x402 from a wallet PEM (docs/x402.md).

Challenge (402 with PAYMENT-REQUIRED), sign the payment transaction once, retry with PAYMENT-SIGNATURE,
and poll the payment until it is final. Exit 0: the payment settled; 1: it failed (PAYMENT_FAILED, or not
final in time); 2: the service refused the request or could not be reached.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gasless.cli.common import errors, fail, read_pem, refused_answer
from gasless.cli.endpoints import EndpointError, check_api
from gasless.cli.output import CliConsole, key_value_table
from gasless.cli.relay import DEFAULT_API, Api

x402_app = typer.Typer(help="Buy credits or a plan over x402 (HTTP 402 payments).", no_args_is_help=True)
out = CliConsole()

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
USDC = 1_000_000
MAX_RATE_LIMIT_WAITS = 30

Pem = Annotated[Path, typer.Option("--pem", help="The payer's wallet PEM (it signs the payment once).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the payment to be final.")]


class Refused(Exception):
    def __init__(self, status: int, body: Any, request_id: str | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.request_id = status, body, request_id


async def _post(session: Any, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """POST, honouring 429 + Retry-After (the paid routes allow 1 request per second per IP)."""
    for _ in range(MAX_RATE_LIMIT_WAITS):
        async with session.post(url, json=body, headers=headers or {}) as answer:
            payload = await answer.json(content_type=None)
            if answer.status != 429:
                return answer.status, dict(answer.headers), payload
            wait = int(answer.headers.get("Retry-After", "1"))
        with out.status(f"rate limited: retrying in {wait} s"):
            await asyncio.sleep(wait)
    raise Refused(429, payload)


def _challenge_table(required: Any) -> Table:
    from gasless.billing.advice import usdc

    entry = required.accepts[0]
    rows: list[tuple[str, Any]] = [
        ("pay", f"{usdc(int(entry.amount))} USDC ({entry.amount} micro-USDC of {entry.asset})"),
        ("to", entry.pay_to),
        ("network", entry.network),
        ("calls", entry.extra.get("function")),
        ("quote", entry.extra.get("quoteId")),
        ("valid for", f"{entry.max_timeout_seconds} s"),
    ]
    return key_value_table("x402 challenge", [(k, v) for k, v in rows if v is not None])


def _result_table(result: dict[str, Any]) -> Table:
    names = ("paymentId", "kind", "payer", "beneficiary", "amountMicroUsdc", "tierId", "months", "txHash")
    return key_value_table(
        "x402 payment settled", [(name, result[name]) for name in names if result.get(name) is not None]
    )


async def _pay(
    api: str,
    path: str,
    body: dict[str, Any],
    key: Any,
    *,
    as_json: bool,
    timeout_s: float,
    to_escrow: bool = False,
    pem: Path | None = None,
) -> int:
    import aiohttp

    from gasless.client.x402 import pay_header, read_challenge, read_settlement

    url = f"{api.rstrip('/')}{path}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        try:
            await check_api(session, api)
        except EndpointError as exc:
            errors.print(f"[red]error:[/red] {escape(str(exc))}")
            return EXIT_REFUSED
        topup = path.endswith("/topup") and body.get("beneficiary", key.address) == key.address
        credits_before = await _credits_of(api, session, key.address) if topup else 0
        status, headers, challenge = await _post(session, url, body)
        if status != 402 or not isinstance(challenge, dict) or challenge.get("code") != "PAYMENT_REQUIRED":
            raise Refused(status, challenge, _request_id(headers))
        required = read_challenge(headers)
        if not as_json:
            out.print(_challenge_table(required))
        header, payment_id = pay_header(required, key)
        status, headers, paid = await _post(session, url, body, {"PAYMENT-SIGNATURE": header})
        deadline = time.monotonic() + timeout_s
        if status == 202:
            poll = f"{api.rstrip('/')}/v1/x402/payments/{payment_id}"
            with out.status(f"payment {payment_id} co-signed; waiting for the contract's event"):
                while status == 202 and time.monotonic() < deadline:
                    await asyncio.sleep(max(0.2, int(paid.get("retryAfterMs", 1_000)) / 1000))
                    async with session.get(poll) as answer:
                        status, headers, paid = (
                            answer.status,
                            dict(answer.headers),
                            await answer.json(content_type=None),
                        )
        if status == 202:
            errors.print(f"[red]error:[/red] payment {payment_id} not final after {timeout_s:.0f} s")
            return EXIT_FAILED
        if (
            status == 402
            and isinstance(paid, dict)
            and paid.get("code") in ("PAYMENT_FAILED", "PAYMENT_INVALID")
        ):
            refused_answer(status, paid, _request_id(headers))
            return EXIT_FAILED
        if status != 200:
            raise Refused(status, paid, _request_id(headers))
        settlement = read_settlement(headers)
        if as_json:
            out.print_json(
                json.dumps(
                    {
                        "result": paid,
                        "settlement": settlement.model_dump(mode="json", by_alias=True, exclude_none=True),
                    }
                )
            )
        else:
            out.print(_result_table(paid))
        if topup:
            return await _after_topup(api, key, credits_before, to_escrow, pem, timeout_s, quiet=as_json)
        return EXIT_OK


def _request_id(headers: dict[str, str]) -> str | None:
    return next((value for name, value in headers.items() if name.lower() == "relay-request-id"), None)


async def _credits_of(api: str, session: Any, address: str) -> int:
    async with session.get(f"{api.rstrip('/')}/v1/account/{address}") as answer:
        view = await answer.json(content_type=None)
    return int(view.get("creditsMicro") or 0) if answer.status == 200 and isinstance(view, dict) else 0


async def _after_topup(
    api: str, key: Any, before: int, to_escrow: bool, pem: Path | None, timeout_s: float, *, quiet: bool
) -> int:
    """Once the credits show in the account: move them into the escrow (`--to-escrow`), or say how."""
    from gasless.cli.purchases import (
        escrow_hint,
        holdings_table,
        move_to_escrow,
        wait_account,
        with_client,
    )

    if quiet and not to_escrow:
        return EXIT_OK  # --json: the payment's JSON alone on stdout

    async def work(client: Any) -> int:
        view = await wait_account(
            client, key.address, lambda v: int(v.get("creditsMicro") or 0) > before, "the credits", timeout_s
        )
        added = int(view.get("creditsMicro") or 0) - before
        if to_escrow:
            view = await move_to_escrow(client, key, added, timeout_s)
            if not quiet:
                out.print(holdings_table(view))
        elif not quiet and pem is not None:
            escrow_hint(view, pem, added)
        return EXIT_OK

    return await with_client(api, work)


def _run(
    api: str,
    path: str,
    body: dict[str, Any],
    key: Any,
    as_json: bool,
    timeout_s: float,
    *,
    to_escrow: bool = False,
    pem: Path | None = None,
) -> None:
    try:
        code = asyncio.run(
            _pay(api, path, body, key, as_json=as_json, timeout_s=timeout_s, to_escrow=to_escrow, pem=pem)
        )
    except Refused as answer:
        refused_answer(answer.status, answer.body, answer.request_id)
        code = EXIT_REFUSED
    except OSError as exc:
        errors.print(f"[red]error:[/red] --api {escape(api)} does not answer ({escape(type(exc).__name__)})")
        code = EXIT_REFUSED
    raise typer.Exit(code)


@x402_app.command("topup")
def topup(
    pem: Pem,
    amount: Annotated[
        float, typer.Option("--amount", help="USDC to deposit (e.g. 10 or 2.5).", min=0.000001)
    ],
    beneficiary: Annotated[
        str | None, typer.Option("--beneficiary", help="The account credited (default: the payer).")
    ] = None,
    to_escrow: Annotated[
        bool,
        typer.Option(
            "--to-escrow",
            help="Then move the credited amount into the pay-as-you-go escrow and turn pay-as-you-go on "
            "(setPayg, free): credits pay for relays only from there.",
        ),
    ] = False,
    api: Api = DEFAULT_API,
    as_json: AsJson = False,
    timeout: Timeout = 120.0,
) -> None:
    """Deposit USDC as credits over x402 (deposit, or depositFor a beneficiary)."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    if to_escrow and beneficiary and beneficiary != key.address:
        fail("--to-escrow moves the payer's own credits: it cannot go with --beneficiary another account")
    if to_escrow and as_json:
        fail("--to-escrow prints the steps of the move: it cannot go with --json (stdout is JSON alone)")
    body: dict[str, Any] = {"payer": key.address, "amountMicroUsdc": round(amount * USDC)}
    if beneficiary:
        body["beneficiary"] = beneficiary
    _run(api, "/v1/x402/topup", body, key, as_json, timeout, to_escrow=to_escrow, pem=pem)


async def _tier_id(api: str, tier: str) -> int:
    import aiohttp

    if tier.isdigit():
        return int(tier)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(f"{api.rstrip('/')}/v1/pricing") as answer:
            pricing = await answer.json(content_type=None)
    names = {str(t["name"]).lower(): int(t["id"]) for t in pricing.get("tiers", [])}
    if tier.lower() not in names:
        raise Refused(
            404, {"code": "NOT_FOUND", "detail": f"no tier {tier!r}; tiers: {', '.join(sorted(names))}"}
        )
    return names[tier.lower()]


@x402_app.command("purchase")
def purchase(
    pem: Pem,
    tier: Annotated[str, typer.Option("--tier", help="A tier of GET /v1/pricing, by name or id.")],
    months: Annotated[int, typer.Option("--months", help="Months to buy.", min=1, max=12)] = 1,
    api: Api = DEFAULT_API,
    as_json: AsJson = False,
    timeout: Timeout = 120.0,
) -> None:
    """Buy a plan over x402 (depositAndSubscribe; the quote id is the contract ref)."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    try:
        tier_id = asyncio.run(_tier_id(api, tier))
    except Refused as answer:
        refused_answer(answer.status, answer.body, answer.request_id)
        raise typer.Exit(EXIT_REFUSED) from None
    except OSError as exc:
        errors.print(f"[red]error:[/red] --api {escape(api)} does not answer ({escape(type(exc).__name__)})")
        raise typer.Exit(EXIT_REFUSED) from None
    body = {"payer": key.address, "tierId": tier_id, "months": months}
    _run(api, "/v1/x402/purchase", body, key, as_json, timeout)
