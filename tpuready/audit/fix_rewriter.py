"""The rewriter behind `--fix`: a libcst transformer that ports what the audit found, one
node at a time, and the module-level edits (the device line, `import torch`). It changes only
statements that hold a finding, leaves what the audit calls guarded, and records each change.
`tpuready.audit.fix` decides what to rewrite from the audit's findings and `RULE_TABLE`'s `fix`
column, runs this, and reports what is left."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from tpuready.accelerator_api import CUDA_TO_ACCELERATOR
from tpuready.audit.fix_facts import (
    ModuleFacts,
    dotted,
    scope_kind,
    string_value,
    walk,
)
from tpuready.audit.sources import parse_python
from tpuready.audit.syntax import (
    DEVICE_CHOICE,
    RANK_LIKE_NAME,
)
from tpuready.audit.syntax import (
    DEVICE_FIRST_ARGUMENT as AUDIT_DEVICE_FIRST_ARGUMENT,
)
from tpuready.audit.syntax import (
    DEVICE_KEYWORDS as AUDIT_DEVICE_KEYWORDS,
)

__all__ = [
    "AFTER_THE_BACKEND",
    "CHOOSE_DEVICE",
    "DEVICE_FIRST_ARGUMENT",
    "DEVICE_KEYWORDS",
    "DEVICE_LINE",
    "DIRECT",
    "NEEDS_AN_ACCELERATOR",
    "Change",
    "Protection",
    "Rewriter",
    "StatementPositions",
    "binds_the_name_device",
    "direct_replacements",
    "insertion_index",
    "is_import_line",
    "put_back",
    "stand_in_text",
]

CHOOSE_DEVICE = DEVICE_CHOICE  # the expression `--fix` writes where a device is chosen
# The statement `--fix` adds, wrapped as chapter 1 writes it so it fits a 79-column file.
DEVICE_LINE = (
    "device = (\n"
    "    torch.accelerator.current_accelerator(check_available=True)\n"
    '    or torch.device("cpu")\n'
    ")"
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


@dataclass(frozen=True)
class Change:
    """One rewrite, at its line in the original text."""

    line: int
    rule: str
    description: str


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


DIRECT = direct_replacements()

# --------------------------------------------------------------------------------------------
# The rewriter


class StatementPositions:
    """libcst's positions (`PositionProvider`'s spans) of a module's nodes, worked out one
    top-level statement at a time, for the statements the rewriter enters. libcst's own
    provider renders the whole module to find them, the slowest step of a fix on a long file
    with few findings. The first and last line of each top-level statement come from Python's
    parser; where it refuses the text, every span is worked out at once, as libcst does."""

    def __init__(self, module: cst.Module, source: str) -> None:
        self.module = module
        self.spans: dict[cst.CSTNode, CodeRange] = {}
        # id(top-level statement) -> (first line, decorators included; last line of its code).
        self.lines: dict[int, tuple[int, int]] = {}
        self._anchors: dict[int, int] = {}  # id(top-level statement) -> where its span starts
        self._loaded: set[int] = set()
        self.whole = not self._read_lines(source)
        if self.whole:
            wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
            self.spans.update(wrapper.resolve(PositionProvider))

    def _read_lines(self, source: str) -> bool:
        try:
            tree = parse_python(source)  # its warnings silenced
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        statements = iter(tree.body)
        for statement in self.module.body:
            count = len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
            taken = [next(statements, None) for _ in range(count)]
            first, last = taken[0], taken[-1]
            if first is None or last is None or last.end_lineno is None:
                return False
            decorators = getattr(first, "decorator_list", [])
            start = min([first.lineno, *(decorator.lineno for decorator in decorators)])
            self.lines[id(statement)] = (start, last.end_lineno)
            self._anchors[id(statement)] = first.lineno  # libcst's span starts at `def`
        return next(statements, None) is None

    def load(self, statement: cst.CSTNode) -> None:
        """Work out the spans of a top-level statement and every node in it."""
        if self.whole or id(statement) in self._loaded:
            return
        self._loaded.add(id(statement))
        alone = self.module.with_changes(body=[statement], header=(), footer=())
        spans = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
        shift = self._anchors[id(statement)] - spans[statement].start.line
        for node, span in spans.items():
            if node is not alone:
                self.spans[node] = CodeRange(
                    CodePosition(span.start.line + shift, span.start.column),
                    CodePosition(span.end.line + shift, span.end.column),
                )

    def of(self, statement: cst.CSTNode) -> CodeRange:
        """The span of a top-level statement."""
        self.load(statement)
        return self.spans[statement]


@dataclass(frozen=True)
class Protection:
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


class Rewriter(cst.CSTTransformer):
    def __init__(
        self,
        facts: ModuleFacts,
        module: cst.Module,
        guarded: frozenset[tuple[int, int]] = frozenset(),
        protection: Protection | None = None,
        ported_checks: frozenset[int] = frozenset(),
        fresh_device: str = "chosen_device",
        fresh_everywhere: bool = False,
        left_behind: frozenset[int] = frozenset(),
        finding_lines: frozenset[int] | None = None,
        positions: StatementPositions | None = None,
    ) -> None:
        super().__init__()
        self.positions = positions or StatementPositions(module, module.code)
        self.left_behind = left_behind
        # Lines holding a finding: a statement with none is not entered (None: enter all).
        self.finding_lines = finding_lines
        self.fresh_everywhere = fresh_everywhere  # one device name per file: the fresh one
        self.facts = facts
        self.module = module
        self.ported_checks = ported_checks
        # (line, 1-based column) of what the audit calls a CUDA check kept on purpose.
        self.guarded = guarded
        self.protection = protection or Protection()
        self._untouched: set[int] = set()
        self.changes: list[Change] = []
        self.uses_torch = False
        self.module_device_needed = False
        self.fresh_device_needed = False  # `fresh_device` named where a scope binds `device`
        self.fresh_device = fresh_device
        self.first_device_line: int | None = None
        self.device_scopes: list[str | None] = [
            scope_kind(None, module.body, "device" in facts.string_used)
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
        and a statement that holds no finding: the fixer changes only what the audit found.
        A top-level statement with no finding in its lines is skipped before its spans are
        worked out."""
        top = self.positions.lines.get(id(node))
        if top is not None:
            if self.finding_lines is not None and not any(
                top[0] <= line <= top[1] for line in self.finding_lines
            ):
                self._untouched.add(id(node))
                return False
            self.positions.load(node)
        lines = self.protection.lines
        if lines:
            span = self.positions.spans.get(node)
            if span is not None and all(
                line in lines for line in range(span.start.line, span.end.line + 1)
            ):
                self._untouched.add(id(node))
                return False
        if self.finding_lines is not None and isinstance(
            node, cst.SimpleStatementLine | cst.BaseCompoundStatement
        ):
            span = self.positions.spans[node]
            if not any(
                line in self.finding_lines for line in range(span.start.line, span.end.line + 1)
            ):
                self._untouched.add(id(node))
                return False
        return super().on_visit(node)

    def on_leave(
        self, original_node: cst.CSTNodeT, updated_node: cst.CSTNodeT
    ) -> cst.CSTNodeT | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNodeT]:
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
        return self.positions.spans[node].start.line

    def _code(self, node: cst.CSTNode) -> str:
        return " ".join(self.module.code_for_node(node).split()).rstrip(", ")

    def _qualify(self, node: cst.BaseExpression) -> str | None:
        name = dotted(node)
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
        for node in walk(test):
            if isinstance(node, cst.Call) and self._qualify(node.func) in {
                "torch.cuda.is_available",
                "torch.cuda.device_count",
            }:
                return True
            if isinstance(node, cst.Comparison):
                operands = [node.left, *(target.comparator for target in node.comparisons)]
                if any((string_value(operand) or "").startswith("cuda") for operand in operands):
                    return True
        return False

    def _is_availability_choice(self, node: cst.IfExp) -> bool:
        """`"cuda" if torch.cuda.is_available() else "cpu"` (or `"cuda:0"`, the same device in
        a process that never calls set_device)."""
        test = node.test
        return (
            isinstance(test, cst.Call)
            and self._qualify(test.func) == "torch.cuda.is_available"
            and string_value(node.body) in {"cuda", "cuda:0"}
            and string_value(node.orelse) == "cpu"
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
        text = string_value(original)
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
            and (string_value(original.func.value) or "").startswith("cuda:")
        ):
            return updated
        if isinstance(original, cst.IfExp) and isinstance(updated, cst.IfExp):
            if self._is_availability_choice(original):
                self._change(original, rule, f"{self._code(original)} -> {wanted}")
                return self._device(original, as_type=as_type, outer=outer)
            if self._is_cuda_check(original.test):
                branches = (string_value(original.body), string_value(original.orelse))
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
        span = self.positions.spans[test]
        return not any(
            line in self.ported_checks for line in range(span.start.line, span.end.line + 1)
        )

    def _holds_left_behind_code(self, node: cst.CSTNode) -> bool:
        """True when `node` spans a line the rewrite leaves CUDA-only (`.cuda(args.gpu)`,
        `torch.cuda.set_device(rank)`, `torch.cuda.get_device_name()`): a check ported over
        it would send a TPU into CUDA-only code that the original kept it out of."""
        span = self.positions.spans[node]
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
        self.device_scopes.append(scope_kind(node.params, [node.body], string_used))

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
            position = self.positions.spans[call.func].start
            if (
                name.startswith("torch.cuda.")
                and member in NEEDS_AN_ACCELERATOR
                and member in DIRECT
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
        position = self.positions.spans[original].start
        if (position.line, position.column + 1) in self.guarded:
            return updated  # the audit's verdict: a CUDA check on purpose, correct as it is
        member = name.removeprefix("torch.cuda.")
        if member == "amp" or member.startswith("amp."):
            if member not in {"amp.autocast", "amp.GradScaler"} or (
                id(original) not in self._call_funcs
            ):
                return updated  # left: the audit reports it
            return updated  # autocast and GradScaler calls are rewritten in leave_Call
        replacement = DIRECT.get(member)
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
        last = name.rsplit(".", 1)[-1] if name else (method or dotted(func) or "")

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
        if name in DEVICE_FIRST_ARGUMENT or method == "to":
            as_type = DEVICE_FIRST_ARGUMENT.get(name or "", False)
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
        method = cast(cst.Attribute, original.func)  # leave_Call calls this only for `x.cuda(...)`
        self._change(method.attr, "cuda-method", ".cuda(...) -> .to(device, ...)")
        device_argument = cst.Arg(value=self._device(original, as_type=False))
        if updated.args:
            device_argument = device_argument.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        func = updated.func.with_changes(attr=cst.Name("to"))
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
        if string_value(value) == "cuda" or (  # the whole call is the device
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
            text = string_value(value)
            is_nccl = (text or "").lower() == "nccl" or (dotted(value) or "").endswith(
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
            if keyword in DEVICE_KEYWORDS:
                as_type = DEVICE_KEYWORDS[keyword]
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
        target_name = dotted(target)
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
        if string_value(original) == "cuda" or (
            isinstance(original, cst.IfExp) and self._is_availability_choice(original)
        ):
            self._change(original, "cuda-device-string", f"{self._code(original)} -> {choose}")
            return self._torch(choose)
        if isinstance(updated, cst.Name) and updated.value == "device":
            return self._torch(choose)  # torch.device("cuda"), already counted as a change
        if isinstance(original, cst.IfExp | cst.BooleanOperation) and any(
            (string_value(node) or "").startswith("cuda")
            for node in walk(original)
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
        key = string_value(original_node.key)
        if key not in DEVICE_KEYWORDS:
            return updated_node
        value = self._device_value(
            original_node.value, updated_node.value, as_type=DEVICE_KEYWORDS[key]
        )
        return updated_node.with_changes(value=value)


# Where a device stands in a call, and whether it is a device *type*: the audit's tables, so
# what one flags the other rewrites (`torch.device` is rewritten whole, by `_fix_torch_device`).
# Not taken from them: argparse's `default=` (`_fix_keywords` keeps it a string, and leaves it
# beside `choices`) and `pin_memory_device=`, which torch 2.13 ignores with a deprecation
# warning (it pins for the current accelerator): left and reported, to be dropped.
DEVICE_FIRST_ARGUMENT = AUDIT_DEVICE_FIRST_ARGUMENT
DEVICE_KEYWORDS = {
    keyword: as_type
    for keyword, as_type in AUDIT_DEVICE_KEYWORDS.items()
    if keyword not in {"default", "pin_memory_device"}
}


# `init_process_group`'s parameters after `backend`, in order (torch 2.13).
AFTER_THE_BACKEND = ("init_method", "timeout", "world_size", "rank", "store", "group_name")


def _named_after_the_backend(
    originals: Sequence[cst.Arg], updated: Sequence[cst.Arg]
) -> list[cst.Arg] | None:
    """The arguments after `init_process_group`'s positional backend, each positional one
    given its parameter's name, so that dropping the backend moves none of them; None where
    that cannot be done."""
    named: list[cst.Arg] = []
    for position, (before, after) in enumerate(zip(originals, updated, strict=True)):
        if before.star or (before.keyword is None and position >= len(AFTER_THE_BACKEND)):
            return None
        if before.keyword is None:
            after = after.with_changes(
                keyword=cst.Name(AFTER_THE_BACKEND[position]),
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
    if isinstance(node, cst.Call) and dotted(node.func) == "int":
        return True
    name = dotted(node)
    return name is not None and RANK_LIKE_NAME.search(name.rsplit(".", 1)[-1]) is not None


# --------------------------------------------------------------------------------------------
# The module: insert `device = ...` (and `import torch`) after the imports


def is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Import | cst.ImportFrom) for small in statement.body
    )


def insertion_index(
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
        if is_import_line(statement):
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


# --------------------------------------------------------------------------------------------
# Stand-ins: what libcst need not parse


_PYTHON_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _blocks(statements: Sequence[ast.stmt]) -> list[tuple[int, int, list[ast.stmt]]]:
    """`statements` as (first line, decorators included; last line; statements), those that
    share a line (`a = 1; b = 2`) together."""
    blocks: list[tuple[int, int, list[ast.stmt]]] = []
    for statement in statements:
        decorators = getattr(statement, "decorator_list", [])
        start = min([statement.lineno, *(decorator.lineno for decorator in decorators)])
        end = statement.end_lineno or statement.lineno
        if blocks and start <= blocks[-1][1]:
            blocks[-1] = (blocks[-1][0], max(end, blocks[-1][1]), [*blocks[-1][2], statement])
        else:
            blocks.append((start, end, [statement]))
    return blocks


def _bodies(statement: ast.stmt, lines: Sequence[str]) -> Iterator[list[ast.stmt]]:
    """The statement lists nested in a compound statement: its body, `else`, handlers, cases
    and `finally`; an `elif`'s own lists, never the `elif` itself (it cannot stand alone)."""
    for field_name in ("body", "orelse", "finalbody"):
        nested = getattr(statement, field_name, None)
        if not isinstance(nested, list) or not nested or not isinstance(nested[0], ast.stmt):
            continue
        first = nested[0]
        if (
            field_name == "orelse"
            and isinstance(statement, ast.If)
            and len(nested) == 1
            and isinstance(first, ast.If)
            and lines[first.lineno - 1].lstrip().startswith("elif")
        ):
            yield from _bodies(first, lines)
        else:
            yield nested
    for handler in getattr(statement, "handlers", ()):
        yield handler.body
    for case in getattr(statement, "cases", ()):
        yield case.body


def stand_in_text(source: str, finding_lines: frozenset[int]) -> tuple[str, list[tuple[str, str]]]:
    """`source` with each statement that the rewrite cannot touch replaced by a stand-in of
    the same lines and indentation (`def _tpuready_stand_in_N(...): pass`, a few nodes for
    libcst to parse and render however long the original), and the (stand-in, original) pairs
    to put back. Replaced: the statements from the first top-level function or class on,
    nested ones too (a method of a class that holds a finding elsewhere), that start their
    line, hold no finding, import nothing and never bind `device`; everything before the
    first definition, where the device line goes, is kept. Line numbers do not move, so
    findings and spans still hold. The text is returned as it is when Python's parser
    refuses it."""
    try:
        tree = parse_python(source)  # its warnings silenced
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source, []
    # Lines as Python numbers them: str.splitlines also breaks at a form feed, U+2028, ...
    lines = _PYTHON_LINE.findall(source)
    blocks = _blocks(tree.body)
    first_definition = next(
        (
            index
            for index, (_, _, statements) in enumerate(blocks)
            if isinstance(statements[0], ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ),
        len(blocks),
    )
    chosen: list[tuple[int, int]] = []  # (first line, last line) of each stand-in
    pending = list(reversed(blocks[first_definition:]))
    while pending:
        start, end, statements = pending.pop()
        text = "".join(lines[start - 1 : end])
        decorators = getattr(statements[0], "decorator_list", [])  # `@` starts the line
        column = decorators[0].col_offset - 1 if decorators else statements[0].col_offset
        if (
            any(start <= line <= end for line in finding_lines)
            or any(isinstance(node, ast.Import | ast.ImportFrom) for node in statements)
            or (re.search(r"\bdevice\b", text) and binds_the_name_device(statements))
            or "\\" in lines[end - 1][-3:]  # a line continued past the block: leave it
            or lines[start - 1][:column].strip()  # after a header on its line: `if x: y = 1`
            or (start > 1 and lines[start - 2].rstrip("\r\n").endswith("\\"))  # `else: \`
        ):
            nested = [
                block
                for statement in statements
                for body in _bodies(statement, lines)
                for block in _blocks(body)
            ]
            pending.extend(reversed(nested))
            continue
        chosen.append((start, end))
    name = "_tpuready_stand_in"
    while name in source:
        name += "_"
    replaced: list[tuple[str, str]] = []
    pieces: list[str] = []
    done = 0  # lines of `source` already in `pieces`
    for start, end in sorted(chosen):  # a `try`'s handlers come after its `else`/`finally`
        text = "".join(lines[start - 1 : end])
        indent = text[: len(text) - len(text.lstrip(" \t\f"))]
        newline = "\r\n" if lines[end - 1].endswith("\r\n") else "\n"
        count = end - start + 1
        stand_in = f"{indent}def {name}_{len(replaced)}(" + (
            f"): pass{newline}" if count == 1 else newline * (count - 1) + f"): pass{newline}"
        )
        if not lines[end - 1].endswith(("\n", "\r")):
            stand_in = stand_in.rstrip("\r\n")
        pieces.append("".join(lines[done : start - 1]))
        pieces.append(stand_in)
        replaced.append((stand_in, text))
        done = end
    pieces.append("".join(lines[done:]))
    return "".join(pieces), replaced


def binds_the_name_device(statements: Sequence[ast.stmt]) -> bool:
    """True when the name `device` is bound, deleted or declared anywhere in `statements`:
    the rewrites read a scope's `device` bindings, never its other uses of the name."""
    for statement in statements:
        for node in ast.walk(statement):
            if (
                (
                    isinstance(node, ast.Name)
                    and node.id == "device"
                    and type(node.ctx) is not ast.Load
                )
                or (isinstance(node, ast.Global | ast.Nonlocal) and "device" in node.names)
                or (isinstance(node, ast.ExceptHandler) and node.name == "device")
            ):
                return True
    return False


def put_back(text: str, replaced: Sequence[tuple[str, str]]) -> str:
    """`text` with each stand-in of `stand_in_text` replaced by its original lines."""
    for stand_in, original in replaced:
        before, found, after = text.partition(stand_in)
        if not found:
            raise AssertionError(f"a stand-in was changed by the rewrite: {stand_in!r}")
        text = before + original + after
    return text
