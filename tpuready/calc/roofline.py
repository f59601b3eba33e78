"""Rooflines: arithmetic intensity, attainable FLOP/s, model FLOPs utilisation, tokens per second.

Taught in `notebooks/21_rooflines_and_mfu.ipynb`. A kernel that does `flops` FLOPs
while moving `bytes` to and from memory has arithmetic intensity `flops / bytes` (FLOPs per
byte). On a chip with peak `peak_flops_per_second` and memory bandwidth `bytes_per_second` it
can reach at most `min(peak, intensity * bandwidth)` FLOP/s: the roofline. Below the ridge
point `peak / bandwidth` the kernel is memory-bound, at or above it compute-bound.

The byte counts are the ideal ones: every operand read once from memory and every result
written once, as if caches or on-chip memory held everything in between. Real kernels move at
least that much, so their true intensity is at most the figure computed here.

A roofline comes from a `tpuready.calc.hardware.Chip` (`Roofline.from_chip("v6e")`, with the chip's
peak dense bf16 FLOP/s and HBM bandwidth) or from explicit figures, such as a CPU's peak and
bandwidth measured in the notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from tpuready.calc.hardware import Chip, as_chip
from tpuready.validate import InputError, number, one_of, whole_number

__all__ = [
    "AttentionVariant",
    "Bound",
    "Roofline",
    "RooflineError",
    "attainable_flops_per_second",
    "attention_bytes",
    "attention_flops",
    "attention_intensity",
    "bound",
    "elementwise_intensity",
    "matmul_bytes",
    "matmul_flops",
    "matmul_intensity",
    "mfu",
    "ridge_point_flops_per_byte",
    "tokens_per_second",
]

Bound = Literal["compute", "memory"]
AttentionVariant = Literal["flash", "naive"]
ATTENTION_VARIANTS: tuple[str, ...] = ("flash", "naive")


class RooflineError(InputError):
    """Raised for a size, rate or fraction that no kernel or chip can have."""


def _positive_number(name: str, value: object) -> float:
    """`value` as a float after checking it is a finite number above zero."""
    return number(name, value, fix="pass a rate, size or count above zero", error=RooflineError)


def _positive_count(name: str, value: object) -> int:
    """`value` after checking it is a whole number of at least one (a size or a count)."""
    return whole_number(name, value, fix="pass a size or a count such as 4096", error=RooflineError)


# ---------------------------------------------------------------------------------------------
# Arithmetic intensity of common kernels


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: one multiply and one add per term, 2 m k n."""
    m, k, n = (_positive_count(name, v) for name, v in (("m", m), ("k", k), ("n", n)))
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_element: float) -> float:
    """Bytes an (m x k) @ (k x n) matmul moves at best: read both operands, write the result."""
    m, k, n = (_positive_count(name, v) for name, v in (("m", m), ("k", k), ("n", n)))
    size = _positive_number("bytes_per_element", bytes_per_element)
    return (m * k + k * n + m * n) * size


def matmul_intensity(m: int, k: int, n: int, bytes_per_element: float) -> float:
    """FLOPs per byte of an (m x k) @ (k x n) matmul: 2 m k n / ((m k + k n + m n) bytes)."""
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, bytes_per_element)


def _check_variant(variant: str) -> None:
    one_of("variant", variant, ATTENTION_VARIANTS, error=RooflineError)


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> int:
    """FLOPs of attention's forward pass without a mask: Q K^T and P V, each 2 S^2 d per head
    (4 B H S^2 d in all; the softmax's few FLOPs per score are left out, as the matmuls
    dominate)."""
    batch, heads, seq_len, head_dim = (
        _positive_count(name, value)
        for name, value in (
            ("batch", batch),
            ("heads", heads),
            ("seq_len", seq_len),
            ("head_dim", head_dim),
        )
    )
    return 4 * batch * heads * seq_len * seq_len * head_dim


