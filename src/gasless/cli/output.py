"""The CLI's rich consoles: drawn to the terminal's width on a terminal; anywhere else (a pipe, a file, a CI
log) never cut, wrapped or ellipsised, so addresses (62 characters) and hashes (64) survive `| grep` whole
and a line stays one line. Tables still size to their content; on a terminal their cells fold (an address or a
hash continues on the next line) and are never cut or ellipsised (`key_value_table`, `folding_table`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# No line the CLI prints comes near this; rich lays tables out by content, so nothing is padded to it.
UNBOUNDED_WIDTH = 1_000_000


class CliConsole(Console):
    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        size = super().size
        # Checked at each print: typer's test runner and redirections swap the stream after start-up.
        return size if self.is_terminal else ConsoleDimensions(UNBOUNDED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def shown(value: Any) -> str:
    """A value as the CLI prints it: JSON spelling (`true`, `false`, `null` as `-`), never Python's."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def key_value_table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    """A two-column table (key, value) whose values fold at the width instead of being cut: an address, a
    hash or a number is printed whole, over several lines when the terminal is narrow."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, Text) else escape(shown(value)))
    return table


def folding_table(title: str, columns: Iterable[str]) -> Table:
    """A table with a header whose every cell folds (wraps inside a word) rather than being cut."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def print_records(
    console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Rows as one table when it fits the console's width whole; else each row as its own key/value table
    (titled by its first column), so no cell has to be folded mid-word to fit a narrow terminal."""
    table = folding_table(title, columns)
    for row in rows:
        table.add_row(*(escape(shown(value)) for value in row))
    natural = Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    for row in rows:
        heading = f"{title}: {columns[0]} {shown(row[0])}"
        console.print(key_value_table(heading, list(zip(columns[1:], row[1:], strict=True))))
