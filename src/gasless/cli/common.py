"""What every `gasless` command shares: its exit statuses, one-line errors, reading wallet PEM files and
reporting invalid settings.

Status 1: the operation was tried and failed. Status 2: usage or configuration (an option, a file, the
settings, a port, a URL that is not what the option names): nothing was done. 130/143: stopped by a signal
(gasless.cli.signals). Each error is one line on stderr naming what is wrong; a refusal by the service is
printed by `refused`, in one form for every command.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.markup import escape

from gasless.cli.output import CliConsole

if TYPE_CHECKING:
    from multiversx_sdk import UserSecretKey

EXIT_FAILED = 1
EXIT_USAGE = 2

errors = CliConsole(stderr=True)


def fail(message: str, code: int = EXIT_USAGE, *, label: str = "error") -> NoReturn:
    """Print `label: message` on one line (stderr) and exit with `code`."""
    errors.print(f"[red]{escape(label)}:[/red] {escape(one_line(message))}")
    raise typer.Exit(code)


def one_line(text: str) -> str:
    return " ".join(text.split())


def refused(
    code: str,
    status: int | None,
    detail: str,
    details: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> None:
    """A refusal by the service, in the one form every command prints, on stderr:
    `refused: CODE (status): detail`, then its `details` and request id when it has them (whole)."""
    where = f" ({status})" if status is not None else ""
    errors.print(f"[red]refused:[/red] [bold]{escape(code)}[/bold]{where}: {escape(one_line(detail))}")
    if details:
        errors.print(f"  details: {escape(json.dumps(dict(details), separators=(',', ':')))}")
    if request_id:
        errors.print(f"  request id: {escape(request_id)}")


def refused_answer(status: int, body: Any, request_id: str | None = None) -> None:
    """`refused` for a raw HTTP answer (a problem document, or anything else a server said)."""
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        details = body.get("details") if isinstance(body.get("details"), dict) else None
        refused(body["code"], status, str(body.get("detail") or ""), details, request_id)
    else:
        refused("HTTP_ERROR", status, one_line(str(body)) or f"HTTP {status} without a problem document")


def read_pem(path: Path, option: str = "--pem") -> UserSecretKey:
    """The secret key of a MultiversX wallet PEM file, or one line naming the file and the problem (2)."""
    from multiversx_sdk import UserPEM

    where = f"{option} {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"{where}: no such file")
    except IsADirectoryError:
        fail(f"{where}: is a directory, not a PEM file")
    except PermissionError:
        fail(f"{where}: not readable (permission denied)")
    except UnicodeDecodeError:
        fail(f"{where}: not a PEM file (binary content)")
    except OSError as exc:
        fail(f"{where}: cannot be read ({exc.strerror or exc})")
    if "-----BEGIN" not in text:
        fail(f"{where}: not a PEM file (no '-----BEGIN' line)")
    try:
        return UserPEM.from_text(text).secret_key
    except Exception:  # noqa: BLE001 - the SDK raises ValueError, IndexError, binascii.Error, ...
        fail(f"{where}: not a MultiversX wallet PEM (its content is not a 32-byte secret key)")


_ECHOED = frozenset(
    {"int_parsing", "int_type", "bool_parsing", "float_parsing", "literal_error", "enum"}
    | {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
)


def settings_problem(exc: ValueError) -> str:
    """A settings error on one line, each field with its environment variable: `metrics_port
    (GASLESS_METRICS_PORT): Input should be a valid integer ... (got 'lots')`."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return one_line(str(exc))
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        name = f"{field} (GASLESS_{field.upper()})" if field else "settings"
        # The value only for numbers and choices: a secret or a URL with a password is never echoed.
        given = f" (got {error['input']!r})" if error["type"] in _ECHOED else ""
        parts.append(f"{name}: {error['msg']}{given}")
    return one_line("; ".join(parts))


def invalid_settings(exc: ValueError) -> NoReturn:
    fail(settings_problem(exc), EXIT_USAGE, label="invalid settings")
