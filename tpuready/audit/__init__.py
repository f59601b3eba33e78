"""Find the lines that tie PyTorch code to CUDA, and say what to write instead.

Taught in `notebooks/02_train_save_and_audit_on_any_device.ipynb`. `audit_source(paths)` and
`python -m tpuready audit-source PATH...` run the same function (`run_audit`) over Python
files and notebooks, read with `ast`, never with regular expressions over the text, so the
word "cuda" in a comment, a docstring or a printed message is never a finding. The
`torch.cuda.*` replacements come from `tpuready.accelerator_api`, the table chapter 2 prints.
This module holds the entry points; the rest is split by concern: `tpuready.audit.sources`
reads files, notebooks, pragmas and `[tool.tpuready]`; `tpuready.audit.syntax` is the shared
vocabulary (severities, `Finding`, small readers of syntax); `tpuready.audit.walker` makes
the one pass over each tree; `tpuready.audit.rules` holds each rule's check and `RULE_TABLE`
(add a rule there, with its fixture in `tests/fixtures/audit/`); `tpuready.audit.report`
writes text, JSON and GitHub annotations.

Each finding has a severity:

- `must-change`: the line ties the code to CUDA; port it.
- `guarded`: CUDA-only code inside an explicit guard (`if device.type == "cuda":`,
  `if torch.cuda.is_available():`, the else-branch of their negation), and the probes that
  check for CUDA on purpose outside an `if`: an `and` / `or` that also asks which CUDA
  (`torch.version.hip`, a compute capability), a test-skip decorator's condition. It is
  correct as it stands; review it. A guard that probes for CUDA is never to be "fixed" into a
  probe that is also true on a TPU (`torch.accelerator.is_available()`), and `--fix` leaves
  every probe the audit calls a CUDA guard.
- `note`: worth knowing, but not a tie (float64 in a file that never names a device,
  `torch.inference_mode` in a file that never compiles, a cuDNN or CUDA setting that does
  nothing off CUDA and asks for nothing a TPU lacks, such as `cudnn.benchmark = True`, a file
  skipped for its size).

Each node gives at most one finding. `# tpuready: ignore` in a real comment (read with
`tokenize`) silences every rule on its line, `# tpuready: ignore[float64, pin-memory]` only
those rules. Notebooks are read cell by cell: cells are numbered among code cells from 1 and
lines within the cell (`notebook.ipynb:cell 3:line 2`); cells tagged exactly
`cuda-on-purpose` are exempt; line magics and shell lines go through IPython's own
`TransformerManager` (line numbers kept); `%%time`, `%%timeit`, `%%capture`, `%%prun` and
`%%writefile NAME.py` cells are Python, other cell magics are skipped. Imports anywhere in a
file or notebook resolve names everywhere in it (`import torch.cuda as tc`,
`from torch.backends import cudnn`, and a module alias such as `device_module = torch.cuda`).

A file or cell that does not parse gives one `syntax-error` finding and the scan goes on;
syntax newer than the running Python is said to be so. Every file's syntax is checked, so
one that does not parse is reported whatever it holds; text with no trigger word at all (no
"cuda", ".to(", "double", ...) is only compiled, not parsed into a tree, since no rule could
fire in it, and a statement without one is not walked. The cyclic garbage collector is paused
while trees are built and walked (they hold no cycles). Files over `MAX_FILE_BYTES` are
skipped with a `skipped-file` note, which bounds memory. Columns count characters, not bytes.
A tree of over 2 MB is audited by one worker process per CPU.

The rules (generated from `RULE_TABLE`, one entry per rule):
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpuready.audit.report import format_github, format_json, format_text
from tpuready.audit.rules import (
    CHECKS_BY_NODE_TYPE,
    RULE_BY_ID,
    RULE_TABLE,
    RULES,
)
from tpuready.audit.sources import (
    CUDA_ON_PURPOSE_TAG,
    MAX_FILE_BYTES,
    SKIPPED_DIRECTORIES,
    AuditConfig,
    AuditInputError,
    check_python_syntax,
    cycle_collection_paused,
    find_source_files,
    find_source_files_and_unreadable,
    ignored_rules_by_line,
    is_too_large,
    load_config,
    needs_newer_python,
    parse_python,
    python_of_ipython,
    read_notebook_cells,
    read_python,
)
from tpuready.audit.syntax import (
    CHOOSE_DEVICE,
    GUARDED,
    MUST_CHANGE,
    NOTE,
    OFF_CUDA_BRANCH,
    ONE_DEVICE_PER_PROCESS,
    PICKS_FLOAT16,
    SEVERITIES,
    TRIGGER_WORDS,
    Finding,
    Rule,
    per_rank_advice,
)
from tpuready.audit.walker import (
    BFLOAT16_OFF_CUDA,
    Auditor,
    FileFacts,
    collect_facts,
)

__all__ = [
    "BFLOAT16_OFF_CUDA",
    "CHOOSE_DEVICE",
    "CUDA_ON_PURPOSE_TAG",
    "GUARDED",
    "MAX_FILE_BYTES",
    "MUST_CHANGE",
    "NOTE",
    "OFF_CUDA_BRANCH",
    "ONE_DEVICE_PER_PROCESS",
    "PICKS_FLOAT16",
    "RULES",
    "RULE_TABLE",
    "SEVERITIES",
    "SKIPPED_DIRECTORIES",
    "AuditConfig",
    "AuditInputError",
    "AuditResult",
    "Finding",
    "Rule",
    "audit_code",
    "audit_file",
    "audit_notebook",
    "audit_source",
    "find_source_files",
    "format_github",
    "format_json",
    "format_text",
    "load_config",
    "per_rank_advice",
    "run_audit",
]

PathArgument = str | os.PathLike[str]

__doc__ = (__doc__ or "") + "".join(
    f"\n- `{rule.id}` ({rule.severity}): {rule.description}." for rule in RULE_TABLE
)


# --------------------------------------------------------------------------------------------
# Auditing text, files, notebooks


def syntax_error_finding(error: SyntaxError, source: str, path: str, cell: int | None) -> Finding:
    if needs_newer_python(error, source):
        running = f"{sys.version_info.major}.{sys.version_info.minor}"
        message = f"needs Python 3.12 to parse (this is Python {running}): {error.msg}"
        suggestion = "run the audit with Python 3.12 or newer (nothing here was checked)"
    else:
        message = f"could not parse: {error.msg}"
        suggestion = RULE_BY_ID["syntax-error"].advice
    return Finding(
        path=path,
        cell=cell,
        line=error.lineno or 1,
        column=max(error.offset or 1, 1),
        rule="syntax-error",
        message=message,
        suggestion=suggestion,
    )


_TRIGGER_TEXTS = tuple(sorted({word.lower() for word in (*TRIGGER_WORDS, "nccl")}))


def _alias_pattern(aliases: Mapping[str, str]) -> re.Pattern[str] | None:
    """An imported name that stands for a trigger word (`tc` for `torch.cuda`), or None."""
    words = sorted(
        rf"\b{re.escape(local.lower())}\b"
        for local, full in aliases.items()
        if local != full and any(word in full for word in TRIGGER_WORDS)
    )
    if not words:
        return None
    key = "|".join(words)
    pattern = _ALIAS_PATTERNS.get(key)
    if pattern is None:
        if len(_ALIAS_PATTERNS) > 256:
            _ALIAS_PATTERNS.clear()
        pattern = _ALIAS_PATTERNS[key] = re.compile(key)
    return pattern


_LINE_END = re.compile(r"\r\n|\r|\n")
_ALIAS_PATTERNS: dict[str, re.Pattern[str]] = {}


def trigger_lines(source: str, aliases: Mapping[str, str]) -> list[int]:
    """The numbers of the lines that hold a trigger word, ascending (lines as `ast` counts
    them: a form feed does not end a line). `str.find` per word: faster than one regex."""
    # "İ".lower() is two characters, which would shift every offset after it.
    lowered = source.replace("\u0130", "I").lower()
    starts: list[int] = []
    for word in _TRIGGER_TEXTS:
        at = lowered.find(word)
        while at >= 0:
            starts.append(at)
            at = lowered.find(word, at + 1)
    alias_pattern = _alias_pattern(aliases)
    if alias_pattern is not None:
        starts += [match.start() for match in alias_pattern.finditer(lowered)]
    starts.sort()
    lines: list[int] = []
    if "\r" in source:
        line_ends = [match.start() for match in _LINE_END.finditer(source)]
        for start in starts:
            line = bisect.bisect_left(line_ends, start) + 1
            if not lines or lines[-1] != line:
                lines.append(line)
        return lines
    line, counted_to = 1, 0
    for start in starts:
        line += source.count("\n", counted_to, start)
        counted_to = start
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _may_have_findings(source: str, aliases: Mapping[str, str]) -> bool:
    """False when no rule can fire: every finding needs a trigger word in the text, or a name
    imported elsewhere (another notebook cell) that stands for one, like `amp`."""
    if any(word in source for word in TRIGGER_WORDS) or "nccl" in source.lower():
        return True
    return any(
        local in source
        for local, full in aliases.items()
        if local != full and any(word in full for word in TRIGGER_WORDS)
    )


def _audit_tree(
    tree: ast.AST, source: str, facts: FileFacts, path: str, cell: int | None
) -> list[Finding]:
    if not _may_have_findings(source, facts.aliases):
        return []
    lines = None if source.isascii() else re.split(r"\r\n|\r|\n", source)
    auditor = Auditor(facts, path, cell, lines, rules=RULE_BY_ID, checks=CHECKS_BY_NODE_TYPE)
    auditor.run(tree, trigger_lines(source, facts.aliases))
    findings = auditor.findings
    ignored = ignored_rules_by_line(source) if findings else {}
    if ignored:
        findings = [
            finding
            for finding in findings
            if not (
                finding.line in ignored
                and ((rules := ignored[finding.line]) is None or finding.rule in rules)
            )
        ]
    return findings


def audit_code(source: str, path: str = "<string>", *, cell: int | None = None) -> list[Finding]:
    """Audit Python source text; `path` and `cell` only label the findings.

    Chapter 2 uses it on code held in a string. A syntax error gives one `syntax-error` finding.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be Python text (str), got {type(source).__name__}")
    with cycle_collection_paused():
        # The tree is freed inside, as its last reference goes: the collector, back on,
        # would otherwise walk every node once (a tenth of the audit's time).
        findings = _audit_text(source, path, cell)
    return sorted(findings, key=Finding.sort_key)


