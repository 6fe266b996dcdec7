"""The CLI's rich consoles: drawn to the terminal's width on a terminal; anywhere else (a pipe, a file, a CI
log) never cut, wrapped or ellipsised, so addresses (62 characters) and hashes (64) survive `| grep` whole
and a line stays one line. Tables still size to their content."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

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
