"""tpuready's types: every `# type: ignore` left in the package names its error code and says
why. mypy itself (pinned in requirements.txt, configured in pyproject.toml) runs in `make lint`,
once, rather than again here."""

from __future__ import annotations

import io
import re
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
