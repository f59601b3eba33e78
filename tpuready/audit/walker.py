"""The audit's walker: what a whole file tells every rule (imports, aliases, names that carry
a backend or a device type), and one pass over each tree that judges CUDA guards by what
their other branch does and runs each rule of `tpuready.audit.rules.RULE_TABLE` on the node
types it looks at. Public entry points live in `tpuready.audit`."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from tpuready.accelerator_api import equivalent_for
from tpuready.audit.syntax import (
    CHOOSE_DEVICE,
    CUDA_FLAG_NAME,
    CUDA_IDENTITY_PROBES,
    CUDA_PROBES,
    CUDA_TENSOR_TYPE,
    DEVICE_WORDS,
    FALLBACKS,
    GUARDED,
    MUST_CHANGE,
    OFF_CUDA_BRANCH,
    ONE_DEVICE_PER_PROCESS,
    PICKS_FLOAT16,
    PROBE_ADVICE,
    TEST_SKIP_DECORATORS,
    Finding,
    Rule,
    code_of,
    device_choice,
    dotted_parts,
    index_in_device_text,
    is_cuda_device_text,
    last_name,
    per_rank_advice,
    rank_of_device_text,
    string_value,
)

__all__ = [
    "BFLOAT16_OFF_CUDA",
    "Auditor",
    "FileFacts",
    "collect_facts",
]

# --------------------------------------------------------------------------------------------
# What a whole file (or notebook) tells every rule


_DEVICE_MODULE_BINDING = re.compile(r"([A-Za-z_][\w.]*)\s*=\s*(?:torch\.)?get_device_module\(")
# A name passed on as a backend or device type. Each pattern starts with its literal (the
# regex engine then searches like `str.find`); a keyword must start a word (`_word_starts`).
_NAME_PASSED = r"\s*([A-Za-z_]\w*)\b(?!\s*[.(\[])"
_BACKEND_NAME_USES = (
    re.compile(r"init_process_group\(" + _NAME_PASSED),
    re.compile(r"backend\s*=" + _NAME_PASSED),
)
_DEVICE_TYPE_NAME_USES = (
    re.compile(r"autocast\(" + _NAME_PASSED),
    re.compile(r"device_type\s*=" + _NAME_PASSED),
)
_COMPILE_CALL = re.compile(r"compile\s*\(")


def _word_starts(source: str, at: int) -> bool:
    return at == 0 or not (source[at - 1].isalnum() or source[at - 1] == "_")


def _names_passed(source: str, patterns: Iterable[re.Pattern[str]]) -> set[str]:
    """The names the patterns capture, where each match starts a word."""
    return {
        match.group(1)
        for pattern in patterns
        for match in pattern.finditer(source)
        if _word_starts(source, match.start())
    }


_DEVICE_WORD = re.compile(r"device|cuda|accelerator|tpu", re.IGNORECASE)


@dataclass
class FileFacts:
    aliases: dict[str, str]
    compiles: bool
    trees: Sequence[ast.AST]
    backend_names: set[str] = field(default_factory=set)
    device_module_names: set[str] = field(default_factory=set)  # `dm = torch.get_device_module()`
    device_type_names: set[str] = field(default_factory=set)
    _names_a_device: bool | None = None
    ported_flags: frozenset[str] | None = None  # filled by Auditor.ported_flags
    _falls_through_to: dict[int, list[ast.stmt]] | None = None
    _optional_imports: set[int] | None = None

    def is_optional_import(self, node: ast.Import | ast.ImportFrom) -> bool:
        """True for an import in the body of a `try` that catches its failure (`except
        ImportError`, `ModuleNotFoundError`, `Exception` or a bare `except`) and goes on: a
        handler that ends in `raise` or an exit does not make the import optional."""
        if self._optional_imports is None:
            self._optional_imports = set()
            catching = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
            for tree in self.trees:
                for statement in _statements(tree):
                    if not isinstance(statement, ast.Try) or not any(
                        (
                            handler.type is None
                            or {last_name(kind) for kind in _handled_types(handler.type)} & catching
                        )
                        and not _ends_the_program(handler.body[-1])
                        for handler in statement.handlers
                    ):
                        continue
                    for inner in statement.body:
                        for part in _statements(inner):
                            if isinstance(part, ast.Import | ast.ImportFrom):
                                self._optional_imports.add(id(part))
        return id(node) in self._optional_imports

    def after_if(self, node: ast.If) -> list[ast.stmt]:
        """The statements after an `if` with no `else` whose body always leaves (`return`,
        `raise`): what runs when its test is false. Found on the first such `if` of a file."""
        if self._falls_through_to is None:
            self._falls_through_to = {}
            for tree in self.trees:
                for parent in _statements(tree):  # blocks belong to statements (and handlers)
                    for name in ("body", "orelse", "finalbody"):
                        block = getattr(parent, name, None)
                        if not isinstance(block, list):
                            continue
                        for index, statement in enumerate(block):
                            if (
                                isinstance(statement, ast.If)
                                and not statement.orelse
                                and isinstance(statement.body[-1], ast.Return | ast.Raise)
                            ):
                                self._falls_through_to[id(statement)] = block[index + 1 :]
        return self._falls_through_to.get(id(node), [])

    @property
    def names_a_device(self) -> bool:
        """True when code (not prose) names a device anywhere: a name, attribute or keyword
        with device, cuda, accelerator or tpu in it, or a device string. Computed once, on the
        first float64 finding, since it walks the whole tree."""
        if self._names_a_device is None:
            self._names_a_device = any(
                _DEVICE_WORD.search(_node_word(node)) is not None
                for tree in self.trees
                for node in ast.walk(tree)
            )
        return self._names_a_device


def _ends_the_program(statement: ast.stmt) -> bool:
    """`raise ...` or an exit call (`sys.exit(...)`, `exit()`)."""
    if isinstance(statement, ast.Raise):
        return True
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and last_name(statement.value.func) in {"exit", "quit", "_exit"}
    )


def _handled_types(kind: ast.AST) -> list[ast.AST]:
    return list(kind.elts) if isinstance(kind, ast.Tuple) else [kind]


def _node_word(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.keyword):
        return node.arg or ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 12:
        return node.value if node.value.split(":")[0] in DEVICE_WORDS - {"cpu", "meta"} else ""
    return ""


def _statements(tree: ast.AST) -> Iterable[ast.AST]:
    """Every statement of a tree, nested ones included, without visiting expressions."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for field_name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field_name, None)
            if isinstance(children, list):
                pending.extend(children)


