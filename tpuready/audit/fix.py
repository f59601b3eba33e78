"""Port a CUDA-only script in one command: rewrite the CUDA ties `tpuready.audit` finds, where
a rewrite is safe, and say what is left and why.

Taught in `notebooks/02_train_save_and_audit_on_any_device.ipynb` (the `--diff` of
`notebooks/examples/train_cuda_only.py`). `fix_source(text)` and `fix_file(path)` return a
`FixResult`; `python -m tpuready audit-source --fix PATH...` (the one command line, in
`tpuready.__main__`) writes the files, `--diff` prints a unified diff instead. The code is
rewritten with libcst, so comments and formatting are kept; a second run changes nothing.

What it rewrites (each keeps the code's behaviour on a CUDA GPU, where `device` is `cuda`):

- `x.cuda()` / `x.cuda(non_blocking=True)` -> `x.to(device)` / `x.to(device, non_blocking=True)`.
- `torch.cuda.X` -> its spelling in `tpuready.accelerator_api`'s table, for the entries whose
  replacement is the same call with the same arguments (`torch.cuda.synchronize()` ->
  `torch.accelerator.synchronize()`, `torch.cuda.manual_seed_all(s)` -> `torch.manual_seed(s)`).
  Calls that raise on a machine with no accelerator (synchronize, memory statistics, ...) are
  rewritten only as a statement of their own, under `if torch.accelerator.is_available():`.
- `torch.cuda.amp.autocast(...)` -> `torch.amp.autocast(device.type, ...)` (float16 on CUDA,
  as before; bfloat16 on a TPU and the CPU, their autocast default) and
  `torch.cuda.amp.GradScaler(...)` -> `torch.amp.GradScaler(device.type, ...,
  enabled=device.type == "cuda")`: loss scaling only where autocast is float16.
- A `"cuda"` device string -> `device` where a device is expected (`.to("cuda")`,
  `torch.device("cuda")`, `device="cuda"`, `map_location="cuda"`), `device.type` where a device
  type is (`device_type="cuda"`, `torch.autocast("cuda")`) or where the value stays a string
  (a name compared with `"cuda"` later keeps a string: `device.type`). The whole
  `"cuda" if torch.cuda.is_available() else "cpu"` (or `"cuda:0"`) becomes `device`; a name
  assigned `device = "cuda"` becomes the device choice itself.
- `init_process_group("nccl")` / `backend="nccl"` -> no backend (PyTorch picks the
  machine accelerator's).
- `pin_memory=True` -> `pin_memory=torch.accelerator.is_available()`.
- `assert torch.cuda.is_available()` -> `assert torch.accelerator.is_available()`: a script
  that needed a GPU needs an accelerator (its message is kept as written).

When the rewritten code names `device` and the module defines none at module level, one
statement `device = torch.accelerator.current_accelerator(check_available=True) or
torch.device("cpu")` (wrapped in parentheses over four lines, so it fits 79 columns) is added
after the imports (and `import torch` when the module lacks it).

Code inside an explicit CUDA guard (`if torch.cuda.is_available():`, `if device.type ==
"cuda":`, `x if torch.cuda.is_available() else y`) is left alone: it is correct as it stands.
So is every `torch.cuda` name the audit reports as `guarded` (`tpuready.audit`'s verdict, not
a second opinion): `@unittest.skipUnless(torch.cuda.is_available(), ...)`,
`torch.cuda.is_available() and torch.version.hip is None`, code under `if args.cuda:`. A flag
the file sets from a CUDA probe (`use_cuda = torch.cuda.is_available()`) is ported, and so is
the code it guards.
What cannot be fixed safely is left and reported with advice: a device index (`"cuda:1"`,
`f"cuda:{local_rank}"`, `.cuda(local_rank)`, `.to(local_rank)`, `device_ids=[local_rank]`),
cuDNN and CUDA backend settings, and `torch.cuda` names with no same-argument replacement.

Which audit rules are rewritten, and which leave a line CUDA-only (so that no CUDA check is
ported over it), is the `fix` column of `tpuready.audit.rules.RULE_TABLE`, read here as
`FIXED_RULES` and `LEFT_CUDA_ONLY_RULES`. This module decides what to rewrite from the audit's
findings and reports what is left; `tpuready.audit.fix_facts` reads a module's imports and device
bindings, and `tpuready.audit.fix_rewriter` holds the libcst transformer.

Notebooks (`fix_notebook`) are rewritten cell by cell, as one module: imports in any cell
resolve names in every cell, and the device line goes once into the first cell that imports
torch. Cells tagged `cuda-on-purpose` are left alone; cells that are not plain Python (IPython
magics) are left and reported.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import libcst as cst
import nbformat

from tpuready.audit import (
    GUARDED,
    MUST_CHANGE,
    PICKS_FLOAT16,
    RULE_TABLE,
    RULES,
    Finding,
    audit_code,
)
from tpuready.audit.fix_facts import ModuleFacts, binds_device, module_facts
from tpuready.audit.fix_rewriter import (
    CHOOSE_DEVICE,
    DEVICE_LINE,
    DIRECT,
    NEEDS_AN_ACCELERATOR,
    Change,
    Protection,
    Rewriter,
    StatementPositions,
    direct_replacements,
    insertion_index,
    is_import_line,
    put_back,
    stand_in_text,
)
from tpuready.audit.sources import (
    CUDA_ON_PURPOSE_TAG,
    IPYTHON_ONLY_LINE,
    AuditConfig,
    AuditInputError,
    cycle_collection_paused,
    find_source_files_and_unreadable,
    ignored_rules_by_line,
    load_config,
    load_notebook,
    parse_python,
    python_of_cell,
    python_of_ipython,
    read_python_and_encoding,
)
from tpuready.audit.sources import (
    MAX_FILE_BYTES as AUDIT_MAX_FILE_BYTES,
)
from tpuready.audit.syntax import LEAVE_CUDA_ONLY, REWRITE

__all__ = [
    "CHOOSE_DEVICE",
    "DEVICE_LINE",
    "EXIT_CLEAN",
    "EXIT_LEFT",
    "EXIT_UNREADABLE",
    "FIXED_RULES",
    "LEFT_CUDA_ONLY_RULES",
    "MAX_FILE_BYTES",
    "NEEDS_AN_ACCELERATOR",
    "Change",
    "FixInputError",
    "FixResult",
    "LeftUnfixed",
    "NotebookFixResult",
    "direct_replacements",
    "fix_file",
    "fix_notebook",
    "fix_source",
    "run_fix",
]

# What the fixer does with each audit rule is the `fix` column of `RULE_TABLE`; these are its
# two lists. Rules it rewrites (where safe: a rank's own index is left):
FIXED_RULES: frozenset[str] = frozenset(rule.id for rule in RULE_TABLE if rule.fix == REWRITE)
# Rules whose lines stay CUDA-only when left: no CUDA check is ported over them.
LEFT_CUDA_ONLY_RULES: frozenset[str] = frozenset(
    rule.id for rule in RULE_TABLE if rule.fix == LEAVE_CUDA_ONLY
)

# Files larger than the audit reads are refused too (libcst holds a whole tree in memory:
# about 1 KB a line); the audit's own limit, so what one skips the other does.
MAX_FILE_BYTES = AUDIT_MAX_FILE_BYTES

EXIT_CLEAN = 0
EXIT_LEFT = 1
EXIT_UNREADABLE = 2


class FixInputError(ValueError):
    """Input the fixer cannot read: a missing file, undecodable bytes, or text that does not
    parse as Python."""


@dataclass(frozen=True)
class LeftUnfixed:
    """A must-change finding of the audit on the fixed text: its line and column there, the
    rule, the line's code, and the audit's message (`reason`: what to do instead)."""

    line: int
    rule: str
    code: str
    reason: str
    column: int = 1
    message: str = ""


@dataclass(frozen=True)
class FixResult:
    """The original text, the fixed text, what was changed and what was left."""

    original: str
    fixed: str
    changes: tuple[Change, ...] = field(default_factory=tuple)
    left: tuple[LeftUnfixed, ...] = field(default_factory=tuple)
    # True when the rewrites name a module-level `device` that this text neither defines nor
    # got added (a notebook cell whose device line goes into another cell).
    needs_device_line: bool = False
    # The same for the fresh device name (`chosen_device`) that rewrites name where a scope
    # binds `device` to something else.
    needs_fresh_device_line: bool = False

    @property
    def changed(self) -> bool:
        """True when the fixed text differs from the original."""
        return self.fixed != self.original

    def diff(self, path: str = "<string>") -> str:
        """The change as a unified diff (`a/PATH`, `b/PATH`), empty when nothing changed; a
        last line without a newline (a notebook cell's) is marked as `diff` marks it."""
        lines = difflib.unified_diff(
            self.original.splitlines(keepends=True),
            self.fixed.splitlines(keepends=True),
            fromfile=f"a/{path.lstrip('/')}",
            tofile=f"b/{path.lstrip('/')}",
        )
        return "".join(
            line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n"
            for line in lines
        )


def _may_be_rewritten(findings: Sequence[Finding]) -> bool:
    """True when a finding may be rewritten, or the text does not parse (libcst says why).
    A text with none is not rewritten, so it is never parsed by libcst, the slow half of a
    fix."""
    return any(
        finding.rule == "syntax-error"
        or (
            finding.rule in FIXED_RULES
            and finding.severity != GUARDED
            and not _left_behind(finding)
        )
        for finding in findings
    )


def _audit_with_imports(source: str, aliases: Mapping[str, str]) -> list[Finding]:
    """The audit's findings on `source`, at its own lines. A notebook cell is audited after one
    import line per name its other cells import, so that the audit resolves the same names."""
    imports = [f"import {full} as {name}" for name, full in sorted(aliases.items())]
    prelude = "".join(f"{line}\n" for line in imports)
    shift = len(imports)
    return [
        dataclasses.replace(finding, line=finding.line - shift)
        for finding in audit_code(prelude + source)
        if finding.line > shift
    ]


def _protection(source: str, findings: Sequence[Finding], config: AuditConfig) -> Protection:
    """The lines and rules the fixer leaves alone: where the audit finds only guarded code
    (its verdict, not a second opinion), `# tpuready: ignore` and the config's `skip`."""
    must_change = {finding.line for finding in findings if finding.severity == MUST_CHANGE}
    lines = {
        finding.line
        for finding in findings
        if finding.severity == GUARDED and finding.line not in must_change
    }
    rules_by_line: dict[int, frozenset[str]] = {}
    for line, rules in ignored_rules_by_line(source).items():
        if rules is None:
            lines.add(line)
        else:
            rules_by_line[line] = rules
    return Protection(frozenset(lines), rules_by_line, frozenset(config.skip))


def _left(fixed: str, findings: Sequence[Finding], config: AuditConfig) -> tuple[LeftUnfixed, ...]:
    """What the audit still finds must change in the fixed text, at the fixed text's lines;
    a CUDA check kept over code the fixer leaves CUDA-only says so."""
    lines = fixed.splitlines()
    kept = _kept_checks(fixed, findings)
    return tuple(
        LeftUnfixed(
            line=finding.line,
            rule=finding.rule,
            code=lines[finding.line - 1].strip() if finding.line <= len(lines) else "",
            reason=finding.suggestion,
            column=finding.column,
            message=finding.message + kept.get(finding.line, ""),
        )
        for finding in findings
        if finding.severity == MUST_CHANGE and finding.rule not in config.skip
    )


def _kept_checks(fixed: str, findings: Sequence[Finding]) -> dict[int, str]:
    """For each CUDA check the fixer kept because its branch holds code it leaves CUDA-only
    (porting the check alone would send a TPU into that code), why, by the check's line."""
    behind = sorted({finding.line for finding in findings if _left_behind(finding)})
    checks = {
        finding.line
        for finding in findings
        if finding.rule == "torch-cuda-call" and finding.severity == MUST_CHANGE
    }
    if not behind or not checks - set(behind):
        return {}
    try:
        tree = parse_python(fixed)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    kept: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If | ast.IfExp) or node.test.lineno not in checks:
            continue
        guarded = [
            line
            for line in behind
            if node.lineno <= line <= (node.end_lineno or node.lineno) and line not in checks
        ]
        if guarded:
            shown = ", ".join(str(line) for line in guarded)
            kept[node.test.lineno] = (
                f" (kept by the fixer: it guards line{'s' if len(guarded) > 1 else ''} {shown}, "
                "which the fixer leaves CUDA-only; port them together)"
            )
    return kept


