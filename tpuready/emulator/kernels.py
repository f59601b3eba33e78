"""The emulated TPU's kernels: every ATen operator on a `tpu` tensor, run by the CPU.

One fallback kernel serves every operator that has no kernel of its own for `PrivateUse1`:
it hands the CPU kernel CPU views of the `tpu` tensors (the same bytes, so in-place updates
land on the device tensors), then returns the results as `tpu` tensors without copying. On
the way it does what TorchTPU would, and records what a TPU would not like:

- float32 matmuls (mm, bmm, addmm, baddbmm, convolution, grouped_mm) run as 1, 3 or 6 bf16
  passes (`tpuready.inspection.check.MATMUL_PASSES`), as TorchTPU runs them by default and when
  asked;
- tensors on two devices raise, as on CUDA (a CPU scalar is allowed, as there);
- host syncs, float64 tensors and known gaps go to the report.

A few operators need kernels of their own: allocation, copies between devices, resizing,
`set_`, and the metadata-only view operators, which the CPU's kernels serve directly.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch

from tpuready.emulator import memory
from tpuready.emulator.findings import report
from tpuready.emulator.state import state
from tpuready.inspection.check import MATMUL_PASSES

__all__ = ["KNOWN_GAPS", "register"]

_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_AUTOCAST_KEYS = torch._C.DispatchKeySet(
    torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]  # not in torch's stub
)
aten = torch.ops.aten

# Operators whose output shape depends on the data: the host must wait for the device.
DATA_DEPENDENT = frozenset(
    {
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "bincount",
        "is_nonzero",
        "equal",
    }
)
# The reference notes' gaps in TorchTPU's operator coverage: cholesky, unique(dim), and some
# pooling and interpolation gradients. They run here; the report names them.
KNOWN_GAPS = frozenset(
    {
        "cholesky",
        "linalg_cholesky_ex",
        "cholesky_solve",
        "cholesky_inverse",
        "unique_dim",
        "unique_dim_consecutive",
        "max_pool2d_with_indices_backward",
        "max_pool3d_with_indices_backward",
        "avg_pool2d_backward",
        "avg_pool3d_backward",
        "adaptive_max_pool2d_backward",
        "adaptive_avg_pool3d_backward",
        "upsample_bilinear2d_backward",
        "upsample_bicubic2d_backward",
        "upsample_trilinear3d_backward",
        "upsample_nearest2d_backward",
        "upsample_nearest3d_backward",
        "_upsample_bilinear2d_aa_backward",
        "grid_sampler_2d_backward",
    }
)
# Operators that may take CPU tensors beside device ones on CUDA too: indices of an index.
_CPU_ARGUMENTS_ALLOWED = frozenset({"index", "index_put_", "_index_put_impl_", "index_put"})
_MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm", "_grouped_mm"})


class _OpInfo:
    """What the fallback needs to know about one operator overload, worked out once."""

    __slots__ = (
        "data_dependent",
        "gap",
        "generator",
        "matmul",
        "metadata_only",
        "name",
        "outs",
        "tensor_positions",
    )

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.name = schema.name.split("::", 1)[1]
        self.metadata_only = self.name in ("set_", "alias") or any(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        self.outs = tuple(
            a.name
            for a in schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        )
        self.generator = any(a.name == "generator" for a in schema.arguments)
        # Structured matmuls reach a backend as their out= form, into an output already made.
        self.matmul = self.name in _MATMULS and op._overloadname in ("default", "out")
        self.data_dependent = self.name in DATA_DEPENDENT
        self.gap = self.name in KNOWN_GAPS
        # Where a Python number may stand for a Tensor: the dispatcher hands a Python kernel a
        # wrapped number (`x % 2`) as the number itself.
        self.tensor_positions = tuple(
            i
            for i, a in enumerate(schema.arguments)
            if not a.kwarg_only and isinstance(a.type, torch._C.TensorType)
        )


_INFO: dict[torch._ops.OpOverload, _OpInfo] = {}


def _info(op: torch._ops.OpOverload) -> _OpInfo:
    info = _INFO.get(op)
    if info is None:
        info = _INFO[op] = _OpInfo(op)
    return info


def _mixed_device_error(name: str, first: str, second: str) -> RuntimeError:
    report().record("mixed_device", f"{name}: {first} and {second}")
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{first} and {second}! (when checking arguments for {name} on the emulated TPU)"
    )


class _Call:
    """One operator call moved to the CPU: the CPU views handed out, to map results back."""

    __slots__ = ("cpu_tensor", "index", "name", "storages", "views")

    def __init__(self, name: str) -> None:
        self.name = name
        self.index: int | None = None  # the logical device index of the call
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(view): (view, device)
        self.storages: dict[int, torch.UntypedStorage] = {}  # data_ptr: device storage
        self.cpu_tensor: torch.Tensor | None = None  # a CPU tensor (not a scalar) among the args

    def down(self, value: Any) -> Any:
        """A device tensor becomes its CPU view; a `tpu` device becomes the CPU."""
        if isinstance(value, torch.Tensor):
            if value.device.type == "tpu":
                view, index = memory.cpu_view_and_index(value)
                if self.index is None:
                    self.index = index
                elif index != self.index:
                    raise _mixed_device_error(self.name, f"tpu:{self.index}", f"tpu:{index}")
                self.views[id(view)] = (view, value)
                storage = value.untyped_storage()
                self.storages[storage.data_ptr()] = storage
                return view
            if value.dim() > 0 and value.device.type == "cpu":
                self.cpu_tensor = value
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(self.down(item) for item in value)
        if isinstance(value, torch.device) and value.type == "tpu":
            if self.index is None:
                self.index = state().resolve(value)
            return _CPU
        return value

    def up(self, value: Any) -> Any:
        """A CPU result becomes a device tensor: the argument it is, a view of one, or new."""
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return value
            known = self.views.get(id(value))
            if known is not None and known[0] is value:
                return known[1]
            if self.index is None:  # only CPU tensors came in: the result stays there
                return value
            pointer = value.untyped_storage().data_ptr()
            storage = self.storages.get(pointer) if pointer else None
            if storage is not None:
                return memory.new_tensor(
                    storage, value.storage_offset(), value.shape, value.stride(), value.dtype
                )
            return memory.on_device(value, self.index)
        if isinstance(value, (list, tuple)):
            return type(value)(self.up(item) for item in value)
        return value


_FORKED = False  # set in a child made by fork: TorchTPU's workers must be spawned


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


def _out_of_the_profiler(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """Under torch.profiler, the CPU operators that serve a device operator stay out of the
    trace: it shows what the program ran, as on a device (the profiler records the device
    operator itself before the kernel runs)."""

    @functools.wraps(kernel)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        if _FORKED:
            raise RuntimeError(
                "this process was started with fork from one that had loaded the TPU: TorchTPU "
                "needs its workers spawned (multiprocessing's 'spawn' start method, as "
                "torchrun and tpuready.runtime.launch.run_workers do), not forked"
            )
        if not torch._C._autograd._profiler_enabled():
            return kernel(*args, **kwargs)
        torch._C._autograd._enable_record_function(False)
        try:
            return kernel(*args, **kwargs)
        finally:
            torch._C._autograd._enable_record_function(True)

    return quiet


@_out_of_the_profiler
def _fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run `op` on the CPU over views of its `tpu` arguments (see the module's docstring)."""
    info = _info(op)
    if info.metadata_only:
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    call = _Call(info.name)
    cpu_args = [call.down(value) for value in args]
    cpu_kwargs: dict[str, Any] = {}
    fresh_outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, value in kwargs.items():
        if name in info.outs and isinstance(value, torch.Tensor) and value.device.type == "tpu":
            call.down(value)  # device checks only
            if value.numel() == 0:  # the `at::empty({0})` idiom: the kernel will resize it
                fresh = torch.empty(0, dtype=value.dtype)
                fresh_outs.append((fresh, value))
                call.views[id(fresh)] = (fresh, value)
                cpu_kwargs[name] = fresh
                continue
        cpu_kwargs[name] = call.down(value)
    if (
        call.cpu_tensor is not None
        and call.index is not None
        and info.name not in _CPU_ARGUMENTS_ALLOWED
    ):
        raise _mixed_device_error(info.name, f"tpu:{call.index}", "cpu")
    if call.index is None:  # no device tensor or device: nothing of ours (a CPU-only call)
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    if info.generator and cpu_kwargs.get("generator") is None:
        cpu_kwargs["generator"] = state().generator
    if (
        info.data_dependent
        or (info.name in _CPU_ARGUMENTS_ALLOWED and _has_bool_index(args))
        or (info.name == "repeat_interleave" and kwargs.get("output_size") is None)
    ):
        report().record("host_syncs", f"{info.name} (output shape depends on the data)")
    if info.gap:
        report().record("known_gaps", info.name)
    try:
        special = _CPU_IMPLEMENTATIONS.get(info.name)
        if special is not None:
            result = special(op, cpu_args, cpu_kwargs)
        elif info.matmul and _is_float32_matmul(info.name, cpu_args):
            result = _matmul_in_passes(op, info.name, cpu_args, cpu_kwargs)
        elif info.matmul and _operand_dtype(info.name, cpu_args) == torch.bfloat16:
            result = _bf16_matmul(op, cpu_args, cpu_kwargs)
        elif _number_for_a_tensor(info, cpu_args):
            # The overload packet picks the overload that takes a number (remainder.Scalar),
            # with a wrapped number's type promotion, as the C++ side would have.
            result = op.overloadpacket(*cpu_args, **cpu_kwargs)
        else:
            result = op(*cpu_args, **cpu_kwargs)
    except NotImplementedError as error:
        raise NotImplementedError(
            f"aten::{info.name} is not emulated: the emulated TPU runs each operator with the "
            f"CPU's kernel, and the CPU has none for this one ({str(error).splitlines()[0]})"
        ) from error
    for fresh, target in fresh_outs:
        target.resize_(fresh.shape)
        memory.cpu_view(target).copy_(fresh)
    return call.up(result)