def collect_facts(trees: Sequence[ast.AST], source: str) -> FileFacts:
    """Imports (and `name = torch.cuda` aliases) anywhere, whether the file compiles, whether
    it names a device, and names that carry a backend or a device type to where it is used."""
    aliases = {"torch": "torch"}
    module_aliases: list[tuple[str, ast.AST]] = []
    for tree in trees:
        for node in _statements(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        top_level = alias.name.split(".")[0]
                        aliases[top_level] = top_level
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Attribute | ast.Name)
            ):
                module_aliases.append((node.targets[0].id, node.value))
    for local, value in module_aliases:
        parts = dotted_parts(value)
        if parts and parts[0] in aliases:
            full = ".".join([aliases[parts[0]], *parts[1:]])
            if full == "torch.cuda":
                aliases[local] = full
    facts = FileFacts(
        aliases=aliases,
        compiles=any(
            _word_starts(source, match.start()) for match in _COMPILE_CALL.finditer(source)
        ),
        trees=trees,
    )
    # Names that carry a value to where it is used, read from the text (a cheap stand-in for
    # data flow; a match in a comment only makes an assignment to that name count).
    if "nccl" in source:
        facts.backend_names = _names_passed(source, _BACKEND_NAME_USES)
    if "device_type" in source or "autocast" in source:
        facts.device_type_names = _names_passed(source, _DEVICE_TYPE_NAME_USES)
    if "get_device_module" in source:
        facts.device_module_names = set(_DEVICE_MODULE_BINDING.findall(source))
    return facts


# --------------------------------------------------------------------------------------------
# The walker: one pass over the tree, every rule looked up by node type