def _left_behind(finding: Finding) -> bool:
    """A must-change finding the rewrite never ports: a per-rank index (reported rules and
    `.cuda(local_rank)`), or a `torch.cuda` member with no same-argument replacement."""
    if finding.severity != MUST_CHANGE:
        return False
    if finding.rule in LEFT_CUDA_ONLY_RULES:
        return True
    if finding.rule in {"cuda-method", "cuda-device-string"}:
        return finding.per_rank  # `.cuda(i)`, f"cuda:{i}"
    if finding.rule == "torch-cuda-call":
        member = finding.cuda_name
        return (
            member is not None
            and member not in DIRECT
            and member not in {"is_available", "device_count", "is_bf16_supported"}
        )
    return False


def fresh_device_name(source: str) -> str:
    """The name rewrites use where a scope binds `device` to another value: `chosen_device`,
    or with underscores added until `source` does not use it."""
    name = "chosen_device"
    while re.search(rf"\b{name}\b", source):
        name += "_"
    return name


@cycle_collection_paused()  # libcst's trees hold no cycles either
def _rewrite(
    source: str,
    *,
    device_line: str = "auto",
    fresh_line: str = "auto",
    fresh_device: str | None = None,
    fresh_everywhere: bool = False,
    bound_elsewhere: frozenset[str] = frozenset(),
    aliases_elsewhere: dict[str, str] | None = None,
    config: AuditConfig | None = None,
) -> FixResult:
    """Rewrite one module (or notebook cell). `device_line`: "auto" adds the device line when
    the rewrites need it, "never" leaves it to another cell, "always" adds it here;
    `fresh_line` does the same for `fresh_device` (default: `fresh_device_name(source)`),
    which `fresh_everywhere` uses in every scope that binds no `device` too;
    `bound_elsewhere`: "torch" / "device" when other cells of the notebook bind them."""
    config = config or AuditConfig()
    findings: list[Finding] | None = None
    if "always" not in (device_line, fresh_line):
        findings = _audit_with_imports(source, aliases_elsewhere or {})
        if not _may_be_rewritten(findings):
            return FixResult(original=source, fixed=source, left=_left(source, findings, config))
    # Statements the rewrite cannot touch are parsed as stand-ins (line numbers kept), and
    # put back after: libcst's parsing and rendering are the slow half of a fix.
    text, replaced = stand_in_text(source, frozenset(f.line for f in findings or ()))
    if findings is None or aliases_elsewhere:  # a notebook cell: its findings come later
        text, replaced = source, []
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        raise FixInputError(
            f"cannot parse (line {error.raw_line}): {error.message}; fix the syntax first"
        ) from error
    except (RecursionError, MemoryError) as error:
        raise FixInputError(f"cannot parse: {type(error).__name__}") from error
    fresh_device = fresh_device or fresh_device_name(source)
    positions = StatementPositions(module, text)
    facts = module_facts(source, module)
    facts.aliases = {**(aliases_elsewhere or {}), **facts.aliases}
    facts.binds_torch = facts.binds_torch or "torch" in bound_elsewhere
    if findings is None or aliases_elsewhere:
        # The audit resolves a file's own imports wherever they stand: only a notebook cell,
        # whose names other cells import, needs a second look with them.
        findings = _audit_with_imports(source, facts.aliases)
    guarded = frozenset(  # and the probes that pick float16 off CUDA: a person ports them
        (finding.line, finding.column)
        for finding in findings
        if finding.severity == GUARDED
        or (finding.rule == "torch-cuda-call" and finding.off_cuda == PICKS_FLOAT16)
    )
    ported_checks = frozenset(  # lines of CUDA checks the audit ports: it judged the other branch
        finding.line
        for finding in findings
        if finding.severity == MUST_CHANGE
        and finding.rule == "torch-cuda-call"
        and finding.off_cuda is not None
    )
    left_behind = frozenset(  # lines the rewrite leaves CUDA-only: no check is ported over them
        finding.line for finding in findings if _left_behind(finding)
    )
    rewriter = Rewriter(
        facts,
        module,
        guarded,
        _protection(source, findings, config),
        ported_checks,
        fresh_device,
        fresh_everywhere,
        left_behind,
        frozenset(finding.line for finding in findings),
        positions,
    )
    if "device" in bound_elsewhere and rewriter.device_scopes[0] is None:
        rewriter.device_scopes[0] = "device"
    fixed = module.visit(rewriter)
    body = list(module.body)
    additions: dict[int, list[cst.BaseStatement]] = {}
    first_import_index = -1
    wants_line = device_line == "always" or (
        device_line == "auto" and rewriter.module_device_needed
    )
    wants_fresh = fresh_line == "always" or (fresh_line == "auto" and rewriter.fresh_device_needed)
    if (
        wants_line
        and wants_fresh
        and "auto" == device_line == fresh_line
        and not binds_device(module.body)
    ):
        # Two device lines with one value: name the fresh one everywhere instead.
        return _rewrite(
            source,
            device_line="never",
            fresh_line="auto",
            fresh_device=fresh_device,
            fresh_everywhere=True,
            bound_elsewhere=bound_elsewhere,
            aliases_elsewhere=aliases_elsewhere,
            config=config,
        )
    if "always" in (device_line, fresh_line):
        rewriter.uses_torch = True
    lines_to_add = [DEVICE_LINE] if wants_line and not binds_device(module.body) else []
    if wants_fresh:
        lines_to_add.append(DEVICE_LINE.replace("device", fresh_device, 1))
    for text in lines_to_add:
        index = insertion_index(module, rewriter.first_device_line, positions.of)
        line = cst.parse_statement(text + "\n")
        additions.setdefault(index, []).append(line.with_changes(leading_lines=[cst.EmptyLine()]))
    if rewriter.uses_torch and not facts.binds_torch:
        # Before the first import (after `from __future__`), where isort would put it.
        first_import = next(
            (
                position
                for position, statement in enumerate(body)
                if is_import_line(statement) and "__future__" not in module.code_for_node(statement)
            ),
            insertion_index(module, None, positions.of),
        )
        additions.setdefault(first_import, []).insert(0, cst.parse_statement("import torch\n"))
        first_import_index = first_import
    new_body: list[cst.BaseStatement] = []
    kept = iter(fixed.body)
    for position, statement in enumerate([*body, None]):
        for added in additions.get(position, []):
            new_body.append(added)
            after = positions.of(body[position - 1]).end.line + 1 if position else 1
            code = module.code_for_node(added).strip()
            rewriter.changes.append(Change(after, "cuda-device-string", f"added `{code}`"))
        if statement is not None:
            kept_statement = next(kept)
            if position in additions and position == first_import_index:
                # The added `import torch` takes the blank lines above the first import.
                new_body[-len(additions[position])] = new_body[
                    -len(additions[position])
                ].with_changes(leading_lines=statement.leading_lines)
                kept_statement = kept_statement.with_changes(leading_lines=())
            new_body.append(kept_statement)
    if additions:
        fixed = fixed.with_changes(body=new_body)
    fixed_text = put_back(fixed.code, replaced)
    if fixed_text != source:  # what is left is what the audit finds in the fixed text
        findings = _audit_with_imports(fixed_text, facts.aliases)
    return FixResult(
        needs_device_line=rewriter.module_device_needed and not wants_line,
        needs_fresh_device_line=rewriter.fresh_device_needed and not wants_fresh,
        original=source,
        fixed=fixed_text,
        changes=tuple(sorted(rewriter.changes, key=lambda change: change.line)),
        left=_left(fixed_text, findings, config),
    )


