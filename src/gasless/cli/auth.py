"""`gasless auth token`: a MultiversX native-auth token for a wallet PEM, to call the API's native-auth
routes from a shell (`curl -H "Authorization: Bearer $(gasless auth token --pem F)" .../v1/me`).

The token is made by `gasless.client.native_auth` (the SDK's NativeAuthClient format, the code the tests
use) on the recent shard-1 block the API itself publishes in `GET /v1/network` (`nativeAuth`), for one of
the origins the API accepts (its first, unless `--origin` says otherwise). The token alone goes to stdout;
a line about it to stderr.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gasless.cli.common import EXIT_FAILED, errors, fail, one_line, read_pem, refused
from gasless.cli.endpoints import EndpointError, check_api
from gasless.cli.relay import DEFAULT_API, Api

auth_app = typer.Typer(help="Credentials for the gasless API's native-auth routes.", no_args_is_help=True)

# Long enough for a session at the shell, far below the 24 h the API allows: a pasted token leaks less.
DEFAULT_TTL_SECONDS = 3_600


async def _native_auth(api: str) -> dict[str, Any]:
    """`nativeAuth` of `GET {api}/v1/network` (a gasless API checked first)."""
    import aiohttp

    from gasless.client import RelayClient, RelayProblem

    async with RelayClient(api) as client:
        try:
            await check_api(client.session, api)
            _, network, _ = await client.request("GET", "/v1/network")
        except EndpointError as exc:
            fail(str(exc))
        except RelayProblem as problem:
            refused(problem.code, problem.status, problem.detail, problem.details, problem.request_id)
            raise typer.Exit(EXIT_FAILED) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            fail(f"GET {api}/v1/network: {type(exc).__name__}: {exc}", EXIT_FAILED, label="failed")
    native = network.get("nativeAuth") if isinstance(network, dict) else None
    if not isinstance(native, dict):
        fail(f"GET {api}/v1/network has no nativeAuth member (an older API?)", EXIT_FAILED, label="failed")
    return native


@auth_app.command("token")
def token(
    pem: Annotated[Path, typer.Option("--pem", help="The wallet PEM whose address the token names.")],
    origin: Annotated[
        str | None,
        typer.Option("--origin", help="Origin the token is for (default: the first the API accepts)."),
    ] = None,
    ttl_seconds: Annotated[
        int, typer.Option("--ttl-seconds", help="Validity, counted on the chain's clock.", min=1)
    ] = DEFAULT_TTL_SECONDS,
    api: Api = DEFAULT_API,
) -> None:
    """Print a native-auth token for the PEM's address (stdout), made on the API's recent shard-1 block."""
    from gasless.client import UserKey
    from gasless.client.native_auth import make_native_auth_token

    key = UserKey(read_pem(pem))
    native = asyncio.run(_native_auth(api))
    max_ttl_ms = native.get("maxTtlMs")
    if isinstance(max_ttl_ms, int) and ttl_seconds * 1000 > max_ttl_ms:
        fail(f"--ttl-seconds {ttl_seconds} is more than the API accepts ({max_ttl_ms // 1000})")
    accepted = [o for o in native.get("origins") or [] if isinstance(o, str)]
    if origin is None:
        exact = [o for o in accepted if "*" not in o]  # a wildcard is a pattern, not an origin
        if not exact:
            fail(f"the API names no origin to use ({', '.join(accepted) or 'none'}): pass --origin")
        origin = exact[0]
    elif origin not in accepted and not any("*" in o for o in accepted):
        errors.print(
            f"[yellow]warning:[/yellow] {escape(f'origin {origin} is not one this API accepts')} "
            f"({escape(', '.join(accepted))})"
        )
    block = native.get("blockHash")
    if not isinstance(block, str):
        fail(
            "the API has recorded no shard-1 block yet (is it ready?): try again", EXIT_FAILED, label="failed"
        )
    made = make_native_auth_token(key.secret_key, origin=origin, block_hash=block, ttl_seconds=ttl_seconds)
    about = f"native-auth token for {key.address}: origin {origin}, shard-1 block {native.get('blockNonce')}"
    errors.print(escape(one_line(f"{about}, valid {ttl_seconds} s")))
    typer.echo(made)