_STATEMENT_TYPES = frozenset(
    node_type
    for node_type in vars(ast).values()
    if isinstance(node_type, type) and issubclass(node_type, ast.stmt)
)
# Nodes no rule looks at and that hold nothing a rule looks at; never scheduled. Strings and
# other plain values in node fields are skipped the same way.
_LEAF_TYPES = frozenset(
    {ast.Constant, str, bytes, int, float, complex, bool, type(None), type(...)}
    | {
        node_type
        for node_type in vars(ast).values()
        if isinstance(node_type, type)
        and issubclass(
            node_type, ast.expr_context | ast.operator | ast.unaryop | ast.cmpop | ast.boolop
        )
    }
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(node_type: type[ast.AST]) -> tuple[str, ...]:
    """The fields of a node type that may hold child nodes (names, ids and contexts do not)."""
    fields = _CHILD_FIELDS.get(node_type)
    if fields is None:
        skipped = {
            "ctx",
            "id",
            "attr",
            "arg",
            "name",
            "type_comment",
            "kind",
            "level",
            "module",
            "conversion",
            "is_async",
        }
        fields = tuple(field_name for field_name in node_type._fields if field_name not in skipped)
        _CHILD_FIELDS[node_type] = fields
    return fields


_GUARDED_FLAG = 1  # inside the body of a CUDA guard
_GUARD_TEST_FLAG = 2  # inside the test of a CUDA guard
_FLAG_GUARD_FLAG = 4  # and every guard around it is a CUDA-named flag (`if self.use_cuda:`)
_FALLBACK_SHIFT = 3  # the bits above: which fallback the test's other branch takes (1-based)
_CPU_TENSOR_TYPES = frozenset(
    f"torch.{kind}Tensor"
    for kind in ("Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long")
)
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
_FLOAT16_NAMES = frozenset({"torch.float16", "torch.half"})
# Devices a decision in that branch may name: a TPU (then the code handles it) or another one,
# whose branch a TPU does not take.
_TPU_DEVICE_TYPES = frozenset({"tpu", "xla"})
_OTHER_DEVICE_TYPES = frozenset({"cpu", "mps", "xpu", "hpu", "mtia", "meta"})
_OTHER_DEVICE_PROBES = frozenset(
    {"torch.backends.mps.is_available", "torch.mps.is_available", "torch.xpu.is_available"}
)
# The advice for a CUDA probe whose other branch picks float16: on a TPU it would pick float16
# too. `--fix` leaves the probes that get this advice (tpuready.audit.fix reads it from here).
BFLOAT16_OFF_CUDA = (
    'bfloat16 wherever device.type != "cuda": write `device.type != "cuda" or '
    "torch.cuda.is_bf16_supported()` (TPUs and CPUs compute in bfloat16; only a GPU older "
    "than Ampere needs the float16 branch)"
)


def _places_work(node: ast.AST, *, on_cuda: bool) -> bool:
    """Whether `node` moves work to a device: `.cuda(...)` or `.to(...)` (with `on_cuda`,
    only `.to("cuda...")` or `.to(<a name with device in it>)`; a CUDA branch moving to
    `device` leaves a TPU on the CPU too). `--fix` ports no check over `.cuda(args.gpu)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "cuda":
        return True
    return node.func.attr == "to" and (
        not on_cuda
        or any(
            is_cuda_device_text(value) or "device" in last_name(value).lower()
            for value in node.args
        )
    )


# Comparisons of a device count that tell one device from several: (operator, smallest n).
_SEVERAL_DEVICES = ((ast.Gt, 1), (ast.GtE, 2), (ast.Lt, 2), (ast.LtE, 1), (ast.Eq, 2))


def _is_cuda_method_call(node: ast.AST) -> bool:
    """`x.cuda(...)`: a call that needs a CUDA GPU."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "cuda"
    )


def _is_device_count_call(node: object) -> bool:
    """`torch.cuda.device_count()` (or `cuda.device_count()` after `from torch import cuda`)."""
    return (
        isinstance(node, ast.Call)
        and last_name(node.func) == "device_count"
        and "cuda" in (dotted_parts(node.func) or ())
    )


