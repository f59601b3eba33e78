"""The audit's rules: one check function each, and `RULE_TABLE`, where each rule is written
once (id, severity, description, node types, check, advice, and what `--fix` does with its
findings). Adding a rule means a check here, its row in the table, and its fixture in
`tests/fixtures/audit/`; `RULES`, the module docstring of `tpuready.audit` and `--fix`'s
view of the rules all come from the table."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from tpuready.accelerator_api import equivalent_for
from tpuready.audit.sources import (
    MAX_FILE_BYTES,
)
from tpuready.audit.syntax import (
    BACKEND_CALLS,
    CHOOSE_DEVICE,
    CUDA_ONLY_PACKAGES,
    CUDA_PROBES,
    CUDA_TENSOR_TYPE,
    DDP_NAMES,
    DEVICE_DICT_KEYS,
    DEVICE_FIRST_ARGUMENT,
    DEVICE_KEYWORDS,
    ENVIRON_CALLS,
    EXTRA_EQUIVALENTS,
    FALLBACKS,
    FLOAT64_NAMES,
    GUARD_ADVICE,
    INFERENCE_MODE_NAMES,
    LEAVE,
    LEAVE_CUDA_ONLY,
    MUST_CHANGE,
    NOTE,
    OFF_CUDA_BRANCH,
    ONE_DEVICE_PATH,
    ONE_DEVICE_PER_PROCESS,
    PROBE_ADVICE,
    RANK_LIKE_NAME,
    REWRITE,
    Rule,
    choices_are_not_devices,
    code_of,
    device_choice,
    dotted_parts,
    is_cuda_device_text,
    is_false,
    is_nccl,
    is_none,
    is_true,
    last_name,
    names_the_cpu,
    per_rank_advice,
    rank_index,
    string_value,
)

__all__ = [
    "CHECKS_BY_NODE_TYPE",
    "RULES",
    "RULE_BY_ID",
    "RULE_TABLE",
]

if TYPE_CHECKING:
    from tpuready.audit.walker import Auditor

# --------------------------------------------------------------------------------------------
# The rules: one check function each, registered in RULE_TABLE below


def _check_cuda_method(audit: Auditor, call: ast.Call) -> None:
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
        shown = code_of(index, 30)
        # `.cuda(0)`: the first GPU, one device per script, chosen once.
        where = f"device = {CHOOSE_DEVICE}" if shown == "0" else per_rank_advice(shown)
        audit.report(
            "cuda-method",
            func,
            f"`.cuda({shown})` moves to CUDA GPU {shown} only; {ONE_DEVICE_PER_PROCESS}",
            f".to(device), where {where}",
            at_attribute=True,
            per_rank=True,
        )


def _check_cuda_amp(audit: Auditor, node: ast.Name | ast.Attribute) -> None:
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


def _check_cuda_tensor_type(audit: Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Call):
        if last_name(node.func) in {"set_default_tensor_type", "type"} and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Name | ast.Attribute):
                name = audit.qualify(argument)
                if (
                    name is not None
                    and CUDA_TENSOR_TYPE.fullmatch(name)
                    and last_name(node.func) == "set_default_tensor_type"
                ):
                    audit.report(
                        "cuda-tensor-type",
                        argument,
                        f"`{name}` is a CUDA-only tensor type",
                        _default_type_advice(name),
                    )
                return
            text = string_value(argument)
            if text is not None and CUDA_TENSOR_TYPE.fullmatch(text):
                audit.report(
                    "cuda-tensor-type",
                    node.args[0],
                    f"{text!r} is a CUDA-only tensor type",
                    _default_type_advice(text)
                    if last_name(node.func) == "set_default_tensor_type"
                    else ".to(device, dtype)",
                )
        return
    name = audit.current_name
    if name is not None and CUDA_TENSOR_TYPE.fullmatch(name):
        audit.report(
            "cuda-tensor-type",
            node,
            f"`{name}` is a CUDA-only tensor type",
            "torch.tensor(..., dtype=..., device=device) (or torch.empty with dtype and device)",
        )


def _check_profiler_activity(audit: Auditor, node: ast.Name | ast.Attribute) -> None:
    name = audit.current_name
    if name is not None and name.endswith("ProfilerActivity.CUDA"):
        audit.report("cuda-profiler-activity", node, f"`{name}` profiles CUDA kernels only")


def _check_cuda_test_fallback(audit: Auditor, node: ast.If | ast.IfExp) -> None:
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
        device_choice(statement.value if isinstance(statement, ast.Assign) else statement)
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
        f"`{code_of(node.test)}` sends a TPU down {OFF_CUDA_BRANCH}, which {FALLBACKS[fallback]}",
    )


# `torch.cuda` calls that do nothing unless CUDA was initialised, and whose effect no result
# depends on (`empty_cache` only hands cached blocks back to the driver).
_NOTHING_OFF_CUDA = frozenset({"empty_cache"})


def _check_cuda_decision(audit: Auditor, node: ast.Compare | ast.BoolOp) -> None:
    """A decision a TPU gets wrong even where a CUDA guard holds it: guarding it is the fault.

    `torch.cuda.device_count() > 1` is False on a TPU host with several chips (it counts 0),
    so the one-device path runs (no all_reduce of the loss, no DDP); an `and` with
    `torch.cuda.is_bf16_supported()` is False on a TPU, which runs bfloat16 natively.
    """
    if isinstance(node, ast.Compare):
        if audit.asks_for_several_cuda_gpus(node):
            audit.report(
                "torch-cuda-call",
                cast(ast.Call, node.left).func,  # asks_for_several_cuda_gpus: a call
                f"`{code_of(node)}` counts CUDA GPUs: torch.cuda counts 0 on a TPU host, "
                f"which {ONE_DEVICE_PATH} however many chips it has",
                "torch.accelerator.device_count()" + code_of(node)[len(code_of(node.left)) :],
                cuda_name="device_count",
                even_in_guard=True,
                off_cuda=ONE_DEVICE_PATH,
            )
        return
    bf16_check = audit.bf16_check_in(node)
    if bf16_check is not None:
        audit.report(
            "torch-cuda-call",
            bf16_check.func,
            f"`{code_of(node, 60)}` is False on a TPU, which runs bfloat16 natively: a TPU never "
            "takes the bfloat16 path",
            EXTRA_EQUIVALENTS["is_bf16_supported"],
            cuda_name="is_bf16_supported",
            even_in_guard=True,
        )


def _check_torch_cuda(
    audit: Auditor, node: ast.Name | ast.Attribute | ast.Compare | ast.BoolOp
) -> None:
    if isinstance(node, ast.Compare | ast.BoolOp):
        _check_cuda_decision(audit, node)
        return
    name = audit.current_name
    if name is None or not (name == "torch.cuda" or name.startswith("torch.cuda.")):
        return
    if name.startswith("torch.cuda.amp") or CUDA_TENSOR_TYPE.fullmatch(name):
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
    extra = EXTRA_EQUIVALENTS.get(member)
    if extra is not None:
        audit.report("torch-cuda-call", node, message, extra, cuda_name=member)
        return
    entry = equivalent_for(member)
    if entry is None:
        audit.report(
            "torch-cuda-call",
            node,
            message,
            f"no entry in tpuready.accelerator_api: look under torch.accelerator, {GUARD_ADVICE}",
            cuda_name=member,
        )
        return
    if entry.refused_by_torch_tpu:
        message += f" (and `torch.tpu.{entry.name}` raises in TorchTPU 0.2.0)"
    nothing_off_cuda = member in _NOTHING_OFF_CUDA and not audit.in_cuda_guard
    if nothing_off_cuda:
        message = f"`{name}` does nothing off CUDA, and nothing depends on it (a note)"
    audit.report(
        "torch-cuda-call",
        node,
        message,
        entry.replacement + (f" ({entry.note})" if entry.note else ""),
        cuda_name=member,
        severity=NOTE if nothing_off_cuda else None,
    )


def _setting_suggestion(setting: str, value: ast.AST | None) -> str:
    """Advice for `torch.backends.cudnn.X = value` / `torch.backends.cuda.X = value` that
    follows the value being assigned."""
    shown = code_of(value) if value is not None else "..."
    if setting == "deterministic":
        if value is not None and is_false(value):
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
        if value is not None and is_true(value):
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
        if value is not None and is_false(value):
            return (
                'torch.set_float32_matmul_precision("highest"): full float32 matmuls on CUDA '
                "(TF32 off, its default) and on TorchTPU (six bf16 passes; its default is one)"
            )
        if value is not None and not is_true(value):
            return f'torch.set_float32_matmul_precision("high" if {shown} else "highest")'
        return (
            'keep it, under `if device.type == "cuda":`. In torch 2.13 this line also sets '
            'torch.get_float32_matmul_precision() to "high", as '
            'torch.set_float32_matmul_precision("high") does, and TorchTPU maps "high" to three '
            "bf16 passes per matmul where its default is one; whether TorchTPU 0.2.0 reads the "
            "value this line sets is not recorded, so keep it off the TPU path"
        )
    if setting == "enabled":
        return "keep it: it switches cuDNN on CUDA GPUs and does nothing elsewhere"
    if setting == "sdp_kernel":
        return "torch.nn.attention.sdpa_kernel(...), " + GUARD_ADVICE
    return f"remove it, {GUARD_ADVICE}"


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
    if setting == "allow_tf32":
        return is_true(value)  # TF32 for cuDNN convolutions: a TPU's default is coarser still
    # `matmul.allow_tf32 = True` is not harmless: in torch 2.13 it also sets the global float32
    # matmul precision to "high", which TorchTPU may read as three passes.
    if setting == "deterministic":
        return is_false(value)  # non-determinism allowed: the default everywhere
    return False


def _check_backend_setting(
    audit: Auditor, node: ast.AST, prefix: str, rule: str, what: str
) -> None:
    if isinstance(node, ast.Assign):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        target: ast.AST  # a target as written, then each target of a pair
        for target in node.targets:
            values = node.value
            if (
                isinstance(target, ast.Tuple | ast.List)
                and isinstance(values, ast.Tuple | ast.List)
                and len(target.elts) == len(values.elts)
            ):  # `cudnn.benchmark, cudnn.deterministic = True, False`
                pairs += zip(target.elts, values.elts, strict=True)
            else:
                pairs.append((target, values))
        for target, value in pairs:
            name = audit.qualify(target) if isinstance(target, ast.Attribute) else None
            if name is not None and name.startswith(prefix):
                setting = name.removeprefix(prefix)
                harmless = _harmless_off_cuda(setting, value)
                audit.report(
                    rule,
                    target,
                    f"`{name}` {what}"
                    + (
                        " (off CUDA it does nothing and loses nothing asked for: a note)"
                        if harmless
                        else ""
                    ),
                    _setting_suggestion(setting, value),
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
    elif (
        name is not None
        and isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and name.startswith(prefix)
        and _is_a_setting_value(name)
    ):  # `saved = torch.backends.cudnn.benchmark`, `if cudnn.deterministic:`: a read
        audit.report(
            rule,
            node,
            f"`{name}` is read (off CUDA it holds what the program set, or its default: a note)",
            "keep it: reading a setting is harmless; where it is set, see that line",
            severity=NOTE,
        )
    elif name is not None and name.startswith(prefix) and name not in CUDA_PROBES:
        audit.report(
            rule, node, f"`{name}` {what}", _setting_suggestion(name.removeprefix(prefix), None)
        )
    elif name in CUDA_PROBES and name is not None and name.startswith(prefix):
        audit.report(rule, node, f"`{name}` {what}", PROBE_ADVICE)


# The settings that hold plain values, and so can be read without effect (the others, like
# `torch.backends.cuda.sdp_kernel`, are switches even when held in a name).
_CUDNN_VALUES = frozenset(
    {"benchmark", "deterministic", "enabled", "allow_tf32", "benchmark_limit"}
)


def _is_a_setting_value(name: str) -> bool:
    if name.startswith("torch.backends.cudnn."):
        return name.removeprefix("torch.backends.cudnn.") in _CUDNN_VALUES
    return name.startswith("torch.backends.cuda.matmul.")


def _check_cudnn_setting(audit: Auditor, node: ast.AST) -> None:
    _check_backend_setting(
        audit, node, "torch.backends.cudnn.", "cudnn-setting", "configures cuDNN, a CUDA library"
    )


def _check_cuda_backend_setting(audit: Auditor, node: ast.AST) -> None:
    _check_backend_setting(
        audit, node, "torch.backends.cuda.", "cuda-backend-setting", "configures CUDA kernels only"
    )


def _check_device_string(audit: Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Call):
        name = audit.qualify(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method == "to":
            for argument in node.args:
                audit.check_device_value(argument, as_type=False)
        if name is not None and name in DEVICE_FIRST_ARGUMENT and node.args:
            audit.check_device_value(node.args[0], as_type=DEVICE_FIRST_ARGUMENT[name])
        if name == "torch.device" and len(node.args) == 2:  # torch.device(device_type, rank)
            index = rank_index(node.args[1])
            if index is not None and string_value(node.args[0]) is None:
                audit.report(
                    "set-device-index",
                    node,
                    f"`{code_of(node)}` names the device at the rank's own index; "
                    f"{ONE_DEVICE_PER_PROCESS}",
                    per_rank_advice(index),
                    per_rank=True,
                )
        not_devices = choices_are_not_devices(node)
        for keyword in node.keywords:
            if (
                keyword.arg is not None
                and keyword.arg in DEVICE_KEYWORDS
                and not (keyword.arg == "default" and not_devices)
            ):
                if keyword.arg == "map_location" and isinstance(keyword.value, ast.Dict):
                    values = [*keyword.value.keys, *keyword.value.values]
                    if any(v is not None and is_cuda_device_text(v) for v in values):
                        audit.report(
                            "cuda-device-string",
                            keyword.value,
                            f"map_location {code_of(keyword.value)} names CUDA GPUs only",
                            f"map_location=device, where {CHOOSE_DEVICE}",
                        )
                    continue
                audit.check_device_value(keyword.value, as_type=DEVICE_KEYWORDS[keyword.arg])
            elif keyword.arg == "type" and name == "torch.device":
                audit.check_device_value(keyword.value, as_type=False)
    elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = {last_name(target) for target in targets}
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
            key_text = string_value(key) if key is not None else None
            if key_text in DEVICE_DICT_KEYS:
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


def _check_pin_memory(audit: Auditor, call: ast.Call) -> None:
    for keyword in call.keywords:
        if keyword.arg == "pin_memory" and is_true(keyword.value):
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


def _check_device_module_call(audit: Auditor, call: ast.Call) -> None:
    """`device_module.synchronize()` where `device_module = torch.get_device_module(...)`: on
    TorchTPU the module is `torch.tpu`, whose CUDA-style device calls raise in 0.2.0."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return
    holder = func.value
    parts = dotted_parts(holder)
    bound = parts is not None and ".".join(parts) in audit.facts.device_module_names
    direct = (
        isinstance(holder, ast.Call) and audit.qualify(holder.func) == "torch.get_device_module"
    )
    argument = holder.args[0] if isinstance(holder, ast.Call) and direct and holder.args else None
    named = argument is not None and string_value(argument) is not None
    # ("cuda"): CUDA's own module, whose calls need CUDA; --fix must not port a check over it.
    names_cuda = argument is not None and is_cuda_device_text(argument)
    if not (bound or (direct and (not named or names_cuda))):
        return
    entry = equivalent_for(func.attr)
    if entry is None or not entry.refused_by_torch_tpu:
        return
    whose = (
        "CUDA's own module, which needs a CUDA GPU"
        if names_cuda
        else f"the device's own module: on TorchTPU that is `torch.tpu`, whose `{func.attr}` "
        "raises in 0.2.0"
    )
    audit.report(
        "device-module-call",
        call,
        f"`{code_of(func, 60)}()` calls {whose}",
        entry.note if "get_device_module" in entry.replacement else entry.replacement,
    )


