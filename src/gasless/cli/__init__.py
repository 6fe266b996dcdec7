"""The `gasless` command: `main` (serving, localnet, errors), `admin` (operator commands), `incidents`
(`gasless admin incident`) and `relay` (send and follow one transaction).

`main` takes SIGINT and SIGTERM before it imports the command (seconds of imports on a slow machine), so
a stop asked for during start-up is never lost (`gasless.cli.signals`)."""

from __future__ import annotations

from typing import Any


def main() -> None:
    from gasless.cli import signals

    signals.install()
    try:
        from gasless.cli.main import main as run
    except signals.StopRequested as stop:
        raise SystemExit(stop.exit_code) from None
    except Exception:
        # A signal taken inside the interpreter's import machinery can come out as another exception
        # (CPython 3.11 replaced it with "TypeError: expected a message argument" in a `from _ssl import
        # RAND_egd` that ssl.py expects to fail): the stop was asked for all the same.
        code = signals.stop_exit_code()
        if code is not None:
            raise SystemExit(code) from None
        raise
    run()


def __getattr__(name: str) -> Any:
    if name == "app":  # the typer application, loaded on first use
        from gasless.cli.main import app

        return app
    raise AttributeError(name)


__all__ = ["app", "main"]
