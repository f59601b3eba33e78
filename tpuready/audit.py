"""Find the lines that tie PyTorch code to CUDA, and say what to write instead.

Taught in `notebooks/01_device_agnostic_basics.ipynb`. `audit_source(paths)` and
`python -m tpuready audit-source PATH...` read Python files and notebooks with `ast`, never
with regular expressions over the text, so the word "cuda" in a comment, a docstring or a
message printed for the reader is never a finding. The `torch.cuda.*` replacements come from
`tpuready.accelerator_api`, the same table chapter 1 prints.

What each rule looks for (`RULES` holds the one-line descriptions):

- `cuda-device-string`: a string that is exactly `cuda` or `cuda:N` (or an f-string, `+`,
  `%` or `.format` that starts with `cuda:`) used as a device: an argument of `.to(...)`;
  the first argument of `torch.device`, `torch.set_default_device`, `torch.Generator`,
  `torch.autocast` / `torch.amp.autocast`, `torch.amp.GradScaler`, `init_device_mesh`; the
  value of a `device=`, `device_type=`, `map_location=`, `device_map=` or `default=` keyword
  or of a `"device"` key in a dict literal; the whole value assigned to a name or attribute,
  returned from a function, or given as a parameter default. Branches of `a if c else b`
  and `a or b` count. Comparisons (`device.type == "cuda"`), lists (`choices=[...]`),
  prints and docstrings do not.
- `float64`: float64 requested for computation: `.double()`, and `torch.float64` /
  `torch.double` as a `dtype=` value, an argument of `.to(...)` / `.type(...)` or of
  `torch.set_default_dtype`. A call that also names the CPU (`x.to("cpu", torch.float64)`,
  `x.cpu().double()`) is exempt: float64 on the host is fine. Mentions (dict keys,
  comparisons such as `x.dtype == torch.float64`) are not findings.
- `inference-mode`: `torch.inference_mode` as a `with` context or a decorator. Whether
  compiled code runs inside cannot be known statically, so every such region is flagged:
  `torch.no_grad()` is the portable choice.
- `to-int-device`: `.to(N)` with an integer literal, `int(...)`, or a name whose last part is
  `rank`, `local_rank`, `gpu`, `gpu_id`, `device_id`, `device_index` (`x.to(args.local_rank)`).
- `set-device-index`: `set_device(...)` / `set_device_index(...)` with anything but the
  literal 0. It wins over `torch-cuda-call` for `torch.cuda.set_device(local_rank)`.
- The other rules match names after resolving imports anywhere in the file (flow-insensitive):
  `import torch.cuda as tc`, `from torch import cuda`, `from torch.cuda.amp import autocast`
  and `from torch.backends import cudnn` all resolve to the `torch.` names.

Each node gives at most one finding. Code that is CUDA-specific on purpose (a branch that runs
only when `device.type == "cuda"`) can say so on its line: `# tpuready: ignore` silences every
rule on that line, `# tpuready: ignore[float64, pin-memory]` only those rules.

Notebooks are read cell by cell. Cells are numbered 1, 2, ... among code cells only (markdown
cells are skipped), which is the execution count of a notebook run top to bottom; lines are
counted within the cell: `notebook.ipynb:cell 3:line 2`. Code cells tagged `cuda-on-purpose`
are exempt. IPython line magics and shell lines (`%matplotlib`, `!pip`, `x = !ls`, `obj?`)
become `pass` when the cell does not parse as it is; cells starting with `%%time`,
`%%timeit`, `%%capture`, `%%prun` or `%%writefile NAME.py` are read as Python, other cell
magics (`%%bash`, `%%html`, ...) are skipped. Imports anywhere in the notebook resolve names in
every cell.

A file or cell that does not parse gives one `syntax-error` finding (so the command exits
with 1) and the scan goes on with the next file or cell.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import tokenize
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tpuready.accelerator_api import equivalent_for

__all__ = [
    "CUDA_ON_PURPOSE_TAG",
    "RULES",
    "SKIPPED_DIRECTORIES",
    "AuditInputError",
    "Finding",
    "audit_code",
    "audit_file",
    "audit_notebook",
    "audit_source",
    "find_source_files",
    "format_json",
    "format_text",
]

CUDA_ON_PURPOSE_TAG = "cuda-on-purpose"

# Folders never entered when a folder is scanned (hidden folders are skipped as well).
# A path named explicitly on the command line is always scanned.
SKIPPED_DIRECTORIES: frozenset[str] = frozenset(
    {".venv", "venv", ".git", "_build", "__pycache__", "node_modules", "site-packages"}
)

RULES: Mapping[str, str] = MappingProxyType(
    {
        "cuda-method": "`.cuda()` on a tensor or module",
        "torch-cuda-call": "a `torch.cuda.*` name, with its `torch.accelerator` equivalent",
        "cuda-device-string": '`"cuda"` / `"cuda:N"` used as a device or device type',
        "cuda-amp": "`torch.cuda.amp` (autocast, GradScaler, custom_fwd, ...)",
        "cudnn-setting": "a `torch.backends.cudnn` setting (benchmark, deterministic, ...)",
        "cuda-backend-setting": "a `torch.backends.cuda` setting (matmul.allow_tf32, ...)",
        "pin-memory": "`pin_memory=True` written unconditionally",
        "to-int-device": "`.to(<int>)`: an integer device index",
        "set-device-index": "`set_device(i)` / `set_device_index(i)` with i that may not be 0",
        "nccl-backend": '`init_process_group("nccl")` / `backend="nccl"` hard-coded',
        "float64": "float64 requested for computation (`.double()`, `dtype=torch.float64`)",
        "inference-mode": "`torch.inference_mode` as a `with` context or decorator",
        "syntax-error": "a file or notebook cell that does not parse (nothing in it was checked)",
    }
)

CHOOSE_DEVICE = (
    'device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
)
_GUARD_ADVICE = 'or run it only when device.type == "cuda"'
_ONE_DEVICE_PER_PROCESS = "TorchTPU runs one process per device and each sees it as index 0"

_CUDA_DEVICE_LITERAL = re.compile(r"cuda(:\d+)?")
# Calls whose first positional argument is a device, and whether it is a device *type*.
_DEVICE_FIRST_ARGUMENT: Mapping[str, bool] = MappingProxyType(
    {
        "torch.device": False,
        "torch.set_default_device": False,
        "torch.Generator": False,
        "torch.get_device_module": False,
        "torch.autocast": True,
        "torch.amp.autocast": True,
        "torch.amp.autocast_mode.autocast": True,
        "torch.amp.GradScaler": True,
        "torch.distributed.device_mesh.init_device_mesh": True,
        "torch.distributed.init_device_mesh": True,
    }
)
# Keyword arguments whose value is a device, and whether it is a device *type*.
_DEVICE_KEYWORDS: Mapping[str, bool] = MappingProxyType(
    {
        "device": False,
        "device_type": True,
        "map_location": False,
        "device_map": False,
        "default": False,  # argparse: add_argument("--device", default="cuda")
    }
)
_DEVICE_DICT_KEYS = frozenset({"device", "device_type", "map_location", "device_map"})
_RANK_LIKE_NAME = re.compile(r"(?:^|_)(?:rank|gpu|gpu_id|gpu_index|device_id|device_index)$")
_FLOAT64_NAMES = frozenset({"torch.float64", "torch.double"})
_INFERENCE_MODE_NAMES = frozenset(
    {
        "torch.inference_mode",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
_CUDNN_SUGGESTIONS: Mapping[str, str] = MappingProxyType(
    {
        "benchmark": 'remove it, or set it only when device.type == "cuda" '
        "(cuDNN autotuning has no TPU counterpart)",
        "deterministic": "torch.use_deterministic_algorithms(True), the backend-neutral switch",
        "allow_tf32": 'torch.set_float32_matmul_precision("high")',
        "enabled": "remove it: cuDNN is never used off CUDA GPUs",
    }
)
_CUDA_BACKEND_SUGGESTIONS: Mapping[str, str] = MappingProxyType(
    {
        "matmul.allow_tf32": 'torch.set_float32_matmul_precision("high")',
        "sdp_kernel": "torch.nn.attention.sdpa_kernel(...), " + _GUARD_ADVICE,
    }
)

# Cell magics whose body is Python; `%%writefile` counts when it writes a .py file.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
_IPYTHON_ONLY_LINE = re.compile(r"^(\s*)(?:[!%]|[\w.\[\], ]+=\s*[!%]|[\w.]+\?{1,2}\s*$)")
# Every rule needs one of these in the source text (an import of torch.cuda contains "cuda").
_TRIGGER_WORDS = (
    "cuda",
    "cudnn",
    "pin_memory",
    ".to",
    "set_device",
    "double",
    "float64",
    "inference_mode",
)
_IGNORE_PRAGMA = re.compile(r"#\s*tpuready:\s*ignore(?:\[(?P<rules>[^\]]*)\])?")

PathArgument = str | os.PathLike[str]


class AuditInputError(ValueError):
    """A path the audit cannot read: missing, of an unsupported type, or not decodable."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One line that ties code to CUDA, with the portable spelling to write instead.

    `cell` is None for .py files; for notebooks it counts code cells from 1 and `line` is
    the line within that cell. `line` and `column` are 1-based.
    """

    path: str
    cell: int | None = None
    line: int
    column: int
    rule: str
    message: str
    suggestion: str

    @property
    def location(self) -> str:
        """`file.py:12`, or `notebook.ipynb:cell 3:line 2` for a notebook cell."""
        if self.cell is None:
            return f"{self.path}:{self.line}"
        return f"{self.path}:cell {self.cell}:line {self.line}"

    def sort_key(self) -> tuple[str, int, int, int, str]:
        """Order of the report: file, cell, line, column, rule."""
        return (self.path, self.cell or 0, self.line, self.column, self.rule)

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain JSON-ready values (the `--format json` objects)."""
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.location}  {self.rule}: {self.message}  ->  {self.suggestion}"


