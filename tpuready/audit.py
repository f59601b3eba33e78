"""Find the lines that tie PyTorch code to CUDA, and say what to write instead.

Taught in `notebooks/01_device_agnostic_basics.ipynb`. `audit_source(paths)` and
`python -m tpuready audit-source PATH...` run the same function (`run_audit`) over Python
files and notebooks, read with `ast`, never with regular expressions over the text, so the
word "cuda" in a comment, a docstring or a printed message is never a finding. The
`torch.cuda.*` replacements come from `tpuready.accelerator_api`, the table chapter 1 prints.
Reading files, notebooks, pragmas and `[tool.tpuready]` lives in `tpuready.audit_sources`.

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
syntax newer than the running Python is said to be so. Every file is parsed, so one that
does not parse is reported whatever it holds; a tree with no trigger word at all (no "cuda",
".to(", "double", ...) is not walked, since no rule could fire in it, and neither is a
statement without one. Files over `MAX_FILE_BYTES` are skipped with a
`skipped-file` note, which bounds memory. Columns count characters, not bytes. A tree of over
2 MB is audited by one worker process per CPU.

The rules (generated from `RULE_TABLE`, one entry per rule):
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tpuready.accelerator_api import equivalent_for
from tpuready.audit_sources import (
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

__all__ = [
    "BFLOAT16_OFF_CUDA",
    "CUDA_ON_PURPOSE_TAG",
    "GUARDED",
    "MAX_FILE_BYTES",
    "MUST_CHANGE",
    "NOTE",
    "OFF_CUDA_BRANCH",
    "ONE_DEVICE_PER_PROCESS",
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
    "run_audit",
]

MUST_CHANGE = "must-change"
GUARDED = "guarded"
NOTE = "note"
# Most severe first: the order of the text report and of `--severity`.
SEVERITIES: tuple[str, ...] = (MUST_CHANGE, GUARDED, NOTE)
_SEVERITY_HEADINGS = {
    MUST_CHANGE: "must change",
    GUARDED: "guarded: review (CUDA-only code inside a CUDA guard, correct as it stands)",
    NOTE: "notes",
}

CHOOSE_DEVICE = (
    'device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
)
_GUARD_ADVICE = 'or run it only when device.type == "cuda"'
# Ends the message of a per-rank index; `--fix` reads it to leave such lines (and their checks).
ONE_DEVICE_PER_PROCESS = "TorchTPU runs one process per device and each sees it as index 0"
_PROBE_ADVICE = (
    "keep it: it detects CUDA on purpose and guards CUDA-only code; do not replace it with "
    "torch.accelerator.is_available(), which is also true on a TPU"
)

_CUDA_DEVICE_LITERAL = re.compile(r"cuda(:\d+)?")
_DEVICE_WORDS = frozenset({"cpu", "cuda", "mps", "xpu", "tpu", "meta", "hpu", "npu", "auto"})
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
        "pin_memory_device": True,
        "default": False,  # argparse: add_argument("--device", default="cuda")
    }
)
_DEVICE_DICT_KEYS = frozenset({"device", "device_type", "map_location", "device_map"})
_RANK_LIKE_NAME = re.compile(r"(?:^|_)(?:rank|gpu|gpu_id|gpu_index|device_id|device_index)$")
_CUDA_FLAG_NAME = re.compile(r"(?:^|_)(?:is_|use_|has_|on_)?cuda(?:_available)?$", re.IGNORECASE)
_FLOAT64_NAMES = frozenset({"torch.float64", "torch.double"})
_INFERENCE_MODE_NAMES = frozenset(
    {
        "torch.inference_mode",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
# Calls and attributes that exist to detect CUDA (or ROCm, which answers to the same names).
_CUDA_PROBES = frozenset(
    {
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.cuda.get_device_capability",
        "torch.cuda.is_bf16_supported",
        "torch.backends.cudnn.is_available",
        "torch.version.cuda",
        "torch.version.hip",
    }
)
# Probes that ask which CUDA, not whether an accelerator is there: a test that also reads one
# (`torch.cuda.is_available() and torch.version.hip is None`) checks for CUDA on purpose.
_CUDA_IDENTITY_PROBES = frozenset(
    {
        "torch.cuda.get_device_capability",
        "torch.cuda.get_device_name",
        "torch.cuda.get_device_properties",
        "torch.backends.cudnn.is_available",
        "torch.version.cuda",
        "torch.version.hip",
    }
)
# Decorators that skip a test on a condition: a CUDA probe there keeps CUDA-only tests off
# other devices, so it is a CUDA check on purpose.
_TEST_SKIP_DECORATORS = frozenset(
    {
        "unittest.skipIf",
        "unittest.skipUnless",
        "unittest.case.skipIf",
        "unittest.case.skipUnless",
        "pytest.mark.skipif",
    }
)
# `torch.cuda.*` names tpuready.accelerator_api has no row for, with the portable spelling.
_EXTRA_EQUIVALENTS: Mapping[str, str] = MappingProxyType(
    {
        "CUDAGraph": "torch.accelerator.Graph() (capture_begin / capture_end / replay)",
        "graph": "torch.accelerator.Graph() with g.capture_begin(); ...; g.capture_end(); "
        "then g.replay()",
        "stream": "`with stream:` where stream is a torch.Stream (a stream is its own "
        "context manager)",
        "is_bf16_supported": 'device.type != "cuda" or torch.cuda.is_bf16_supported() '
        "(bfloat16 is native on TPUs and runs on CPUs; only a GPU older than Ampere lacks it)",
        "get_device_capability": "no portable compute capability exists: keep it inside "
        '`if device.type == "cuda":` (torch.accelerator.get_device_capability() returns a '
        "dict in torch 2.13, so comparing it with (major, minor) breaks)",
    }
)
_CUDA_TENSOR_TYPE = re.compile(r"torch\.cuda\.\w*Tensor")
_BACKEND_CALLS = frozenset({"init_process_group", "new_group"})
_DDP_NAMES = frozenset({"DistributedDataParallel", "DDP", "DataParallel"})
_ENVIRON_CALLS = frozenset(
    {"os.environ.get", "os.environ.setdefault", "os.environ.pop", "os.getenv", "os.putenv"}
)
_TRIGGER_WORDS = (
    "cuda",
    "CUDA",
    "cudnn",
    "pin_memory",
    ".to(",
    "set_device",
    "double",
    "float64",
    "inference_mode",
    "device_ids",
    "compile",
    "rank",  # f"{device_type}:{local_rank}"
    "gpu",
    "device_module",  # device_module = torch.get_device_module(device)
    "synchronize",  # dm.synchronize(), whatever the module's name
    "current_device",
)

PathArgument = str | os.PathLike[str]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One line that ties code to CUDA, with the portable spelling to write instead.

    `cell` is None for .py files; for notebooks it counts code cells from 1 and `line` is
    the line within that cell. `line` and `column` (characters) are 1-based. `severity` is
    one of `SEVERITIES`. `--format json` writes these fields, in this order.
    """

    path: str
    cell: int | None = None
    line: int
    column: int
    rule: str
    severity: str = MUST_CHANGE
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
# Small readers of syntax


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


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _is_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _string_value(node: ast.AST) -> str | None:
    return node.value if _is_string(node) else None  # type: ignore[attr-defined]