def _check_compile_mode(audit: Auditor, call: ast.Call) -> None:
    """`torch.compile(..., mode=...)` or `module.compile(mode=...)`: TorchTPU 0.2.0 takes only
    its own backend options and raises TypeError on `mode=`."""
    is_compile = audit.qualify(call.func) == "torch.compile" or (
        isinstance(call.func, ast.Attribute) and call.func.attr == "compile"
    )
    if not is_compile:
        return
    for keyword in call.keywords:
        mode = string_value(keyword.value)
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
                f"`mode={code_of(keyword.value, 30)}`{why}: TorchTPU 0.2.0's torch.compile takes "
                'only its backend\'s options, and mode="reduce-overhead" raises TypeError there',
            )


def _check_integer_device(audit: Auditor, call: ast.Call) -> None:
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        # `torch.tensor(..., device=rank)`, `torch.zeros(n, device=local_rank)`: a rank's own
        # index as the device, which a TorchTPU rank does not have.
        for keyword in call.keywords:
            index = rank_index(keyword.value) if keyword.arg == "device" else None
            if index is not None:
                audit.report(
                    "to-int-device",
                    keyword.value,
                    f"`device={index}` reads a rank's own index as an accelerator index; "
                    f"{ONE_DEVICE_PER_PROCESS}",
                    "device=device, as for .to(device), with device chosen once per process",
                )
        return
    candidates = call.args[:1] + [kw.value for kw in call.keywords if kw.arg == "device"]
    for argument in candidates:
        if (
            isinstance(argument, ast.Constant)
            and isinstance(argument.value, int)
            and not isinstance(argument.value, bool)
        ):
            shown = str(argument.value)
        elif isinstance(argument, ast.Call) and dotted_parts(argument.func) == ["int"]:
            shown = code_of(argument)
        else:
            parts = dotted_parts(argument)
            if parts is None or not RANK_LIKE_NAME.search(parts[-1]):
                continue
            shown = ".".join(parts)
        audit.report(
            "to-int-device",
            argument,
            f"`.to({shown})` reads an integer as an accelerator index, which TorchTPU "
            "ignores (TorchTPU issue #4164)",
        )


