"""The audit's shared vocabulary: severities, a finding, the CUDA names and advice it knows,
and the small readers of syntax that the walker (`tpuready.audit.walker`) and the rules
(`tpuready.audit.rules`) both use. Depends on no other part of the audit."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, TypeGuard

__all__ = [
    "BACKEND_CALLS",
    "CHOOSE_DEVICE",
    "CUDA_FLAG_NAME",
    "CUDA_IDENTITY_PROBES",
    "CUDA_ONLY_PACKAGES",
    "CUDA_PROBES",
    "CUDA_TENSOR_TYPE",
    "DDP_NAMES",
    "DEVICE_CHOICE",
    "DEVICE_DICT_KEYS",
    "DEVICE_FIRST_ARGUMENT",
    "DEVICE_KEYWORDS",
    "DEVICE_WORDS",
    "ENVIRON_CALLS",
    "EXTRA_EQUIVALENTS",
    "FALLBACKS",
    "FIX_ACTIONS",
    "FLOAT64_NAMES",
    "GUARDED",
    "GUARD_ADVICE",
    "INFERENCE_MODE_NAMES",
    "LEAVE",
    "LEAVE_CUDA_ONLY",
    "MUST_CHANGE",
    "NOTE",
    "OFF_CUDA_BRANCH",
    "ONE_DEVICE_PATH",
    "ONE_DEVICE_PER_PROCESS",
    "PICKS_FLOAT16",
    "PROBE_ADVICE",
    "RANK_LIKE_NAME",
    "REWRITE",
    "SEVERITIES",
    "SEVERITY_HEADINGS",
    "TEST_SKIP_DECORATORS",
    "TRIGGER_WORDS",
    "Finding",
    "Rule",
    "choices_are_not_devices",
    "code_of",
    "device_choice",
    "dotted_parts",
    "index_in_device_text",
    "is_cuda_device_text",
    "is_false",
    "is_nccl",
    "is_none",
    "is_true",
    "last_name",
    "names_the_cpu",
    "per_rank_advice",
    "rank_index",
    "rank_of_device_text",
    "string_value",
]

MUST_CHANGE = "must-change"
GUARDED = "guarded"
NOTE = "note"
# Most severe first: the order of the text report and of `--severity`.
SEVERITIES: tuple[str, ...] = (MUST_CHANGE, GUARDED, NOTE)
SEVERITY_HEADINGS = {
    MUST_CHANGE: "must change",
    GUARDED: "guarded: review (CUDA-only code inside a CUDA guard, correct as it stands)",
    NOTE: "notes",
}

# What `--fix` does with a rule's findings: the `fix` column of `RULE_TABLE`, which the fixer
# reads instead of keeping its own lists. Every must-change finding it leaves is reported.
REWRITE = "rewrite"  # rewritten where that is safe (not a rank's own index, ...)
# Left as written, and the line still runs off CUDA (a setting, float64): a CUDA check over it
# may be ported.
LEAVE = "leave"
# Left as written, and the line stays CUDA-only (a device index, a CUDA-only package or tensor
# type, `mode=`): a CUDA check over it is never ported, or a TPU would run into it.
LEAVE_CUDA_ONLY = "leave-cuda-only"
FIX_ACTIONS: tuple[str, ...] = (REWRITE, LEAVE, LEAVE_CUDA_ONLY)

# The one device choice the book teaches: the accelerator present, else the CPU.
DEVICE_CHOICE = 'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'
CHOOSE_DEVICE = f"device = {DEVICE_CHOICE}"
GUARD_ADVICE = 'or run it only when device.type == "cuda"'
# Ends the message of a per-rank index; `--fix` reads it to leave such lines (and their checks).
ONE_DEVICE_PER_PROCESS = "TorchTPU runs one process per device and each sees it as index 0"
PROBE_ADVICE = (
    "keep it: it detects CUDA on purpose and guards CUDA-only code; do not replace it with "
    "torch.accelerator.is_available(), which is also true on a TPU"
)

_CUDA_DEVICE_LITERAL = re.compile(r"cuda(:\d+)?")
DEVICE_WORDS = frozenset({"cpu", "cuda", "mps", "xpu", "tpu", "meta", "hpu", "npu", "auto"})
# Calls whose first positional argument is a device, and whether it is a device *type*.
DEVICE_FIRST_ARGUMENT: Mapping[str, bool] = MappingProxyType(
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
DEVICE_KEYWORDS: Mapping[str, bool] = MappingProxyType(
    {
        "device": False,
        "device_type": True,
        "map_location": False,
        "device_map": False,
        "pin_memory_device": True,
        "default": False,  # argparse: add_argument("--device", default="cuda")
    }
)
DEVICE_DICT_KEYS = frozenset({"device", "device_type", "map_location", "device_map"})
RANK_LIKE_NAME = re.compile(r"(?:^|_)(?:rank|gpu|gpu_id|gpu_index|device_id|device_index)$")
CUDA_FLAG_NAME = re.compile(r"(?:^|_)(?:is_|use_|has_|on_)?cuda(?:_available)?$", re.IGNORECASE)
FLOAT64_NAMES = frozenset({"torch.float64", "torch.double"})
INFERENCE_MODE_NAMES = frozenset(
    {
        "torch.inference_mode",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
# Calls and attributes that exist to detect CUDA (or ROCm, which answers to the same names).
CUDA_PROBES = frozenset(
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
CUDA_IDENTITY_PROBES = frozenset(
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
TEST_SKIP_DECORATORS = frozenset(
    {
        "unittest.skipIf",
        "unittest.skipUnless",
        "unittest.case.skipIf",
        "unittest.case.skipUnless",
        "pytest.mark.skipif",
    }
)
# `torch.cuda.*` names tpuready.accelerator_api has no row for, with the portable spelling.
EXTRA_EQUIVALENTS: Mapping[str, str] = MappingProxyType(
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
CUDA_TENSOR_TYPE = re.compile(r"torch\.cuda\.\w*Tensor")
BACKEND_CALLS = frozenset({"init_process_group", "new_group"})
DDP_NAMES = frozenset({"DistributedDataParallel", "DDP", "DataParallel"})
ENVIRON_CALLS = frozenset(
    {"os.environ.get", "os.environ.setdefault", "os.environ.pop", "os.getenv", "os.putenv"}
)

# Packages built for GPUs only (CUDA; some also ROCm; `cuda` is NVIDIA's cuda-python, as in
# `from cuda import cudart`): importing one ties the file to a GPU, whatever it does with it.
CUDA_ONLY_PACKAGES: Mapping[str, str] = MappingProxyType(
    {
        "apex": "NVIDIA's apex (fused CUDA kernels, amp, DDP)",
        "cuda": "NVIDIA's cuda-python",
        "pycuda": "PyCUDA",
        "cupy": "CuPy",
        "tensorrt": "TensorRT",
        "torch_tensorrt": "Torch-TensorRT",
        "pynvml": "NVML, NVIDIA's GPU management library",
        "flash_attn": "FlashAttention's CUDA kernels",
    }
)

TRIGGER_WORDS = (
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
    "GradScaler",  # torch.amp.GradScaler() defaults to device="cuda"
    *CUDA_ONLY_PACKAGES,
)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One line that ties code to CUDA, with the portable spelling to write instead.

    `cell` is None for .py files; for notebooks it counts code cells from 1 and `line` is
    the line within that cell. `line` and `column` (characters) are 1-based. `severity` is
    one of `SEVERITIES`. What the message says in words, the last three fields say for
    programs (`--fix` reads them): `per_rank` when the line names a process's own CUDA index
    (which TorchTPU, one device per process, sees as 0), `off_cuda` what the branch taken off
    CUDA does when a TPU would take it (one of `FALLBACKS`, or `ONE_DEVICE_PATH`), and
    `cuda_name` the `torch.cuda` member named. `--format json` writes these fields, in this
    order.
    """

    path: str
    cell: int | None = None
    line: int
    column: int
    rule: str
    severity: str = MUST_CHANGE
    message: str
    suggestion: str
    per_rank: bool = False
    off_cuda: str | None = None
    cuda_name: str | None = None

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