def _audit_text(source: str, path: str, cell: int | None) -> list[Finding]:
    """The findings of one text, unsorted; the syntax tree dies when this returns."""
    try:
        if not _may_have_findings(source, {}):
            # No rule can fire; only whether it parses is reported, so no tree is built.
            check_python_syntax(source)
            return []
        tree = parse_python(source)
    except SyntaxError as error:
        return [syntax_error_finding(error, source, path, cell)]
    return _audit_tree(tree, source, collect_facts([tree], source), path, cell)


def audit_notebook(path: PathArgument) -> list[Finding]:
    """Audit every code cell of a notebook except those tagged `cuda-on-purpose`."""
    with cycle_collection_paused():
        return _audit_notebook(Path(path))


def _audit_notebook(notebook_path: Path) -> list[Finding]:
    shown = notebook_path.as_posix()
    parsed: list[tuple[int, str, ast.Module | None, SyntaxError | None]] = []
    exempt: set[int] = set()
    for cell in read_notebook_cells(notebook_path):
        if cell.on_purpose:
            exempt.add(cell.number)
        if cell.python is None:
            continue
        python = cell.python
        try:
            parsed.append((cell.number, python, parse_python(python), None))
        except SyntaxError:
            python = python_of_ipython(python)
            try:
                parsed.append((cell.number, python, parse_python(python), None))
            except SyntaxError as error:
                parsed.append((cell.number, cell.python, None, error))
    trees = [tree for _, _, tree, _ in parsed if tree is not None]
    facts = collect_facts(trees, "\n".join(python for _, python, _, _ in parsed))
    findings: list[Finding] = []
    for number, python, tree, syntax_error in parsed:
        if number in exempt:
            continue
        if syntax_error is not None:
            findings.append(syntax_error_finding(syntax_error, python, shown, number))
        elif tree is not None:
            findings += _audit_tree(tree, python, facts, shown, number)
    return sorted(findings, key=Finding.sort_key)


