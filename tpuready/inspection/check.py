"""Parity checks: how far did the numbers move on another device, dtype or precision?

Taught in `notebooks/05_bfloat16_and_float32_matmuls.ipynb`, after `torch.testing.assert_close`,
which is the check to use for pass/fail. This module adds what the standard API lacks:

- `relative_error`: the book's one definition of relative error, the Frobenius ratio
  ||actual - expected|| / ||expected||, a single number for a whole tensor (chapters 2 and 5);
- `emulate_bf16_matmul_passes`: a CPU model of how TorchTPU runs float32 matmuls (one bf16
  pass by default), packaged as a context manager; chapter 5 builds the same model inline;
- `power_of_ten`: a measured rounding error or ratio quoted as the power of ten every CPU
  agrees on (the last digits depend on the CPU's kernels, chapters 1 and 5);
- `matmul_unit_roundoff` and `device_matmul_unit_roundoff`: the unit roundoff u of a float32
  matmul's inputs, for a TorchTPU pass count or for a device as the program has set up its
  matmul precision, from which the book's tolerances follow (chapters 2 and 5).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "BFLOAT16_UNIT_ROUNDOFF",
    "FLOAT32_UNIT_ROUNDOFF",
    "MATMUL_PASSES",
    "TF32_UNIT_ROUNDOFF",
    "device_matmul_unit_roundoff",
    "emulate_bf16_matmul_passes",
    "matmul_in_bf16_passes",
    "matmul_unit_roundoff",
    "power_of_ten",
    "relative_error",
]

# Unit roundoff u = 2**-p of a format with p significand bits: rounding to it changes a value
# by a relative u at most.
FLOAT32_UNIT_ROUNDOFF = 2.0**-24  # 24 significand bits
BFLOAT16_UNIT_ROUNDOFF = 2.0**-8  # 8 significand bits
TF32_UNIT_ROUNDOFF = 2.0**-11  # 11 significand bits (10 stored)
# The old getter's levels, read only where a backend's own setting is unset ("medium" allows
# bf16 on the CPU and TF32 on CUDA: the looser of the two is the bound).
_PRECISION_UNIT_ROUNDOFF = {
    "highest": FLOAT32_UNIT_ROUNDOFF,
    "high": TF32_UNIT_ROUNDOFF,
    "medium": BFLOAT16_UNIT_ROUNDOFF,
}
# The per-backend form of the same setting, which set_float32_matmul_precision also writes.
_FP32_PRECISION_UNIT_ROUNDOFF = {
    "ieee": FLOAT32_UNIT_ROUNDOFF,
    "tf32": TF32_UNIT_ROUNDOFF,
    "bf16": BFLOAT16_UNIT_ROUNDOFF,
}

# power_of_ten refuses a value whose log10 lies closer than this to the midpoint between two
# powers of ten: there, another CPU's rounding (a few per cent) could pick the other power.
POWER_OF_TEN_MARGIN = 0.1


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius norms, in float64 on the CPU).

    One number for a whole tensor that follows its scale, so elements near zero do not blow it
    up as an elementwise ratio would. The dtypes may differ (a bf16 result against a float32
    reference); the shapes may not (no broadcasting). A non-finite `actual` gives `inf`.
    """
    for name, value in (("actual", actual), ("expected", expected)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if actual.shape != expected.shape:
        raise ValueError(
            f"shape mismatch: actual has shape {tuple(actual.shape)}, expected has shape "
            f"{tuple(expected.shape)}; compare tensors of the same shape (no broadcasting)"
        )
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    expected_wide = expected.detach().to("cpu", wide)
    actual_wide = actual.detach().to("cpu", wide)
    if not bool(expected_wide.isfinite().all()):
        raise ValueError("expected holds NaN or infinite values; the reference must be finite")
    reference_norm = float(torch.linalg.vector_norm(expected_wide))
    if reference_norm == 0.0:
        raise ValueError(
            f"expected has norm 0 (all zeros or empty, shape {tuple(expected.shape)}): a "
            f"relative error is undefined; bound the absolute error instead"
        )
    if not bool(actual_wide.isfinite().all()):
        return math.inf
    return float(torch.linalg.vector_norm(actual_wide - expected_wide)) / reference_norm


# --- A CPU model of TorchTPU's float32 matmul precision ------------------------------------
# TorchTPU 0.2.0 runs float32 matmuls as one bf16 pass by default; HIGH = 3 passes and
# HIGHEST = 6 passes (torch.set_float32_matmul_precision "high" / "highest"). Splitting each
# float32 operand into bf16 pieces and summing the products of the pieces is the textbook way
# such passes work (Henry, Tang and Heinecke, 2019); it is a model for teaching, not
# TorchTPU's code. Each pair names the pieces (0 = high, 1 = middle, 2 = low) multiplied.
MATMUL_PASSES: dict[int, tuple[tuple[int, int], ...]] = {
    1: ((0, 0),),
    3: ((0, 0), (0, 1), (1, 0)),
    6: ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 0)),
}


