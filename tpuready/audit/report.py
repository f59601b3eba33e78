"""The audit's reports: findings as text grouped by severity, as JSON, and as GitHub
workflow annotations."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tpuready.audit.syntax import (
    NOTE,
    SEVERITIES,
    SEVERITY_HEADINGS,
    Finding,
)

__all__ = [
    "format_github",
    "format_json",
    "format_text",
]

# --------------------------------------------------------------------------------------------
# Reports


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def format_text(
    findings: Sequence[Finding], files_scanned: int | None = None, files_skipped: int = 0
) -> str:
    """Findings grouped by severity (must change, guarded, notes), one line each
    (`file:line  rule: message  ->  suggestion`), then a summary line such as
    `3 findings in 2 files (5 files scanned)`, or `(5 files scanned, 1 skipped: too large)`."""
    ordered = sorted(findings, key=Finding.sort_key)
    lines: list[str] = []
    for severity in SEVERITIES:
        group = [finding for finding in ordered if finding.severity == severity]
        if group:
            lines.append(f"{SEVERITY_HEADINGS[severity]} ({len(group)}):")
            lines += [str(finding) for finding in group]
    files_with_findings = len({finding.path for finding in ordered})
    summary = f"{_count(len(ordered), 'finding')}"
    if ordered:
        summary += f" in {_count(files_with_findings, 'file')}"
    if files_scanned is not None:
        skipped = f", {files_skipped} skipped: too large" if files_skipped else ""
        summary += f" ({_count(files_scanned, 'file')} scanned{skipped})"
    return "\n".join([*lines, summary]) + "\n"


def format_json(findings: Sequence[Finding]) -> str:
    """The findings as a JSON list of objects with the `Finding` fields (path, cell, line,
    column, rule, severity, message, suggestion, per_rank, off_cuda, cuda_name), in report
    order."""
    ordered = sorted(findings, key=Finding.sort_key)
    return json.dumps([finding.to_dict() for finding in ordered], indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_github(findings: Sequence[Finding]) -> str:
    """GitHub Actions workflow commands, one per finding: `::warning file=F,line=L,col=C,
    title=T::message -> suggestion` (`::notice` for notes), shown on the pull request's diff."""
    lines = []
    for finding in sorted(findings, key=Finding.sort_key):
        command = "notice" if finding.severity == NOTE else "warning"
        title = f"tpuready {finding.rule} ({finding.severity})"
        if finding.cell is not None:
            title += f" cell {finding.cell}"
        lines.append(
            f"::{command} file={_escape_property(finding.path)},line={finding.line},"
            f"col={finding.column},title={_escape_property(title)}::"
            f"{_escape_data(f'{finding.message} -> {finding.suggestion}')}"
        )
    return "".join(line + "\n" for line in lines)