def _number_for_a_tensor(info: _OpInfo, args: list[Any]) -> bool:
    return any(
        i < len(args) and isinstance(args[i], (int, float, complex, bool))
        for i in info.tensor_positions
    )


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in indices or ()
    )


# --- float32 matmuls as bf16 passes ---------------------------------------------------------


def _operand_dtype(name: str, args: list[Any]) -> torch.dtype | None:
    """The dtype both operands of a matmul share, else None."""
    operands = args[1:3] if name in ("addmm", "baddbmm") else args[:2]
    dtypes = {t.dtype if isinstance(t, torch.Tensor) else None for t in operands}
    return dtypes.pop() if len(dtypes) == 1 else None


def _is_float32_matmul(name: str, args: list[Any]) -> bool:
    return _operand_dtype(name, args) == torch.float32


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        return value.float()
    return value


def _bf16_matmul(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A bf16 matmul as a TPU's matrix unit runs it: bf16 products (exact in float32), summed
    in float32, rounded to bf16 once. CPUs without bf16 matrix instructions take the float32
    route about fifty times faster than their own bf16 kernels."""
    options = {k: v for k, v in kwargs.items() if k != "out"}
    out_dtype = None
    if op.overloadpacket is aten._grouped_mm:  # its fifth argument may ask for another dtype
        out_dtype = options.get("out_dtype", args[4] if len(args) > 4 else None)
    result = op.overloadpacket.default(
        *[_to_float32(a) for a in args], **{k: _to_float32(v) for k, v in options.items()}
    )
    result = result.to(out_dtype or torch.bfloat16)
    if "out" in kwargs:
        out = kwargs["out"]
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)
    return result


def _pieces(tensor: torch.Tensor, count: int) -> list[torch.Tensor]:
    """`tensor` as `count` bf16-representable float32 pieces that sum to it."""
    remainder, pieces = tensor, []
    for _ in range(count):
        piece = remainder.to(torch.bfloat16).to(torch.float32)
        pieces.append(piece)
        remainder = remainder - piece
    return pieces


def _product_in_passes(
    product: Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor],
    left: torch.Tensor,
    right: torch.Tensor,
    passes: int,
) -> torch.Tensor:
    """`product(left, right)` (bilinear) as the sum of the bf16 piece products TorchTPU runs;
    its third argument says whether this is the first term (which alone adds a bias)."""
    count = 1 + max(max(pair) for pair in MATMUL_PASSES[passes])
    left_pieces, right_pieces = _pieces(left, count), _pieces(right, count)
    result = None
    for i, j in MATMUL_PASSES[passes]:
        term = product(left_pieces[i], right_pieces[j], result is None)
        result = term if result is None else result + term
    return cast(torch.Tensor, result)  # every entry of MATMUL_PASSES lists at least one pass


# Where each matmul keeps its bias, among the arguments after its two operands.
_BIAS_POSITION = {"convolution": 0, "_grouped_mm": 1}


def _matmul_in_passes(
    op: torch._ops.OpOverload, name: str, args: list[Any], kwargs: dict[str, Any]
) -> torch.Tensor:
    """A float32 matmul as TorchTPU runs it: `state().active_passes()` bf16 passes."""
    if "out" in kwargs:  # the out= form: compute, then fill the output the caller made
        kwargs = dict(kwargs)
        out = kwargs.pop("out")
        result = _matmul_in_passes(getattr(aten, name).default, name, args, kwargs)
        if out.shape != result.shape:
            out.resize_(result.shape)
        return out.copy_(result)
    passes = state().active_passes()
    if name in ("addmm", "baddbmm"):  # beta * self + alpha * (mat1 @ mat2)
        base, left, right = args[:3]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        plain = aten.mm.default if name == "addmm" else aten.bmm.default
        scaled = _product_in_passes(lambda a, b, _: plain(a, b), left, right, passes)
        return torch.add(base * beta if beta != 1 else base, scaled, alpha=alpha)
    left, right, *rest = args
    bias_position = _BIAS_POSITION.get(name)

    def product(a: torch.Tensor, b: torch.Tensor, first: bool) -> torch.Tensor:
        others, options = list(rest), dict(kwargs)
        if not first and bias_position is not None:
            if len(others) > bias_position:
                others[bias_position] = None
            if "bias" in options:
                options["bias"] = None
        return op(a, b, *others, **options)

    return _product_in_passes(product, left, right, passes)


# --- Operators the CPU cannot run as they come -------------------------------------------


def _histc(op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """The CPU has no integer histc (transformers' MoE calls it off the CPU): count in float."""
    values = args[0]
    if values.is_floating_point():
        return op(*args, **kwargs)
    return op(values.float(), *args[1:], **kwargs).to(values.dtype)


def _convolution_overrideable(
    op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """A backend's convolution hook: the CPU's own convolution, in bf16 passes for float32."""
    if _is_float32_matmul("convolution", args):
        return _matmul_in_passes(aten.convolution.default, "convolution", args, kwargs)
    if _operand_dtype("convolution", args) == torch.bfloat16:
        return _bf16_matmul(aten.convolution.default, args, kwargs)
    return aten.convolution.default(*args, **kwargs)


def _convolution_backward_overrideable(
    op: torch._ops.OpOverload, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    grad_output, inputs, weight, stride, padding, dilation, transposed, output_padding, groups = (
        args[:9]
    )
    output_mask = args[9] if len(args) > 9 else kwargs["output_mask"]
    return aten.convolution_backward.default(
        grad_output,
        inputs,
        weight,
        [weight.shape[0]],
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        output_mask,
    )


_CPU_IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {
    "histc": _histc,
    "convolution_overrideable": _convolution_overrideable,
    "convolution_backward_overrideable": _convolution_backward_overrideable,
}


# --- Kernels of their own ---------------------------------------------------------------------


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    target = state().resolve(device)
    dtype = dtype or torch.get_default_dtype()
    cpu = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return memory.on_device(cpu, target)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    target = state().resolve(device)
    dtype = dtype or torch.get_default_dtype()
    return memory.on_device(torch.empty_strided(size, stride, dtype=dtype), target)


def _copy_from(source: torch.Tensor, destination: torch.Tensor, non_blocking: bool = False):
    """Copy between the CPU and a device, or between two device tensors."""
    if source.device.type == "tpu" and destination.device.type == "cpu":
        report().record("host_syncs", "copy to the host")
    source_cpu = memory.cpu_view(source) if source.device.type == "tpu" else source
    target_cpu = memory.cpu_view(destination) if destination.device.type == "tpu" else destination
    target_cpu.copy_(source_cpu)
    return destination


def _to_copy(
    tensor: torch.Tensor,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking: bool = False,
    memory_format=None,
):
    """`.to()` from the device: to the host without the pinned buffer torch's generic kernel
    asks the backend for (non_blocking=True), or to another dtype or device tensor."""
    target = tensor.device if device is None else torch.device(device)
    copy = memory.cpu_view(tensor).to(
        dtype=dtype or tensor.dtype,
        memory_format=memory_format or torch.preserve_format,
        copy=True,
    )
    if target.type == "cpu":
        report().record("host_syncs", "copy to the host")
        return copy
    return memory.on_device(copy, state().resolve(target))


def _copy_from_and_resize(source: torch.Tensor, destination: torch.Tensor):
    destination.resize_(source.shape)
    return _copy_from(source, destination)


def _contiguous_strides(size: list[int]) -> list[int]:
    strides, step = [], 1
    for extent in reversed(size):
        strides.append(step)
        step *= max(extent, 1)
    return list(reversed(strides))


def _resize(tensor: torch.Tensor, size, memory_format=None):
    """Resize in place; the storage grows (keeping its bytes) when it is too small."""
    size = list(size)
    numel = 1
    for extent in size:
        numel *= extent
    storage = tensor.untyped_storage()
    needed = (tensor.storage_offset() + numel) * tensor.element_size()
    if needed > storage.nbytes():
        memory.resize_storage(storage, int(needed))  # an int already: no symbolic sizes here
    strides = _contiguous_strides(size)
    if memory_format == torch.channels_last and len(size) == 4:
        strides = (
            torch.empty(0)
            .new_empty(  # type: ignore[call-overload]  # torch's stub lacks memory_format
                size, memory_format=torch.channels_last
            )
            .stride()
        )
    memory.SET_STORAGE.redispatch(
        _CPU_KEYS, tensor, storage, tensor.storage_offset(), size, list(strides)
    )
    return tensor


def _set_empty(tensor: torch.Tensor):
    storage = memory.adopt(torch.UntypedStorage(0), memory.logical_index(tensor.untyped_storage()))
    memory.SET_STORAGE.redispatch(_CPU_KEYS, tensor, storage, 0, [0], [1])
    return tensor


def _local_scalar_dense(tensor: torch.Tensor):
    report().record("host_syncs", ".item() (a value read by the host)")
    return memory.cpu_view(tensor).item()


def _compatible_shallow_copy(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    """`.data =` and `Module.to()` may swap a CPU tensor's contents for a device tensor's: with
    False here (PyTorch's answer for a PrivateUse1 backend without its own kernel), `Module.to`
    makes new Parameters and unties tied weights."""
    return tensor.layout == other.layout == torch.strided


def _is_pinned(tensor: torch.Tensor, device=None) -> bool:
    return False


def _pin_memory(tensor: torch.Tensor, device=None) -> torch.Tensor:
    """A CPU tensor "pinned" for the emulated device: a copy (there is no DMA to speed up)."""
    return tensor.clone(memory_format=torch.contiguous_format)


_OWN_KERNELS: dict[str, Callable[..., Any]] = {
    "empty.memory_format": _empty,
    "empty_strided": _empty_strided,
    "_copy_from": _copy_from,
    "_copy_from_and_resize": _copy_from_and_resize,
    "_to_copy": _to_copy,
    "resize_": _resize,
    "set_": _set_empty,
    "_local_scalar_dense": _local_scalar_dense,
    "_has_compatible_shallow_copy_type": _compatible_shallow_copy,
}

# --- Autocast: what torch.autocast("tpu") casts, as CUDA's lists do ---------------------------
LOWER_PRECISION_OPS = (
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "scaled_dot_product_attention",
    "_grouped_mm",
)
FLOAT32_OPS = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    "layer_norm",
    "group_norm",
    "norm",
    "cosine_similarity",
    "nll_loss",
    "nll_loss2d",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "binary_cross_entropy_with_logits",
    "cross_entropy_loss",
    "cdist",
    "logsumexp",
    "softmax",
    "log_softmax",
    "cumsum",
    "cumprod",
    "prod",
    "sum",
)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        if (
            value.device.type == "tpu"
            and value.is_floating_point()
            and value.dtype not in (torch.float64, dtype)
        ):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _autocast_kernel(op: torch._ops.OpOverload, lower: bool) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            dtype = torch.get_autocast_dtype("tpu") if lower else torch.float32
            return op(*_cast(args, dtype), **_cast(kwargs, dtype))

    return kernel


_LIBRARIES: list[torch.library.Library] = []


def _served_by_fallback(op: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _fallback(op, *args, **kwargs)

    return kernel


def register() -> None:
    """Register the fallback, the own kernels and autocast's casts for `PrivateUse1`."""
    import os

    os.register_at_fork(after_in_child=_mark_forked)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, "PrivateUse1")
    own = torch.library.Library("aten", "IMPL")
    for name, kernel in _OWN_KERNELS.items():
        own.impl(name, _out_of_the_profiler(kernel), "PrivateUse1")
    own.impl("is_pinned", _is_pinned, "PrivateUse1")
    # Structured operators have a generic functional kernel that allocates the output and calls
    # the out= form through the dispatcher: two device operators (and two profiler events) for
    # one. Served here directly, each is one call of the CPU's functional kernel.
    # A backend's convolution hooks: PyTorch's default kernel for them only raises.
    for name in ("convolution_overrideable", "convolution_backward_overrideable"):
        own.impl(name, _served_by_fallback(getattr(aten, name).default), "PrivateUse1")
    taken = set(_OWN_KERNELS) | {"convolution_overrideable", "convolution_backward_overrideable"}
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, name = qualified.partition("::")
        if namespace != "aten" or name in taken:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            qualified, "CompositeExplicitAutogradNonFunctional"
        ):
            packet_name, _, overload = name.partition(".")
            op = getattr(getattr(aten, packet_name), overload or "default")
            own.impl(name, _served_by_fallback(op), "PrivateUse1")
    with warnings.catch_warnings():  # replaces the CPU kernel, which asks the backend's hooks
        warnings.simplefilter("ignore")
        own.impl("_pin_memory", _pin_memory, "CPU")
    autocast = torch.library.Library("aten", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, lower in ((LOWER_PRECISION_OPS, True), (FLOAT32_OPS, False)):
        for name in names:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(a.kwarg_only and a.name == "out" for a in op._schema.arguments):
                    continue
                qualified = name if overload == "default" else f"{name}.{overload}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    autocast.impl(qualified, _autocast_kernel(op, lower), "AutocastPrivateUse1")
    _LIBRARIES.extend((fallback, own, autocast))
