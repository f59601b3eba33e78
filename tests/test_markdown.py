"""tpuready.pages.markdown.table: what goes in comes back out of the Markdown, cell by cell."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuready.pages.markdown import table


def _read_back(markdown: str) -> list[list[str]]:
    """The cells of each line of a pipe table, split on unescaped pipes, unescaped."""
    rows = []
    for line in markdown.splitlines():
        inner = line.strip()[1:-1]
        cells = re.split(r"(?<!\\)\|", inner)
        rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


# Cells as the generated pages write them: text with spaces, code spans, pipes, no newline.
_CELL = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="\\"
    ),
    max_size=12,
).map(str.strip)


@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda width: st.tuples(
            st.lists(_CELL.filter(bool), min_size=width, max_size=width),
            st.lists(st.lists(_CELL, min_size=width, max_size=width), max_size=5),
        )
    )
)
def test_every_cell_reads_back_as_written(header_and_rows) -> None:
    header, rows = header_and_rows
    lines = _read_back(table(header, rows))
    assert lines[0] == header
    assert set("".join(lines[1])) <= {"-", ":"}  # the separator line
    assert lines[2:] == rows


def test_numbers_are_written_as_given_not_reformatted() -> None:
    markdown = table(("Chip", "GB/s"), [("v5e", "819"), ("v7", "7,380"), ("H100", "3350.0")])
    assert _read_back(markdown)[2:] == [["v5e", "819"], ["v7", "7,380"], ["H100", "3350.0"]]


def test_a_pipe_inside_a_cell_does_not_split_it() -> None:
    assert "`a \\| b`" in table(("Call",), [("`a | b`",)])


def test_a_row_with_the_wrong_number_of_cells_is_refused_by_number() -> None:
    with pytest.raises(ValueError, match=r"row 2 has 1 cells for 2 columns"):
        table(("Chip", "Tile"), [("v5e", "128x128"), ("v7",)])