def _shown(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except RecursionError:  # an expression nested deeper than unparse can follow
        return "..."
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _constant_fstring(node: ast.JoinedStr) -> str | None:
    parts = [_string_value(value) for value in node.values]
    return None if any(part is None for part in parts) else "".join(parts)  # type: ignore[arg-type]


def _cuda_index(node: ast.AST) -> ast.AST | str | None:
    """For a CUDA device text, the index it names: "0", an expression node, or None (`"cuda"`).
    Returns False-y "" when the node is not CUDA device text at all; see `_is_cuda_device_text`."""
    text = _string_value(node)
    if text is not None:
        return text.partition(":")[2] or None
    if isinstance(node, ast.JoinedStr):
        constant = _constant_fstring(node)
        if constant is not None:
            return constant.partition(":")[2] or None
        formatted = [value for value in node.values if isinstance(value, ast.FormattedValue)]
        return formatted[0].value if formatted else None
    if isinstance(node, ast.BinOp):
        return node.right
    if isinstance(node, ast.Call) and node.args:
        return node.args[0]
    return None


def _starts_with_cuda_index(node: ast.AST) -> bool:
    text = _string_value(node)
    return text is not None and text.startswith("cuda:")


def _is_cuda_device_text(node: ast.AST) -> bool:
    """True for `"cuda"`, `"cuda:1"`, `f"cuda"`, `f"cuda:{rank}"`, `"cuda:" + r`,
    `"cuda:%d" % r`, `"cuda:{}".format(r)`."""
    text = _string_value(node)
    if text is not None:
        return _CUDA_DEVICE_LITERAL.fullmatch(text) is not None
    if isinstance(node, ast.JoinedStr):
        constant = _constant_fstring(node)
        if constant is not None:
            return _CUDA_DEVICE_LITERAL.fullmatch(constant) is not None
        return bool(node.values) and _starts_with_cuda_index(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _starts_with_cuda_index(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "format" and _starts_with_cuda_index(node.func.value)
    return False


def _is_nccl(node: ast.AST) -> bool:
    text = _string_value(node)
    if text is not None:
        return "nccl" in text.lower()
    if isinstance(node, ast.IfExp):
        return _is_nccl(node.body) or _is_nccl(node.orelse)
    return (_dotted_parts(node) or [""])[-1] == "NCCL"


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


def _choices_are_not_devices(call: ast.Call) -> bool:
    """`choices=["cuda", "triton"]`: the option names kernels, so `default="cuda"` is not a
    device."""
    for keyword in call.keywords:
        if keyword.arg == "choices" and isinstance(keyword.value, ast.List | ast.Tuple | ast.Set):
            words = [_string_value(item) for item in keyword.value.elts]
            return any(
                word is not None and word.split(":")[0] not in _DEVICE_WORDS for word in words
            )
    return False


def _last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


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
class _FileFacts:
    aliases: dict[str, str]
    compiles: bool
    trees: Sequence[ast.AST]
    backend_names: set[str] = field(default_factory=set)
    device_module_names: set[str] = field(default_factory=set)  # `dm = torch.get_device_module()`
    device_type_names: set[str] = field(default_factory=set)
    _names_a_device: bool | None = None
    ported_flags: frozenset[str] | None = None  # filled by _Auditor.ported_flags
    _falls_through_to: dict[int, list[ast.stmt]] | None = None

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


def _node_word(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.keyword):
        return node.arg or ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 12:
        return node.value if node.value.split(":")[0] in _DEVICE_WORDS - {"cpu", "meta"} else ""
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


def _collect_facts(trees: Sequence[ast.AST], source: str) -> _FileFacts:
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
        parts = _dotted_parts(value)
        if parts and parts[0] in aliases:
            full = ".".join([aliases[parts[0]], *parts[1:]])
            if full == "torch.cuda":
                aliases[local] = full
    facts = _FileFacts(
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
    {ast.Constant, str, int, bool, type(None)}
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


def _child_fields(node_type: type) -> tuple[str, ...]:
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
        fields = tuple(field_name for field_name in node_type._fields if field_name not in skipped)  # type: ignore[attr-defined]
        _CHILD_FIELDS[node_type] = fields
    return fields


_GUARDED_FLAG = 1  # inside the body of a CUDA guard
_GUARD_TEST_FLAG = 2  # inside the test of a CUDA guard
_FALLBACK_SHIFT = 2  # the bits above: which fallback the test's other branch takes (1-based)
_FALLBACKS = (
    "falls back to the CPU",
    "stops the program",
    "picks float16",
    "leaves the work on the CPU",  # the CUDA branch moves it (`.cuda()`, DDP); this one not
)
_CPU_TENSOR_TYPES = frozenset(
    f"torch.{kind}Tensor"
    for kind in ("Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long")
)
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
_FLOAT16_NAMES = frozenset({"torch.float16", "torch.half"})


# Marks the message of a CUDA check the audit ports because of what its other branch does;
# `--fix` rewrites those checks (tpuready.fix reads the mark from here).
OFF_CUDA_BRANCH = "the branch taken off CUDA"
# Devices a decision in that branch may name: a TPU (then the code handles it) or another one,
# whose branch a TPU does not take.
_TPU_DEVICE_TYPES = frozenset({"tpu", "xla"})
_OTHER_DEVICE_TYPES = frozenset({"cpu", "mps", "xpu", "hpu", "mtia", "meta"})
_OTHER_DEVICE_PROBES = frozenset(
    {"torch.backends.mps.is_available", "torch.mps.is_available", "torch.xpu.is_available"}
)
# The advice for a CUDA probe whose other branch picks float16: on a TPU it would pick float16
# too. `--fix` leaves the probes that get this advice (tpuready.fix reads it from here).
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
            _is_cuda_device_text(value) or "device" in _last_name(value).lower()
            for value in node.args
        )
    )


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


def _stays_cuda_only(audit: _Auditor, node: ast.AST) -> bool:
    """A node that is CUDA-specific whatever a port does: such a `torch.cuda` member, or one
    the table has no entry for. (A rank's index, `.cuda(args.gpu)`, is a tie to port.)"""
    if isinstance(node, ast.Attribute):
        name = audit.qualify(node) or ""
        if name.startswith("torch.cuda.") and not _CUDA_TENSOR_TYPE.fullmatch(name):
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
            last = _last_name(node.func)
            if last in {"to", "device"}:
                values += node.args[:1]
            values += [k.value for k in node.keywords if k.arg in {"device", "device_type"}]
        elif isinstance(node, ast.Assign | ast.Return) and node.value is not None:
            values.append(node.value)
    return values


def _fallback_flags(fallback: int | None) -> int:
    return 0 if fallback is None else (fallback + 1) << _FALLBACK_SHIFT


class _Auditor:
    """Walks one parsed module or cell and collects findings; each node reports once.

    A stack instead of recursion (a generated `a + b + ...` of 600 terms is deeper than
    Python's recursion limit); parents are handled before their children, so a rule on a
    call can silence the names inside it.
    """

    def __init__(self, facts: _FileFacts, path: str, cell: int | None, lines: list[str] | None):
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
                        and self.qualify(inner) in _CUDA_PROBES
                        for inner in ast.walk(node.value)
                    ):
                        continue
                    names |= {
                        _last_name(target)
                        for target in node.targets
                        if isinstance(target, ast.Name | ast.Attribute)
                    }
            self.facts.ported_flags = frozenset(names)
        return self.facts.ported_flags

    def run(self, tree: ast.AST, trigger_lines: Sequence[int] | None = None) -> None:
        """Check every node of `tree`. `trigger_lines`: the lines that hold a trigger word,
        ascending; a statement whose lines hold none is skipped whole, since every finding
        needs one."""
        checks = _CHECKS_BY_NODE_TYPE
        pending: list[tuple[ast.AST, int]] = [(tree, 0)]
        while pending:
            node, flags = pending.pop()
            if trigger_lines is not None and type(node) in _STATEMENT_TYPES:
                start = node.lineno
                decorators = getattr(node, "decorator_list", None)
                if decorators:
                    start = min(start, *(decorator.lineno for decorator in decorators))
                end = node.end_lineno or start
                next_trigger = bisect.bisect_left(trigger_lines, start)
                if next_trigger == len(trigger_lines) or trigger_lines[next_trigger] > end:
                    continue
            self.flags = flags
            node_type = type(node)
            if node_type is ast.Name or node_type is ast.Attribute:
                # Every rule on names needs a `torch.` name: resolve it once, here.
                self.current_name = self.imported_name(node)  # type: ignore[arg-type]
                if self.current_name is None or not self.current_name.startswith("torch."):
                    if node_type is ast.Name:
                        continue
                    self.current_name = None
            if node_type is not ast.Attribute or self.current_name is not None:
                for check in checks.get(node_type, ()):
                    check(self, node)
            if node_type is ast.Attribute:
                # The chain `a.b.c` is checked as a whole; only a non-name base is visited.
                base = node.value  # type: ignore[attr-defined]
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
            elif node_type is ast.If or node_type is ast.IfExp:
                polarity = self.guard_polarity(node)
                test_flags = flags | _GUARD_TEST_FLAG if polarity is not None else flags
                if polarity is None:
                    test_flags |= _fallback_flags(self.fallback_of(node))
                pending.append((node.test, test_flags))  # type: ignore[attr-defined]
                body_flags = flags | _GUARDED_FLAG if polarity is True else flags
                else_flags = flags | _GUARDED_FLAG if polarity is False else flags
                for child, child_flags in ((node.body, body_flags), (node.orelse, else_flags)):  # type: ignore[attr-defined]
                    if isinstance(child, list):
                        pending.extend((item, child_flags) for item in child)
                    else:
                        pending.append((child, child_flags))
            else:
                for name in _child_fields(node_type):
                    value = getattr(node, name, None)
                    if type(value) is list:
                        pending.extend(
                            (item, flags) for item in value if type(item) not in _LEAF_TYPES
                        )
                    elif value is not None and type(value) not in _LEAF_TYPES:
                        pending.append((value, flags))

    # -- names ----------------------------------------------------------------------------

    def qualify(self, node: ast.AST) -> str | None:
        """Full dotted name of a name or attribute chain whose head was imported."""
        parts = _dotted_parts(node)
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
            if any(_string_value(side) in ("cuda", "cuda:0") for side in sides):
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
            and _string_value(node.args[0]) == "cuda"
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
                and self.qualify(inner) in _CUDA_IDENTITY_PROBES
                for value in node.values
                for inner in ast.walk(value)
            )
            return list(node.values) if reads_identity else None
        if isinstance(node, ast.Call) and self.qualify(node.func) in _TEST_SKIP_DECORATORS:
            # The probe is the first argument or the `condition=` keyword (a child node).
            keyword = next((k for k in node.keywords if k.arg == "condition"), None)
            child = node.args[0] if node.args else keyword
            condition = child.value if isinstance(child, ast.keyword) else child
            if condition is None or self.is_cuda_test(condition) is None:
                return None
            return [child]
        return None

    def _is_probe(self, node: ast.AST) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Call):
            node = node.func
        if not isinstance(node, ast.Name | ast.Attribute):
            return False
        name = self.qualify(node)
        if name in _CUDA_PROBES:
            return True
        flag = _last_name(node)
        return _CUDA_FLAG_NAME.search(flag) is not None and flag not in self.ported_flags

    def guard_polarity(self, node: ast.If | ast.IfExp) -> bool | None:
        """True: the body runs only on CUDA; False: the else-branch does; None: not a guard.

        An `if` whose CUDA branch chooses the device (`device = "cuda"`, `return
        torch.device("cuda")`) is a choice, not a guard, and so is one whose other branch is
        what a TPU must not get (`fallback_of`): both are ported, not kept."""
        polarity = self.is_cuda_test(node.test)
        if polarity is None:
            return None
        chosen = node.body if polarity else node.orelse
        statements = chosen if isinstance(chosen, list) else []
        for statement in statements:
            if (
                isinstance(statement, ast.Assign | ast.Return)
                and statement.value is not None
                and _device_choice(statement.value)
            ):
                return None
        if isinstance(chosen, ast.AST) and _is_cuda_device_text(chosen):
            return None
        if self.fallback_of(node, polarity) is not None:
            return None
        return polarity

    def fallback_of(self, node: ast.If | ast.IfExp, polarity: bool | None = None) -> int | None:
        """Which of `_FALLBACKS` the branch taken off CUDA takes, or None: the CPU (a `"cpu"`
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
            if id(inner) in cpu_devices and _string_value(inner) == "cpu":
                return 0
            if isinstance(inner, ast.Name | ast.Attribute):
                name = self.qualify(inner)
                if name in _CPU_TENSOR_TYPES:
                    return 0
                if name in _FLOAT16_NAMES:
                    return 2
            if _string_value(inner) in {"float16", "fp16", "half"}:
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
            text = _string_value(node)
            if text is not None and text.split(":")[0] in _TPU_DEVICE_TYPES:
                return "handled"
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            for side in (test.left, test.comparators[0]):
                if (_string_value(side) or "").split(":")[0] in _OTHER_DEVICE_TYPES:
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

    def already_reported(self, node: ast.AST) -> bool:
        return id(node) in self._reported

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
    ) -> None:
        if id(node) in self._reported:
            return
        self._reported.add(id(node))
        entry = RULE_BY_ID[rule]
        severity = severity or entry.severity
        suggestion = suggestion or entry.advice
        fallback = self.flags >> _FALLBACK_SHIFT
        if severity == MUST_CHANGE and fallback:
            message += f" ({OFF_CUDA_BRANCH} {_FALLBACKS[fallback - 1]}: a TPU would take it)"
            if rule == "torch-cuda-call" and _FALLBACKS[fallback - 1] == "picks float16":
                suggestion = BFLOAT16_OFF_CUDA
        if severity == MUST_CHANGE and self.flags & _GUARD_TEST_FLAG:
            severity, suggestion = GUARDED, _PROBE_ADVICE
            message += " (a CUDA guard)"
        elif severity == MUST_CHANGE and self.flags & _GUARDED_FLAG:
            severity = GUARDED
            message += " (inside a CUDA-only guard: correct as it stands)"
        if at_attribute and isinstance(node, ast.Attribute) and node.end_lineno is not None:
            # `model\n    .cuda()`: point at the line that holds `.cuda`, not at `model`.
            line = node.end_lineno
            byte_column = (node.end_col_offset or 0) - len(node.attr.encode("utf-8"))
        else:
            line = node.lineno  # type: ignore[attr-defined]
            byte_column = node.col_offset  # type: ignore[attr-defined]
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
            if polarity is not None and _is_cuda_device_text(chosen):
                # `"cuda" if torch.cuda.is_available() else "cpu"`: one finding, the choice.
                target = "device.type" if as_type else "device"
                self.report(
                    "cuda-device-string",
                    node,
                    f"`{_shown(node)}` chooses a CUDA GPU or the CPU, never a TPU",
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
        if not _is_cuda_device_text(node):
            rank = _rank_of_device_text(node)
            if rank is not None:  # f"{device_type}:{local_rank}": the accelerator style
                self.report(
                    "set-device-index",
                    node,
                    f"`{_shown(node)}` names the device at the rank's own index; "
                    f"{ONE_DEVICE_PER_PROCESS}",
                    per_rank_advice(rank),
                )
            return
        shown = _shown(node)
        index = _cuda_index(node)
        message = f"{shown} names a CUDA GPU only"
        target = "device.type" if as_type else "device"
        suggestion = f"{target}, where {CHOOSE_DEVICE}"
        if index is not None:
            message += f"; {ONE_DEVICE_PER_PROCESS}"
            index_text = index if isinstance(index, str) else _shown(index, 30)
            if not as_type and index_text != "0":
                suggestion = (
                    per_rank_advice(index_text)
                    + " (a torchrun port that uses current_accelerator() alone puts every rank "
                    "on device 0 of a CUDA host)"
                )
        self.report("cuda-device-string", node, message, suggestion)


def _rank_index(node: ast.AST) -> str | None:
    """The text of a rank's own index: a rank-like name (`local_rank`, `args.gpu`) or
    `int(os.environ["LOCAL_RANK"])`; None for anything else (`index`, `0`)."""
    if isinstance(node, ast.Call) and _dotted_parts(node.func) == ["int"] and node.args:
        inner = node.args[0]
        key = inner.slice if isinstance(inner, ast.Subscript) else None
        if isinstance(inner, ast.Call) and inner.args:  # os.environ.get("LOCAL_RANK", ...)
            key = inner.args[0]
        text = _string_value(key) if key is not None else None
        return _shown(node, 40) if text is not None and "RANK" in text.upper() else None
    parts = _dotted_parts(node)
    if parts is None or not _RANK_LIKE_NAME.search(parts[-1]):
        return None
    return ".".join(parts)


def _rank_of_device_text(node: ast.AST) -> str | None:
    """`rank` for `f"{device_type}:{rank}"` (any type, a rank-like index name), else None."""
    if not isinstance(node, ast.JoinedStr) or len(node.values) != 3:
        return None
    kind, colon, index = node.values
    if not (
        isinstance(kind, ast.FormattedValue)
        and isinstance(colon, ast.Constant)
        and colon.value == ":"
        and isinstance(index, ast.FormattedValue)
    ):
        return None
    parts = _dotted_parts(index.value)
    if parts is None or not _RANK_LIKE_NAME.search(parts[-1]):
        return None
    return ".".join(parts)


def per_rank_advice(index: str) -> str:
    """The per-process device of a torchrun port, right on a CUDA host (one process per GPU,
    each sees them all) and on TorchTPU (each process sees one device, index 0)."""
    return (
        f"index = {index} if torch.accelerator.device_count() > 1 else 0; "
        "torch.accelerator.set_device_index(index); device = torch.device(device_type, index), "
        "where device_type = torch.accelerator.current_accelerator().type (TorchTPU gives each "
        "process one device, index 0)"
    )


def _device_choice(value: ast.AST) -> bool:
    """`"cuda"`, `torch.device("cuda")`: the value of a device choice."""
    if _is_cuda_device_text(value):
        return True
    return (
        isinstance(value, ast.Call)
        and _last_name(value.func) == "device"
        and bool(value.args)
        and _is_cuda_device_text(value.args[0])
    )


# --------------------------------------------------------------------------------------------
# The rules: one check function each, registered in RULE_TABLE below


def _check_cuda_method(audit: _Auditor, call: ast.Call) -> None:
    func = call.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "cuda"
        and audit.qualify(func) != "torch.cuda"
    ):
        index = next(
            (
                argument.value if isinstance(argument, ast.keyword) else argument
                for argument in [*call.args, *call.keywords]
                if not isinstance(argument, ast.keyword) or argument.arg == "device"
            ),
            None,
        )
        if index is None:
            audit.report(
                "cuda-method", func, "`.cuda()` moves to a CUDA GPU only", at_attribute=True
            )
            return
        shown = _shown(index, 30)
        # `.cuda(0)`: the first GPU, one device per script, chosen once.
        where = f"device = {CHOOSE_DEVICE}" if shown == "0" else per_rank_advice(shown)
        audit.report(
            "cuda-method",
            func,
            f"`.cuda({shown})` moves to CUDA GPU {shown} only; {ONE_DEVICE_PER_PROCESS}",
            f".to(device), where {where}",
            at_attribute=True,
        )


def _check_cuda_amp(audit: _Auditor, node: ast.Name | ast.Attribute) -> None:
    name = audit.current_name
    if name is None or not (name == "torch.cuda.amp" or name.startswith("torch.cuda.amp.")):
        return
    member = name.removeprefix("torch.cuda.")
    entry = equivalent_for(member) if member != "amp" else None
    if entry is not None:
        suggestion = entry.replacement + (f" ({entry.note})" if entry.note else "")
    elif member == "amp":
        suggestion = "torch.amp, with device_type=device.type"
    else:
        suggestion = f"torch.{member}, with device_type=device.type"
    audit.report("cuda-amp", node, f"`{name}` is CUDA-only (and deprecated)", suggestion)


_TENSOR_TYPE_DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "FloatTensor": "torch.float32",
        "DoubleTensor": "torch.float64",
        "HalfTensor": "torch.float16",
        "BFloat16Tensor": "torch.bfloat16",
    }
)


def _default_type_advice(type_name: str) -> str:
    """`set_default_tensor_type(torch.cuda.HalfTensor)` sets a device and a dtype: two calls."""
    dtype = _TENSOR_TYPE_DTYPES.get(type_name.rsplit(".", 1)[-1], "...")
    return (
        f"torch.set_default_device(device) and torch.set_default_dtype({dtype}) "
        "(set_default_dtype takes floating-point types only)"
    )


def _check_cuda_tensor_type(audit: _Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Call):
        if _last_name(node.func) in {"set_default_tensor_type", "type"} and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Name | ast.Attribute):
                name = audit.qualify(argument)
                if (
                    name is not None
                    and _CUDA_TENSOR_TYPE.fullmatch(name)
                    and _last_name(node.func) == "set_default_tensor_type"
                ):
                    audit.report(
                        "cuda-tensor-type",
                        argument,
                        f"`{name}` is a CUDA-only tensor type",
                        _default_type_advice(name),
                    )
                return
            text = _string_value(argument)
            if text is not None and _CUDA_TENSOR_TYPE.fullmatch(text):
                audit.report(
                    "cuda-tensor-type",
                    node.args[0],
                    f"{text!r} is a CUDA-only tensor type",
                    _default_type_advice(text)
                    if _last_name(node.func) == "set_default_tensor_type"
                    else ".to(device, dtype)",
                )
        return
    name = audit.current_name
    if name is not None and _CUDA_TENSOR_TYPE.fullmatch(name):
        audit.report(
            "cuda-tensor-type",
            node,
            f"`{name}` is a CUDA-only tensor type",
            "torch.tensor(..., dtype=..., device=device) (or torch.empty with dtype and device)",
        )


def _check_profiler_activity(audit: _Auditor, node: ast.Name | ast.Attribute) -> None:
    name = audit.current_name
    if name is not None and name.endswith("ProfilerActivity.CUDA"):
        audit.report("cuda-profiler-activity", node, f"`{name}` profiles CUDA kernels only")


def _check_cuda_test_fallback(audit: _Auditor, node: ast.If | ast.IfExp) -> None:
    """A CUDA check with no `torch.cuda` name in it (`x.is_cuda`, `device.type == "cuda"`,
    `torch.version.cuda`) whose other branch falls back to the CPU, exits or picks float16: a
    TPU takes that branch. (A `torch.cuda` probe gets the same mark from `torch-cuda-call`.)"""
    polarity = audit.is_cuda_test(node.test)
    if polarity is None:
        return
    for inner in ast.walk(node.test):
        if isinstance(inner, ast.Name | ast.Attribute):
            name = audit.qualify(inner) or ""
            if name == "torch.cuda" or name.startswith("torch.cuda."):
                return
    chosen = node.body if polarity else node.orelse
    statements = chosen if isinstance(chosen, list) else [chosen]
    if any(  # a device choice (`"cuda" if use_cuda else "cpu"`) is reported as the choice
        _device_choice(statement.value if isinstance(statement, ast.Assign) else statement)
        for statement in statements
        if isinstance(statement, ast.Assign | ast.expr)
    ):
        return
    fallback = audit.fallback_of(node, polarity)
    if fallback is None:
        return
    audit.report(
        "cuda-test-fallback",
        node.test,
        f"`{_shown(node.test)}` sends a TPU down {OFF_CUDA_BRANCH}, which {_FALLBACKS[fallback]}",
    )


def _check_torch_cuda(audit: _Auditor, node: ast.Name | ast.Attribute) -> None:
    name = audit.current_name
    if name is None or not (name == "torch.cuda" or name.startswith("torch.cuda.")):
        return
    if name.startswith("torch.cuda.amp") or _CUDA_TENSOR_TYPE.fullmatch(name):
        return
    if name == "torch.cuda":
        audit.report(
            "torch-cuda-call",
            node,
            "the module `torch.cuda` held as a value works on CUDA GPUs only",
            "torch.get_device_module(device) (or call torch.accelerator.* directly)",
        )
        return
    member = name.removeprefix("torch.cuda.")
    message = f"`{name}` works on CUDA GPUs only"
    extra = _EXTRA_EQUIVALENTS.get(member)
    if extra is not None:
        audit.report("torch-cuda-call", node, message, extra)
        return
    entry = equivalent_for(member)
    if entry is None:
        audit.report(
            "torch-cuda-call",
            node,
            message,
            f"no entry in tpuready.accelerator_api: look under torch.accelerator, {_GUARD_ADVICE}",
        )
        return
    if entry.refused_by_torch_tpu:
        message += f" (and `torch.tpu.{entry.name}` raises in TorchTPU 0.2.0)"
    audit.report(
        "torch-cuda-call",
        node,
        message,
        entry.replacement + (f" ({entry.note})" if entry.note else ""),
    )


def _setting_suggestion(setting: str, value: ast.AST | None) -> str:
    """Advice for `torch.backends.cudnn.X = value` / `torch.backends.cuda.X = value` that
    follows the value being assigned."""
    shown = _shown(value) if value is not None else "..."
    if setting == "deterministic":
        if value is not None and _is_false(value):
            return (
                "remove it: non-deterministic algorithms are already allowed by default "
                "(torch.use_deterministic_algorithms(False) is the backend-neutral spelling)"
            )
        argument = "True" if value is None else shown
        return (
            f"torch.use_deterministic_algorithms({argument}), the backend-neutral switch; it is "
            "stricter than the cuDNN flag: ops with no deterministic kernel raise (the CUDA "
            "backward of AdaptiveAvgPool2d, for one), and warn_only=True reports them instead"
        )
    if setting == "benchmark":
        return (
            "keep it: cuDNN autotuning picks CUDA convolution kernels, and has no TPU "
            "counterpart to ask for"
        )
    if setting == "allow_tf32":
        if value is not None and _is_true(value):
            return (
                "keep it (PyTorch's default): it lets cuDNN convolutions use TF32 on CUDA "
                "and does nothing on a TPU; torch.set_float32_matmul_precision does not touch "
                "convolutions"
            )
        return (
            'keep it, under `if device.type == "cuda":`: it governs cuDNN convolutions only, '
            "and torch.set_float32_matmul_precision does not touch convolutions; on TorchTPU "
            "ask for full float32 with torch.tpu.precision(torch.tpu.Precision.HIGHEST)"
        )
    if setting == "matmul.allow_tf32":
        if value is not None and _is_false(value):
            return (
                'torch.set_float32_matmul_precision("highest"): full float32 matmuls on CUDA '
                "(TF32 off, its default) and on TorchTPU (six bf16 passes; its default is one)"
            )
        if value is not None and not _is_true(value):
            return f'torch.set_float32_matmul_precision("high" if {shown} else "highest")'
        return (
            "keep it: it turns TF32 on for CUDA matmuls and does nothing on a TPU, whose "
            "float32 matmuls are one bf16 pass by default. Do not port it to "
            'torch.set_float32_matmul_precision("high") unconditionally: on TorchTPU "high" '
            "means three bf16 passes per matmul, slower, where the original line did nothing"
        )
    if setting == "enabled":
        return "keep it: it switches cuDNN on CUDA GPUs and does nothing elsewhere"
    if setting == "sdp_kernel":
        return "torch.nn.attention.sdpa_kernel(...), " + _GUARD_ADVICE
    return f"remove it, {_GUARD_ADVICE}"


# `torch.backends.cuda` calls that only choose among CUDA kernels: nothing to lose elsewhere.
# (Not the SDPA switches: `enable_math_sdp(False)` and `sdp_kernel(enable_math=False)` also
# turn off the CPU's attention kernel, so they stay must-change.)
_CUDA_KERNEL_CHOICES = frozenset({"preferred_linalg_library", "preferred_blas_library"})


def _harmless_off_cuda(setting: str, value: ast.AST) -> bool:
    """Whether `torch.backends.cudnn/cuda.<setting> = value` loses nothing the script asked for
    on a TPU: the flag is only read by CUDA kernels, and a TPU already does what it asks (speed
    over precision, or no cuDNN). A request for determinism or for full float32 precision is
    lost there, and stays must-change."""
    if setting in {"benchmark", "enabled"}:
        return True  # autotuning and the cuDNN switch: CUDA kernels only, no result changes
    if setting in {"allow_tf32", "matmul.allow_tf32"}:
        return _is_true(value)  # TF32 allowed: a TPU's default float32 matmul is coarser still
    if setting == "deterministic":
        return _is_false(value)  # non-determinism allowed: the default everywhere
    return False


def _check_backend_setting(
    audit: _Auditor, node: ast.AST, prefix: str, rule: str, what: str
) -> None:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            name = audit.qualify(target) if isinstance(target, ast.Attribute) else None
            if name is not None and name.startswith(prefix):
                setting = name.removeprefix(prefix)
                harmless = _harmless_off_cuda(setting, node.value)
                audit.report(
                    rule,
                    target,
                    f"`{name}` {what}"
                    + (
                        " (off CUDA it does nothing and loses nothing asked for: a note)"
                        if harmless
                        else ""
                    ),
                    _setting_suggestion(setting, node.value),
                    severity=NOTE if harmless else None,
                )
        return
    name = audit.current_name
    if name is not None and name.removeprefix(prefix) in _CUDA_KERNEL_CHOICES:
        audit.report(
            rule,
            node,
            f"`{name}` picks among CUDA's own kernels (off CUDA it does nothing and loses "
            "nothing asked for: a note)",
            "keep it: a TPU has no such libraries to choose",
            severity=NOTE,
        )
    elif name is not None and name.startswith(prefix) and name not in _CUDA_PROBES:
        audit.report(
            rule, node, f"`{name}` {what}", _setting_suggestion(name.removeprefix(prefix), None)
        )
    elif name in _CUDA_PROBES and name is not None and name.startswith(prefix):
        audit.report(rule, node, f"`{name}` {what}", _PROBE_ADVICE)


def _check_cudnn_setting(audit: _Auditor, node: ast.AST) -> None:
    _check_backend_setting(
        audit, node, "torch.backends.cudnn.", "cudnn-setting", "configures cuDNN, a CUDA library"
    )


def _check_cuda_backend_setting(audit: _Auditor, node: ast.AST) -> None:
    _check_backend_setting(
        audit, node, "torch.backends.cuda.", "cuda-backend-setting", "configures CUDA kernels only"
    )


def _check_device_string(audit: _Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Call):
        name = audit.qualify(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method == "to":
            for argument in node.args:
                audit.check_device_value(argument, as_type=False)
        if name in _DEVICE_FIRST_ARGUMENT and node.args:
            audit.check_device_value(node.args[0], as_type=_DEVICE_FIRST_ARGUMENT[name])
        if name == "torch.device" and len(node.args) == 2:  # torch.device(device_type, rank)
            index = _rank_index(node.args[1])
            if index is not None and _string_value(node.args[0]) is None:
                audit.report(
                    "set-device-index",
                    node,
                    f"`{_shown(node)}` names the device at the rank's own index; "
                    f"{ONE_DEVICE_PER_PROCESS}",
                    per_rank_advice(index),
                )
        not_devices = _choices_are_not_devices(node)
        for keyword in node.keywords:
            if keyword.arg in _DEVICE_KEYWORDS and not (keyword.arg == "default" and not_devices):
                if keyword.arg == "map_location" and isinstance(keyword.value, ast.Dict):
                    values = [*keyword.value.keys, *keyword.value.values]
                    if any(v is not None and _is_cuda_device_text(v) for v in values):
                        audit.report(
                            "cuda-device-string",
                            keyword.value,
                            f"map_location {_shown(keyword.value)} names CUDA GPUs only",
                            f"map_location=device, where {CHOOSE_DEVICE}",
                        )
                    continue
                audit.check_device_value(keyword.value, as_type=_DEVICE_KEYWORDS[keyword.arg])
            elif keyword.arg == "type" and name == "torch.device":
                audit.check_device_value(keyword.value, as_type=False)
    elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = {_last_name(target) for target in targets}
        as_type = any("type" in name for name in names) or bool(
            names & audit.facts.device_type_names
        )
        if node.value is not None:
            audit.check_device_value(node.value, as_type=as_type)
    elif isinstance(node, ast.Return):
        if node.value is not None:
            audit.check_device_value(node.value, as_type=False)
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            key_text = _string_value(key) if key is not None else None
            if key_text in _DEVICE_DICT_KEYS:
                audit.check_device_value(value, as_type=key_text == "device_type")
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            audit.check_device_value(default, as_type=False)


# Tensor factories whose pin_memory=True allocates pinned memory at once (it raises with no
# accelerator); any other callee is taken for a loader, which pins per batch when it can.
_TENSOR_FACTORIES = frozenset(
    f"torch.{name}"
    for name in (
        "empty",
        "zeros",
        "ones",
        "full",
        "tensor",
        "as_tensor",
        "rand",
        "randn",
        "randint",
        "arange",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_strided",
    )
)


def _check_pin_memory(audit: _Auditor, call: ast.Call) -> None:
    for keyword in call.keywords:
        if keyword.arg == "pin_memory" and _is_true(keyword.value):
            if (audit.qualify(call.func) or "") not in _TENSOR_FACTORIES:
                audit.report(
                    "pin-memory",
                    keyword,
                    "a loader's pin_memory=True (a DataLoader's) pins for the current "
                    "accelerator (a TPU too); on a machine with none it pins nothing and warns: "
                    "a note",
                    severity=NOTE,
                )
            else:
                audit.report(
                    "pin-memory",
                    keyword,
                    "pin_memory=True allocates pinned memory, which raises on a machine with "
                    "no accelerator",
                )
    if isinstance(call.func, ast.Attribute) and call.func.attr == "pin_memory" and not call.args:
        audit.report(
            "pin-memory",
            call.func,
            "`.pin_memory()` pins host memory for copies to an accelerator, also where there is "
            "none",
            "call it only when torch.accelerator.is_available()",
            at_attribute=True,
        )


def _check_device_module_call(audit: _Auditor, call: ast.Call) -> None:
    """`device_module.synchronize()` where `device_module = torch.get_device_module(...)`: on
    TorchTPU the module is `torch.tpu`, whose CUDA-style device calls raise in 0.2.0."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return
    holder = func.value
    parts = _dotted_parts(holder)
    bound = parts is not None and ".".join(parts) in audit.facts.device_module_names
    direct = (
        isinstance(holder, ast.Call)
        and audit.qualify(holder.func) == "torch.get_device_module"
        and not (holder.args and _string_value(holder.args[0]) is not None)  # ("cuda")
    )
    if not (bound or direct):
        return
    entry = equivalent_for(func.attr)
    if entry is None or not entry.refused_by_torch_tpu:
        return
    audit.report(
        "device-module-call",
        call,
        f"`{_shown(func, 60)}()` calls the device's own module: on TorchTPU that is "
        f"`torch.tpu`, whose `{func.attr}` raises in 0.2.0",
        entry.note if "get_device_module" in entry.replacement else entry.replacement,
    )


