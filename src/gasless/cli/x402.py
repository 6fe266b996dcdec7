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

from gasless.cli.common import errors, one_line, read_pem
from gasless.cli.endpoints import EndpointError, check_api
from gasless.cli.output import CliConsole
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
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


def _problem_line(status: int, body: Any) -> str:
    if isinstance(body, dict) and "code" in body:
        return f"{body['code']} ({status}): {body.get('detail', '')}"
    return f"HTTP {status}: {one_line(str(body))[:300]}"


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
    entry = required.accepts[0]
    table = Table(title="x402 challenge", show_header=False)
    table.add_row("pay", f"{int(entry.amount) / USDC:.6f} {entry.asset} ({entry.amount} micro)")
    table.add_row("to", entry.pay_to)
    table.add_row("network", entry.network)
    table.add_row("calls", str(entry.extra.get("function")))
    table.add_row("quote", str(entry.extra.get("quoteId")))
    table.add_row("valid for", f"{entry.max_timeout_seconds} s")
    return table


def _result_table(result: dict[str, Any]) -> Table:
    table = Table(title="x402 payment settled", show_header=False)
    for name in (
        "paymentId",
        "kind",
        "payer",
        "beneficiary",
        "amountMicroUsdc",
        "tierId",
        "months",
        "txHash",
    ):
        if result.get(name) is not None:
            table.add_row(name, str(result[name]))
    return table


async def _pay(
    api: str, path: str, body: dict[str, Any], key: Any, *, as_json: bool, timeout_s: float
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
        status, headers, challenge = await _post(session, url, body)
        if status != 402 or not isinstance(challenge, dict) or challenge.get("code") != "PAYMENT_REQUIRED":
            raise Refused(status, challenge)
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
            errors.print(f"[red]payment failed:[/red] {escape(_problem_line(status, paid))}")
            return EXIT_FAILED
        if status != 200:
            raise Refused(status, paid)
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
        return EXIT_OK


def _run(api: str, path: str, body: dict[str, Any], key: Any, as_json: bool, timeout_s: float) -> None:
    try:
        code = asyncio.run(_pay(api, path, body, key, as_json=as_json, timeout_s=timeout_s))
    except Refused as refused:
        errors.print(f"[red]refused:[/red] {escape(_problem_line(refused.status, refused.body))}")
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
    api: Api = DEFAULT_API,
    as_json: AsJson = False,
    timeout: Timeout = 120.0,
) -> None:
    """Deposit USDC as credits over x402 (deposit, or depositFor a beneficiary)."""
    from gasless.client import UserKey

    key = UserKey(read_pem(pem))
    body: dict[str, Any] = {"payer": key.address, "amountMicroUsdc": round(amount * USDC)}
    if beneficiary:
        body["beneficiary"] = beneficiary
    _run(api, "/v1/x402/topup", body, key, as_json, timeout)


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
    except Refused as refused:
        errors.print(f"[red]refused:[/red] {escape(_problem_line(refused.status, refused.body))}")
        raise typer.Exit(EXIT_REFUSED) from None
    except OSError as exc:
        errors.print(f"[red]error:[/red] --api {escape(api)} does not answer ({escape(type(exc).__name__)})")
        raise typer.Exit(EXIT_REFUSED) from None
    body = {"payer": key.address, "tierId": tier_id, "months": months}
    _run(api, "/v1/x402/purchase", body, key, as_json, timeout)
