"""The `gasless` command: `main` (serving, localnet, errors), `admin` (operator commands), `incidents`
(`gasless admin incident`) and `relay` (send and follow one transaction)."""

from gasless.cli.main import app, main

__all__ = ["app", "main"]