def _check_compile_mode(audit: _Auditor, call: ast.Call) -> None:
    """`torch.compile(..., mode=...)` or `module.compile(mode=...)`: TorchTPU 0.2.0 takes only
    its own backend options and raises TypeError on `mode=`."""
    is_compile = audit.qualify(call.func) == "torch.compile" or (
        isinstance(call.func, ast.Attribute) and call.func.attr == "compile"
    )
    if not is_compile:
        return
    for keyword in call.keywords:
        mode = _string_value(keyword.value)
        # A literal mode only: `mode="default"` is dropped before a non-inductor backend, and
        # a computed one (`... if device.type == "cuda" else None`) is the port itself.
        if keyword.arg == "mode" and mode is not None and mode != "default":
            why = {
                "reduce-overhead": " (it asks for CUDA graphs)",
                "max-autotune": " (it asks for Triton autotuning and CUDA graphs)",
                "max-autotune-no-cudagraphs": " (it asks for Triton autotuning)",
            }.get(mode or "", "")
            audit.report(
                "compile-mode",
                keyword,
                f"`mode={_shown(keyword.value, 30)}`{why}: TorchTPU 0.2.0's torch.compile takes "
                'only its backend\'s options, and mode="reduce-overhead" raises TypeError there',
            )


def _check_integer_device(audit: _Auditor, call: ast.Call) -> None:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        return
    candidates = call.args[:1] + [kw.value for kw in call.keywords if kw.arg == "device"]
    for argument in candidates:
        if (
            isinstance(argument, ast.Constant)
            and isinstance(argument.value, int)
            and not isinstance(argument.value, bool)
        ):
            shown = str(argument.value)
        elif isinstance(argument, ast.Call) and _dotted_parts(argument.func) == ["int"]:
            shown = _shown(argument)
        else:
            parts = _dotted_parts(argument)
            if parts is None or not _RANK_LIKE_NAME.search(parts[-1]):
                continue
            shown = ".".join(parts)
        audit.report(
            "to-int-device",
            argument,
            f"`.to({shown})` reads an integer as an accelerator index, which TorchTPU "
            "ignores (TorchTPU issue #4164)",
        )