def fix_source(source: str, *, config: AuditConfig | None = None) -> FixResult:
    """Rewrite the CUDA ties in Python `source` that can be rewritten safely; `config`'s
    `skip` rules are neither rewritten nor reported.

    Raises FixInputError when the text does not parse, TypeError when it is not a str."""
    if not isinstance(source, str):
        raise TypeError(f"source must be Python text (str), got {type(source).__name__}")
    return _rewrite(source, config=config)


def _read_text(path: Path) -> tuple[str, str]:
    """The text of a Python file and its encoding, read as the audit reads it."""
    try:
        return read_python_and_encoding(path)
    except AuditInputError as error:
        raise FixInputError(str(error)) from error


def fix_file(path: str | os.PathLike[str], *, config: AuditConfig | None = None) -> FixResult:
    """`fix_source` on the text of one `.py` file (the file is not written).

    Raises FixInputError naming the file when it cannot be read or parsed."""
    file_path = Path(path)
    if file_path.suffix == ".ipynb":
        raise FixInputError(f"{file_path}: a notebook; use fix_notebook")
    if not file_path.is_file():
        raise FixInputError(f"{file_path}: not a regular file")
    text, _ = _read_text(file_path)
    try:
        return fix_source(text, config=config)
    except FixInputError as error:
        raise FixInputError(f"{file_path}: {error}") from error


