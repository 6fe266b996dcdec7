"""The `gasless` command."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gasless.cli_relay import relay_app
from gasless.logs import configure_logging

app = typer.Typer(
    help="gasless: the gasless relaying service for MultiversX.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

app.add_typer(relay_app, name="relay")

def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Long-running servers run on uvloop (uvicorn's standard loop) where it exists."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        asyncio.run(main)
        return
    uvloop.run(main)


DataDir = Annotated[Path, typer.Option("--data-dir", help="Where wallets, the database and secrets live.")]


def _print_embedded(settings, localnet) -> None:  # type: ignore[no-untyped-def]
    table = Table(title="gasless is up (embedded default: localnet + SQLite)", show_lines=False)
    table.add_column("what")
    table.add_column("where")
    table.add_row("API", settings.network.api_base_url)
    table.add_row(
        "health", f"{settings.network.api_base_url}/healthz  {settings.network.api_base_url}/readyz"
    )
    for url in localnet.urls:
        table.add_row("localnet gateway", url)
    table.add_row("localnet admin", f"{localnet.urls[0]}/localnet/info")
    table.add_row("chain id", settings.network.chain_id)
    table.add_row("database", settings.effective_database_url)
    info = localnet.info
    table.add_row("billing contract", str(info.get("contract")))
    table.add_row("owner wallet", info["ownerPem"])
    for relayer in info["relayers"]:
        table.add_row(f"relayer (shard {relayer['shard']})", relayer["pem"])
    for user in info["users"]:
        table.add_row(f"demo user (shard {user['shard']})", user["pem"])
    console.print(table)
    console.print("Press Ctrl-C to stop.")


@app.command()
def up(
    port: Annotated[int, typer.Option("--port", help="API port.")] = 8080,
    localnet_port: Annotated[int, typer.Option("--localnet-port", help="localnet gateway port.")] = 7950,
    data_dir: DataDir = Path("var"),
    round_ms: Annotated[int, typer.Option("--round-ms", help="localnet round duration.")] = 600,
) -> None:
    """Start the embedded default: localnet and the API on loopback, data under --data-dir."""
    from gasless.embedded import EmbeddedOptions, run_embedded

    configure_logging(json_lines=False)
    options = EmbeddedOptions(
        data_dir=data_dir, api_port=port, localnet_port=localnet_port, round_ms=round_ms
    )
    with contextlib.suppress(KeyboardInterrupt):
        run_service(run_embedded(options, on_ready=_print_embedded))


@app.command()
def localnet(
    port: Annotated[int, typer.Option("--port", help="Gateway port.")] = 7950,
    data_dir: DataDir = Path("var"),
    round_ms: Annotated[int, typer.Option("--round-ms", help="Round duration in ms.")] = 600,
    gateways: Annotated[int, typer.Option("--gateways", help="How many gateways (consecutive ports).")] = 1,
) -> None:
    """Run the local network alone (gateway REST API + admin API under /localnet/)."""
    from gasless.localnet.chain import ChainConfig
    from gasless.localnet.server import Localnet
    from gasless.settings import LOCALNET_PAYMENT_TOKEN

    configure_logging(json_lines=False)

    async def main() -> None:
        net = Localnet(
            data_dir=data_dir / "localnet",
            payment_token=LOCALNET_PAYMENT_TOKEN,
            config=ChainConfig(round_ms=round_ms),
        )
        urls = await net.start("127.0.0.1", [port + i if port else 0 for i in range(gateways)])
        for url in urls:
            console.print(f"localnet gateway: {url}  (admin: {url}/localnet/info)")
        console.print(f"owner wallet: {net.info['ownerPem']}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await net.stop()

    run_service(main())


@app.command()
def serve(
    host_id: Annotated[str | None, typer.Option("--host-id", help="a or b.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="API port.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML settings file.")] = None,
) -> None:
    """Run the API alone against the configured gateways and database (GASLESS_* settings)."""
    from gasless.embedded import serve_api
    from gasless.settings import Settings

    configure_logging(json_lines=True)
    overrides: dict[str, object] = {}
    if host_id is not None:
        overrides["host_id"] = host_id
    if port is not None:
        overrides["api_port"] = port
    try:
        settings = Settings.load(config_file=config, **overrides)
    except ValueError as exc:
        console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from None
    run_service(serve_api(settings, log_level="info"))


@app.command()
def errors(
    docs_url: Annotated[str, typer.Option("--docs-url", help="Base of the error reference pages.")] = (
        "https://docs.gasless.example"
    ),
) -> None:
    """Print the error catalogue as JSON (published as docs/errors.json)."""
    import json

    from gasless.errors import catalogue_document

    typer.echo(json.dumps(catalogue_document(docs_url), indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