def _skipped_finding(path: Path) -> Finding:
    return Finding(
        path=path.as_posix(),
        line=1,
        column=1,
        rule="skipped-file",
        severity=NOTE,
        message=f"skipped: larger than {MAX_FILE_BYTES:,} bytes (parsing it would need too much "
        "memory)",
        suggestion=RULE_BY_ID["skipped-file"].advice,
    )


def audit_file(path: PathArgument) -> list[Finding]:
    """Audit one `.py` file or `.ipynb` notebook. Raises AuditInputError if it cannot be read."""
    file_path = Path(path)
    if is_too_large(file_path):
        return [_skipped_finding(file_path)]
    if file_path.suffix == ".ipynb":
        return audit_notebook(file_path)
    return audit_code(read_python(file_path), file_path.as_posix())


@dataclass
class AuditResult:
    """What `run_audit` found: the findings, how many files were read and how many of them
    were too large to audit (`files_skipped`, each also a `skipped-file` note), and one line
    per file or folder that could not be read (`errors`) or that made the audit itself fail
    (`internal_errors`)."""

    findings: list[Finding]
    files_scanned: int
    files_skipped: int = 0
    errors: list[str] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)


def _audit_one(path: Path) -> tuple[list[Finding], str | None, str | None]:
    """Audit one file, turning every failure into one line naming it (for worker processes)."""
    try:
        return audit_file(path), None, None
    except AuditInputError as error:
        return [], str(error), None
    except Exception as error:
        return [], None, f"{path}: internal error: {type(error).__name__}: {error}"