def attention_bytes(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    bytes_per_element: float,
    variant: AttentionVariant = "flash",
) -> float:
    """Bytes attention's forward pass moves at best. "flash": read Q, K, V and write the output
    (4 B H S d elements; the S x S scores stay on chip). "naive": also write the scores, read
    them for the softmax, write the probabilities and read them for P V (4 B H S^2 more)."""
    _check_variant(variant)
    attention_flops(batch, heads, seq_len, head_dim)  # checks the sizes
    size = _positive_number("bytes_per_element", bytes_per_element)
    elements = 4 * batch * heads * seq_len * head_dim
    if variant == "naive":
        elements += 4 * batch * heads * seq_len * seq_len
    return elements * size


def attention_intensity(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    bytes_per_element: float,
    variant: AttentionVariant = "flash",
) -> float:
    """FLOPs per byte of attention's forward pass: S / bytes_per_element for "flash" (the score
    matrix never reaches memory), S d / ((S + d) bytes_per_element) for "naive"."""
    return attention_flops(batch, heads, seq_len, head_dim) / attention_bytes(
        batch, heads, seq_len, head_dim, bytes_per_element, variant
    )


def elementwise_intensity(
    flops_per_element: float,
    bytes_per_element: float,
    num_inputs: int = 1,
    num_outputs: int = 1,
) -> float:
    """FLOPs per byte of an elementwise op that reads `num_inputs` tensors and writes
    `num_outputs`, all of one size: flops_per_element / ((inputs + outputs) bytes_per_element)."""
    flops = _positive_number("flops_per_element", flops_per_element)
    size = _positive_number("bytes_per_element", bytes_per_element)
    tensors = _positive_count("num_inputs", num_inputs) + _positive_count(
        "num_outputs", num_outputs
    )
    return flops / (tensors * size)


# ---------------------------------------------------------------------------------------------
# The roofline itself


def ridge_point_flops_per_byte(peak_flops_per_second: float, bytes_per_second: float) -> float:
    """The intensity where the memory slope meets the compute roof: peak / bandwidth."""
    peak = _positive_number("peak_flops_per_second", peak_flops_per_second)
    return peak / _positive_number("bytes_per_second", bytes_per_second)


def attainable_flops_per_second(
    intensity: float, peak_flops_per_second: float, bytes_per_second: float
) -> float:
    """The roofline: min(peak, intensity * bandwidth), the most FLOP/s a kernel of this
    arithmetic intensity (FLOPs per byte) can reach on this chip."""
    intensity = _positive_number("intensity", intensity)
    peak = _positive_number("peak_flops_per_second", peak_flops_per_second)
    bandwidth = _positive_number("bytes_per_second", bytes_per_second)
    return min(peak, intensity * bandwidth)


def bound(intensity: float, peak_flops_per_second: float, bytes_per_second: float) -> Bound:
    """ "memory" below the ridge point, "compute" at or above it (at the ridge both limits are
    reached at once, and more intensity no longer helps)."""
    intensity = _positive_number("intensity", intensity)
    ridge = ridge_point_flops_per_byte(peak_flops_per_second, bytes_per_second)
    return "compute" if intensity >= ridge else "memory"


