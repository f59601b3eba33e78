"""What the fixer reads of a module before it rewrites anything: its imports (the aliases of
`torch` and friends), the names it uses as strings, and where and how a scope binds `device`
(the choice, a caller's device, or something else the rewrites must not capture). Part of
`tpuready.audit.fix`; the rewriter (`tpuready.audit.fix_rewriter`) asks these questions."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

import libcst as cst

from tpuready.audit.sources import parse_python
from tpuready.audit.syntax import (
    dotted_parts,
)

__all__ = [
    "ModuleFacts",
    "binds_device",
    "dotted",
    "is_the_choice",
    "module_facts",
    "scope_kind",
    "string_value",
    "walk",
]


def dotted(node: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name or Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def string_value(node: cst.CSTNode) -> str | None:
    """The value of a plain string literal (no f-string), else None."""
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under `node`, itself included (iterative: deep expressions do not recurse)."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.children)


class ModuleFacts(cst.CSTVisitor):
    """What the fixer needs to know before rewriting: imports, and names used as strings."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {"torch": "torch"}
        self.binds_torch = False
        self.string_used: set[str] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            full = dotted(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.aliases[alias.asname.name.value] = full
            else:
                top = full.split(".")[0]
                self.aliases[top] = top
                if top == "torch":
                    self.binds_torch = True
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = dotted(node.module) if node.module is not None else None
        if module is None or node.relative or isinstance(node.names, cst.ImportStar):
            return False
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.aliases[local] = f"{module}.{name}"
        return False

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(target.comparator for target in node.comparisons)]
        if any(isinstance(operand, cst.SimpleString | cst.FormattedString) for operand in operands):
            for operand in operands:
                name = dotted(operand)
                if name is not None:
                    self.string_used.add(name)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        for operand in (node.left, node.right):
            name = dotted(operand)
            if name is not None:
                self.string_used.add(name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # `name.startswith(...)`, `name.split(":")`: a string method on the name.
        if node.attr.value not in {"type", "index"}:
            name = dotted(node.value)
            if name is not None and not name.startswith("torch"):
                self.string_used.add(name)


def module_facts(source: str, module: cst.Module) -> ModuleFacts:
    """`ModuleFacts` of `source`, read from Python's own syntax tree (several times faster
    than a libcst pass); from `module` where `ast` refuses the text."""
    facts = ModuleFacts()
    try:
        tree = parse_python(source)  # its warnings silenced
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
    parts = dotted_parts(node)
    return ".".join(parts) if parts is not None else None


def _ast_dotted_names(nodes: Sequence[ast.AST]) -> list[str]:
    return [name for node in nodes if (name := _ast_dotted(node)) is not None]


def binds_device(statements: Sequence[cst.CSTNode]) -> bool:
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
            if any(dotted(target.target) == "device" for target in node.targets):
                values.append(node.value)
        elif isinstance(node, cst.AnnAssign | cst.AugAssign):
            if dotted(node.target) == "device":
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
        return dotted(node.target) == "device"
    if isinstance(node, cst.With):
        return any(
            item.asname is not None and dotted(item.asname.name) == "device" for item in node.items
        )
    return False


def scope_kind(
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
                if parameter.default is not None and not is_the_choice(parameter.default):
                    return "other"
                annotation = parameter.annotation
                if annotation is not None and dotted(annotation.annotation) == "torch.device":
                    return "device"
                return "unknown"
    values = _device_values(statements)
    if not values:
        return None
    if not all(value is not None and is_the_choice(value) for value in values):
        return "other"
    return "unknown" if string_used else "device"


def is_the_choice(value: cst.BaseExpression) -> bool:
    """True for the device choice, or a CUDA choice the fixer turns into it:
    `current_accelerator(...) or ...`, `choose_device()`, `"cuda"`, `torch.device("cuda")`,
    `"cuda" if torch.cuda.is_available() else "cpu"` (also inside `torch.device(...)`), and
    the program's own choice `torch.device(args.device)`: its model is there, so are inputs."""
    if isinstance(value, cst.BooleanOperation):
        return is_the_choice(value.left)
    if isinstance(value, cst.Call):
        name = (dotted(value.func) or "").rsplit(".", 1)[-1]
        if name in {"current_accelerator", "choose_device"}:
            return True
        if name != "device" or len(value.args) != 1:
            return False
        argument = value.args[0].value
        return string_value(argument) is None or is_the_choice(argument)
    if string_value(value) == "cuda":
        return True
    return isinstance(value, cst.IfExp) and string_value(value.body) == "cuda"