def _check_set_device(audit: _Auditor, call: ast.Call) -> None:
    if _last_name(call.func) not in {"set_device", "set_device_index"}:
        return
    qualified = audit.qualify(call.func) or ""
    if qualified in {
        "torch.accelerator.set_device_index",
        "torch.accelerator.set_device_idx",
    }:
        # The portable call this rule recommends, unless it is handed a rank's index itself.
        index = call.args[0] if call.args else None
        shown = _rank_index(index) if index is not None else None
        if shown is not None:
            audit.report(
                "set-device-index",
                call,
                f"`{_shown(call.func, 40)}({shown})` sets a rank's own index; on TorchTPU each "
                "process sees one device, index 0, and another index raises",
                per_rank_advice(shown),
            )
        return
    if qualified.startswith("torch.") and not qualified.startswith(("torch.cuda.", "torch.tpu.")):
        return  # another vendor's device (`torch.mlu.set_device`); torch.tpu's raises in 0.2.0
    arguments = call.args[:1] + [kw.value for kw in call.keywords if kw.arg == "device"]
    if not arguments or isinstance(arguments[0], ast.Starred):
        return
    argument = arguments[0]
    if isinstance(argument, ast.Constant) and argument.value == 0:
        return
    audit.silence(call.func)  # one finding for torch.cuda.set_device(rank)
    shown = _shown(argument, 30)
    audit.report(
        "set-device-index",
        call,
        f"`{_shown(call.func, 40)}({shown})` picks a device by index; on TorchTPU "
        "set_device(i) for another index raises",
        per_rank_advice(shown),
    )