# --------------------------------------------------------------------------------------------
# Notebooks


@dataclass(frozen=True)
class NotebookFixResult:
    """A notebook's JSON text before and after, each rewritten code cell's `FixResult` (cells
    numbered 1, 2, ... among code cells, as `tpuready.audit` numbers them), and the code cells
    left as they were because they are not Python even without their IPython lines (`%%bash`;
    their result lists what the audit finds in them). Cells tagged `cuda-on-purpose` are left
    alone and are in neither."""

    original: str
    fixed: str
    cells: tuple[tuple[int, FixResult], ...] = ()
    skipped: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        """True when some cell changed."""
        return any(result.changed for _, result in self.cells)


def _cell_text(cell: dict[str, object]) -> str | None:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        return "".join(source)
    return source if isinstance(source, str) else None


def _mask_ipython(source: str) -> tuple[str, dict[str, str]]:
    """`source` with each IPython-only line (`%time`, `!pip ...`) replaced by a `pass` that
    names it, so that the cell parses and keeps its line numbers; and the stand-ins."""
    lines = source.split("\n")
    originals: dict[str, str] = {}
    for number, line in enumerate(lines):
        match = IPYTHON_ONLY_LINE.match(line)
        if match is not None:
            lines[number] = f"{match.group(1)}pass  # IPython line {number + 1}"
            originals[lines[number]] = line
    return "\n".join(lines), originals


