"""`gasless --help` and the paying commands' help, through typer's runner: the commands listed in groups
(serving, paying, relaying, reading, operating), each command once, and the help of the commands that move
credits saying that they do."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from gasless.cli import app

PANELS = {
    "Serving": ["up", "serve", "localnet", "status-site", "mcp"],
    "Paying": ["pricing", "buy", "deposit", "flags", "senders", "x402"],
    "Relaying": ["relay"],
    "Reading": ["auth", "errors", "verify-proof"],
    "Operating": ["admin", "keys"],
}


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def _panels(text: str) -> dict[str, list[str]]:
    """Panel title -> the command names listed in it, in order."""
    panels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        title = re.match(r"[╭+]─ (\w+) ─", line)
        if title:
            current = title[1]
            panels[current] = []
        elif current and (row := re.match(r"[│|] (\S+)\s{2,}", line)):
            panels[current].append(row[1])
    return panels


def test_the_commands_are_listed_by_group() -> None:
    panels = _panels(_help())
    assert list(panels) == ["Options", *PANELS], panels
    for title, names in PANELS.items():
        assert panels[title] == names, (title, panels[title])
    listed = [name for title in PANELS for name in panels[title]]
    assert len(listed) == len(set(listed)), listed


def _words(text: str) -> str:
    """The help's words in order, the box drawn around them removed."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def test_the_commands_that_move_credits_say_so() -> None:
    flags = _words(_help("flags"))
    assert "USDC of credits this call moves into the pay-as-you-go escrow" in flags, flags
    assert "Not given: nothing is moved" in flags and "--payg-auto-topup" in flags, flags
    for command in (["deposit"], ["x402", "topup"]):
        text = _words(_help(*command))
        assert "--to-escrow" in text and "credits pay for relays only from there" in text, text