def matmul_unit_roundoff(passes: int | None) -> float:
    """u of a float32 matmul's inputs under TorchTPU's `passes` (1, 3 or 6); None: float32.

    Each pass count splits an input into 1, 2 or 3 bfloat16 pieces, keeping 8 bits each, and
    never finer than float32's own 24."""
    if passes is None:
        return FLOAT32_UNIT_ROUNDOFF
    if type(passes) is not int or passes not in MATMUL_PASSES:  # not True, 1.0 or "1"
        raise ValueError(f"passes must be one of {sorted(MATMUL_PASSES)} or None, got {passes!r}")
    pieces = 1 + max(max(pair) for pair in MATMUL_PASSES[passes])
    return max(BFLOAT16_UNIT_ROUNDOFF**pieces, FLOAT32_UNIT_ROUNDOFF)


def _matmul_precision_setting(device_type: str) -> Any:
    """The `torch.backends` object whose `fp32_precision` governs float32 matmuls there."""
    if device_type == "cuda":
        return torch.backends.cuda.matmul  # tpuready: ignore[cuda-backend-setting] (read only)
    if device_type == "cpu":
        return torch.backends.mkldnn.matmul  # type: ignore[attr-defined]  # MkldnnModule's; not typed
    return torch.backends


def device_matmul_unit_roundoff(device: torch.device) -> float:
    """u of a float32 matmul on `device` as this program has set its precision up: the loosest
    the setting allows (a CPU without bf16 kernels or a GPU without TF32 may still run float32).

    On a TPU, one bfloat16 pass: TorchTPU's default, and the loosest it allows, a bound for any
    setting (PyTorch cannot say whether the program asked for more). Elsewhere the per-backend
    `torch.backends.<backend>.matmul.fp32_precision` ("ieee", "tf32", "bf16") decides; where it
    is unset ("none"), `torch.get_float32_matmul_precision()` does. That older getter raises
    once a backend's setting no longer matches what its setter wrote, and then the unset
    backend runs plain float32.
    """
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device, got {device!r}")
    if device.type == "tpu":
        return matmul_unit_roundoff(1)
    setting = _matmul_precision_setting(device.type).fp32_precision
    if setting != "none":
        return _FP32_PRECISION_UNIT_ROUNDOFF[setting]
    try:
        return _PRECISION_UNIT_ROUNDOFF[torch.get_float32_matmul_precision()]
    except RuntimeError:  # the two APIs disagree, and this backend is unset
        return FLOAT32_UNIT_ROUNDOFF