def _unmask_ipython(text: str, originals: dict[str, str]) -> str:
    return "\n".join(originals.get(line, line) for line in text.split("\n"))


def _notebook_text(notebook: dict[str, object]) -> str:
    """The notebook as Jupyter saves it (nbformat's writer); a notebook nbformat cannot write
    (a cell whose metadata is a list, a code cell with no outputs: the audit reads those too)
    is written as JSON with the same indent, keys in their order."""
    try:
        return nbformat.v4.writes(nbformat.from_dict(notebook)) + "\n"
    except (AttributeError, TypeError, KeyError, ValueError):
        return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def fix_notebook(
    path: str | os.PathLike[str], *, config: AuditConfig | None = None
) -> NotebookFixResult:
    """Rewrite the code cells of a `.ipynb` notebook as `fix_source` does a module: imports
    in any cell resolve names in every cell, and the one device line goes after the imports
    of the first cell that imports torch. Outputs are kept (re-run the notebook).

    Raises FixInputError naming the file when it cannot be read or is not a notebook."""
    config = config or AuditConfig()
    notebook_path = Path(path)
    text, _ = _read_text(notebook_path)
    try:  # an nbformat 3 notebook is refused: writing it back as 4 would convert it unasked
        notebook = load_notebook(text, notebook_path, upgrade=False)
    except AuditInputError as error:
        raise FixInputError(str(error)) from error
    cells = notebook["cells"]
    code_cells = [
        cell for cell in cells if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]
    modules: dict[int, tuple[str, cst.Module, ModuleFacts]] = {}
    magic_lines: dict[int, dict[str, str]] = {}
    skipped: list[int] = []
    unparsed: dict[int, str] = {}
    for number, cell in enumerate(code_cells, start=1):
        metadata = cell.get("metadata")
        tags = metadata.get("tags") if isinstance(metadata, dict) else None
        if isinstance(tags, list) and CUDA_ON_PURPOSE_TAG in tags:
            continue  # CUDA-only on purpose, as the audit reads it: left alone
        source = _cell_text(cell)
        module = None
        if source is not None:
            masked, magic_lines[number] = _mask_ipython(source)
            try:
                module = cst.parse_module(masked)
            except (cst.ParserSyntaxError, RecursionError, MemoryError):
                module = None
        if source is None or module is None:
            skipped.append(number)  # not Python even without its IPython lines (%%bash)
            if source is not None:
                unparsed[number] = source
            continue
        facts = ModuleFacts()
        module.visit(facts)
        modules[number] = (masked, module, facts)
    aliases: dict[str, str] = {}
    bound: set[str] = set()
    for _, module, facts in modules.values():
        aliases.update(facts.aliases)
        bound |= {"torch"} if facts.binds_torch else set()
        bound |= {"device"} if binds_device(module.body) else set()
    fresh_device = fresh_device_name("\n".join(source for source, _, _ in modules.values()))

    def rewrite_cells(fresh_everywhere: bool) -> dict[int, FixResult]:
        return {
            number: _rewrite(
                source,
                device_line="never",
                fresh_line="never",
                fresh_device=fresh_device,
                fresh_everywhere=fresh_everywhere,
                bound_elsewhere=frozenset(bound),
                aliases_elsewhere=aliases,
                config=config,
            )
            for number, (source, _, _) in modules.items()
        }

    results = rewrite_cells(fresh_everywhere=False)
    needs_device = any(result.needs_device_line for result in results.values())
    needs_fresh = any(result.needs_fresh_device_line for result in results.values())
    if needs_device and needs_fresh:  # one device line, with the fresh name, for all cells
        results = rewrite_cells(fresh_everywhere=True)
        needs_device = False
    if needs_device or needs_fresh:
        target = next(
            (number for number, (_, _, facts) in modules.items() if facts.binds_torch),
            next(iter(modules)),
        )
        first = results[target]
        second = _rewrite(
            first.fixed,
            device_line="always" if needs_device else "never",
            fresh_line="always" if needs_fresh else "never",
            fresh_device=fresh_device,
            bound_elsewhere=frozenset(bound - {"device"}),
            aliases_elsewhere=aliases,
            config=config,
        )
        results[target] = FixResult(
            original=first.original,
            fixed=second.fixed,
            changes=first.changes + second.changes,
            left=second.left,  # the audit of the final text
        )
    for number, source in unparsed.items():  # not rewritten, but what the audit finds is left
        python = python_of_cell(source)  # None for a cell magic in another language
        findings = [] if python is None else _audit_with_imports(python_of_ipython(python), aliases)
        results[number] = FixResult(source, source, left=_left(source, findings, config))
    result: FixResult | None  # each cell's, then None where a cell has none
    for number, result in list(results.items()):
        if magic_lines.get(number):  # the IPython lines back in place of their stand-ins
            results[number] = dataclasses.replace(
                result,
                original=_unmask_ipython(result.original, magic_lines[number]),
                fixed=_unmask_ipython(result.fixed, magic_lines[number]),
            )
    for number, cell in enumerate(code_cells, start=1):
        result = results.get(number)
        if result is not None and result.changed:
            if isinstance(cell.get("source"), list):
                cell["source"] = result.fixed.splitlines(keepends=True)
            else:
                cell["source"] = result.fixed
    cell_results = tuple(sorted(results.items()))
    fixed = text
    if any(result.changed for _, result in cell_results):
        fixed = _notebook_text(notebook)
    return NotebookFixResult(text, fixed, cell_results, tuple(skipped))