def _check_process_group_backend(audit: _Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        # `def init_dist(launcher, backend="nccl")`: the default every caller gets.
        arguments = node.args
        positional = [*arguments.posonlyargs, *arguments.args]
        pairs = [
            *zip(
                positional[len(positional) - len(arguments.defaults) :],
                arguments.defaults,
                strict=True,
            ),
            *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
        ]
        for argument, default in pairs:
            if default is not None and "backend" in argument.arg and _is_nccl(default):
                audit.report(
                    "nccl-backend",
                    default,
                    f"the default {argument.arg}={_shown(default)} is a backend for CUDA GPUs only",
                    f"{argument.arg}=None, passed on as init_process_group(backend=...): "
                    "PyTorch then picks one per device type",
                )
        return
    if isinstance(node, ast.Assign):
        names = {target.id for target in node.targets if isinstance(target, ast.Name)}
        names_a_backend = any(  # `args.dist_backend = "nccl"`, `self.backend = "nccl"`
            isinstance(target, ast.Attribute) and "backend" in target.attr
            for target in node.targets
        )
        if (names & audit.facts.backend_names or names_a_backend) and _is_nccl(node.value):
            audit.report(
                "nccl-backend",
                node.value,
                f"backend {_shown(node.value)} (passed to init_process_group later) exists for "
                "CUDA GPUs only",
            )
        return
    call: ast.Call = node  # type: ignore[assignment]
    last = _last_name(call.func)
    if last == "add_argument":
        for keyword in call.keywords:
            if keyword.arg == "default" and _string_value(keyword.value) == "nccl":
                audit.report(
                    "nccl-backend",
                    keyword.value,
                    'the option default "nccl" is a backend for CUDA GPUs only',
                    "default=None, passed on as init_process_group(backend=args.backend): "
                    "PyTorch then picks one per device type",
                )
        return
    if last not in _BACKEND_CALLS:
        return
    candidates = [kw.value for kw in call.keywords if kw.arg == "backend"]
    if last == "init_process_group":
        candidates += call.args[:1]
    for value in candidates:
        if _is_nccl(value):
            audit.report(
                "nccl-backend", value, f"backend {_shown(value)} exists for CUDA GPUs only"
            )


def _check_ddp_device_ids(audit: _Auditor, call: ast.Call) -> None:
    if _last_name(call.func) not in _DDP_NAMES:
        return
    for keyword in call.keywords:
        if keyword.arg in {"device_ids", "output_device"} and not (
            isinstance(keyword.value, ast.Constant) and keyword.value.value is None
        ):
            single_process = _last_name(call.func) == "DataParallel"
            audit.report(
                "ddp-device-ids",
                keyword,
                f"`{keyword.arg}={_shown(keyword.value, 30)}` names CUDA GPUs by index"
                + (
                    " for DataParallel, which splits a batch over GPUs in one process"
                    if single_process
                    else ""
                ),
                "DistributedDataParallel with one process per device and no device_ids "
                "(TorchTPU gives each process one device)"
                if single_process
                else None,
            )


def _check_float64(audit: _Auditor, call: ast.Call) -> None:
    if _names_the_cpu(call):
        return
    func = call.func
    method = func.attr if isinstance(func, ast.Attribute) else None
    name = audit.qualify(func)
    is_double = method == "double" and not call.args and not call.keywords
    dtype_values = [kw.value for kw in call.keywords if kw.arg == "dtype"]
    if method in {"to", "type"} or name == "torch.set_default_dtype":
        dtype_values += call.args
    if not is_double and not dtype_values:
        return
    severity = MUST_CHANGE if audit.facts.names_a_device else NOTE
    tail = "" if severity == MUST_CHANGE else " (nothing in this file names a device: a note)"
    if is_double:
        receiver = func.value  # type: ignore[union-attr]
        if not (isinstance(receiver, ast.Call) and _names_the_cpu(receiver)):
            audit.report(
                "float64",
                func,
                "`.double()` asks for float64, which TPUs cannot run fast" + tail,
                ".float() (keep float64 for checks on the CPU: `.cpu().double()`)",
                severity=severity,
                at_attribute=True,
            )
    for value in dtype_values:
        if audit.qualify(value) in _FLOAT64_NAMES:
            audit.report(
                "float64",
                value,
                f"`{_shown(value)}` asks for float64, which TPUs cannot run fast" + tail,
                severity=severity,
            )


def _check_inference_mode(audit: _Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.With | ast.AsyncWith):
        candidates = [item.context_expr for item in node.items]
    else:
        candidates = list(node.decorator_list)  # type: ignore[attr-defined]
    for candidate in candidates:
        target = candidate.func if isinstance(candidate, ast.Call) else candidate
        if audit.qualify(target) not in _INFERENCE_MODE_NAMES:
            continue
        if audit.facts.compiles:
            audit.report(
                "inference-mode",
                candidate,
                "compiled code under torch.inference_mode crashes TorchTPU 0.2.0 (this file "
                "compiles)",
            )
        else:
            audit.report(
                "inference-mode",
                candidate,
                "torch.inference_mode is fine in eager code, but compiled code under it "
                "crashes TorchTPU 0.2.0 (nothing in this file compiles: a note)",
                severity=NOTE,
            )
        audit.silence(target)


def _check_cuda_environment(audit: _Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Subscript):
        key = node.slice
        container = node.value
    elif isinstance(node, ast.Call) and node.args:
        key = node.args[0]
        container = node.func
    else:
        return
    text = _string_value(key)
    if text is None or not text.startswith("CUDA_"):
        return
    name = audit.qualify(container) or ".".join(_dotted_parts(container) or [])
    if (isinstance(node, ast.Subscript) and name == "os.environ") or name in _ENVIRON_CALLS:
        audit.report(
            "cuda-env-var",
            key,
            f"the environment variable {text} is read by CUDA only",
        )


# --------------------------------------------------------------------------------------------
# The rule table: each rule written once; RULES and the module docstring come from it


@dataclass(frozen=True)
class Rule:
    """One audit rule: its id, default severity, a one-line description, the syntax node types
    it looks at, the check run on each such node, and the default advice."""

    id: str
    severity: str
    description: str
    node_types: tuple[type[ast.AST], ...]
    check: Callable[[Any, Any], None] | None
    advice: str


_NAMES = (ast.Name, ast.Attribute)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

RULE_TABLE: tuple[Rule, ...] = (
    Rule(
        "set-device-index",
        MUST_CHANGE,
        "`torch.cuda.set_device(i)` / `set_device(i)` with i that may not be 0, and a rank's "
        'own index in the accelerator style (`set_device_index(local_rank)`, `f"{device_type}:'
        '{rank}"`)',
        (ast.Call,),
        _check_set_device,
        per_rank_advice("i"),
    ),
    Rule(
        "cuda-method",
        MUST_CHANGE,
        "`.cuda()` on a tensor or module",
        (ast.Call,),
        _check_cuda_method,
        ".to(device)",
    ),
    Rule(
        "cuda-amp",
        MUST_CHANGE,
        "`torch.cuda.amp` (autocast, GradScaler, custom_fwd, ...)",
        _NAMES,
        _check_cuda_amp,
        "torch.amp, with device_type=device.type",
    ),
    Rule(
        "cuda-tensor-type",
        MUST_CHANGE,
        '`torch.cuda.FloatTensor` and friends, also as `set_default_tensor_type("...")`',
        (*_NAMES, ast.Call),
        _check_cuda_tensor_type,
        "torch.tensor(..., dtype=..., device=device)",
    ),
    Rule(
        "cuda-profiler-activity",
        MUST_CHANGE,
        "`ProfilerActivity.CUDA`",
        _NAMES,
        _check_profiler_activity,
        "activities=torch.profiler.supported_activities() (the CPU plus the accelerator present)",
    ),
    Rule(
        "torch-cuda-call",
        MUST_CHANGE,
        "a `torch.cuda.*` name (or `torch.cuda` held as a module), with its portable spelling",
        _NAMES,
        _check_torch_cuda,
        "torch.accelerator",
    ),
    Rule(
        "cuda-test-fallback",
        MUST_CHANGE,
        'a CUDA check without a `torch.cuda` name (`x.is_cuda`, `device.type == "cuda"`, '
        "a `use_cuda` flag) whose other branch falls back to the CPU, exits or picks float16",
        (ast.If, ast.IfExp),
        _check_cuda_test_fallback,
        'ask for any accelerator: `x.device.type != "cpu"` for a tensor, `device.type != '
        '"cpu"` for a device, torch.accelerator.is_available() for a probe (`args.cuda and '
        "torch.accelerator.is_available()` keeps a user's opt-in); not for a kernel choice "
        "(`if x.is_cuda: cuda_kernel(x)`), where the other branch is right on a TPU",
    ),
    Rule(
        "cudnn-setting",
        MUST_CHANGE,
        "a `torch.backends.cudnn` setting; the advice follows the value assigned",
        (*_NAMES, ast.Assign),
        _check_cudnn_setting,
        f"remove it, {_GUARD_ADVICE}",
    ),
    Rule(
        "cuda-backend-setting",
        MUST_CHANGE,
        "a `torch.backends.cuda` setting (matmul.allow_tf32, ...); advice follows the value",
        (*_NAMES, ast.Assign),
        _check_cuda_backend_setting,
        f"remove it, {_GUARD_ADVICE}",
    ),
    Rule(
        "cuda-device-string",
        MUST_CHANGE,
        '`"cuda"` / `"cuda:N"` / `f"cuda:{rank}"` used as a device or device type: in '
        "`.to()`, `torch.device` (also `type=`), autocast, `device=`, `device_type=`, "
        "`map_location=` (also a dict), `pin_memory_device=`, an argparse `default=` (not "
        "beside `choices` naming kernels), a dict value, an assignment, a return, a default",
        (
            ast.Call,
            ast.Assign,
            ast.AnnAssign,
            ast.NamedExpr,
            ast.Return,
            ast.Dict,
            *_FUNCTIONS,
            ast.Lambda,
        ),
        _check_device_string,
        f"device, where {CHOOSE_DEVICE}",
    ),
    Rule(
        "pin-memory",
        MUST_CHANGE,
        "`pin_memory=True` in a tensor factory, or `.pin_memory()` called directly (in a "
        "DataLoader or another loader a note: it pins for any accelerator)",
        (ast.Call,),
        _check_pin_memory,
        "pin_memory=torch.accelerator.is_available()",
    ),
    Rule(
        "to-int-device",
        MUST_CHANGE,
        "`.to(<int>)`: an integer device index (`.to(local_rank)`)",
        (ast.Call,),
        _check_integer_device,
        ".to(device), with device chosen once per process",
    ),
    Rule(
        "nccl-backend",
        MUST_CHANGE,
        '`init_process_group("nccl")` / `backend="nccl"`, also through a variable, an '
        "attribute (`args.dist_backend`), a parameter default or an argparse default",
        (ast.Call, ast.Assign, *_FUNCTIONS),
        _check_process_group_backend,
        "dist.init_process_group() with no backend: PyTorch picks the one backend of the "
        "machine's accelerator (gloo with none, nccl on CUDA, tpu_dist on TorchTPU); "
        "name 'cpu:gloo,cuda:nccl' if CPU tensors must be reduced too",
    ),
    Rule(
        "ddp-device-ids",
        MUST_CHANGE,
        "`DistributedDataParallel(..., device_ids=[local_rank])` (or `output_device=`), and "
        "`DataParallel(..., device_ids=...)`",
        (ast.Call,),
        _check_ddp_device_ids,
        "leave device_ids and output_device out: for a module on one device DDP uses the "
        "module's device, whatever it is called",
    ),
    Rule(
        "cuda-env-var",
        MUST_CHANGE,
        '`os.environ["CUDA_VISIBLE_DEVICES"]` and other `CUDA_*` variables',
        (ast.Subscript, ast.Call),
        _check_cuda_environment,
        "choose the device per process instead (torchrun's LOCAL_RANK; TorchTPU gives each "
        "process one device)",
    ),
    Rule(
        "float64",
        MUST_CHANGE,
        "float64 requested for computation (`.double()`, `dtype=torch.float64`); a note in a "
        "file that names no device",
        (ast.Call,),
        _check_float64,
        "torch.float32 (bfloat16 only where precision allows, never for counts or sums: "
        "12345 becomes 12352; counts summed across ranks go in int64); keep float64 for checks "
        "on the CPU",
    ),
    Rule(
        "device-module-call",
        MUST_CHANGE,
        "a CUDA-style device call (`synchronize`, `current_device`, ...) on the module of "
        "`torch.get_device_module(...)`, which on TorchTPU 0.2.0 raises",
        (ast.Call,),
        _check_device_module_call,
        "torch.accelerator",
    ),
    Rule(
        "compile-mode",
        MUST_CHANGE,
        "`torch.compile(..., mode=...)` (`reduce-overhead`, `max-autotune`: CUDA graphs and "
        "Triton), which TorchTPU 0.2.0 refuses",
        (ast.Call,),
        _check_compile_mode,
        'mode="reduce-overhead" if device.type == "cuda" else None (TorchTPU takes no mode=)',
    ),
    Rule(
        "inference-mode",
        MUST_CHANGE,
        "`torch.inference_mode` as a `with` context or decorator in a file that compiles (a "
        "note elsewhere)",
        (ast.With, ast.AsyncWith, *_FUNCTIONS),
        _check_inference_mode,
        "torch.no_grad()",
    ),
    Rule(
        "syntax-error",
        MUST_CHANGE,
        "a file or notebook cell that does not parse (nothing in it was checked)",
        (),
        None,
        "fix the syntax and audit again (nothing else here was checked)",
    ),
    Rule(
        "skipped-file",
        NOTE,
        f"a file over {MAX_FILE_BYTES:,} bytes, skipped to bound memory",
        (),
        None,
        "audit it in parts, or leave it out with [tool.tpuready] exclude",
    ),
)

RULE_BY_ID: Mapping[str, Rule] = MappingProxyType({rule.id: rule for rule in RULE_TABLE})
RULES: Mapping[str, str] = MappingProxyType({rule.id: rule.description for rule in RULE_TABLE})


def _checks_by_node_type() -> dict[type, tuple[Callable[[Any, Any], None], ...]]:
    table: dict[type, list[Callable[[Any, Any], None]]] = {}
    for rule in RULE_TABLE:
        for node_type in rule.node_types:
            if rule.check is not None:
                table.setdefault(node_type, []).append(rule.check)
    return {node_type: tuple(checks) for node_type, checks in table.items()}


_CHECKS_BY_NODE_TYPE = _checks_by_node_type()

__doc__ = (__doc__ or "") + "".join(
    f"\n- `{rule.id}` ({rule.severity}): {rule.description}." for rule in RULE_TABLE
)


# --------------------------------------------------------------------------------------------
# Auditing text, files, notebooks


def _syntax_error_finding(error: SyntaxError, source: str, path: str, cell: int | None) -> Finding:
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


_TRIGGER_TEXTS = tuple(sorted({word.lower() for word in (*_TRIGGER_WORDS, "nccl")}))


def _alias_pattern(aliases: Mapping[str, str]) -> re.Pattern[str] | None:
    """An imported name that stands for a trigger word (`tc` for `torch.cuda`), or None."""
    words = sorted(
        rf"\b{re.escape(local.lower())}\b"
        for local, full in aliases.items()
        if local != full and any(word in full for word in _TRIGGER_WORDS)
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


def _trigger_lines(source: str, aliases: Mapping[str, str]) -> list[int]:
    """The numbers of the lines that hold a trigger word, ascending (lines as `ast` counts
    them: a form feed does not end a line). `str.find` per word: faster than one regex."""
    lowered = source.lower()
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
    if any(word in source for word in _TRIGGER_WORDS) or "nccl" in source.lower():
        return True
    return any(
        local in source
        for local, full in aliases.items()
        if local != full and any(word in full for word in _TRIGGER_WORDS)
    )


def _audit_tree(
    tree: ast.AST, source: str, facts: _FileFacts, path: str, cell: int | None
) -> list[Finding]:
    if not _may_have_findings(source, facts.aliases):
        return []
    lines = None if source.isascii() else re.split(r"\r\n|\r|\n", source)
    auditor = _Auditor(facts, path, cell, lines)
    auditor.run(tree, _trigger_lines(source, facts.aliases))
    findings = auditor.findings
    ignored = ignored_rules_by_line(source) if findings else {}
    if ignored:
        findings = [
            finding
            for finding in findings
            if not (
                finding.line in ignored
                and (ignored[finding.line] is None or finding.rule in ignored[finding.line])  # type: ignore[operator]
            )
        ]
    return findings


def audit_code(source: str, path: str = "<string>", *, cell: int | None = None) -> list[Finding]:
    """Audit Python source text; `path` and `cell` only label the findings.

    Chapter 1 uses it on code held in a string. A syntax error gives one `syntax-error` finding.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be Python text (str), got {type(source).__name__}")
    with cycle_collection_paused():
        try:
            if not _may_have_findings(source, {}):
                # No rule can fire; only whether it parses is reported, so no tree is built.
                check_python_syntax(source)
                return []
            tree = parse_python(source)
        except SyntaxError as error:
            return [_syntax_error_finding(error, source, path, cell)]
        findings = _audit_tree(tree, source, _collect_facts([tree], source), path, cell)
    return sorted(findings, key=Finding.sort_key)


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
    facts = _collect_facts(trees, "\n".join(python for _, python, _, _ in parsed))
    findings: list[Finding] = []
    for number, python, tree, error in parsed:
        if number in exempt:
            continue
        if error is not None:
            findings.append(_syntax_error_finding(error, python, shown, number))
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
            lines.append(f"{_SEVERITY_HEADINGS[severity]} ({len(group)}):")
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
    column, rule, severity, message, suggestion), in report order."""
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
