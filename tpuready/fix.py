"""Port a CUDA-only script in one command: rewrite the CUDA ties `tpuready.audit` finds, where
a rewrite is safe, and say what is left and why.

Taught in `notebooks/01_device_agnostic_basics.ipynb` (the `--diff` of
`notebooks/examples/train_cuda_only.py`). `fix_source(text)` and `fix_file(path)` return a
`FixResult`; `python -m tpuready audit-source --fix PATH...` (or `python -m tpuready.fix`)
writes the files, `--diff` prints a unified diff instead. The code is rewritten with libcst, so
comments and formatting are kept; a second run changes nothing.

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

Notebooks (`fix_notebook`) are rewritten cell by cell, as one module: imports in any cell
resolve names in every cell, and the device line goes once into the first cell that imports
torch. Cells tagged `cuda-on-purpose` are left alone; cells that are not plain Python (IPython
magics) are left and reported.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import libcst as cst
import nbformat
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from tpuready.accelerator_api import CUDA_TO_ACCELERATOR
from tpuready.audit import (
    GUARDED,
    MUST_CHANGE,
    PICKS_FLOAT16,
    RULES,
    Finding,
    audit_code,
)
from tpuready.audit_sources import (
    IPYTHON_ONLY_LINE,
    AuditConfig,
    AuditInputError,
    cycle_collection_paused,
    find_source_files_and_unreadable,
    ignored_rules_by_line,
    load_config,
    load_notebook,
    python_of_cell,
    python_of_ipython,
    read_python_and_encoding,
)
from tpuready.audit_sources import (
    MAX_FILE_BYTES as AUDIT_MAX_FILE_BYTES,
)
from tpuready.audit_syntax import _RANK_LIKE_NAME, DEVICE_CHOICE, _dotted_parts

__all__ = [
    "CHOOSE_DEVICE",
    "DEVICE_LINE",
    "EXIT_CLEAN",
    "EXIT_LEFT",
    "EXIT_UNREADABLE",
    "FIXED_RULES",
    "MAX_FILE_BYTES",
    "NEEDS_AN_ACCELERATOR",
    "REPORTED_RULES",
    "Change",
    "FixInputError",
    "FixResult",
    "LeftUnfixed",
    "NotebookFixResult",
    "direct_replacements",
    "fix_file",
    "fix_notebook",
    "fix_source",
    "main",
    "run_fix",
]

CHOOSE_DEVICE = DEVICE_CHOICE  # the expression `--fix` writes where a device is chosen
# The statement `--fix` adds, wrapped as chapter 1 writes it so it fits a 79-column file.
DEVICE_LINE = (
    "device = (\n"
    "    torch.accelerator.current_accelerator(check_available=True)\n"
    '    or torch.device("cpu")\n'
    ")"
)

# The audit rules (`tpuready.audit.RULES`) whose findings the fixer rewrites; what it cannot
# rewrite safely under these rules it reports as left.
FIXED_RULES: frozenset[str] = frozenset(
    {
        "cuda-method",
        "torch-cuda-call",
        "cuda-device-string",
        "cuda-amp",
        "nccl-backend",
        "pin-memory",
    }
)

# Audit rules the fixer never rewrites but reports where it sees them, with advice.
REPORTED_RULES: frozenset[str] = frozenset(
    {
        "to-int-device",
        "set-device-index",
        "ddp-device-ids",
        "cudnn-setting",
        "cuda-backend-setting",
        "cuda-only-package",
    }
)

# `torch.cuda` names whose table replacement raises RuntimeError on a machine with no
# accelerator (torch 2.13; checked by tests/test_fix.py): rewritten only as a statement of
# their own, under `if torch.accelerator.is_available():`.
NEEDS_AN_ACCELERATOR: frozenset[str] = frozenset(
    {
        "current_device",
        "set_device",
        "device",
        "synchronize",
        "current_stream",
        "set_stream",
        "empty_cache",
        "memory_allocated",
        "max_memory_allocated",
        "reset_peak_memory_stats",
        "memory_stats",
        "memory_reserved",
        "max_memory_reserved",
        "reset_accumulated_memory_stats",
        "mem_get_info",
    }
)

# Entries with a same-argument replacement whose result differs: never rewritten.
_DIFFERENT_RESULT = frozenset({"get_device_capability"})

_ACCELERATOR_GUARD = "torch.accelerator.is_available()"
CUDA_ON_PURPOSE_TAG = "cuda-on-purpose"  # notebook cells CUDA-only on purpose (see tpuready.audit)

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
class Change:
    """One rewrite, at its line in the original text."""

    line: int
    rule: str
    description: str


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


def direct_replacements() -> dict[str, str]:
    """`torch.cuda` name -> dotted replacement, for the entries of
    `tpuready.accelerator_api.CUDA_TO_ACCELERATOR` whose replacement is the same call with the
    same arguments (or the same class under another name), e.g. "synchronize" ->
    "torch.accelerator.synchronize". `torch.cuda.amp` entries are handled on their own."""
    spelling = re.compile(r"(?P<name>[A-Za-z_][\w.]*)(?:\((?P<arguments>[^()]*)\))?")
    replacements: dict[str, str] = {}
    for entry in CUDA_TO_ACCELERATOR:
        cuda = spelling.fullmatch(entry.cuda_call)
        portable = spelling.fullmatch(entry.replacement)
        if cuda is None or portable is None:
            continue
        if cuda.group("arguments") != portable.group("arguments"):
            continue
        name = cuda.group("name").removeprefix("torch.cuda.")
        if name.startswith("amp") or name in _DIFFERENT_RESULT:
            continue
        replacements[name] = portable.group("name")
    return replacements


_DIRECT = direct_replacements()

# --------------------------------------------------------------------------------------------
# Reading the module


def _dotted(node: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name or Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _string_value(node: cst.CSTNode) -> str | None:
    """The value of a plain string literal (no f-string), else None."""
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under `node`, itself included (iterative: deep expressions do not recurse)."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.children)


class _ModuleFacts(cst.CSTVisitor):
    """What the fixer needs to know before rewriting: imports, and names used as strings."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {"torch": "torch"}
        self.binds_torch = False
        self.string_used: set[str] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            full = _dotted(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = full
            else:
                top = full.split(".")[0]
                self.aliases[top] = top
                if top == "torch":
                    self.binds_torch = True
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = _dotted(node.module) if node.module is not None else None
        if module is None or node.relative or isinstance(node.names, cst.ImportStar):
            return False
        for alias in node.names:
            name = _dotted(alias.name) or ""
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.aliases[local] = f"{module}.{name}"
        return False

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        if any(isinstance(operand, cst.SimpleString | cst.FormattedString) for operand in operands):
            for operand in operands:
                name = _dotted(operand)
                if name is not None:
                    self.string_used.add(name)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        for operand in (node.left, node.right):
            name = _dotted(operand)
            if name is not None:
                self.string_used.add(name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # `name.startswith(...)`, `name.split(":")`: a string method on the name.
        if node.attr.value not in {"type", "index"}:
            name = _dotted(node.value)
            if name is not None and not name.startswith("torch"):
                self.string_used.add(name)


def _module_facts(source: str, module: cst.Module) -> _ModuleFacts:
    """`_ModuleFacts` of `source`, read from Python's own syntax tree (several times faster
    than a libcst pass); from `module` where `ast` refuses the text."""
    facts = _ModuleFacts()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        module.visit(facts)
        return facts
    imports: list[ast.Import | ast.ImportFrom] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(node)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_text_literal(operand) for operand in operands):
                facts.string_used.update(_ast_dotted_names(operands))
        elif isinstance(node, ast.BinOp):
            facts.string_used.update(_ast_dotted_names([node.left, node.right]))
        elif isinstance(node, ast.Attribute) and node.attr not in {"type", "index"}:
            name = _ast_dotted(node.value)  # `name.startswith(...)`: a string method on it
            if name is not None and not name.startswith("torch"):
                facts.string_used.add(name)
    imports.sort(key=lambda node: (node.lineno, node.col_offset))  # the last import wins
    for node in imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    facts.aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    facts.aliases[top] = top
                    facts.binds_torch = facts.binds_torch or top == "torch"
        elif node.module is not None and not node.level and node.names[0].name != "*":
            for alias in node.names:
                facts.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return facts


def _is_text_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
    )


