"""Tests for `tpuready.audit.report`: the audit's findings as text grouped by severity, as JSON
and as GitHub workflow annotations, each in report order."""

from __future__ import annotations

import json

from conftest import REPOSITORY

from tpuready import audit
from tpuready.audit.report import format_github, format_json, format_text
from tpuready.audit.syntax import GUARDED, MUST_CHANGE, NOTE, Finding

FIXTURES = REPOSITORY / "tests" / "fixtures" / "audit"


def finding(path: str, line: int, severity: str = MUST_CHANGE, cell: int | None = None) -> Finding:
    return Finding(
        path=path,
        cell=cell,
        line=line,
        column=5,
        rule="cuda-method",
        severity=severity,
        message="`.cuda()` moves to a CUDA GPU only, 100%: a, b",
        suggestion=".to(device)",
    )


# Out of order on purpose: every report sorts by file, cell, line.
FINDINGS = [
    finding("b.py", 3, NOTE),
    finding("a.py", 9),
    finding("a.py", 2, GUARDED),
    finding("a.py", 4),
    finding("nb.ipynb", 1, cell=2),
]


def test_text_report_groups_by_severity() -> None:
    text = audit.format_text(audit.audit_file(FIXTURES / "issue9" / "guarded.py"))
    headings = [line for line in text.splitlines() if line.endswith("):")]
    assert headings[0] == "must change (1):"
    assert headings[1].startswith("guarded: review") and headings[1].endswith("(7):")


def test_text_report_sorts_each_group_and_counts_files() -> None:
    lines = format_text(FINDINGS, files_scanned=4, files_skipped=1).splitlines()
    located = [line.split("  ")[0] for line in lines if not line.endswith("):")]
    assert located[:3] == ["a.py:4", "a.py:9", "nb.ipynb:cell 2:line 1"]  # must change
    assert located[3:5] == ["a.py:2", "b.py:3"]  # guarded, then the note
    assert lines[-1] == "5 findings in 3 files (4 files scanned, 1 skipped: too large)"
    assert format_text([], files_scanned=1).splitlines()[-1] == "0 findings (1 file scanned)"


def test_json_report_is_every_field_in_report_order() -> None:
    objects = json.loads(format_json(FINDINGS))
    assert [(o["path"], o["cell"], o["line"]) for o in objects] == [
        ("a.py", None, 2),
        ("a.py", None, 4),
        ("a.py", None, 9),
        ("b.py", None, 3),
        ("nb.ipynb", 2, 1),
    ]
    assert objects[0] == {**FINDINGS[2].to_dict()}


def test_github_annotations_escape_what_would_end_a_field() -> None:
    lines = format_github(FINDINGS).splitlines()
    assert len(lines) == 5
    assert lines[0] == (
        "::warning file=a.py,line=2,col=5,title=tpuready cuda-method (guarded)::"
        "`.cuda()` moves to a CUDA GPU only, 100%25: a, b -> .to(device)"
    )
    assert lines[3].startswith("::notice file=b.py,line=3,")  # a note is a notice
    assert "title=tpuready cuda-method (must-change) cell 2::" in lines[4]
    weird = finding("dir:one,two.py", 1)
    assert format_github([weird]).startswith("::warning file=dir%3Aone%2Ctwo.py,line=1,")