# Below this many bytes of source, starting worker processes costs more than it saves.
_PARALLEL_MIN_BYTES = 2_000_000


def _total_bytes(files: Sequence[Path]) -> int:
    total = 0
    for file in files:
        with contextlib.suppress(OSError):
            total += file.stat().st_size
    return total


def run_audit(
    paths: PathArgument | Iterable[PathArgument],
    *,
    config: AuditConfig | None = None,
    use_config: bool = True,
    jobs: int | None = None,
) -> AuditResult:
    """Find the files under `paths`, audit each, and collect findings and errors; the one
    function behind `audit_source` and `python -m tpuready audit-source`.

    `config` defaults to `[tool.tpuready]` of the nearest pyproject.toml above the first path
    (unless `use_config` is False). `jobs` worker processes audit files in parallel when the
    tree is large (default: the CPU count); a missing or bad path raises AuditInputError.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    paths = list(paths)
    files, unreadable = find_source_files_and_unreadable(paths)
    if config is None:
        config = load_config(paths[0], RULES) if use_config else AuditConfig()
    files = [file for file in files if not config.excludes(file)]
    workers = min(jobs or os.cpu_count() or 1, len(files))
    if workers > 1 and _total_bytes(files) >= _PARALLEL_MIN_BYTES:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(_audit_one, files, chunksize=8))
    else:
        outcomes = [_audit_one(file) for file in files]
    result = AuditResult(findings=[], files_scanned=0, errors=list(unreadable))
    for findings, error, internal_error in outcomes:
        if error is not None:
            result.errors.append(error)
        elif internal_error is not None:
            result.internal_errors.append(internal_error)
        else:
            result.files_scanned += 1
            result.files_skipped += any(f.rule == "skipped-file" for f in findings)
            result.findings += [f for f in findings if f.rule not in config.skip]
    result.findings.sort(key=Finding.sort_key)
    return result


def audit_source(
    paths: PathArgument | Iterable[PathArgument], *, use_config: bool = True
) -> list[Finding]:
    """Audit files, folders and notebooks; findings sorted by file, cell, line.

    Raises AuditInputError (naming the path) for a missing or unreadable path.
    """
    result = run_audit(paths, use_config=use_config)
    problems = result.errors + result.internal_errors
    if problems:
        raise AuditInputError(problems[0])
    return result.findings
