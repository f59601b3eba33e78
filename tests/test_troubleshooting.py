"""The troubleshooting page's CPU reproductions run and print what the page quotes.

In `book/reference/troubleshooting.md` a reproduction is a ```python block right after a MyST
comment line `% reproduces: SLUG`, under the label `(reproduce-SLUG)=`. The first ```text
block after it holds lines the code prints (to stdout or stderr) on every machine. In the
table "Errors and their fixes", the last column of a reproduced row links to
`#reproduce-SLUG`; a row that is not reproduced starts that column with "no:" and says why.
Each block runs in its own process group with this venv's Python, bounded by a timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPOSITORY

PAGE = REPOSITORY / "book/reference/troubleshooting.md"
MARKER = re.compile(r"^% reproduces: (?P<slug>[a-z0-9-]+)$")
LINK = re.compile(r"\(#reproduce-(?P<slug>[a-z0-9-]+)\)")
CODE_LINE_LENGTH = 79
TIMEOUT_SECONDS = 90
# Variables that change what torch logs: a block must print what a reader's plain run prints.
LOGGING_VARIABLES = ("TORCH_LOGS", "TORCHDYNAMO_VERBOSE", "TORCH_SHOW_CPP_STACKTRACES")


@dataclass(frozen=True)
class Reproduction:
    """One marked block: its slug, its code and the lines the page says it prints."""

    slug: str
    code: str
    quoted_lines: tuple[str, ...]


def fenced_blocks(lines: list[str]) -> list[tuple[int, str, str]]:
    """Every ``` block of `lines` as (index of its opening line, info string, body)."""
    blocks = []
    index = 0
    while index < len(lines):
        if lines[index].startswith("```"):
            end = lines.index("```", index + 1)
            blocks.append((index, lines[index][3:].strip(), "\n".join(lines[index + 1 : end])))
            index = end
        index += 1
    return blocks


def read_reproductions(text: str) -> dict[str, Reproduction]:
    """The page's marked blocks by slug, each with the text block that follows it."""
    lines = text.splitlines()
    blocks = fenced_blocks(lines)
    reproductions = {}
    for position, (start, info, code) in enumerate(blocks):
        marker = MARKER.match(lines[start - 1]) if start else None
        if marker is None:
            continue
        slug = marker["slug"]
        assert info == "python", f"`% reproduces: {slug}` stands before a {info!r} block"
        following = blocks[position + 1] if position + 1 < len(blocks) else None
        assert following and following[1] == "text", f"no ```text block after {slug!r}"
        quoted = tuple(line.strip() for line in following[2].splitlines() if line.strip())
        assert slug not in reproductions, f"two blocks reproduce {slug!r}"
        reproductions[slug] = Reproduction(slug, code + "\n", quoted)
    stray = [line for line in lines if line.startswith("% reproduces")]
    assert len(stray) == len(reproductions), f"markers not before a block: {stray}"
    return reproductions


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the table "Errors and their fixes", header left out."""
    section = text.split("## Errors and their fixes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def linked_slugs(row: list[str]) -> list[str]:
    """The reproductions that a row's last column links to."""
    return [link["slug"] for link in LINK.finditer(row[-1])]


PAGE_TEXT = PAGE.read_text()
REPRODUCTIONS = read_reproductions(PAGE_TEXT)
ROWS = table_rows(PAGE_TEXT)


def test_the_table_has_its_rows_and_some_are_reproduced() -> None:
    assert len(ROWS) >= 10 and all(len(row) == 4 for row in ROWS)
    assert any(linked_slugs(row) for row in ROWS)


def test_every_row_links_a_reproduction_or_says_why_not() -> None:
    unexplained = [
        row[0]
        for row in ROWS
        if not linked_slugs(row) and not re.match(r"no: needs a [GT]PU", row[-1])
    ]
    assert unexplained == []


def test_every_linked_reproduction_is_on_the_page_under_its_label() -> None:
    missing = [
        slug
        for row in ROWS
        for slug in linked_slugs(row)
        if slug not in REPRODUCTIONS or f"\n(reproduce-{slug})=\n" not in PAGE_TEXT
    ]
    assert missing == []


def test_every_reproduction_is_linked_from_the_table() -> None:
    linked = {slug for row in ROWS for slug in linked_slugs(row)}
    assert set(REPRODUCTIONS) - linked == set()


@pytest.mark.parametrize("slug", sorted(REPRODUCTIONS))
def test_a_reproduction_fits_a_code_block_at_desktop_width(slug: str) -> None:
    reproduction = REPRODUCTIONS[slug]
    too_long = [
        line
        for line in (*reproduction.code.splitlines(), *reproduction.quoted_lines)
        if len(line) > CODE_LINE_LENGTH
    ]
    assert too_long == []


def group_is_alive(group_id: int) -> bool:
    """Whether any process of the process group `group_id` still runs."""
    try:
        os.killpg(group_id, 0)
    except ProcessLookupError:
        return False
    return True


def run_in_own_group(script: Path, folder: Path) -> tuple[int, str, list[str]]:
    """Run `script` in a new session: exit status, stdout and stderr, and the errors seen."""
    env = {k: v for k, v in os.environ.items() if k not in LOGGING_VARIABLES}
    env.update(TMPDIR=str(folder), OMP_NUM_THREADS="1")
    if sys.platform == "linux":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's ranks talk over loopback only
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    problems = []
    try:
        output, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        problems.append(f"still running after {TIMEOUT_SECONDS} s")
    deadline = time.monotonic() + 5
    while group_is_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_is_alive(process.pid):
        os.killpg(process.pid, signal.SIGKILL)
        problems.append("left processes running")
    return process.returncode, output, problems


@pytest.mark.parametrize("slug", sorted(REPRODUCTIONS))
def test_a_reproduction_prints_what_the_page_quotes(slug: str, tmp_path: Path) -> None:
    reproduction = REPRODUCTIONS[slug]
    script = tmp_path / f"{slug}.py"
    script.write_text(reproduction.code)
    returncode, output, problems = run_in_own_group(script, tmp_path)
    assert problems == [] and returncode == 0, output[-4000:]
    quoted = list(reproduction.quoted_lines)
    for row in ROWS:
        message = re.fullmatch(r"`([^`]+)`", row[0])
        if slug in linked_slugs(row) and message:
            quoted.append(message[1])
    assert quoted, f"the page quotes nothing that {slug!r} prints"
    assert [line for line in quoted if line not in output] == [], output[-4000:]