# --------------------------------------------------------------------------------------------
# Reading names


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every statement of a tree, nested ones included, without visiting expressions
    (imports are statements, so this finds them all at a fraction of `ast.walk`'s cost)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                pending.extend(children)


def _collect_aliases(trees: Iterable[ast.AST]) -> dict[str, str]:
    """Map each imported local name to its full dotted name (`tc` -> `torch.cuda`)."""
    aliases = {"torch": "torch"}
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
    return aliases


def _dotted_parts(node: ast.AST) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None when the chain does not start at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    parts.reverse()
    return parts


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _starts_with_cuda_index(node: ast.AST) -> bool:
    return _is_string(node) and node.value.startswith("cuda:")  # type: ignore[attr-defined]


def _is_cuda_device_text(node: ast.AST) -> bool:
    """True for `"cuda"`, `"cuda:1"`, `f"cuda:{rank}"`, `"cuda:" + r`, `"cuda:%d" % r`,
    `"cuda:{}".format(r)`."""
    if _is_string(node):
        return _CUDA_DEVICE_LITERAL.fullmatch(node.value) is not None  # type: ignore[attr-defined]
    if isinstance(node, ast.JoinedStr):
        return bool(node.values) and _starts_with_cuda_index(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _starts_with_cuda_index(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _starts_with_cuda_index(node.func.value)
    return False


def _is_cpu_device(node: ast.AST) -> bool:
    """`"cpu"` or `torch.device("cpu")`: a value that keeps data on the host."""
    if _is_string(node):
        return node.value == "cpu"  # type: ignore[attr-defined]
    if isinstance(node, ast.Call) and node.args:
        return _dotted_parts(node.func) in (["torch", "device"], ["device"]) and _is_cpu_device(
            node.args[0]
        )
    return False


def _names_the_cpu(call: ast.Call) -> bool:
    """True when the call itself moves to or creates on the CPU: `.cpu()`, `.to("cpu")`,
    `device="cpu"`."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cpu" and not call.args:
        return True
    arguments = list(call.args) + [kw.value for kw in call.keywords if kw.arg == "device"]
    return any(_is_cpu_device(argument) for argument in arguments)


# --------------------------------------------------------------------------------------------
# The checker


class _Auditor(ast.NodeVisitor):
    """Walks one parsed module or cell and collects findings; each node reports once."""

    def __init__(self, aliases: Mapping[str, str], path: str, cell: int | None) -> None:
        self.aliases = aliases
        self.path = path
        self.cell = cell
        self.findings: list[Finding] = []
        self._reported: set[int] = set()
        self._dispatch: dict[type, Callable[[Any], None]] = {}
        self._pending: list[ast.AST] = []

    # -- traversal ------------------------------------------------------------------------
    # ast.NodeVisitor's dispatch, but with a stack instead of recursion (a generated
    # `a + b + ... ` of 600 terms is deeper than Python's recursion limit) and the method
    # lookup cached per node class. Parents are handled before their children, so a rule
    # on a call can silence the names inside it.

    def visit(self, node: ast.AST) -> None:
        self._pending = [node]
        while self._pending:
            current = self._pending.pop()
            method = self._dispatch.get(type(current))
            if method is None:
                method = getattr(self, "visit_" + type(current).__name__, self.generic_visit)
                self._dispatch[type(current)] = method
            method(current)

    def generic_visit(self, node: ast.AST) -> None:
        """Schedule the children of `node` (contexts such as Load and Store have none to check)."""
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                self._pending.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST) and not isinstance(value, ast.expr_context):
                self._pending.append(value)

    # -- helpers --------------------------------------------------------------------------

    def _qualify(self, node: ast.AST) -> str | None:
        """Full dotted name of a name or attribute chain whose head was imported."""
        parts = _dotted_parts(node)
        if parts is None:
            return None
        head = self.aliases.get(parts[0])
        if head is None:
            return None
        return ".".join([head, *parts[1:]])

    def _report(
        self,
        rule: str,
        node: ast.AST,
        message: str,
        suggestion: str,
        *,
        at_attribute: bool = False,
    ) -> None:
        if id(node) in self._reported:
            return
        self._reported.add(id(node))
        if at_attribute and isinstance(node, ast.Attribute) and node.end_lineno is not None:
            # `model\n    .cuda()`: point at the line that holds `.cuda`, not at `model`.
            line = node.end_lineno
            column = (node.end_col_offset or 0) - len(node.attr) + 1
        else:
            line = node.lineno  # type: ignore[attr-defined]
            column = node.col_offset + 1  # type: ignore[attr-defined]
        self.findings.append(
            Finding(
                path=self.path,
                cell=self.cell,
                line=line,
                column=column,
                rule=rule,
                message=message,
                suggestion=suggestion,
            )
        )

    def _check_device_value(self, node: ast.AST, *, as_type: bool) -> None:
        """Report a CUDA device string used where a device (or device type) is expected."""
        if isinstance(node, ast.IfExp):
            self._check_device_value(node.body, as_type=as_type)
            self._check_device_value(node.orelse, as_type=as_type)
            return
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self._check_device_value(value, as_type=as_type)
            return
        if not _is_cuda_device_text(node):
            return
        shown = ast.unparse(node)
        message = f"{shown} names a CUDA GPU only"
        if not (_is_string(node) and node.value == "cuda"):  # type: ignore[attr-defined]
            message += f"; {_ONE_DEVICE_PER_PROCESS}"
        if as_type:
            suggestion = f"device.type, where {CHOOSE_DEVICE}"
        else:
            suggestion = f"device, where {CHOOSE_DEVICE}"
        self._report("cuda-device-string", node, message, suggestion)

    def _check_qualified_name(self, name: str, node: ast.AST) -> None:
        """Rules that depend only on the full name: torch.cuda.*, cudnn and cuda backends."""
        if name == "torch.cuda.amp" or name.startswith("torch.cuda.amp."):
            self._report_cuda_amp(name, node)
        elif name.startswith("torch.cuda."):
            self._report_torch_cuda(name, node)
        elif name.startswith("torch.backends.cudnn."):
            setting = name.removeprefix("torch.backends.cudnn.")
            suggestion = _CUDNN_SUGGESTIONS.get(
                setting.split(".")[0], f"remove it, {_GUARD_ADVICE}"
            )
            self._report(
                "cudnn-setting", node, f"`{name}` configures cuDNN, a CUDA library", suggestion
            )
        elif name.startswith("torch.backends.cuda."):
            setting = name.removeprefix("torch.backends.cuda.")
            suggestion = _CUDA_BACKEND_SUGGESTIONS.get(setting, f"remove it, {_GUARD_ADVICE}")
            self._report(
                "cuda-backend-setting", node, f"`{name}` configures CUDA kernels only", suggestion
            )

    def _report_torch_cuda(self, name: str, node: ast.AST) -> None:
        entry = equivalent_for(name.removeprefix("torch.cuda."))
        if entry is None:
            self._report(
                "torch-cuda-call",
                node,
                f"`{name}` works on CUDA GPUs only",
                "no entry in tpuready.accelerator_api: look under torch.accelerator, "
                + _GUARD_ADVICE,
            )
            return
        message = f"`{name}` works on CUDA GPUs only"
        if entry.refused_by_torch_tpu:
            message += f" (and `torch.tpu.{entry.name}` raises in TorchTPU 0.2.0)"
        suggestion = entry.replacement + (f" ({entry.note})" if entry.note else "")
        self._report("torch-cuda-call", node, message, suggestion)

    def _report_cuda_amp(self, name: str, node: ast.AST) -> None:
        member = name.removeprefix("torch.cuda.")
        entry = equivalent_for(member) if member != "amp" else None
        if entry is not None:
            suggestion = entry.replacement + (f" ({entry.note})" if entry.note else "")
        elif member == "amp":
            suggestion = "torch.amp, with device_type=device.type"
        else:
            suggestion = f"torch.{member}, with device_type=device.type"
        self._report("cuda-amp", node, f"`{name}` is CUDA-only (and deprecated)", suggestion)

    def _check_inference_mode(self, node: ast.AST) -> None:
        target = node.func if isinstance(node, ast.Call) else node
        if self._qualify(target) in _INFERENCE_MODE_NAMES:
            self._report(
                "inference-mode",
                node,
                "compiled code under torch.inference_mode crashes TorchTPU 0.2.0",
                "torch.no_grad()",
            )
            self._reported.add(id(target))

    # -- calls ----------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self._qualify(func)
        method = func.attr if isinstance(func, ast.Attribute) else None
        if name is not None:
            last = name.rsplit(".", 1)[-1]
        else:
            last = method or (func.id if isinstance(func, ast.Name) else "")

        if method == "cuda" and name != "torch.cuda":
            self._report(
                "cuda-method",
                func,
                "`.cuda()` moves to a CUDA GPU only",
                ".to(device)",
                at_attribute=True,
            )
        if method == "to":
            self._check_integer_device(node)
            for argument in node.args:
                self._check_device_value(argument, as_type=False)
        if last in {"set_device", "set_device_index"}:
            self._check_set_device(node)
        if last in {"init_process_group", "new_group"}:
            self._check_process_group_backend(node, positional=last == "init_process_group")
        if name in _DEVICE_FIRST_ARGUMENT and node.args:
            self._check_device_value(node.args[0], as_type=_DEVICE_FIRST_ARGUMENT[name])
        self._check_float64(node, method, name)
        for keyword in node.keywords:
            if keyword.arg in _DEVICE_KEYWORDS:
                self._check_device_value(keyword.value, as_type=_DEVICE_KEYWORDS[keyword.arg])
            elif keyword.arg == "pin_memory" and _is_true(keyword.value):
                self._report(
                    "pin-memory",
                    keyword,
                    "pin_memory=True pins host memory even with no accelerator to copy to "
                    "(PyTorch warns on a CPU-only machine)",
                    "pin_memory=torch.accelerator.is_available()",
                )
        self.generic_visit(node)

    def _check_integer_device(self, call: ast.Call) -> None:
        candidates = call.args[:1] + [kw.value for kw in call.keywords if kw.arg == "device"]
        for argument in candidates:
            if (
                isinstance(argument, ast.Constant)
                and isinstance(argument.value, int)
                and not isinstance(argument.value, bool)
            ):
                shown = str(argument.value)
            elif isinstance(argument, ast.Call) and _dotted_parts(argument.func) == ["int"]:
                shown = ast.unparse(argument)
            else:
                parts = _dotted_parts(argument)
                if parts is None or not _RANK_LIKE_NAME.search(parts[-1]):
                    continue
                shown = ".".join(parts)
            self._report(
                "to-int-device",
                argument,
                f"`.to({shown})` reads an integer as an accelerator index, which TorchTPU "
                "ignores (TorchTPU issue #4164)",
                ".to(device), with device chosen once per process",
            )

    def _check_set_device(self, call: ast.Call) -> None:
        arguments = call.args[:1] + [kw.value for kw in call.keywords if kw.arg == "device"]
        if not arguments:
            return
        argument = arguments[0]
        if isinstance(argument, ast.Constant) and argument.value == 0:
            return
        self._reported.add(id(call.func))  # one finding for torch.cuda.set_device(rank)
        self._report(
            "set-device-index",
            call,
            f"`{ast.unparse(call.func)}({ast.unparse(argument)})` picks a device by index; "
            "on TorchTPU set_device(i) for another index raises",
            f"choose device once per process ({_ONE_DEVICE_PER_PROCESS}); call "
            "torch.accelerator.set_device_index(i) only where a process sees several devices",
        )

    def _check_process_group_backend(self, call: ast.Call, *, positional: bool) -> None:
        candidates = [kw.value for kw in call.keywords if kw.arg == "backend"]
        if positional:
            candidates += call.args[:1]
        for value in candidates:
            is_nccl = (_is_string(value) and "nccl" in value.value.lower()) or (  # type: ignore[attr-defined]
                (_dotted_parts(value) or [""])[-1] == "NCCL"
            )
            if is_nccl:
                self._report(
                    "nccl-backend",
                    value,
                    f"backend {ast.unparse(value)} exists for CUDA GPUs only",
                    "dist.init_process_group() with no backend: PyTorch picks one per device "
                    "type (gloo on CPU, nccl on CUDA, tpu_dist on TorchTPU)",
                )

    def _check_float64(self, call: ast.Call, method: str | None, name: str | None) -> None:
        if _names_the_cpu(call):
            return
        if method == "double" and not call.args and not call.keywords:
            receiver = call.func.value  # type: ignore[attr-defined]
            if not (isinstance(receiver, ast.Call) and _names_the_cpu(receiver)):
                self._report(
                    "float64",
                    call.func,
                    "`.double()` asks for float64, which TPUs cannot run fast",
                    ".float() (keep float64 for checks on the CPU: `.cpu().double()`)",
                    at_attribute=True,
                )
        dtype_values = [kw.value for kw in call.keywords if kw.arg == "dtype"]
        if method in {"to", "type"} or name == "torch.set_default_dtype":
            dtype_values += call.args
        for value in dtype_values:
            if self._qualify(value) in _FLOAT64_NAMES:
                self._report(
                    "float64",
                    value,
                    f"`{ast.unparse(value)}` asks for float64, which TPUs cannot run fast",
                    "torch.float32 (or bfloat16); keep float64 for checks on the CPU",
                )

    # -- names ----------------------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # Only the outermost attribute of a chain gets here: the chain is checked as a whole.
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name):
            name = self._qualify(node)
            if name is not None and id(node) not in self._reported:
                self._check_qualified_name(name, node)
        else:
            self._pending.append(base)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and id(node) not in self._reported:
            name = self.aliases.get(node.id)
            if name is not None and name != node.id:
                self._check_qualified_name(name, node)

    # -- places where a device string is a device -----------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_device_value(node.value, as_type=False)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._check_device_value(node.value, as_type=False)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._check_device_value(node.value, as_type=False)
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self._check_device_value(node.value, as_type=False)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values, strict=True):
            if key is not None and _is_string(key) and key.value in _DEVICE_DICT_KEYS:  # type: ignore[attr-defined]
                self._check_device_value(value, as_type=key.value == "device_type")  # type: ignore[attr-defined]
        self.generic_visit(node)

    def _check_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        for default in defaults:
            self._check_device_value(default, as_type=False)
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self._check_inference_mode(decorator)
        self.generic_visit(node)

    visit_FunctionDef = _check_function
    visit_AsyncFunctionDef = _check_function
    visit_Lambda = _check_function

    def _check_with(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self._check_inference_mode(item.context_expr)
        self.generic_visit(node)

    visit_With = _check_with
    visit_AsyncWith = _check_with


# --------------------------------------------------------------------------------------------
# Sources: strings, files, notebooks


def _parse(source: str) -> ast.Module:
    """`ast.parse`, with the other ways it refuses text (null bytes, nesting deeper than the
    parser allows) turned into SyntaxError so they are reported like one."""
    try:
        return ast.parse(source)
    except (ValueError, RecursionError, MemoryError) as error:
        raise SyntaxError(f"{type(error).__name__}: {error}") from error


def _syntax_error_finding(error: SyntaxError, path: str, cell: int | None) -> Finding:
    return Finding(
        path=path,
        cell=cell,
        line=error.lineno or 1,
        column=error.offset or 1,
        rule="syntax-error",
        message=f"could not parse: {error.msg}",
        suggestion="fix the syntax and audit again (nothing else here was checked)",
    )


def _drop_ignored(findings: list[Finding], source: str) -> list[Finding]:
    """Remove findings on lines that carry `# tpuready: ignore` or `# tpuready: ignore[rule]`."""
    if "tpuready:" not in source or not findings:
        return findings
    lines = source.splitlines()
    kept = []
    for finding in findings:
        text = lines[finding.line - 1] if finding.line <= len(lines) else ""
        pragma = _IGNORE_PRAGMA.search(text)
        if pragma is not None and finding.rule != "syntax-error":
            rules = pragma.group("rules")
            if rules is None or finding.rule in {rule.strip() for rule in rules.split(",")}:
                continue
        kept.append(finding)
    return kept


def _may_have_findings(source: str, aliases: Mapping[str, str]) -> bool:
    """False when no rule can fire: every finding needs a trigger word in the text, or a name
    imported elsewhere (another notebook cell) that stands for one, like `amp`."""
    if any(word in source for word in _TRIGGER_WORDS) or "nccl" in source.lower():
        return True
    return any(
        local in source
        for local, full in aliases.items()
        if local != full and any(word in full for word in _TRIGGER_WORDS)
    )


def _audit_tree(
    tree: ast.AST, source: str, aliases: Mapping[str, str], path: str, cell: int | None
) -> list[Finding]:
    if not _may_have_findings(source, aliases):
        return []
    auditor = _Auditor(aliases, path, cell)
    auditor.visit(tree)
    return _drop_ignored(auditor.findings, source)


def audit_code(source: str, path: str = "<string>", *, cell: int | None = None) -> list[Finding]:
    """Audit Python source text; `path` and `cell` only label the findings.

    Chapter 1 uses it on code held in a string. A syntax error gives one `syntax-error` finding.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be Python text (str), got {type(source).__name__}")
    try:
        tree = _parse(source)
    except SyntaxError as error:
        return [_syntax_error_finding(error, path, cell)]
    findings = _audit_tree(tree, source, _collect_aliases([tree]), path, cell)
    return sorted(findings, key=Finding.sort_key)


def _read_python(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditInputError(f"cannot read {path}: {error.strerror or error}") from error
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        raise AuditInputError(
            f"cannot decode {path} as Python source ({error}); save it as UTF-8"
        ) from error


def _read_notebook_cells(path: Path) -> list[dict[str, Any]]:
    try:
        notebook = json.loads(path.read_bytes())
    except OSError as error:
        raise AuditInputError(f"cannot read {path}: {error.strerror or error}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AuditInputError(f"{path} is not a notebook: invalid JSON ({error})") from error
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise AuditInputError(
            f"{path} is not an nbformat 4 notebook (no 'cells' list); convert it with "
            f"`jupyter nbconvert --to notebook --nbformat 4`"
        )
    return [cell for cell in cells if isinstance(cell, dict)]


def _cell_python(source: str) -> str | None:
    """The Python text of a code cell, line numbers kept; None for a non-Python cell magic."""
    lines = source.split("\n")
    first = lines[0].strip()
    if first.startswith("%%"):
        words = first[2:].split()
        magic = words[0] if words else ""
        writes_python = magic == "writefile" and words[-1].endswith(".py")
        if magic not in _PYTHON_CELL_MAGICS and not writes_python:
            return None
        lines[0] = ""
    return "\n".join(lines)


def _blank_ipython_lines(source: str) -> str:
    """Turn IPython-only lines (`%magic`, `!shell`, `x = !ls`, `obj?`) into `pass`."""
    return "\n".join(
        _IPYTHON_ONLY_LINE.sub(lambda match: match.group(1) + "pass  # ", line)
        for line in source.split("\n")
    )


def audit_notebook(path: PathArgument) -> list[Finding]:
    """Audit every code cell of a notebook except those tagged `cuda-on-purpose`."""
    notebook_path = Path(path)
    shown = notebook_path.as_posix()
    parsed: list[tuple[int, str, ast.AST | None, SyntaxError | None]] = []
    exempt: set[int] = set()
    code_cells = [
        cell for cell in _read_notebook_cells(notebook_path) if cell.get("cell_type") == "code"
    ]
    for number, cell in enumerate(code_cells, start=1):
        raw = cell.get("source", "")
        source = "".join(raw) if isinstance(raw, list) else str(raw)
        tags = (cell.get("metadata") or {}).get("tags") or []
        if CUDA_ON_PURPOSE_TAG in tags:
            exempt.add(number)
        python = _cell_python(source)
        if python is None:
            continue
        try:
            parsed.append((number, python, _parse(python), None))
        except SyntaxError:
            python = _blank_ipython_lines(python)
            try:
                parsed.append((number, python, _parse(python), None))
            except SyntaxError as error:
                parsed.append((number, python, None, error))
    aliases = _collect_aliases(tree for _, _, tree, _ in parsed if tree is not None)
    findings: list[Finding] = []
    for number, python, tree, error in parsed:
        if number in exempt:
            continue
        if error is not None:
            findings.append(_syntax_error_finding(error, shown, number))
        elif tree is not None:
            findings += _audit_tree(tree, python, aliases, shown, number)
    return sorted(findings, key=Finding.sort_key)


def audit_file(path: PathArgument) -> list[Finding]:
    """Audit one `.py` file or `.ipynb` notebook. Raises AuditInputError if it cannot be read."""
    file_path = Path(path)
    if file_path.suffix == ".ipynb":
        return audit_notebook(file_path)
    return audit_code(_read_python(file_path), file_path.as_posix())


def _is_skipped_directory(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRECTORIES


def find_source_files(paths: PathArgument | Iterable[PathArgument]) -> list[Path]:
    """The `.py` and `.ipynb` files to audit: files as given, folders searched recursively
    (skipping `SKIPPED_DIRECTORIES`, hidden folders and hidden files), in a stable order."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    given = [Path(path) for path in paths]
    if not given:
        raise AuditInputError("no paths given: name at least one file or folder to audit")
    files: list[Path] = []

    def refuse_folder(error: OSError) -> None:
        raise AuditInputError(f"cannot read folder {error.filename}: {error.strerror}")

    for path in given:
        if path.is_dir():
            for root, folders, names in os.walk(path, onerror=refuse_folder):
                folders[:] = sorted(name for name in folders if not _is_skipped_directory(name))
                files += [
                    Path(root) / name
                    for name in sorted(names)
                    if name.endswith((".py", ".ipynb")) and not name.startswith(".")
                ]
        elif path.is_file():
            if path.suffix not in {".py", ".ipynb"}:
                raise AuditInputError(
                    f"{path} is neither a .py file nor a .ipynb notebook; "
                    f"name Python files, notebooks or folders"
                )
            files.append(path)
        elif path.exists():
            raise AuditInputError(f"{path} is not a regular file or folder")
        else:
            raise AuditInputError(f"{path}: no such file or folder")
    unique: dict[Path, Path] = {}
    for file in files:
        unique.setdefault(file.resolve(), file)
    return list(unique.values())


def audit_source(paths: PathArgument | Iterable[PathArgument]) -> list[Finding]:
    """Audit files, folders and notebooks; findings sorted by file, cell, line.

    Raises AuditInputError (naming the path) for a missing or unreadable path.
    """
    findings: list[Finding] = []
    for file in find_source_files(paths):
        findings += audit_file(file)
    return sorted(findings, key=Finding.sort_key)


# --------------------------------------------------------------------------------------------
# Reports


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def format_text(findings: Sequence[Finding], files_scanned: int | None = None) -> str:
    """One line per finding, `file:line  rule: message  ->  suggestion`, then a summary line
    such as `3 findings in 2 files (5 files scanned)`."""
    ordered = sorted(findings, key=Finding.sort_key)
    files_with_findings = len({finding.path for finding in ordered})
    summary = f"{_count(len(ordered), 'finding')}"
    if ordered:
        summary += f" in {_count(files_with_findings, 'file')}"
    if files_scanned is not None:
        summary += f" ({_count(files_scanned, 'file')} scanned)"
    return "\n".join([*(str(finding) for finding in ordered), summary]) + "\n"


def format_json(findings: Sequence[Finding]) -> str:
    """The findings as a JSON list of objects with the `Finding` fields, in report order."""
    ordered = sorted(findings, key=Finding.sort_key)
    return json.dumps([finding.to_dict() for finding in ordered], indent=2) + "\n"