def _check_set_device(audit: Auditor, call: ast.Call) -> None:
    if last_name(call.func) not in {"set_device", "set_device_index"}:
        return
    qualified = audit.qualify(call.func) or ""
    if qualified in {
        "torch.accelerator.set_device_index",
        "torch.accelerator.set_device_idx",
    }:
        # The portable call this rule recommends, unless it is handed a rank's index itself.
        index = call.args[0] if call.args else None
        shown = rank_index(index) if index is not None else None
        if shown is not None:
            audit.report(
                "set-device-index",
                call,
                f"`{code_of(call.func, 40)}({shown})` sets a rank's own index; on TorchTPU each "
                "process sees one device, index 0, and another index raises",
                per_rank_advice(shown),
                per_rank=True,
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
    shown = code_of(argument, 30)
    audit.report(
        "set-device-index",
        call,
        f"`{code_of(call.func, 40)}({shown})` picks a device by index; on TorchTPU "
        "set_device(i) for another index raises",
        per_rank_advice(shown),
        per_rank=True,
    )


def _check_process_group_backend(audit: Auditor, node: ast.AST) -> None:
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
            if default is not None and "backend" in argument.arg and is_nccl(default):
                audit.report(
                    "nccl-backend",
                    default,
                    f"the default {argument.arg}={code_of(default)} is a backend for "
                    "CUDA GPUs only",
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
        if (names & audit.facts.backend_names or names_a_backend) and is_nccl(node.value):
            audit.report(
                "nccl-backend",
                node.value,
                f"backend {code_of(node.value)} (passed to init_process_group later) exists for "
                "CUDA GPUs only",
            )
        return
    call = cast(ast.Call, node)  # the rule registers this check for calls, assignments, defs
    last = last_name(call.func)
    if last == "add_argument":
        for keyword in call.keywords:
            if keyword.arg == "default" and string_value(keyword.value) == "nccl":
                audit.report(
                    "nccl-backend",
                    keyword.value,
                    'the option default "nccl" is a backend for CUDA GPUs only',
                    "default=None, passed on as init_process_group(backend=args.backend): "
                    "PyTorch then picks one per device type",
                )
        return
    if last not in BACKEND_CALLS:
        return
    candidates = [kw.value for kw in call.keywords if kw.arg == "backend"]
    if last == "init_process_group":
        candidates += call.args[:1]
    for value in candidates:
        if is_nccl(value):
            audit.report(
                "nccl-backend", value, f"backend {code_of(value)} exists for CUDA GPUs only"
            )


def _is_index_zero(value: ast.AST) -> bool:
    """`[0]`: the one index every TorchTPU process has."""
    return (
        isinstance(value, ast.List | ast.Tuple)
        and len(value.elts) == 1
        and isinstance(value.elts[0], ast.Constant)
        and value.elts[0].value == 0
    )


def _check_ddp_device_ids(audit: Auditor, call: ast.Call) -> None:
    if last_name(call.func) == "barrier":
        for keyword in call.keywords:
            value = keyword.value
            if keyword.arg == "device_ids" and not is_none(value) and not _is_index_zero(value):
                audit.report(
                    "ddp-device-ids",
                    keyword,
                    f"`barrier(device_ids={code_of(value, 30)})` names a device by its CUDA "
                    f"index; {ONE_DEVICE_PER_PROCESS}",
                    "init_process_group(..., device_id=device) once, then dist.barrier() "
                    "without device_ids",
                    per_rank=True,
                )
        return
    if last_name(call.func) not in DDP_NAMES:
        return
    for keyword in call.keywords:
        if keyword.arg in {"device_ids", "output_device"} and not is_none(keyword.value):
            single_process = last_name(call.func) == "DataParallel"
            audit.report(
                "ddp-device-ids",
                keyword,
                f"`{keyword.arg}={code_of(keyword.value, 30)}` names CUDA GPUs by index"
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


def _check_float64(audit: Auditor, call: ast.Call) -> None:
    if names_the_cpu(call):
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
        receiver = cast(ast.Attribute, func).value  # is_double: `method` came from an Attribute
        if not (isinstance(receiver, ast.Call) and names_the_cpu(receiver)):
            audit.report(
                "float64",
                func,
                "`.double()` asks for float64, which TPUs cannot run fast" + tail,
                ".float() (keep float64 for checks on the CPU: `.cpu().double()`)",
                severity=severity,
                at_attribute=True,
            )
    for value in dtype_values:
        if audit.qualify(value) in FLOAT64_NAMES:
            audit.report(
                "float64",
                value,
                f"`{code_of(value)}` asks for float64, which TPUs cannot run fast" + tail,
                severity=severity,
            )


def _check_inference_mode(audit: Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.With | ast.AsyncWith):
        candidates = [item.context_expr for item in node.items]
    else:
        # the rule registers this check for `with` statements and function definitions only
        candidates = list(cast(ast.FunctionDef | ast.AsyncFunctionDef, node).decorator_list)
    for candidate in candidates:
        target = candidate.func if isinstance(candidate, ast.Call) else candidate
        if audit.qualify(target) not in INFERENCE_MODE_NAMES:
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


# CUDA variables that tune or debug CUDA and ask for nothing a TPU lacks; any other (above
# all CUDA_VISIBLE_DEVICES, which picks the process's devices) is must-change.
_HARMLESS_CUDA_VARIABLES = frozenset(
    {
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_ORDER",
        "CUDA_MODULE_LOADING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
    }
)


def _check_cuda_environment(audit: Auditor, node: ast.AST) -> None:
    if isinstance(node, ast.Subscript):
        key = node.slice
        container = node.value
    elif isinstance(node, ast.Call) and node.args:
        key = node.args[0]
        container = node.func
    else:
        return
    text = string_value(key)
    if text is None or not text.startswith("CUDA_"):
        return
    name = audit.qualify(container) or ".".join(dotted_parts(container) or [])
    if (isinstance(node, ast.Subscript) and name == "os.environ") or name in ENVIRON_CALLS:
        harmless = text in _HARMLESS_CUDA_VARIABLES
        audit.report(
            "cuda-env-var",
            key,
            f"the environment variable {text} is read by CUDA only"
            + (" (a debugging or tuning switch a TPU ignores: a note)" if harmless else ""),
            "keep it: it changes nothing off CUDA" if harmless else None,
            severity=NOTE if harmless else None,
        )


def _check_cuda_only_package(audit: Auditor, node: ast.Import | ast.ImportFrom) -> None:
    if isinstance(node, ast.ImportFrom):
        modules = [node.module or ""] if not node.level else []
    else:
        modules = [alias.name for alias in node.names]
    for module in modules:
        package = module.split(".")[0]
        what = CUDA_ONLY_PACKAGES.get(package)
        if what is None:
            continue
        optional = audit.facts.is_optional_import(node)
        audit.report(
            "cuda-only-package",
            node,
            f"`{module}` ({what}) needs a GPU build (CUDA, for some also ROCm), not a TPU"
            + (" (imported under a try that catches its failure: a note)" if optional else ""),
            'check that the fallback taken without it runs where device.type != "cuda"'
            if optional
            else None,
            severity=NOTE if optional else None,
        )
        return


# `cuda` as a word of a function's name: `model_parallel_cuda_manual_seed`, `get_cuda_rng`.
_CUDA_WORD = re.compile(r"(?:^|_)cuda(?:_|$)", re.IGNORECASE)
# A private helper (the package's own business) or a question about CUDA (`is_cuda_tensor`).
_NOT_A_CUDA_HELPER = re.compile(r"_|(?:is|has|use|on)_", re.IGNORECASE)


def _check_cuda_named_helper(audit: Auditor, call: ast.Call) -> None:
    """A call of an imported function named for CUDA: the audit does not read its body."""
    function = call.func
    if not isinstance(function, ast.Name | ast.Attribute):
        return
    last = last_name(function)
    if last.lower() == "cuda" or not _CUDA_WORD.search(last) or _NOT_A_CUDA_HELPER.match(last):
        return
    name = audit.qualify(function)
    if name is None or name.split(".")[0] == "torch":  # local, or under the torch rules
        return
    audit.report(
        "cuda-named-helper",
        function,
        f"`{name}` is imported from another module and named for CUDA; the audit does not "
        "read it, and as named it works on CUDA GPUs only",
    )


_SCALERS = frozenset({"GradScaler", "ShardedGradScaler"})


def _check_grad_scaler_default(audit: Auditor, call: ast.Call) -> None:
    name = audit.qualify(call.func)
    if name is None or last_name(call.func) not in _SCALERS:
        return
    if not name.startswith("torch.") or name.startswith("torch.cuda."):
        return  # torch.cuda.amp.GradScaler is the cuda-amp rule's
    if call.args or any(
        keyword.arg in {"device", None} or (keyword.arg == "enabled" and is_false(keyword.value))
        for keyword in call.keywords
    ):
        return  # the device is named, or the scaler is off
    audit.report(
        "grad-scaler-default",
        call,
        f"`{last_name(call.func)}()` defaults to device='cuda': off CUDA it switches itself "
        "off with a UserWarning (a note: right where autocast is bfloat16, TorchTPU's default; "
        "with float16 autocast the run would go unscaled)",
    )


# --------------------------------------------------------------------------------------------
# The rule table: each rule written once; RULES and the module docstring come from it


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
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "cuda-method",
        MUST_CHANGE,
        "`.cuda()` on a tensor or module",
        (ast.Call,),
        _check_cuda_method,
        ".to(device)",
        REWRITE,
    ),
    Rule(
        "cuda-amp",
        MUST_CHANGE,
        "`torch.cuda.amp` (autocast, GradScaler, custom_fwd, ...)",
        _NAMES,
        _check_cuda_amp,
        "torch.amp, with device_type=device.type",
        REWRITE,
    ),
    Rule(
        "cuda-tensor-type",
        MUST_CHANGE,
        '`torch.cuda.FloatTensor` and friends, also as `set_default_tensor_type("...")`',
        (*_NAMES, ast.Call),
        _check_cuda_tensor_type,
        "torch.tensor(..., dtype=..., device=device)",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "cuda-profiler-activity",
        MUST_CHANGE,
        "`ProfilerActivity.CUDA`",
        _NAMES,
        _check_profiler_activity,
        "activities=torch.profiler.supported_activities() (the CPU plus the accelerator present)",
        LEAVE,
    ),
    Rule(
        "torch-cuda-call",
        MUST_CHANGE,
        "a `torch.cuda.*` name (or `torch.cuda` held as a module), with its portable spelling; "
        "under a CUDA guard too where a TPU gets the decision wrong (`torch.cuda.device_count() "
        "> 1`, `torch.cuda.is_available() and torch.cuda.is_bf16_supported()`)",
        (*_NAMES, ast.Compare, ast.BoolOp),
        _check_torch_cuda,
        "torch.accelerator",
        REWRITE,
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
        LEAVE,
    ),
    Rule(
        "cudnn-setting",
        MUST_CHANGE,
        "a `torch.backends.cudnn` setting; the advice follows the value assigned",
        (*_NAMES, ast.Assign),
        _check_cudnn_setting,
        f"remove it, {GUARD_ADVICE}",
        LEAVE,
    ),
    Rule(
        "cuda-backend-setting",
        MUST_CHANGE,
        "a `torch.backends.cuda` setting (matmul.allow_tf32, ...); advice follows the value",
        (*_NAMES, ast.Assign),
        _check_cuda_backend_setting,
        f"remove it, {GUARD_ADVICE}",
        LEAVE,
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
        REWRITE,
    ),
    Rule(
        "pin-memory",
        MUST_CHANGE,
        "`pin_memory=True` in a tensor factory, or `.pin_memory()` called directly (in a "
        "DataLoader or another loader a note: it pins for any accelerator)",
        (ast.Call,),
        _check_pin_memory,
        "pin_memory=torch.accelerator.is_available()",
        REWRITE,
    ),
    Rule(
        "to-int-device",
        MUST_CHANGE,
        "`.to(<int>)`: an integer device index (`.to(local_rank)`), and a rank's own index as "
        "`device=` (`torch.zeros(n, device=rank)`)",
        (ast.Call,),
        _check_integer_device,
        ".to(device), with device chosen once per process",
        LEAVE_CUDA_ONLY,
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
        REWRITE,
    ),
    Rule(
        "ddp-device-ids",
        MUST_CHANGE,
        "`DistributedDataParallel(..., device_ids=[local_rank])` (or `output_device=`), "
        "`DataParallel(..., device_ids=...)`, and `dist.barrier(device_ids=...)`",
        (ast.Call,),
        _check_ddp_device_ids,
        "leave device_ids and output_device out: for a module on one device DDP uses the "
        "module's device, whatever it is called",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "cuda-env-var",
        MUST_CHANGE,
        '`os.environ["CUDA_VISIBLE_DEVICES"]` and other `CUDA_*` variables',
        (ast.Subscript, ast.Call),
        _check_cuda_environment,
        "choose the device per process instead (torchrun's LOCAL_RANK; TorchTPU gives each "
        "process one device)",
        LEAVE,
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
        LEAVE,
    ),
    Rule(
        "device-module-call",
        MUST_CHANGE,
        "a CUDA-style device call (`synchronize`, `current_device`, ...) on the module of "
        "`torch.get_device_module(...)`, which on TorchTPU 0.2.0 raises",
        (ast.Call,),
        _check_device_module_call,
        "torch.accelerator",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "compile-mode",
        MUST_CHANGE,
        "`torch.compile(..., mode=...)` (`reduce-overhead`, `max-autotune`: CUDA graphs and "
        "Triton), which TorchTPU 0.2.0 refuses",
        (ast.Call,),
        _check_compile_mode,
        'mode="reduce-overhead" if device.type == "cuda" else None (TorchTPU takes no mode=)',
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "inference-mode",
        MUST_CHANGE,
        "`torch.inference_mode` as a `with` context or decorator in a file that compiles (a "
        "note elsewhere)",
        (ast.With, ast.AsyncWith, *_FUNCTIONS),
        _check_inference_mode,
        "torch.no_grad()",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "cuda-named-helper",
        MUST_CHANGE,
        "a call of an imported function with `cuda` as a word of its name "
        "(`mpu.model_parallel_cuda_manual_seed(seed)`)",
        (ast.Call,),
        _check_cuda_named_helper,
        "read the helper: use the package's device-neutral version where it has one, port "
        'the torch.cuda calls inside it, or keep it under `if device.type == "cuda":` when it '
        "only serves CUDA",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "cuda-only-package",
        MUST_CHANGE,
        "an import of a package that runs on NVIDIA GPUs only ("
        + ", ".join(f"`{package}`" for package in CUDA_ONLY_PACKAGES)
        + "); a note under a `try` that catches its failure",
        (ast.Import, ast.ImportFrom),
        _check_cuda_only_package,
        'import it only where device.type == "cuda", and give the other devices a PyTorch '
        "path (torch.amp for apex.amp, DistributedDataParallel for apex.parallel, "
        "torch.accelerator for cuda-python and NVML calls)",
        LEAVE_CUDA_ONLY,
    ),
    Rule(
        "grad-scaler-default",
        NOTE,
        "`torch.amp.GradScaler()` or `ShardedGradScaler()` with no device, which means 'cuda'",
        (ast.Call,),
        _check_grad_scaler_default,
        'say which: GradScaler(device.type, enabled=device.type == "cuda"), since a TPU '
        "autocasts to bfloat16, which needs no loss scaling (and torch 2.13 has no generic "
        "loss-scaling kernel; whether TorchTPU 0.2.0 registers one is not recorded)",
        LEAVE,
    ),
    Rule(
        "syntax-error",
        MUST_CHANGE,
        "a file or notebook cell that does not parse (nothing in it was checked)",
        (),
        None,
        "fix the syntax and audit again (nothing else here was checked)",
        LEAVE,
    ),
    Rule(
        "skipped-file",
        NOTE,
        f"a file over {MAX_FILE_BYTES:,} bytes, skipped to bound memory",
        (),
        None,
        "audit it in parts, or leave it out with [tool.tpuready] exclude",
        LEAVE,
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


CHECKS_BY_NODE_TYPE = _checks_by_node_type()