def dotted_parts(node: ast.AST) -> list[str] | None:
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


def is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_string(node: ast.AST) -> TypeGuard[ast.Constant]:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def string_value(node: ast.AST) -> str | None:
    value = node.value if isinstance(node, ast.Constant) else None
    return value if isinstance(value, str) else None


def code_of(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except RecursionError:  # an expression nested deeper than unparse can follow
        return "..."
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _constant_fstring(node: ast.JoinedStr) -> str | None:
    parts = [string_value(value) for value in node.values]
    strings = [part for part in parts if part is not None]
    return None if len(strings) < len(parts) else "".join(strings)


def index_in_device_text(node: ast.AST) -> ast.AST | str | None:
    """For a CUDA device text, the index it names: "0", an expression node, or None (`"cuda"`).
    Returns False-y "" when the node is not CUDA device text at all; see `is_cuda_device_text`."""
    text = string_value(node)
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
    text = string_value(node)
    return text is not None and text.startswith("cuda:")


def is_cuda_device_text(node: ast.AST) -> bool:
    """True for `"cuda"`, `"cuda:1"`, `f"cuda"`, `f"cuda:{rank}"`, `"cuda:" + r`,
    `"cuda:%d" % r`, `"cuda:{}".format(r)`."""
    text = string_value(node)
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


def is_nccl(node: ast.AST) -> bool:
    text = string_value(node)
    if text is not None:
        return "nccl" in text.lower()
    if isinstance(node, ast.IfExp):
        return is_nccl(node.body) or is_nccl(node.orelse)
    if isinstance(node, ast.BoolOp):  # `os.environ.get("BACKEND") or "nccl"`
        return any(is_nccl(value) for value in node.values)
    if isinstance(node, ast.Call) and (dotted_parts(node.func) or [""])[-2:] in (
        ["environ", "get"],
        ["os", "getenv"],
    ):  # `os.environ.get("BACKEND", "nccl")`: the default, when the variable is not set
        defaults = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "default")]
        return any(is_nccl(default) for default in defaults)
    return (dotted_parts(node) or [""])[-1] == "NCCL"