def power_of_ten(value: float) -> int:
    """The exponent k of the power of ten nearest `value` (on a log scale): 8,200 and 11,396 -> 4.

    A rounding error's last digits depend on the order in which the CPU's kernels (AVX2,
    AVX-512, AMX, arm64) add the products, so the book quotes such a value as 10**k. A value
    within POWER_OF_TEN_MARGIN (in log10) of the midpoint between two powers raises
    ValueError: another CPU could round it to the other power, so quote a bound instead.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"value must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"value must be positive and finite, got {value!r}")
    exponent = math.log10(value)
    nearest = round(exponent)
    if abs(abs(exponent - nearest) - 0.5) < POWER_OF_TEN_MARGIN:
        raise ValueError(
            f"{value!r} lies near the midpoint between 10**{math.floor(exponent)} and "
            f"10**{math.ceil(exponent)}, where another CPU's rounding could pick either; "
            "quote a bound (assert value < bound) instead of its power of ten"
        )
    return nearest


def _split_into_bf16(tensor: torch.Tensor, num_pieces: int) -> list[torch.Tensor]:
    """Split a float tensor into `num_pieces` bf16-representable float32 tensors summing to it."""
    remainder = tensor.float()
    pieces = []
    for _ in range(num_pieces):
        piece = remainder.bfloat16().float()
        pieces.append(piece)
        remainder = remainder - piece
    return pieces


def matmul_in_bf16_passes(left: torch.Tensor, right: torch.Tensor, passes: int) -> torch.Tensor:
    """`left @ right` as `passes` bf16 x bf16 products accumulated in float32, in table order."""
    num_pieces = 1 + max(max(pair) for pair in MATMUL_PASSES[passes])
    left_pieces = _split_into_bf16(left, num_pieces)
    right_pieces = _split_into_bf16(right, num_pieces)
    result = None
    for left_index, right_index in MATMUL_PASSES[passes]:
        product = torch.matmul(left_pieces[left_index], right_pieces[right_index])
        result = product if result is None else result + product
    return cast(torch.Tensor, result)  # every entry of MATMUL_PASSES lists at least one pass


class _MatmulInBf16Passes(torch.autograd.Function):
    """`left @ right` in bf16 passes, forward and backward: on TorchTPU the backward pass's
    matmuls (gradient times each operand) are float32 matmuls too, so they run as passes."""

    @staticmethod
    def forward(ctx: Any, left: torch.Tensor, right: torch.Tensor, passes: int) -> torch.Tensor:
        ctx.save_for_backward(left, right)
        ctx.passes = passes
        return matmul_in_bf16_passes(left, right, passes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        left, right = ctx.saved_tensors
        grad_left = grad_right = None
        if ctx.needs_input_grad[0]:
            grad_left = matmul_in_bf16_passes(grad, right.transpose(-1, -2), ctx.passes)
            grad_left = grad_left.sum_to_size(left.shape)  # undo broadcasting
        if ctx.needs_input_grad[1]:
            grad_right = matmul_in_bf16_passes(left.transpose(-1, -2), grad, ctx.passes)
            grad_right = grad_right.sum_to_size(right.shape)
        return grad_left, grad_right, None


def _emulated_matmul(left: torch.Tensor, right: torch.Tensor, passes: int) -> torch.Tensor:
    """The bf16-pass product with its bf16-pass backward, for operands of two or more
    dimensions (a 1-D operand, a vector product, keeps float32: it is not an MXU matmul)."""
    if left.dim() < 2 or right.dim() < 2:
        return torch.matmul(left, right)
    return _MatmulInBf16Passes.apply(left, right, passes)


class _Bf16PassesMode(TorchFunctionMode):
    """Reroute float32 matmuls, linear layers and eager attention matmuls through the model."""

    def __init__(self, passes: int) -> None:
        super().__init__()
        self.passes = passes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            left, right = args
            if left.dtype == torch.float32 and right.dtype == torch.float32:
                return _emulated_matmul(left, right, self.passes)
        if func is torch.nn.functional.linear:
            return self._linear(*args, **kwargs)
        return func(*args, **kwargs)

    def _linear(self, input: Any, weight: Any, bias: Any = None) -> Any:
        if input.dtype != torch.float32 or weight.dtype != torch.float32:
            return torch.nn.functional.linear(input, weight, bias)
        output = _emulated_matmul(input, weight.t(), self.passes)
        return output if bias is None else output + bias


@contextmanager
def emulate_bf16_matmul_passes(passes: int = 1) -> Iterator[None]:
    """Inside this block, float32 `matmul` / `@` / `F.linear` run as `passes` bf16 passes, in
    the forward pass and in the backward pass their gradients take (as on TorchTPU, whose
    backward matmuls are float32 matmuls too).

    A CPU model of TorchTPU's default (1 pass) and its "high" (3) and "highest" (6) settings,
    to see how much a model's outputs and gradients move before you have a TPU. It does not cover
    `F.scaled_dot_product_attention`, `bmm`, `mm` or `einsum`: load the model with
    `attn_implementation="eager"` so that attention goes through `torch.matmul`.
    """
    if passes not in MATMUL_PASSES:
        raise ValueError(f"passes must be one of {sorted(MATMUL_PASSES)}, got {passes!r}")
    with _Bf16PassesMode(passes):
        yield