# --------------------------------------------------------------------------------------------
# Command line


def _expand(paths: Sequence[str], stderr: TextIO) -> tuple[list[Path], bool]:
    """The files to fix, found as the audit finds them (`find_source_files_and_unreadable`),
    and whether an input or a folder inside one could not be read (each named on stderr)."""
    files: list[Path] = []
    failed = False
    for given in paths:
        try:
            found, unreadable = find_source_files_and_unreadable([given])
        except AuditInputError as error:
            print(f"tpuready fix: error: {error}", file=stderr)
            failed = True
            continue
        for line in unreadable:
            print(f"tpuready fix: error: {line}", file=stderr)
            failed = True
        files += found
    return files, failed


def _fix_one(path: Path, config: AuditConfig) -> tuple[list[tuple[str, FixResult]], str, str]:
    """Fix one input: (label, result) per module or notebook cell, the new file text and its
    encoding. Raises FixInputError naming the file."""
    shown = path.as_posix()
    if path.suffix not in {".py", ".ipynb"}:
        raise FixInputError(f"{shown}: neither a .py file nor a .ipynb notebook")
    if not path.exists():
        raise FixInputError(f"{shown}: no such file")
    if not path.is_file():
        raise FixInputError(f"{shown}: not a regular file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise FixInputError(
            f"{shown}: {size} bytes, over the {MAX_FILE_BYTES} the fixer reads; split the file"
        )
    if path.suffix == ".ipynb":
        notebook = fix_notebook(path, config=config)
        parts = [(f"{shown}:cell {number}", result) for number, result in notebook.cells]
        return parts, notebook.fixed, "utf-8"
    text, encoding = _read_text(path)
    try:
        result = fix_source(text, config=config)
    except FixInputError as error:
        raise FixInputError(f"{shown}: {error}") from error
    return [(shown, result)], result.fixed, encoding


