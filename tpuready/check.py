"""Parity checks: did the numbers survive the move to another device, dtype or file?

Taught in `notebooks/03_huggingface_models_anywhere.ipynb`. `compare_tensors` measures how far
a candidate tensor (a bf16 run, a reloaded model, a TPU result copied to the host) is from a
reference and judges it against a tolerance that matches the precision being tested;
`emulate_bf16_matmul_passes` models on the CPU how TorchTPU runs float32 matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "MATMUL_PASSES",
    "ParityReport",
    "Tolerance",
    "compare_tensors",
    "default_tolerance",
    "emulate_bf16_matmul_passes",
    "matmul_in_bf16_passes",
    "split_into_bf16",
]


@dataclass(frozen=True)
class Tolerance:
    """The elementwise bound |candidate - reference| <= atol + rtol * |reference| (as isclose)."""

    rtol: float
    atol: float

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


# The defaults of torch.testing.assert_close (PyTorch docs, "torch.testing"): about two units
# of rounding for bfloat16 (eps 2**-7) and one for float16 (eps 2**-10). They suit one op
# computed two ways; a whole model accumulates more error, so pass rtol/atol you can justify.
_DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-7, atol=1e-7),
    torch.float32: Tolerance(rtol=1.3e-6, atol=1e-5),
    torch.float16: Tolerance(rtol=1e-3, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-5),
}


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """The tolerance for one op computed in `dtype` (torch.testing.assert_close's defaults)."""
    if dtype not in _DEFAULT_TOLERANCES:
        supported = ", ".join(str(known) for known in _DEFAULT_TOLERANCES)
        raise ValueError(f"no default tolerance for dtype {dtype}; supported dtypes: {supported}")
    return _DEFAULT_TOLERANCES[dtype]


@dataclass(frozen=True)
class ParityReport:
    """How far a candidate tensor is from its reference, and whether that is within tolerance.

    `max_rel_error` is `max_abs_error` divided by the largest |reference|: an elementwise
    ratio explodes wherever the reference is near zero, this one measures error against the
    scale of the values. Errors are `inf` where non-finite values disagree.
    """

    max_abs_error: float
    max_rel_error: float
    tolerance: Tolerance
    num_elements: int
    num_mismatched: int

    @property
    def passed(self) -> bool:
        """True when every element is within the tolerance."""
        return self.num_mismatched == 0

    def __str__(self) -> str:
        verdict = "passed"
        if not self.passed:
            verdict = f"FAILED ({self.num_mismatched} of {self.num_elements})"
        return (
            f"{verdict}: max abs error {self.max_abs_error:.2e}, "
            f"max rel error {self.max_rel_error:.2e} "
            f"(rtol {self.tolerance.rtol:.1e}, atol {self.tolerance.atol:.1e})"
        )


def compare_tensors(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> ParityReport:
    """Compare `candidate` with `reference` elementwise; both are copied to the CPU in float64.

    `dtype` names the precision whose default tolerance applies; it defaults to the tensors'
    shared dtype and is required when their dtypes differ. `rtol` / `atol` override it.
    NaN matches NaN in the same position; infinities must match exactly. No broadcasting.
    """
    for name, value in (("reference", reference), ("candidate", candidate)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if not (value.is_floating_point() or value.is_complex()) and dtype is None:
            raise TypeError(
                f"{name} has dtype {value.dtype}; pass dtype= to say which precision's "
                f"tolerance applies (or rtol=0, atol=0 for an exact check)"
            )
    if reference.shape != candidate.shape:
        raise ValueError(
            f"shape mismatch: reference has shape {tuple(reference.shape)}, candidate has "
            f"shape {tuple(candidate.shape)}; compare tensors of the same shape (no broadcasting)"
        )
    if dtype is None:
        if reference.dtype != candidate.dtype:
            raise TypeError(
                f"dtype mismatch: reference is {reference.dtype}, candidate is {candidate.dtype}; "
                f"pass dtype= to choose the tolerance (usually the less precise of the two)"
            )
        dtype = reference.dtype
    if rtol is None or atol is None:
        default = default_tolerance(dtype)
        rtol = default.rtol if rtol is None else rtol
        atol = default.atol if atol is None else atol
    tolerance = Tolerance(rtol=rtol, atol=atol)

    wide = torch.complex128 if reference.is_complex() or candidate.is_complex() else torch.float64
    expected = reference.detach().to("cpu", wide)
    actual = candidate.detach().to("cpu", wide)
    # Identical values (equal infinities included) and NaN facing NaN count as no error.
    same = (expected == actual) | (expected.isnan() & actual.isnan())
    difference = (actual - expected).abs().nan_to_num(nan=math.inf, posinf=math.inf)
    abs_error = torch.where(same, 0.0, difference)
    bound = tolerance.atol + tolerance.rtol * expected.abs()
    within = same | (expected.isfinite() & (abs_error <= bound))
    max_abs_error = float(abs_error.max()) if abs_error.numel() else 0.0
    finite_scale = expected.abs().nan_to_num(nan=0.0, posinf=0.0)
    scale = float(finite_scale.max()) if finite_scale.numel() else 0.0
    if max_abs_error == 0.0:
        max_rel_error = 0.0
    else:
        max_rel_error = max_abs_error / scale if scale > 0 else math.inf
    return ParityReport(
        max_abs_error=max_abs_error,
        max_rel_error=max_rel_error,
        tolerance=tolerance,
        num_elements=abs_error.numel(),
        num_mismatched=int((~within).sum()),
    )


# --- A CPU model of TorchTPU's float32 matmul precision ------------------------------------
# TorchTPU 0.2.0 runs float32 matmuls as one bf16 pass by default; HIGH = 3 passes and
# HIGHEST = 6 passes (torch.set_float32_matmul_precision "high" / "highest"). Splitting each
# float32 operand into bf16 pieces and summing the products of the pieces is the textbook way
# such passes work; it is a model for teaching, not TorchTPU's code.
MATMUL_PASSES: dict[int, tuple[tuple[int, int], ...]] = {
    1: ((0, 0),),
    3: ((0, 0), (0, 1), (1, 0)),
    6: ((0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (2, 0)),
}


def split_into_bf16(tensor: torch.Tensor, num_pieces: int) -> list[torch.Tensor]:
    """Split a float tensor into `num_pieces` bf16-representable float32 tensors summing to it."""
    if not isinstance(num_pieces, int) or isinstance(num_pieces, bool) or num_pieces < 1:
        raise ValueError(f"num_pieces must be an int >= 1, got {num_pieces!r}")
    remainder = tensor.float()
    pieces = []
    for _ in range(num_pieces):
        piece = remainder.bfloat16().float()
        pieces.append(piece)
        remainder = remainder - piece
    return pieces


def matmul_in_bf16_passes(left: torch.Tensor, right: torch.Tensor, passes: int) -> torch.Tensor:
    """`left @ right` as `passes` bf16 x bf16 products accumulated in float32 (1, 3 or 6)."""
    if passes not in MATMUL_PASSES:
        raise ValueError(f"passes must be one of {sorted(MATMUL_PASSES)}, got {passes!r}")
    num_pieces = 1 + max(max(pair) for pair in MATMUL_PASSES[passes])
    left_pieces = split_into_bf16(left, num_pieces)
    right_pieces = split_into_bf16(right, num_pieces)
    result = None
    for left_index, right_index in MATMUL_PASSES[passes]:
        product = torch.matmul(left_pieces[left_index], right_pieces[right_index])
        result = product if result is None else result + product
    return result


class _Bf16PassesMode(TorchFunctionMode):
    """Reroute float32 matmuls, linear layers and eager attention matmuls through the model."""

    def __init__(self, passes: int) -> None:
        super().__init__()
        self.passes = passes

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            left, right = args
            if left.dtype == torch.float32 and right.dtype == torch.float32:
                return matmul_in_bf16_passes(left, right, self.passes)
        if func is torch.nn.functional.linear:
            return self._linear(*args, **kwargs)
        return func(*args, **kwargs)

    def _linear(self, input: Any, weight: Any, bias: Any = None) -> Any:
        if input.dtype != torch.float32 or weight.dtype != torch.float32:
            return torch.nn.functional.linear(input, weight, bias)
        output = matmul_in_bf16_passes(input, weight.t(), self.passes)
        return output if bias is None else output + bias


@contextmanager
def emulate_bf16_matmul_passes(passes: int = 1) -> Iterator[None]:
    """Inside this block, float32 `matmul` / `@` / `F.linear` run as `passes` bf16 passes.

    A CPU model of TorchTPU's default (1 pass) and its "high" (3) and "highest" (6) settings,
    to see how much a model's outputs move before you have a TPU. It does not cover
    `F.scaled_dot_product_attention`, `bmm`, `mm` or `einsum`: load the model with
    `attn_implementation="eager"` so that attention goes through `torch.matmul`.
    """
    if passes not in MATMUL_PASSES:
        raise ValueError(f"passes must be one of {sorted(MATMUL_PASSES)}, got {passes!r}")
    with _Bf16PassesMode(passes):
        yield