def _is_whole_number(node: object) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _names_assigned(nodes: Iterable[ast.AST], value_is: Callable[[ast.AST], bool]) -> set[str]:
    """The plain names that `nodes` assign a value `value_is` accepts: `n = <value>`."""
    return {
        target.id
        for node in nodes
        if isinstance(node, ast.Assign) and value_is(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


# `torch.cuda` members that stay CUDA-only after a port (no accelerator call gives the same):
# a CUDA branch holding one is CUDA-specific code, kept as a guard even where it moves work.
_STAYS_CUDA_ONLY = frozenset(
    {
        "get_device_capability",
        "get_device_name",
        "get_device_properties",
        "stream",
        "Stream",
        "current_stream",
        "set_stream",
        "Event",
        "graph",
        "CUDAGraph",
    }
)


def _stays_cuda_only(audit: Auditor, node: ast.AST) -> bool:
    """A node that is CUDA-specific whatever a port does: such a `torch.cuda` member, or one
    the table has no entry for. (A rank's index, `.cuda(args.gpu)`, is a tie to port.)"""
    if isinstance(node, ast.Attribute):
        name = audit.qualify(node) or ""
        if name.startswith("torch.cuda.") and not CUDA_TENSOR_TYPE.fullmatch(name):
            member = name.removeprefix("torch.cuda.").split(".")[0]
            return member in _STAYS_CUDA_ONLY or (
                member != "amp" and equivalent_for(member) is None
            )
    return False


def _device_values(nodes: Iterable[ast.AST]) -> list[ast.AST]:
    """The values among `nodes` used as devices: `.to(x)`, `torch.device(x)`, `device=x`, and
    the value of `device = x` / `return x` (not `map_location="cpu"`, a loading detail)."""
    values: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, ast.Call):
            last = last_name(node.func)
            if last in {"to", "device"}:
                values += node.args[:1]
            values += [k.value for k in node.keywords if k.arg in {"device", "device_type"}]
        elif isinstance(node, ast.Assign | ast.Return) and node.value is not None:
            values.append(node.value)
    return values


def _fallback_flags(fallback: int | None) -> int:
    return 0 if fallback is None else (fallback + 1) << _FALLBACK_SHIFT


class Auditor:
    """Walks one parsed module or cell and collects findings; each node reports once.

    A stack instead of recursion (a generated `a + b + ...` of 600 terms is deeper than
    Python's recursion limit); parents are handled before their children, so a rule on a
    call can silence the names inside it.
    """

    def __init__(
        self,
        facts: FileFacts,
        path: str,
        cell: int | None,
        lines: list[str] | None,
        *,
        rules: Mapping[str, Rule],
        checks: Mapping[type, tuple[Callable[[Any, Any], None], ...]],
    ):
        self.rules = rules  # by id: `tpuready.audit.rules.RULE_BY_ID`
        self.checks = checks  # by syntax node type: `tpuready.audit.rules.CHECKS_BY_NODE_TYPE`
        self.facts = facts
        self.aliases = facts.aliases
        self.path = path
        self.cell = cell
        self.lines = lines  # only for non-ASCII text: columns in characters need it
        self.findings: list[Finding] = []
        self.flags = 0
        self.current_name: str | None = None  # the resolved name of the Name/Attribute visited
        self._reported: set[int] = set()

    @property
    def in_cuda_guard(self) -> bool:
        """True inside a CUDA guard's body or test: there a must-change finding is guarded."""
        return bool(self.flags & (_GUARDED_FLAG | _GUARD_TEST_FLAG))

    @property
    def ported_flags(self) -> frozenset[str]:
        """CUDA-named flags this file sets from a CUDA probe (`use_cuda =
        torch.cuda.is_available()`, `self.has_cuda = ...`): the audit ports that probe, so an
        `if use_cuda:` is true on a TPU afterwards and guards nothing."""
        if self.facts.ported_flags is None:  # found once per file, shared by its cells
            names: set[str] = set()
            for tree in self.facts.trees:
                for node in _statements(tree):
                    if not isinstance(node, ast.Assign) or self.deliberate_cuda_check(node.value):
                        continue
                    if not any(
                        isinstance(inner, ast.Name | ast.Attribute)
                        and self.qualify(inner) in CUDA_PROBES
                        for inner in ast.walk(node.value)
                    ):
                        continue
                    names |= {
                        last_name(target)
                        for target in node.targets
                        if isinstance(target, ast.Name | ast.Attribute)
                    }
            self.facts.ported_flags = frozenset(names)
        return self.facts.ported_flags

    def run(self, tree: ast.AST, trigger_lines: Sequence[int] | None = None) -> None:
        """Check every node of `tree`. `trigger_lines`: the lines that hold a trigger word,
        ascending; a statement whose lines hold none is skipped whole, since every finding
        needs one."""
        checks = self.checks
        pending: list[tuple[ast.AST, int]] = [(tree, 0)]
        while pending:
            node, flags = pending.pop()
            if trigger_lines is not None and type(node) in _STATEMENT_TYPES:
                statement = cast("ast.stmt", node)  # quoted: casts here build no type per node
                start = statement.lineno
                decorators = getattr(node, "decorator_list", None)
                if decorators:
                    start = min(start, *(decorator.lineno for decorator in decorators))
                end = statement.end_lineno or start
                next_trigger = bisect.bisect_left(trigger_lines, start)
                if next_trigger == len(trigger_lines) or trigger_lines[next_trigger] > end:
                    continue
            self.flags = flags
            node_type = type(node)
            if node_type is ast.Name or node_type is ast.Attribute:
                # Every rule on names needs a `torch.` name: resolve it once, here.
                self.current_name = self.imported_name(cast("ast.Name | ast.Attribute", node))
                if self.current_name is None or not self.current_name.startswith("torch."):
                    if node_type is ast.Name:
                        continue
                    self.current_name = None
            if node_type is not ast.Attribute or self.current_name is not None:
                for check in checks.get(node_type, ()):
                    check(self, node)
            if node_type is ast.Attribute:
                # The chain `a.b.c` is checked as a whole; only a non-name base is visited.
                base = cast("ast.Attribute", node).value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if not isinstance(base, ast.Name):
                    pending.append((base, flags))
            elif (probe := self.deliberate_cuda_check(node)) is not None:
                # The probe is a CUDA check on purpose; the rest of the node is walked as usual.
                for child in ast.iter_child_nodes(node):
                    if type(child) not in _LEAF_TYPES:
                        pending.append(
                            (child, flags | _GUARD_TEST_FLAG if child in probe else flags)
                        )
            elif node_type is ast.BoolOp:
                # `available and cuda_only()`, `not_cuda or cuda_only()`: the operands after
                # the one that decides for CUDA run on CUDA only.
                bool_op = cast("ast.BoolOp", node)
                on_cuda_only = isinstance(bool_op.op, ast.And)
                value_flags = flags
                for value in bool_op.values:
                    pending.append((value, value_flags))
                    if self.is_cuda_test(value) is on_cuda_only:
                        value_flags = flags | _GUARDED_FLAG
            elif node_type is ast.Assert and flags & _FLAG_GUARD_FLAG:
                # `if self.use_cuda: assert torch.cuda.is_available()`: the flag is the user
                # asking for the accelerator, not proof that CUDA is there, so on a TPU host
                # the assert fails; under a real CUDA check it could not.
                for child in ast.iter_child_nodes(node):
                    pending.append((child, flags & ~(_GUARDED_FLAG | _FLAG_GUARD_FLAG)))
            elif node_type is ast.If or node_type is ast.IfExp:
                branch = cast("ast.If | ast.IfExp", node)
                polarity = self.guard_polarity(branch)
                test_flags = flags | _GUARD_TEST_FLAG if polarity is not None else flags
                if polarity is None:
                    test_flags |= _fallback_flags(self.fallback_of(branch))
                pending.append((branch.test, test_flags))
                guarded_flags = self.guarded_flags(flags, branch.test)
                body_flags = guarded_flags if polarity is True else flags
                else_flags = guarded_flags if polarity is False else flags
                for part, part_flags in ((branch.body, body_flags), (branch.orelse, else_flags)):
                    if isinstance(part, list):
                        pending.extend((item, part_flags) for item in part)
                    else:
                        pending.append((part, part_flags))
            else:
                for name in _child_fields(node_type):
                    field_value = getattr(node, name, None)
                    if type(field_value) is list:
                        pending.extend(
                            (item, flags) for item in field_value if type(item) not in _LEAF_TYPES
                        )
                    elif field_value is not None and type(field_value) not in _LEAF_TYPES:
                        pending.append((field_value, flags))

    # -- names ----------------------------------------------------------------------------

    def qualify(self, node: ast.AST) -> str | None:
        """Full dotted name of a name or attribute chain whose head was imported."""
        parts = dotted_parts(node)
        if parts is None:
            return None
        head = self.aliases.get(parts[0])
        if head is None:
            return None
        return ".".join([head, *parts[1:]])

    def imported_name(self, node: ast.Name | ast.Attribute) -> str | None:
        """The full name of a name or outermost attribute chain that resolves through an
        import, or None (`x` that was never imported, `torch` itself)."""
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                return None
            name = self.aliases.get(node.id)
            return name if name is not None and name != node.id else None
        return self.qualify(node)

    # -- guards ---------------------------------------------------------------------------

    def is_cuda_test(self, node: ast.AST) -> bool | None:
        """True when `node` is true exactly on CUDA, False when exactly off CUDA, else None."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.is_cuda_test(node.operand)
            return None if inner is None else not inner
        if isinstance(node, ast.BoolOp):
            results = [self.is_cuda_test(value) for value in node.values]
            if isinstance(node.op, ast.And) and True in results:
                return True
            if isinstance(node.op, ast.Or) and False in results:
                return False
            return None
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            sides = (node.left, node.comparators[0])
            if any(string_value(side) in ("cuda", "cuda:0") for side in sides):
                if isinstance(node.ops[0], ast.Eq | ast.In | ast.Is):
                    return True
                if isinstance(node.ops[0], ast.NotEq | ast.NotIn | ast.IsNot):
                    return False
            return True if any(self._is_probe(side) for side in sides) else None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
            and node.args
            and string_value(node.args[0]) == "cuda"
        ):
            return True
        return True if self._is_probe(node) else None

    def deliberate_cuda_check(self, node: ast.AST) -> list[ast.AST] | None:
        """The children of `node` that check for CUDA on purpose, or None when none do.

        Outside an `if`, two shapes do: an `and` / `or` that also asks which CUDA (a compute
        capability, ROCm's `torch.version.hip`), whose short-circuit protects that CUDA-only
        call, and the condition of a test-skip decorator. Each guards CUDA-only code, so
        `torch.accelerator.is_available()` would be wrong there. A flag such as `use_cuda =
        torch.cuda.is_available()` is not one: it usually picks the device, so it is ported.
        """
        if isinstance(node, ast.BoolOp):  # `and`, or `not available or capability < 9`
            reads_identity = any(
                isinstance(inner, ast.Name | ast.Attribute)
                and self.qualify(inner) in CUDA_IDENTITY_PROBES
                for value in node.values
                for inner in ast.walk(value)
            )
            return list(node.values) if reads_identity else None
        if isinstance(node, ast.Call) and self.qualify(node.func) in TEST_SKIP_DECORATORS:
            # The probe is the first argument or the `condition=` keyword (a child node).
            keyword = next((k for k in node.keywords if k.arg == "condition"), None)
            child = node.args[0] if node.args else keyword
            if child is None:
                return None
            condition = child.value if isinstance(child, ast.keyword) else child
            if self.is_cuda_test(condition) is None:
                return None
            return [child]
        return None

    def guarded_flags(self, flags: int, test: ast.AST) -> int:
        """`flags` for the CUDA-only branch of a guard with this test: guarded, and guarded by
        CUDA-named flags alone while no real CUDA check encloses it."""
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test = test.operand
        flag_only = (
            isinstance(test, ast.Name | ast.Attribute)
            and self.qualify(test) not in CUDA_PROBES
            and CUDA_FLAG_NAME.search(last_name(test)) is not None
        )
        if not flag_only:
            return (flags | _GUARDED_FLAG) & ~_FLAG_GUARD_FLAG
        if flags & _GUARDED_FLAG:
            return flags
        return flags | _GUARDED_FLAG | _FLAG_GUARD_FLAG

    def _is_probe(self, node: ast.AST) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Call):
            node = node.func
        if not isinstance(node, ast.Name | ast.Attribute):
            return False
        name = self.qualify(node)
        if name in CUDA_PROBES:
            return True
        flag = last_name(node)
        return CUDA_FLAG_NAME.search(flag) is not None and flag not in self.ported_flags

    def asks_for_several_cuda_gpus(self, node: ast.Compare) -> bool:
        """`torch.cuda.device_count() > 1` (or `>= 2`, `== 2`, `< 2`): wrong on a TPU host."""
        if len(node.ops) != 1 or not isinstance(node.left, ast.Call):
            return False
        count, limit = node.left.func, node.comparators[0]
        return (
            isinstance(count, ast.Attribute)
            and self.qualify(count) == "torch.cuda.device_count"
            and isinstance(limit, ast.Constant)
            and type(limit.value) is int
            and any(
                isinstance(node.ops[0], operator) and limit.value >= smallest
                for operator, smallest in _SEVERAL_DEVICES
            )
        )

    def counts_cuda_gpus(self, value: ast.AST | None) -> bool:
        """True when `value` calls `torch.cuda.device_count()`: assigned under a CUDA check, it
        sizes the run (processes, batch per device), which a TPU host then never does."""
        return value is not None and any(
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and self.qualify(inner.func) == "torch.cuda.device_count"
            for inner in ast.walk(value)
        )

    def bf16_check_in(self, node: ast.BoolOp) -> ast.Call | None:
        """The `torch.cuda.is_bf16_supported()` operand of an `and`: False on a TPU."""
        if not isinstance(node.op, ast.And):
            return None
        for value in node.values:
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and self.qualify(value.func) == "torch.cuda.is_bf16_supported"
            ):
                return value
        return None

    def decides_wrong_for_a_tpu(self, test: ast.AST) -> bool:
        """A test holding a decision a TPU gets wrong (`asks_for_several_cuda_gpus`,
        `bf16_check_in`): it is ported, not kept as a guard."""
        return any(
            (isinstance(inner, ast.Compare) and self.asks_for_several_cuda_gpus(inner))
            or (isinstance(inner, ast.BoolOp) and self.bf16_check_in(inner) is not None)
            for inner in ast.walk(test)
        )

    def guard_polarity(self, node: ast.If | ast.IfExp) -> bool | None:
        """True: the body runs only on CUDA; False: the else-branch does; None: not a guard.

        An `if` whose CUDA branch chooses the device (`device = "cuda"`, `return
        torch.device("cuda")`) or counts the GPUs into a name is a choice, not a guard, and so
        is one whose other branch is what a TPU must not get (`fallback_of`): both are ported,
        not kept."""
        polarity = self.is_cuda_test(node.test)
        if polarity is None or self.decides_wrong_for_a_tpu(node.test):
            return None
        chosen = node.body if polarity else node.orelse
        statements = chosen if isinstance(chosen, list) else []
        for statement in statements:
            if (
                isinstance(statement, ast.Assign | ast.Return)
                and statement.value is not None
                and device_choice(statement.value)
            ):
                return None
            if isinstance(statement, ast.Assign | ast.AnnAssign) and self.counts_cuda_gpus(
                statement.value
            ):
                return None  # `n_gpus = torch.cuda.device_count()`: a TPU host never counts
        if isinstance(chosen, ast.AST) and is_cuda_device_text(chosen):
            return None
        if self.fallback_of(node, polarity) is not None:
            return None
        return polarity

    def fallback_of(self, node: ast.If | ast.IfExp, polarity: bool | None = None) -> int | None:
        """Which of `FALLBACKS` the branch taken off CUDA takes, or None: the CPU (a `"cpu"`
        device, `.cpu()`, a CPU tensor type), an exit (`raise`, `sys.exit`), or float16. A TPU
        would take that branch, so the CUDA check must be ported, not kept."""
        if polarity is None:
            polarity = self.is_cuda_test(node.test)
            if polarity is None:
                return None
        other = node.orelse if polarity else node.body
        if polarity and isinstance(node, ast.If) and not other:
            other = self.facts.after_if(node)
        cuda_path = node.body if polarity else node.orelse
        if not polarity and isinstance(node, ast.If) and not cuda_path:
            cuda_path = self.facts.after_if(node)  # `if not available: return x` then CUDA
        cuda_nodes = [
            inner
            for root in (cuda_path if isinstance(cuda_path, list) else [cuda_path])
            for inner in ast.walk(root)
        ]
        if any(_stays_cuda_only(self, inner) for inner in cuda_nodes):
            return None  # CUDA-specific code: a ported check would not make it run on a TPU
        found = self._reachable_off_cuda(other)
        if found is None:
            return None  # the code names the TPU: it handles it, whatever it does
        reachable, direct = found
        cpu_devices = {id(value) for value in _device_values(reachable)}
        for inner in reachable:
            if id(inner) in cpu_devices and string_value(inner) == "cpu":
                return 0
            if isinstance(inner, ast.Name | ast.Attribute):
                name = self.qualify(inner)
                if name in _CPU_TENSOR_TYPES:
                    return 0
                if name in _FLOAT16_NAMES:
                    return 2
            if string_value(inner) in {"float16", "fp16", "half"}:
                return 2
        for statement in direct:  # an exit the branch itself makes, not one under a decision
            call = statement.value if isinstance(statement, ast.Expr) else None
            if isinstance(statement, ast.Raise) or (
                isinstance(call, ast.Call)
                and (
                    self.qualify(call.func) in _EXIT_CALLS
                    or (isinstance(call.func, ast.Name) and call.func.id in _EXIT_CALLS)
                )
            ):
                return 1
        if any(_places_work(inner, on_cuda=True) for inner in cuda_nodes) and not any(
            _places_work(inner, on_cuda=False) for inner in reachable
        ):
            return 3  # `if torch.cuda.is_available(): model.cuda()`: a TPU keeps the CPU
        written = node.orelse if polarity else node.body  # the branch as written, not after it
        if isinstance(node, ast.IfExp):
            if _is_device_count_call(cuda_path) and _is_whole_number(written):
                return 5  # `torch.cuda.device_count() if available else 1`
        elif written:
            if any(_is_cuda_method_call(inner) for inner in reachable):
                return 4
            counted = _names_assigned(cuda_nodes, _is_device_count_call)  # n = device_count()
            if counted & _names_assigned(reachable, _is_whole_number):  # else: n = 1
                return 5
        return None

    def _reachable_off_cuda(
        self, branch: ast.AST | list[ast.stmt]
    ) -> tuple[list[ast.AST], list[ast.AST]] | None:
        """Every node of `branch` a TPU may reach, and the statements it surely runs: an
        `elif` chain or a later decision is followed into the branch a TPU takes
        (`_tpu_takes`), its test left out; None when a decision names the TPU."""
        reachable: list[ast.AST] = []
        direct: list[ast.AST] = []  # statements every TPU run reaches (no unknown decision)
        pending = [(item, True) for item in (branch if isinstance(branch, list) else [branch])]
        while pending:
            inner, certain = pending.pop(0)
            if isinstance(inner, ast.If | ast.IfExp):
                taken = self._tpu_takes(inner.test)
                if taken == "handled":
                    return None
                parts = [inner.body, inner.orelse] if taken is None else [getattr(inner, taken)]
                for part in parts:
                    items = part if isinstance(part, list) else [part]
                    pending.extend((item, certain and taken is not None) for item in items)
                continue
            reachable.append(inner)
            if certain and isinstance(inner, ast.stmt):
                direct.append(inner)
            pending.extend((child, False) for child in ast.iter_child_nodes(inner))
        return reachable, direct

    def _tpu_takes(self, test: ast.AST) -> str | None:
        """Which branch of a decision a TPU takes: "body" or "orelse" for a test about another
        device (`device.type == "cpu"`, `torch.backends.mps.is_available()`), "handled" for a
        test that names the TPU (the code handles it), None when the test says nothing."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._tpu_takes(test.operand)
            return {"body": "orelse", "orelse": "body"}.get(inner or "", inner)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            # `hasattr(torch.backends, "mps") and torch.backends.mps.is_available()`: one
            # conjunct false on a TPU makes the whole test false there.
            parts = [self._tpu_takes(value) for value in test.values]
            if "handled" in parts:
                return "handled"
            if "orelse" in parts:
                return "orelse"
        for node in ast.walk(test):
            text = string_value(node)
            if text is not None and text.split(":")[0] in _TPU_DEVICE_TYPES:
                return "handled"
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            for side in (test.left, test.comparators[0]):
                if (string_value(side) or "").split(":")[0] in _OTHER_DEVICE_TYPES:
                    if isinstance(test.ops[0], ast.Eq | ast.In | ast.Is):
                        return "orelse"
                    if isinstance(test.ops[0], ast.NotEq | ast.NotIn | ast.IsNot):
                        return "body"
        probe = test.func if isinstance(test, ast.Call) else test
        if isinstance(probe, ast.Name | ast.Attribute) and self.qualify(probe) in (
            _OTHER_DEVICE_PROBES
        ):
            return "orelse"
        return None

    # -- reporting ------------------------------------------------------------------------

    def silence(self, node: ast.AST) -> None:
        """Mark `node` and everything under it as reported (one finding per expression)."""
        for inner in ast.walk(node):
            self._reported.add(id(inner))

    def report(
        self,
        rule: str,
        node: ast.AST,
        message: str,
        suggestion: str | None = None,
        *,
        severity: str | None = None,
        at_attribute: bool = False,
        per_rank: bool = False,
        cuda_name: str | None = None,
        even_in_guard: bool = False,
        off_cuda: str | None = None,
    ) -> None:
        """Record one finding at `node` (once per node). A must-change finding inside a CUDA
        guard is guarded, unless `even_in_guard`: the guard itself is what a TPU gets wrong."""
        if id(node) in self._reported:
            return
        self._reported.add(id(node))
        entry = self.rules[rule]
        severity = severity or entry.severity
        suggestion = suggestion or entry.advice
        fallback = self.flags >> _FALLBACK_SHIFT
        if severity == MUST_CHANGE and fallback and off_cuda is None:
            off_cuda = FALLBACKS[fallback - 1]
            message += f" ({OFF_CUDA_BRANCH} {off_cuda}: a TPU would take it)"
            if rule == "torch-cuda-call" and off_cuda == PICKS_FLOAT16:
                suggestion = BFLOAT16_OFF_CUDA
        if severity == MUST_CHANGE and not even_in_guard:
            if self.flags & _GUARD_TEST_FLAG:
                severity, suggestion = GUARDED, PROBE_ADVICE
                message += " (a CUDA guard)"
            elif self.flags & _GUARDED_FLAG:
                severity = GUARDED
                message += " (inside a CUDA-only guard: correct as it stands)"
        if at_attribute and isinstance(node, ast.Attribute) and node.end_lineno is not None:
            # `model\n    .cuda()`: point at the line that holds `.cuda`, not at `model`.
            line = node.end_lineno
            byte_column = (node.end_col_offset or 0) - len(node.attr.encode("utf-8"))
        else:
            line = node.lineno  # type: ignore[attr-defined]  # ast.AST has none; these do
            byte_column = node.col_offset  # type: ignore[attr-defined]  # likewise
        self.findings.append(
            Finding(
                path=self.path,
                cell=self.cell,
                line=line,
                column=self._character_column(line, byte_column) + 1,
                rule=rule,
                severity=severity,
                message=message,
                suggestion=suggestion,
                per_rank=per_rank,
                off_cuda=off_cuda,
                cuda_name=cuda_name,
            )
        )

    def _character_column(self, line: int, byte_column: int) -> int:
        """`ast` counts columns in UTF-8 bytes; editors count characters."""
        if self.lines is None or not 0 < line <= len(self.lines):
            return byte_column
        text = self.lines[line - 1]
        return len(text.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))

    # -- shared by several rules ------------------------------------------------------------

    def check_device_value(self, node: ast.AST, *, as_type: bool) -> None:
        """Report a CUDA device string used where a device (or device type) is expected."""
        if isinstance(node, ast.IfExp):
            polarity = self.is_cuda_test(node.test)
            chosen = node.body if polarity else node.orelse
            if polarity is not None and is_cuda_device_text(chosen):
                # `"cuda" if torch.cuda.is_available() else "cpu"`: one finding, the choice.
                target = "device.type" if as_type else "device"
                self.report(
                    "cuda-device-string",
                    node,
                    f"`{code_of(node)}` chooses a CUDA GPU or the CPU, never a TPU",
                    f"{target}, where {CHOOSE_DEVICE}",
                )
                self.silence(node)
                return
            self.check_device_value(node.body, as_type=as_type)
            self.check_device_value(node.orelse, as_type=as_type)
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self.check_device_value(value, as_type=as_type)
            return
        if not is_cuda_device_text(node):
            rank = rank_of_device_text(node)
            if rank is not None:  # f"{device_type}:{local_rank}": the accelerator style
                self.report(
                    "set-device-index",
                    node,
                    f"`{code_of(node)}` names the device at the rank's own index; "
                    f"{ONE_DEVICE_PER_PROCESS}",
                    per_rank_advice(rank),
                    per_rank=True,
                )
            return
        shown = code_of(node)
        index = index_in_device_text(node)
        message = f"{shown} names a CUDA GPU only"
        target = "device.type" if as_type else "device"
        suggestion = f"{target}, where {CHOOSE_DEVICE}"
        if index is not None:
            message += f"; {ONE_DEVICE_PER_PROCESS}"
            index_text = index if isinstance(index, str) else code_of(index, 30)
            if not as_type and index_text != "0":
                suggestion = (
                    per_rank_advice(index_text)
                    + " (a torchrun port that uses current_accelerator() alone puts every rank "
                    "on device 0 of a CUDA host)"
                )
        self.report("cuda-device-string", node, message, suggestion, per_rank=index is not None)
