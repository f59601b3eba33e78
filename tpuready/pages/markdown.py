"""Markdown tables for the pages tpuready generates: one writer, through tabulate."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate

__all__ = ["table"]


def _cell(value: object) -> str:
    """A cell's text, with a pipe escaped so it cannot end the cell early."""
    return str(value).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; cells are written as given (numbers not reparsed)."""
    body = [list(map(_cell, row)) for row in rows]
    for number, row in enumerate(body, start=1):
        if len(row) != len(header):
            raise ValueError(
                f"row {number} has {len(row)} cells for {len(header)} columns "
                f"({list(header)}): {row}; give every row one cell per column"
            )
    return tabulate(
        body, headers=[_cell(label) for label in header], tablefmt="github", disable_numparse=True
    )