def _ast_dotted(node: ast.AST) -> str | None:
    parts = _dotted_parts(node)
    return ".".join(parts) if parts is not None else None


def _ast_dotted_names(nodes: Sequence[ast.AST]) -> list[str]:
    return [name for node in nodes if (name := _ast_dotted(node)) is not None]


def _binds_device(statements: Sequence[cst.CSTNode]) -> bool:
    """True when these statements (not nested functions or classes) assign `device`."""
    return bool(_device_values(statements))


def _device_values(statements: Sequence[cst.CSTNode]) -> list[cst.BaseExpression | None]:
    """The values these statements (not nested functions or classes) assign to `device`;
    None for a binding whose value is unknown (a loop, `with ... as device`). Only statements
    are walked, never expressions: libcst's `children` costs a visit per node."""
    values: list[cst.BaseExpression | None] = []
    pending = list(statements)
    while pending:
        node = pending.pop()
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            continue
        if isinstance(node, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            pending.extend(node.body)
            continue
        if isinstance(node, cst.Assign):
            if any(_dotted(target.target) == "device" for target in node.targets):
                values.append(node.value)
        elif isinstance(node, cst.AnnAssign | cst.AugAssign):
            if _dotted(node.target) == "device":
                values.append(getattr(node, "value", None))
        elif _binds_device_without_a_value(node):
            values.append(None)
        for attribute in ("body", "orelse", "handlers", "finalbody"):
            child = getattr(node, attribute, None)
            if isinstance(child, cst.CSTNode):
                pending.append(child)
            elif isinstance(child, Sequence) and not isinstance(child, str):
                pending.extend(item for item in child if isinstance(item, cst.CSTNode))
    return values


def _binds_device_without_a_value(node: cst.CSTNode) -> bool:
    """`for device in ...:` or `with ... as device:`."""
    if isinstance(node, cst.For):
        return _dotted(node.target) == "device"
    if isinstance(node, cst.With):
        return any(
            item.asname is not None and _dotted(item.asname.name) == "device"  # type: ignore[arg-type]
            for item in node.items
        )
    return False


def _scope_kind(
    parameters: cst.Parameters | None, statements: Sequence[cst.CSTNode], string_used: bool
) -> str | None:
    """How a scope binds `device`: None (not here), "device" (the device choice, a
    torch.device), "unknown" (the choice or the caller's device, maybe a string) or "other"
    (something else: `device="cpu"`, `device = x.device`, `device = 3`), which the rewrites
    must not capture: they name a fresh module-level device instead."""
    if parameters is not None:
        for parameter in [
            *parameters.posonly_params,
            *parameters.params,
            *parameters.kwonly_params,
        ]:
            if parameter.name.value == "device":
                if parameter.default is not None and not _is_the_choice(parameter.default):
                    return "other"
                annotation = parameter.annotation
                if annotation is not None and _dotted(annotation.annotation) == "torch.device":
                    return "device"
                return "unknown"
    values = _device_values(statements)
    if not values:
        return None
    if not all(value is not None and _is_the_choice(value) for value in values):
        return "other"
    return "unknown" if string_used else "device"


def _is_the_choice(value: cst.BaseExpression) -> bool:
    """True for the device choice, or a CUDA choice the fixer turns into it:
    `current_accelerator(...) or ...`, `choose_device()`, `"cuda"`, `torch.device("cuda")`,
    `"cuda" if torch.cuda.is_available() else "cpu"` (also inside `torch.device(...)`), and
    the program's own choice `torch.device(args.device)`: its model is there, so are inputs."""
    if isinstance(value, cst.BooleanOperation):
        return _is_the_choice(value.left)
    if isinstance(value, cst.Call):
        name = (_dotted(value.func) or "").rsplit(".", 1)[-1]
        if name in {"current_accelerator", "choose_device"}:
            return True
        if name != "device" or len(value.args) != 1:
            return False
        argument = value.args[0].value
        return _string_value(argument) is None or _is_the_choice(argument)
    if _string_value(value) == "cuda":
        return True
    return isinstance(value, cst.IfExp) and _string_value(value.body) == "cuda"


# --------------------------------------------------------------------------------------------
# The rewriter


@dataclass(frozen=True)
class _Protection:
    """What the fixer must leave as it is, from the audit and the config: `lines` where every
    finding is guarded or a bare `# tpuready: ignore` stands, `rules_by_line` for
    `# tpuready: ignore[rule, ...]`, and the config's `skip` rules everywhere."""

    lines: frozenset[int] = frozenset()
    rules_by_line: Mapping[int, frozenset[str]] = field(default_factory=dict)
    skipped_rules: frozenset[str] = frozenset()

    def turns_off(self, change: Change) -> bool:
        """True when `change` is under a rule that is turned off on its line."""
        return change.rule in self.skipped_rules or change.rule in self.rules_by_line.get(
            change.line, frozenset()
        )


class _Rewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(
        self,
        facts: _ModuleFacts,
        module: cst.Module,
        guarded: frozenset[tuple[int, int]] = frozenset(),
        protection: _Protection | None = None,
        ported_checks: frozenset[int] = frozenset(),
        fresh_device: str = "chosen_device",
        fresh_everywhere: bool = False,
        left_behind: frozenset[int] = frozenset(),
        finding_lines: frozenset[int] | None = None,
    ) -> None:
        super().__init__()
        self.left_behind = left_behind
        # Lines holding a finding: a statement with none is not entered (None: enter all).
        self.finding_lines = finding_lines
        self.fresh_everywhere = fresh_everywhere  # one device name per file: the fresh one
        self.facts = facts
        self.module = module
        self.ported_checks = ported_checks
        # (line, 1-based column) of what the audit calls a CUDA check kept on purpose.
        self.guarded = guarded
        self.protection = protection or _Protection()
        self._untouched: set[int] = set()
        self.changes: list[Change] = []
        self.uses_torch = False
        self.module_device_needed = False
        self.fresh_device_needed = False  # `fresh_device` named where a scope binds `device`
        self.fresh_device = fresh_device
        self.first_device_line: int | None = None
        self.device_scopes: list[str | None] = [
            _scope_kind(None, module.body, "device" in facts.string_used)
        ]
        self._call_funcs: set[int] = set()
        self._inner_attributes: set[int] = set()
        self._statement_calls: set[int] = set()
        self._statement_of: dict[int, cst.Call] = {}
        self._set_device_index: dict[int, cst.BaseExpression | None] = {}
        # Bodies of the `if torch.cuda.is_available():` checks the fixer ports, and how many
        # of them enclose the current node: no second accelerator check inside one.
        self._accelerator_bodies: set[int] = set()
        self._accelerator_depth = 0

    # -- lines the fixer must not change -------------------------------------------------

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Skip, whole, a node whose lines are all protected (guarded, or `# tpuready: ignore`),
        and a statement that holds no finding: the fixer changes only what the audit found."""
        lines = self.protection.lines
        if lines:
            span = self.get_metadata(PositionProvider, node, None)
            if span is not None and all(
                line in lines for line in range(span.start.line, span.end.line + 1)
            ):
                self._untouched.add(id(node))
                return False
        if self.finding_lines is not None and isinstance(
            node, cst.SimpleStatementLine | cst.BaseCompoundStatement
        ):
            span = self.get_metadata(PositionProvider, node)
            if not any(
                line in self.finding_lines for line in range(span.start.line, span.end.line + 1)
            ):
                self._untouched.add(id(node))
                return False
        return super().on_visit(node)

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        """Undo a rewrite under a rule that `skip` or `# tpuready: ignore[rule]` turns off."""
        if id(original_node) in self._untouched:
            return updated_node
        if not self.protection.rules_by_line and not self.protection.skipped_rules:
            return super().on_leave(original_node, updated_node)
        count = len(self.changes)
        state = (
            self.uses_torch,
            self.module_device_needed,
            self.fresh_device_needed,
            self.first_device_line,
        )
        result = super().on_leave(original_node, updated_node)
        if not any(self.protection.turns_off(change) for change in self.changes[count:]):
            return result
        del self.changes[count:]
        (
            self.uses_torch,
            self.module_device_needed,
            self.fresh_device_needed,
            self.first_device_line,
        ) = state
        self._statement_calls.discard(id(original_node))
        return updated_node

    # -- helpers --------------------------------------------------------------------------

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _code(self, node: cst.CSTNode) -> str:
        return " ".join(self.module.code_for_node(node).split()).rstrip(", ")

    def _qualify(self, node: cst.BaseExpression) -> str | None:
        name = _dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full_head = self.facts.aliases.get(head)
        if full_head is None:
            return None
        return f"{full_head}.{rest}" if rest else full_head

    def _change(self, node: cst.CSTNode, rule: str, description: str) -> None:
        self.changes.append(Change(self._line(node), rule, description))

    def _torch(self, expression: str) -> cst.BaseExpression:
        self.uses_torch = True
        return cst.parse_expression(expression)

    def _device(
        self, node: cst.CSTNode, *, as_type: bool, outer: bool = False
    ) -> cst.BaseExpression:
        """`device` or its type, as the scope binds `device` (`outer`: the scope around the
        current function, where its parameter defaults are evaluated)."""
        scopes = self.device_scopes[:-1] if outer and len(self.device_scopes) > 1 else None
        scopes = scopes if scopes is not None else self.device_scopes
        kind = next((kind for kind in reversed(scopes) if kind), None)
        if kind is None and self.fresh_everywhere:
            kind = "other"
        if kind is None or kind == "other":
            if kind is None:
                self.module_device_needed = True
            else:
                self.fresh_device_needed = True
            self.uses_torch = True
            line = self._line(node)
            if self.first_device_line is None or line < self.first_device_line:
                self.first_device_line = line
        if kind == "other":
            name = self.fresh_device
            return cst.Name(name) if not as_type else cst.parse_expression(f"{name}.type")
        if not as_type:
            return cst.Name("device")
        if kind == "unknown":
            return self._torch("torch.device(device).type")
        return cst.parse_expression("device.type")

    def _is_cuda_check(self, test: cst.BaseExpression) -> bool:
        """An explicit CUDA guard: `torch.cuda.is_available()`, `torch.cuda.device_count()`,
        or a comparison with a `"cuda..."` string, anywhere in the test."""
        for node in _walk(test):
            if isinstance(node, cst.Call) and self._qualify(node.func) in {
                "torch.cuda.is_available",
                "torch.cuda.device_count",
            }:
                return True
            if isinstance(node, cst.Comparison):
                operands = [node.left, *(target.comparator for target in node.comparisons)]
                if any((_string_value(operand) or "").startswith("cuda") for operand in operands):
                    return True
        return False

    def _is_availability_choice(self, node: cst.IfExp) -> bool:
        """`"cuda" if torch.cuda.is_available() else "cpu"` (or `"cuda:0"`, the same device in
        a process that never calls set_device)."""
        test = node.test
        return (
            isinstance(test, cst.Call)
            and self._qualify(test.func) == "torch.cuda.is_available"
            and _string_value(node.body) in {"cuda", "cuda:0"}
            and _string_value(node.orelse) == "cpu"
        )

    def _device_value(
        self,
        original: cst.BaseExpression,
        updated: cst.BaseExpression,
        *,
        as_type: bool,
        outer: bool = False,
    ) -> cst.BaseExpression:
        """Rewrite a CUDA device string used as a device (or device type); report what cannot
        be rewritten; return `updated` unchanged for anything else."""
        rule = "cuda-device-string"
        text = _string_value(original)
        wanted = "device.type" if as_type else "device"
        if text == "cuda":
            self._change(original, rule, f"{self._code(original)} -> {wanted}")
            return self._device(original, as_type=as_type, outer=outer)
        # A device index ("cuda:1", f"cuda:{rank}", "cuda:" + rank, "cuda:{}".format(rank))
        # is left as it is: the audit reports it with the per-process recipe.
        if text is not None and re.fullmatch(r"cuda:\d+", text):
            return updated
        if isinstance(original, cst.FormattedString | cst.BinaryOperation):
            return updated
        if (
            isinstance(original, cst.Call)
            and isinstance(original.func, cst.Attribute)
            and original.func.attr.value == "format"
            and (_string_value(original.func.value) or "").startswith("cuda:")
        ):
            return updated
        if isinstance(original, cst.IfExp) and isinstance(updated, cst.IfExp):
            if self._is_availability_choice(original):
                self._change(original, rule, f"{self._code(original)} -> {wanted}")
                return self._device(original, as_type=as_type, outer=outer)
            if self._is_cuda_check(original.test):
                branches = (_string_value(original.body), _string_value(original.orelse))
                if not any((branch or "").startswith("cuda") for branch in branches):
                    return updated  # guarded code, correct as it stands
                return updated  # a choice of the CPU on a TPU: left, the audit reports it
            return updated.with_changes(
                body=self._device_value(original.body, updated.body, as_type=as_type, outer=outer),
                orelse=self._device_value(
                    original.orelse, updated.orelse, as_type=as_type, outer=outer
                ),
            )
        if isinstance(original, cst.BooleanOperation) and isinstance(updated, cst.BooleanOperation):
            return updated.with_changes(
                left=self._device_value(original.left, updated.left, as_type=as_type, outer=outer),
                right=self._device_value(
                    original.right, updated.right, as_type=as_type, outer=outer
                ),
            )
        return updated

    # -- guards and imports: not entered ---------------------------------------------------

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def _kept_check(self, test: cst.BaseExpression) -> bool:
        """A CUDA check to leave as it is: one the audit does not ask to port (it guards
        CUDA-only code). One whose other branch falls back to the CPU or exits is ported."""
        if not self._is_cuda_check(test):
            return False
        span = self.get_metadata(PositionProvider, test)
        return not any(
            line in self.ported_checks for line in range(span.start.line, span.end.line + 1)
        )

    def _holds_left_behind_code(self, node: cst.CSTNode) -> bool:
        """True when `node` spans a line the rewrite leaves CUDA-only (`.cuda(args.gpu)`,
        `torch.cuda.set_device(rank)`, `torch.cuda.get_device_name()`): a check ported over
        it would send a TPU into CUDA-only code that the original kept it out of."""
        span = self.get_metadata(PositionProvider, node)
        return any(line in self.left_behind for line in range(span.start.line, span.end.line + 1))

    def visit_If(self, node: cst.If) -> bool:
        if self._kept_check(node.test):
            return False
        if self._is_cuda_check(node.test) and self._holds_left_behind_code(node):
            return False  # left whole: the audit reports the check and what it guards
        test = node.test
        if isinstance(test, cst.Call) and self._qualify(test.func) == "torch.cuda.is_available":
            self._accelerator_bodies.add(id(node.body))  # becomes `if accelerator.is_available()`
        return True

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if id(node) in self._accelerator_bodies:
            self._accelerator_depth += 1

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if id(original_node) in self._accelerator_bodies:
            self._accelerator_depth -= 1
        return updated_node

    def visit_IfExp(self, node: cst.IfExp) -> bool:
        if self._is_cuda_check(node.test) and self._holds_left_behind_code(node):
            return False
        return not self._kept_check(node.test)

    def visit_Assert(self, node: cst.Assert) -> bool:
        """`assert torch.cuda.is_available()` is translated like any other use of the name (a
        script that needs a GPU needs an accelerator); other asserts about CUDA are left."""
        test = node.test
        if isinstance(test, cst.Call) and self._qualify(test.func) == "torch.cuda.is_available":
            return True
        return not self._is_cuda_check(test)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        string_used = "device" in self.facts.string_used
        self.device_scopes.append(_scope_kind(node.params, [node.body], string_used))

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self.device_scopes.pop()
        return updated_node

    # -- torch.cuda names ----------------------------------------------------------------

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._inner_attributes.add(id(node.value))

    def visit_Call(self, node: cst.Call) -> None:
        self._call_funcs.add(id(node.func))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if isinstance(call, cst.Call):
            name = self._qualify(call.func) or ""
            member = name.removeprefix("torch.cuda.")
            position = self.get_metadata(PositionProvider, call.func).start
            if (
                name.startswith("torch.cuda.")
                and member in NEEDS_AN_ACCELERATOR
                and member in _DIRECT
                and (position.line, position.column + 1) not in self.guarded
            ):
                self._statement_calls.add(id(call.func))
                self._statement_of[id(call.func)] = call
                if member == "set_device":
                    self._set_device_index[id(call.func)] = (
                        call.args[0].value if call.args else None
                    )

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement:
        if len(original_node.body) != 1 or not isinstance(original_node.body[0], cst.Expr):
            return updated_node
        call = original_node.body[0].value
        if not (isinstance(call, cst.Call) and id(call.func) in self._statement_calls):
            return updated_node
        if self._accelerator_depth:
            return updated_node  # already under `if torch.accelerator.is_available():`
        inner = updated_node.with_changes(leading_lines=())
        return cst.If(
            test=self._torch(_ACCELERATOR_GUARD),
            body=cst.IndentedBlock(body=[inner]),
            leading_lines=original_node.leading_lines,
        )

    def _rewrite_cuda_name(
        self, original: cst.BaseExpression, updated: cst.BaseExpression
    ) -> cst.BaseExpression:
        name = self._qualify(original)
        if name is None or not name.startswith("torch.cuda."):
            return updated
        position = self.get_metadata(PositionProvider, original).start
        if (position.line, position.column + 1) in self.guarded:
            return updated  # the audit's verdict: a CUDA check on purpose, correct as it is
        member = name.removeprefix("torch.cuda.")
        if member == "amp" or member.startswith("amp."):
            if member not in {"amp.autocast", "amp.GradScaler"} or (
                id(original) not in self._call_funcs
            ):
                return updated  # left: the audit reports it
            return updated  # autocast and GradScaler calls are rewritten in leave_Call
        replacement = _DIRECT.get(member)
        if replacement is None:
            return updated  # left: no same-argument replacement
        if member == "set_device" and id(original) in self._statement_calls:
            index = self._set_device_index.get(id(original))
            if not (isinstance(index, cst.Integer) and index.value == "0"):
                self._statement_calls.discard(id(original))
                return updated  # left: a device index per process
        if member in NEEDS_AN_ACCELERATOR and id(original) not in self._statement_calls:
            return updated  # left: it raises without an accelerator, and is not a statement
        self._change(original, "torch-cuda-call", f"{name} -> {replacement}")
        return self._torch(replacement)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if id(original_node) in self._inner_attributes:
            return updated_node
        name = self._qualify(original_node)
        if name is None:
            return updated_node
        if name.startswith("torch.cuda."):
            return self._rewrite_cuda_name(original_node, updated_node)
        return updated_node  # `torch.cuda` itself and backend settings: left

    # -- calls ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        name = self._qualify(func)
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        last = name.rsplit(".", 1)[-1] if name else (method or _dotted(func) or "")

        if method == "cuda" and name != "torch.cuda":
            return self._fix_cuda_method(original_node, updated_node)
        if isinstance(func, cst.Name) and name and name.startswith("torch.cuda."):
            updated_node = updated_node.with_changes(
                func=self._rewrite_cuda_name(func, updated_node.func)
            )
        if name in {"torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"}:
            return self._fix_amp(original_node, updated_node, name)
        if name == "torch.device":
            return self._fix_torch_device(original_node, updated_node)
        if last in {"init_process_group", "new_group"}:
            updated_node = self._fix_backend(original_node, updated_node, last)
        if name in _DEVICE_FIRST_ARGUMENT or method == "to":
            as_type = _DEVICE_FIRST_ARGUMENT.get(name or "", False)
            updated_node = self._fix_first_argument(original_node, updated_node, as_type=as_type)
        return self._fix_keywords(original_node, updated_node)

    def _fix_cuda_method(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        index = [
            argument
            for argument in original.args
            if argument.keyword is None or argument.keyword.value == "device"
        ]
        if index:
            return updated  # left: a device index
        self._change(original.func.attr, "cuda-method", ".cuda(...) -> .to(device, ...)")  # type: ignore[attr-defined]
        device_argument = cst.Arg(value=self._device(original, as_type=False))
        if updated.args:
            device_argument = device_argument.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        func = updated.func.with_changes(attr=cst.Name("to"))  # type: ignore[attr-defined]
        return updated.with_changes(func=func, args=[device_argument, *updated.args])

    def _fix_amp(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        member = name.rsplit(".", 1)[-1]
        positional = [argument for argument in original.args if argument.keyword is None]
        if member == "autocast" and positional:
            return updated  # left: torch.amp.autocast orders its arguments differently
        self._change(original, "cuda-amp", f"{name}(...) -> torch.amp.{member}(device.type, ...)")
        device_type = self._device(original, as_type=True)
        first = cst.Arg(value=device_type)
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        if updated.args:
            first = first.with_changes(comma=comma)
        arguments = [first, *updated.args]
        if member == "GradScaler":
            arguments = self._scale_only_on_cuda(arguments, device_type)
        return updated.with_changes(func=self._torch(f"torch.amp.{member}"), args=arguments)

    def _scale_only_on_cuda(
        self, arguments: list[cst.Arg], device_type: cst.BaseExpression
    ) -> list[cst.Arg]:
        """Loss scaling where autocast is float16 (CUDA's default), none where it is bfloat16
        (a TPU's): `enabled=device.type == "cuda"`, or `enabled=(X) and ...` for the original
        `enabled=X`. On a TPU an enabled scaler needs loss-scaling kernels torch 2.13 lacks."""
        on_cuda = f'{self.module.code_for_node(device_type)} == "cuda"'
        for position, argument in enumerate(arguments):
            if argument.keyword is not None and argument.keyword.value == "enabled":
                if isinstance(argument.value, cst.Name) and argument.value.value == "False":
                    return arguments
                wanted = self.module.code_for_node(argument.value)
                if not isinstance(argument.value, cst.Name | cst.Attribute):
                    wanted = f"({wanted})"
                value = cst.parse_expression(f"{wanted} and {on_cuda}")
                arguments[position] = argument.with_changes(value=value)
                return arguments
        last = arguments[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        enabled = cst.Arg(
            keyword=cst.Name("enabled"),
            value=cst.parse_expression(on_cuda),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        # A trailing comma (and the line break after it) moves to the new last argument.
        return [*arguments[:-1], last, enabled.with_changes(comma=arguments[-1].comma)]

    def _fix_torch_device(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if len(original.args) != 1:
            return updated  # left: torch.device("cuda", index) names an index
        argument = original.args[0]
        if argument.keyword is not None and argument.keyword.value != "type":
            return updated
        value = argument.value
        if _string_value(value) == "cuda" or (  # the whole call is the device
            isinstance(value, cst.IfExp) and self._is_availability_choice(value)
        ):
            self._change(original, "cuda-device-string", f"{self._code(original)} -> device")
            return self._device(original, as_type=False)
        new_value = self._device_value(value, updated.args[0].value, as_type=False)
        return updated.with_changes(args=[updated.args[0].with_changes(value=new_value)])

    def _fix_backend(self, original: cst.Call, updated: cst.Call, last: str) -> cst.Call:
        keep: list[cst.Arg] = []
        for position, (before, after) in enumerate(zip(original.args, updated.args, strict=True)):
            is_backend = (before.keyword is not None and before.keyword.value == "backend") or (
                before.keyword is None and position == 0 and last == "init_process_group"
            )
            if not is_backend:
                keep.append(after)
                continue
            value = before.value
            text = _string_value(value)
            is_nccl = (text or "").lower() == "nccl" or (_dotted(value) or "").endswith(
                "Backend.NCCL"
            )
            positional_after = before.keyword is None and any(
                other.keyword is None for other in original.args[1:]
            )
            if is_nccl and positional_after:
                named = _named_after_the_backend(original.args[1:], updated.args[1:])
                if named is None:  # `*args`, or more positionals than parameters: left
                    return updated
                self._change(value, "nccl-backend", f"dropped backend {self._code(value)}")
                keep += named
                break
            if is_nccl:
                self._change(value, "nccl-backend", f"dropped backend {self._code(value)}")
                continue
            keep.append(after)  # any other backend: left
        if len(keep) == len(updated.args):
            return updated
        if keep and keep[-1] is not updated.args[-1]:
            # The last argument was dropped: its comma (and a line break) ends the call.
            keep[-1] = keep[-1].with_changes(comma=updated.args[-1].comma)
        return updated.with_changes(args=keep)

    def _fix_first_argument(
        self, original: cst.Call, updated: cst.Call, *, as_type: bool
    ) -> cst.Call:
        if not original.args or original.args[0].keyword is not None:
            return updated
        first = original.args[0].value
        if _looks_like_index(first):
            return updated  # left: a device index
        new_value = self._device_value(first, updated.args[0].value, as_type=as_type)
        if new_value is updated.args[0].value:
            return updated
        return updated.with_changes(
            args=[updated.args[0].with_changes(value=new_value), *updated.args[1:]]
        )

    def _fix_keywords(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        new_arguments = list(updated.args)
        choice_lists = [
            argument.value
            for argument in original.args
            if argument.keyword is not None and argument.keyword.value == "choices"
        ]
        has_choices = bool(choice_lists)
        for position, argument in enumerate(original.args):
            keyword = argument.keyword.value if argument.keyword is not None else None
            if keyword is None or position >= len(new_arguments):
                continue
            current = new_arguments[position]
            if keyword in _DEVICE_KEYWORDS:
                as_type = _DEVICE_KEYWORDS[keyword]
                if keyword == "device" and _looks_like_index(argument.value):
                    continue  # left: a device index
                value = self._device_value(argument.value, current.value, as_type=as_type)
                new_arguments[position] = current.with_changes(value=value)
            elif keyword == "default" and not has_choices:
                # argparse: `add_argument("--device", default="cuda")` keeps a string.
                value = self._device_value(argument.value, current.value, as_type=True)
                new_arguments[position] = current.with_changes(value=value)
            # default="cuda" with "cpu" among the choices is left: the choices need editing.
            elif keyword == "pin_memory" and _is_true(argument.value):
                self._change(
                    argument, "pin-memory", "pin_memory=True -> torch.accelerator.is_available()"
                )
                new_arguments[position] = current.with_changes(
                    value=self._torch("torch.accelerator.is_available()")
                )
        return updated.with_changes(args=new_arguments)

    # -- assignments and other places where a device string stands -------------------------

    def _fix_assigned(
        self, target: cst.BaseExpression, original: cst.BaseExpression, updated: cst.BaseExpression
    ) -> cst.BaseExpression:
        target_name = _dotted(target)
        if target_name is None:
            return updated
        last = target_name.rsplit(".", 1)[-1]
        string_used = target_name in self.facts.string_used
        if target_name == "device":
            return self._fix_device_assignment(original, updated, string_used=string_used)
        as_type = "type" in last or string_used
        return self._device_value(original, updated, as_type=as_type)

    def _fix_device_assignment(
        self, original: cst.BaseExpression, updated: cst.BaseExpression, *, string_used: bool
    ) -> cst.BaseExpression:
        """`device = "cuda"` (or the availability choice, or `torch.device("cuda")`) becomes
        the device choice itself: `device = device` would name what it defines."""
        choose = f"({CHOOSE_DEVICE}).type" if string_used else CHOOSE_DEVICE
        if _string_value(original) == "cuda" or (
            isinstance(original, cst.IfExp) and self._is_availability_choice(original)
        ):
            self._change(original, "cuda-device-string", f"{self._code(original)} -> {choose}")
            return self._torch(choose)
        if isinstance(updated, cst.Name) and updated.value == "device":
            return self._torch(choose)  # torch.device("cuda"), already counted as a change
        if isinstance(original, cst.IfExp | cst.BooleanOperation) and any(
            (_string_value(node) or "").startswith("cuda")
            for node in _walk(original)
            if isinstance(node, cst.SimpleString)
        ):
            return updated  # left: a choice between CUDA and another device
        return self._device_value(original, updated, as_type=False)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1:
            return updated_node
        value = self._fix_assigned(
            original_node.targets[0].target, original_node.value, updated_node.value
        )
        return updated_node.with_changes(value=value)

    def leave_AnnAssign(
        self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign
    ) -> cst.AnnAssign:
        if original_node.value is None or updated_node.value is None:
            return updated_node
        value = self._fix_assigned(original_node.target, original_node.value, updated_node.value)
        return updated_node.with_changes(value=value)

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if original_node.value is None or updated_node.value is None:
            return updated_node
        value = self._device_value(original_node.value, updated_node.value, as_type=True)
        return updated_node.with_changes(value=value)

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if original_node.default is None or updated_node.default is None:
            return updated_node
        value = self._device_value(
            original_node.default, updated_node.default, as_type=True, outer=True
        )
        return updated_node.with_changes(default=value)

    def leave_DictElement(
        self, original_node: cst.DictElement, updated_node: cst.DictElement
    ) -> cst.DictElement:
        key = _string_value(original_node.key)
        if key not in _DEVICE_KEYWORDS:
            return updated_node
        value = self._device_value(
            original_node.value, updated_node.value, as_type=_DEVICE_KEYWORDS[key]
        )
        return updated_node.with_changes(value=value)


# Calls whose first positional argument is a device, and whether it is a device *type*.
_DEVICE_FIRST_ARGUMENT = {
    "torch.set_default_device": False,
    "torch.Generator": False,
    "torch.get_device_module": False,
    "torch.autocast": True,
    "torch.amp.autocast": True,
    "torch.amp.GradScaler": True,
    "torch.distributed.device_mesh.init_device_mesh": True,
    "torch.distributed.init_device_mesh": True,
}
# Keyword arguments (and dict keys) whose value is a device, and whether it is a device type.
_DEVICE_KEYWORDS = {
    "device": False,
    "device_type": True,
    "map_location": False,
    "device_map": False,
}


# `init_process_group`'s parameters after `backend`, in order (torch 2.13).
_AFTER_THE_BACKEND = ("init_method", "timeout", "world_size", "rank", "store", "group_name")


def _named_after_the_backend(
    originals: Sequence[cst.Arg], updated: Sequence[cst.Arg]
) -> list[cst.Arg] | None:
    """The arguments after `init_process_group`'s positional backend, each positional one
    given its parameter's name, so that dropping the backend moves none of them; None where
    that cannot be done."""
    named: list[cst.Arg] = []
    for position, (before, after) in enumerate(zip(originals, updated, strict=True)):
        if before.star or (before.keyword is None and position >= len(_AFTER_THE_BACKEND)):
            return None
        if before.keyword is None:
            after = after.with_changes(
                keyword=cst.Name(_AFTER_THE_BACKEND[position]),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        named.append(after)
    return named


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _looks_like_index(node: cst.BaseExpression) -> bool:
    """An integer literal, `int(...)`, or a name such as `local_rank`: a device index."""
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.Call) and _dotted(node.func) == "int":
        return True
    name = _dotted(node)
    return name is not None and _RANK_LIKE_NAME.search(name.rsplit(".", 1)[-1]) is not None


# --------------------------------------------------------------------------------------------
# The module: insert `device = ...` (and `import torch`) after the imports


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Import | cst.ImportFrom) for small in statement.body
    )


def _insertion_index(
    module: cst.Module,
    first_use_line: int | None,
    position_of: Callable[[cst.CSTNode], CodeRange],
) -> int:
    """Where the added lines go: after the last import that precedes the first function or
    class, and never after the first top-level statement that uses `device`."""
    index = 0
    body = module.body
    for position, statement in enumerate(body):
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            break
        if _is_import_line(statement):
            index = position + 1
        elif position == 0 and isinstance(statement, cst.SimpleStatementLine):
            small = statement.body[0]
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
                index = 1  # after the docstring
    if first_use_line is not None:
        for position, statement in enumerate(body[:index]):
            if position_of(statement).end.line >= first_use_line:
                return position
    return index


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


def _protection(source: str, findings: Sequence[Finding], config: AuditConfig) -> _Protection:
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
    return _Protection(frozenset(lines), rules_by_line, frozenset(config.skip))


def _left(fixed: str, findings: Sequence[Finding], config: AuditConfig) -> tuple[LeftUnfixed, ...]:
    """What the audit still finds must change in the fixed text, at the fixed text's lines."""
    lines = fixed.splitlines()
    return tuple(
        LeftUnfixed(
            line=finding.line,
            rule=finding.rule,
            code=lines[finding.line - 1].strip() if finding.line <= len(lines) else "",
            reason=finding.suggestion,
            column=finding.column,
            message=finding.message,
        )
        for finding in findings
        if finding.severity == MUST_CHANGE and finding.rule not in config.skip
    )


def _left_behind(finding: Finding) -> bool:
    """A must-change finding the rewrite never ports: a per-rank index (reported rules and
    `.cuda(local_rank)`), or a `torch.cuda` member with no same-argument replacement."""
    if finding.severity != MUST_CHANGE:
        return False
    if finding.rule in REPORTED_RULES - {"cudnn-setting", "cuda-backend-setting"}:
        return True
    if finding.rule in {"cuda-method", "cuda-device-string"}:
        return finding.per_rank  # `.cuda(i)`, f"cuda:{i}"
    if finding.rule == "torch-cuda-call":
        member = finding.cuda_name
        return (
            member is not None
            and member not in _DIRECT
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
    if "always" not in (device_line, fresh_line):
        findings = _audit_with_imports(source, aliases_elsewhere or {})
        if not _may_be_rewritten(findings):
            return FixResult(original=source, fixed=source, left=_left(source, findings, config))
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise FixInputError(
            f"cannot parse (line {error.raw_line}): {error.message}; fix the syntax first"
        ) from error
    except (RecursionError, MemoryError) as error:
        raise FixInputError(f"cannot parse: {type(error).__name__}") from error
    fresh_device = fresh_device or fresh_device_name(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    facts = _module_facts(source, module)
    facts.aliases = {**(aliases_elsewhere or {}), **facts.aliases}
    facts.binds_torch = facts.binds_torch or "torch" in bound_elsewhere
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
    rewriter = _Rewriter(
        facts,
        module,
        guarded,
        _protection(source, findings, config),
        ported_checks,
        fresh_device,
        fresh_everywhere,
        left_behind,
        frozenset(finding.line for finding in findings),
    )
    if "device" in bound_elsewhere and rewriter.device_scopes[0] is None:
        rewriter.device_scopes[0] = "device"
    fixed = wrapper.visit(rewriter)
    positions = wrapper.resolve(PositionProvider)
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
        and not _binds_device(module.body)
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
    lines_to_add = [DEVICE_LINE] if wants_line and not _binds_device(module.body) else []
    if wants_fresh:
        lines_to_add.append(DEVICE_LINE.replace("device", fresh_device, 1))
    for text in lines_to_add:
        index = _insertion_index(
            module, rewriter.first_device_line, lambda statement: positions[statement]
        )
        line = cst.parse_statement(text + "\n")
        additions.setdefault(index, []).append(line.with_changes(leading_lines=[cst.EmptyLine()]))
    if rewriter.uses_torch and not facts.binds_torch:
        # Before the first import (after `from __future__`), where isort would put it.
        first_import = next(
            (
                position
                for position, statement in enumerate(body)
                if _is_import_line(statement)
                and "__future__" not in module.code_for_node(statement)
            ),
            _insertion_index(module, None, lambda statement: positions[statement]),
        )
        additions.setdefault(first_import, []).insert(0, cst.parse_statement("import torch\n"))
        first_import_index = first_import
    new_body: list[cst.BaseStatement] = []
    kept = iter(fixed.body)
    for position, statement in enumerate([*body, None]):
        for added in additions.get(position, []):
            new_body.append(added)
            after = positions[body[position - 1]].end.line + 1 if position else 1
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
    fixed_text = fixed.code
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
        return "".join(source)  # type: ignore[arg-type]
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
    modules: dict[int, tuple[str, cst.Module, _ModuleFacts]] = {}
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
        facts = _ModuleFacts()
        module.visit(facts)
        modules[number] = (masked, module, facts)
    aliases: dict[str, str] = {}
    bound: set[str] = set()
    for _, module, facts in modules.values():
        aliases.update(facts.aliases)
        bound |= {"torch"} if facts.binds_torch else set()
        bound |= {"device"} if _binds_device(module.body) else set()
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tpuready.fix [--diff | --write] PATH...`; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tpuready.fix",
        description="Rewrite CUDA-only PyTorch code to run on any accelerator (libcst; "
        "comments kept). Exit status: 0 nothing left, 1 something left, 2 unreadable input.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--diff", action="store_true", help="print a unified diff (default)")
    mode.add_argument("--write", action="store_true", help="rewrite the files in place")
    parser.add_argument("paths", nargs="+", metavar="PATH", help=".py, .ipynb or folder")
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_UNREADABLE
    return run_fix(arguments.paths, write=arguments.write, stdout=sys.stdout, stderr=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