def _is_cpu_device(node: ast.AST) -> bool:
    """`"cpu"` or `torch.device("cpu")`: a value that keeps data on the host."""
    if _is_string(node):
        return node.value == "cpu"
    if isinstance(node, ast.Call) and node.args:
        return dotted_parts(node.func) in (["torch", "device"], ["device"]) and _is_cpu_device(
            node.args[0]
        )
    return False


def names_the_cpu(call: ast.Call) -> bool:
    """True when the call itself moves to or creates on the CPU: `.cpu()`, `.to("cpu")`,
    `device="cpu"`."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cpu" and not call.args:
        return True
    arguments = list(call.args) + [kw.value for kw in call.keywords if kw.arg == "device"]
    return any(_is_cpu_device(argument) for argument in arguments)


def choices_are_not_devices(call: ast.Call) -> bool:
    """`choices=["cuda", "triton"]`: the option names kernels, so `default="cuda"` is not a
    device."""
    for keyword in call.keywords:
        if keyword.arg == "choices" and isinstance(keyword.value, ast.List | ast.Tuple | ast.Set):
            words = [string_value(item) for item in keyword.value.elts]
            return any(
                word is not None and word.split(":")[0] not in DEVICE_WORDS for word in words
            )
    return False


def last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


PICKS_FLOAT16 = "picks float16"
# What the branch taken off CUDA can do that a TPU would be hurt by (`Finding.off_cuda`).
FALLBACKS = (
    "falls back to the CPU",
    "stops the program",
    PICKS_FLOAT16,
    "leaves the work on the CPU",  # the CUDA branch moves it (`.cuda()`, DDP); this one not
    "runs CUDA-only code as well",  # `elif cuda: ... else: model.cuda()`: a TPU crashes there
    "counts a fixed number of devices",  # `n = torch.cuda.device_count()` / `else: n = 1`
)


# What a TPU does at `torch.cuda.device_count() > 1`: a CUDA check that `--fix` ports too.
ONE_DEVICE_PATH = "takes the one-device path"

# Marks the message of a CUDA check the audit ports because of what its other branch does;
# `--fix` rewrites those checks (tpuready.audit.fix reads the mark from here).
OFF_CUDA_BRANCH = "the branch taken off CUDA"


def rank_index(node: ast.AST) -> str | None:
    """The text of a rank's own index: a rank-like name (`local_rank`, `args.gpu`) or
    `int(os.environ["LOCAL_RANK"])`; None for anything else (`index`, `0`)."""
    if isinstance(node, ast.Call) and dotted_parts(node.func) == ["int"] and node.args:
        inner = node.args[0]
        key = inner.slice if isinstance(inner, ast.Subscript) else None
        if isinstance(inner, ast.Call) and inner.args:  # os.environ.get("LOCAL_RANK", ...)
            key = inner.args[0]
        text = string_value(key) if key is not None else None
        return code_of(node, 40) if text is not None and "RANK" in text.upper() else None
    parts = dotted_parts(node)
    if parts is None or not RANK_LIKE_NAME.search(parts[-1]):
        return None
    return ".".join(parts)


def rank_of_device_text(node: ast.AST) -> str | None:
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
    parts = dotted_parts(index.value)
    if parts is None or not RANK_LIKE_NAME.search(parts[-1]):
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


def device_choice(value: ast.AST) -> bool:
    """`"cuda"`, `torch.device("cuda")`: the value of a device choice."""
    if is_cuda_device_text(value):
        return True
    return (
        isinstance(value, ast.Call)
        and last_name(value.func) == "device"
        and bool(value.args)
        and is_cuda_device_text(value.args[0])
    )


@dataclass(frozen=True)
class Rule:
    """One audit rule: its id, default severity, a one-line description, the syntax node types
    it looks at, the check run on each such node, the default advice, and what `--fix` does
    with its findings."""

    id: str
    severity: str
    description: str
    node_types: tuple[type[ast.AST], ...]
    check: Callable[[Any, Any], None] | None
    advice: str
    # What `--fix` does with the rule's findings: REWRITE, LEAVE or LEAVE_CUDA_ONLY.
    fix: str

    def __post_init__(self) -> None:
        if self.fix not in FIX_ACTIONS:
            raise ValueError(
                f"rule {self.id!r}: fix must be one of {FIX_ACTIONS}, got {self.fix!r}"
            )