def run_fix(
    paths: Sequence[str],
    *,
    write: bool,
    stdout: TextIO,
    stderr: TextIO,
    use_config: bool = True,
) -> int:
    """Fix `.py` files and notebooks in place (`write=True`) or print a unified diff
    (`write=False`; one per notebook cell).

    `[tool.tpuready]` of the nearest pyproject.toml applies as it does to the audit (unless
    `use_config` is False): `exclude`d files are neither read nor written, `skip`ped rules are
    neither rewritten nor reported, and neither is a line under `# tpuready: ignore`.
    What is left goes to stderr (so a diff on stdout stays a clean patch): each must-change
    finding the audit makes on the fixed text, at its line there. Returns 0 when nothing
    remains to change, 1 when something is left (with `write=False`, also when the diff is
    not empty), 2 when an input could not be read or parsed (one line naming it)."""
    if not paths:
        print("tpuready fix: error: name at least one .py file, notebook or folder", file=stderr)
        return EXIT_UNREADABLE
    try:
        config = load_config(paths[0], RULES) if use_config else AuditConfig()
    except AuditInputError as error:
        print(f"tpuready fix: error: {error}", file=stderr)
        return EXIT_UNREADABLE
    files, failed = _expand(paths, stderr)
    status = EXIT_UNREADABLE if failed else EXIT_CLEAN
    for path in files:
        shown = path.as_posix()
        if config.excludes(path):
            continue
        try:
            parts, fixed_text, encoding = _fix_one(path, config)
        except FixInputError as error:
            print(f"tpuready fix: error: {error}", file=stderr)
            status = EXIT_UNREADABLE
            continue
        changed = any(result.changed for _, result in parts)
        if write and changed:
            try:
                path.write_bytes(fixed_text.encode(encoding))
            except (OSError, UnicodeEncodeError) as error:
                print(f"tpuready fix: error: cannot write {shown}: {error}", file=stderr)
                status = EXIT_UNREADABLE
                continue
            count = sum(len(result.changes) for _, result in parts)
            print(f"fixed {shown}: {count} changes", file=stdout)
        elif changed:
            for label, result in parts:
                stdout.write(result.diff(label))
            status = max(status, EXIT_LEFT)
        for label, result in parts:
            for item in result.left:
                print(
                    f"{label}:{item.line}:{item.column}  left {item.rule}: {item.message}  ->  "
                    f"{item.reason}",
                    file=stderr,
                )
                status = max(status, EXIT_LEFT)
    return status