@dataclass(frozen=True)
class Roofline:
    """One processor's roofline: a name, a peak FLOP/s and a memory bandwidth in bytes/s."""

    name: str
    peak_flops_per_second: float
    bytes_per_second: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RooflineError(
                f"name must be a non-empty string, got {self.name!r}: name the processor, "
                "such as 'this CPU'"
            )
        _positive_number("peak_flops_per_second", self.peak_flops_per_second)
        _positive_number("bytes_per_second", self.bytes_per_second)

    @classmethod
    def from_chip(cls, chip: Chip | str) -> Roofline:
        """A chip's roofline from `tpuready.calc.hardware`: its peak dense bf16 FLOP/s and HBM
        bandwidth, per chip (on TPU v7 each of the two devices has half of both, so the ridge
        point is the same)."""
        chip = as_chip(chip, error=RooflineError)
        return cls(chip.name, chip.peak_bf16_flops_per_second, chip.hbm_bytes_per_second)

    @property
    def ridge_point_flops_per_byte(self) -> float:
        """Peak over bandwidth: the intensity a kernel needs to be compute-bound."""
        return ridge_point_flops_per_byte(self.peak_flops_per_second, self.bytes_per_second)

    def attainable_flops_per_second(self, intensity: float) -> float:
        """The most FLOP/s a kernel of this intensity reaches on this processor."""
        return attainable_flops_per_second(
            intensity, self.peak_flops_per_second, self.bytes_per_second
        )

    def bound(self, intensity: float) -> Bound:
        """ "compute" or "memory": which limit a kernel of this intensity meets first."""
        return bound(intensity, self.peak_flops_per_second, self.bytes_per_second)

    def min_tokens_for_compute_bound(self, k: int, n: int, bytes_per_element: float = 2.0) -> int:
        """The fewest rows m (tokens per chip) at which an (m, k) @ (k, n) matmul reaches the
        ridge point: the m solving 2 m k n = ridge * bytes * (m k + k n + m n), rounded up.
        For a large weight it approaches ridge * bytes / 2, the ridge point itself in bf16."""
        k, n = _positive_count("k", k), _positive_count("n", n)
        size = _positive_number("bytes_per_element", bytes_per_element)
        ridge = self.ridge_point_flops_per_byte
        # In exact rationals: where the root is a whole number (v6e, k = n = 1125: 153,000),
        # float rounding would land just above it and round up one row too many.
        exact_ridge = Fraction(self.peak_flops_per_second) / Fraction(self.bytes_per_second)
        denominator = 2 * k * n - exact_ridge * Fraction(size) * (k + n)
        if denominator <= 0:
            raise RooflineError(
                f"a ({k}, {n}) weight in {size:g}-byte elements never reaches {self.name}'s "
                f"ridge point of {ridge:.0f} FLOPs per byte, however many tokens: even "
                f"infinitely many give only {2 * k * n / (size * (k + n)):.0f}; make k and n "
                "larger"
            )
        return math.ceil(exact_ridge * Fraction(size) * k * n / denominator)

    def seconds(self, flops: float, bytes_moved: float) -> float:
        """The roofline time of a kernel: the longer of computing its FLOPs at peak and moving
        its bytes at full bandwidth (the two overlap perfectly in this model)."""
        flops = number(
            "flops", flops, fix="pass the kernel's FLOPs", allow_zero=True, error=RooflineError
        )
        bytes_moved = number(
            "bytes_moved",
            bytes_moved,
            fix="pass the bytes it moves",
            allow_zero=True,
            error=RooflineError,
        )
        return max(flops / self.peak_flops_per_second, bytes_moved / self.bytes_per_second)


# ---------------------------------------------------------------------------------------------
# Model FLOPs utilisation


def mfu(model_flops: float, seconds: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs over what the peak could do in `seconds`
    (recomputed FLOPs are not model FLOPs; pass the peak of every chip the step ran on).

    A result above 1 is impossible (no step beats its hardware's peak), so it is refused with
    the inputs named: it means the peak belongs to other hardware than the time, or counts
    fewer chips than the FLOPs do.
    """
    flops = _positive_number("model_flops", model_flops)
    elapsed = _positive_number("seconds", seconds)
    peak = _positive_number("peak_flops_per_second", peak_flops_per_second)
    utilisation = flops / (elapsed * peak)
    if utilisation > 1:
        raise RooflineError(
            f"MFU of {utilisation:.3g} is above 1: model_flops={model_flops!r} in "
            f"seconds={seconds!r} is {flops / elapsed:.3g} FLOP/s, more than "
            f"peak_flops_per_second={peak_flops_per_second!r}. Likely cause: the peak of "
            "another device (a CPU's measured peak against a device's step time), or the FLOPs "
            "of more chips than the peak counts (multiply the per-chip peak by the chips the "
            "step ran on)"
        )
    return utilisation


def tokens_per_second(
    mfu: float,
    num_chips: int,
    peak_flops_per_second_per_chip: float,
    flops_per_token: float,
) -> float:
    """Tokens a run trains per second at utilisation `mfu` on `num_chips` chips:
    mfu * num_chips * peak per chip / training FLOPs per token."""
    fraction = _positive_number("mfu", mfu)
    if fraction > 1:
        raise RooflineError(
            f"mfu is a fraction of the peak, at most 1, got {mfu!r}; write 28 % as 0.28"
        )
    chips = _positive_count("num_chips", num_chips)
    peak = _positive_number("peak_flops_per_second_per_chip", peak_flops_per_second_per_chip)
    return fraction * chips * peak / _positive_number("flops_per_token", flops_per_token)
