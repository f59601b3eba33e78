"""tpuready's types: mypy (pinned in requirements.txt, configured in pyproject.toml) finds no
error, and every `# type: ignore` left in the package names its error code and says why."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize

import pytest
from conftest import REPOSITORY

# `# type: ignore[code, ...]  # the reason`: a code, then a second comment with some words.
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
_IGNORE_WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[\w\-, ]+\]\s*#\s*\S")


def ignores_without_reason(source: str) -> list[int]:
    """The lines of `source` whose `# type: ignore` lacks an error code or a reason after it.

    Read with `tokenize`, so only real comments count (never the text of a string).
    """
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or not _IGNORE.search(token.string):
            continue
        if not _IGNORE_WITH_REASON.search(token.string):
            lines.append(token.start[0])
    return lines


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = f()  # type: ignore\n", [1]),
        ("x = f()  # type: ignore[attr-defined]\n", [1]),
        ("x = f()  # type: ignore[attr-defined]  #\n", [1]),
        ("\nx = f()  # type:ignore[misc, assignment]  # patched on purpose\n", []),
        ("x = f()  # type: ignore  # no code, only a reason\n", [1]),
        ('x = "# type: ignore"  # a string, not a comment\n', []),
        ("x = 1\ny = f()  # type: ignore[arg-type]\nz = 2\n", [2]),
    ],
)
def test_an_ignore_needs_an_error_code_and_a_reason(source: str, expected: list[int]) -> None:
    assert ignores_without_reason(source) == expected


def test_every_type_ignore_in_tpuready_has_a_code_and_a_reason() -> None:
    sources = sorted((REPOSITORY / "tpuready").rglob("*.py"))
    assert sources, "no tpuready sources found"
    bare = [
        f"{path.relative_to(REPOSITORY)}:{line}"
        for path in sources
        for line in ignores_without_reason(path.read_text(encoding="utf-8"))
    ]
    assert not bare, "write `# type: ignore[code]  # why` (or fix the type) at: " + ", ".join(bare)


def test_mypy_finds_no_error_in_tpuready() -> None:
    # The settings and the package list come from pyproject.toml's [tool.mypy], as in make lint.
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert completed.returncode == 0, output
    assert errors == [], output
    assert "Success: no issues found" in completed.stdout, output
