"""When FSDP (ZeRO-3) keeps a TPU busy: the per-chip batch, in tokens, above which the weight
all-gathers and gradient reduce-scatters hide behind the matmuls.

Taught in chapter 28 (the plan for a v5e/v6e slice). The rule is the Scaling Book's: How to Scale
Your Model, part 5, "How to Parallelize a Transformer for Training", section "Fully-Sharded Data
Parallelism (FSDP)", https://jax-ml.github.io/scaling-book/training/. In its words, FSDP is
compute-bound "when B / X > C / W_ici, i.e. when the per-device batch size B/X exceeds the 'ICI
operational intensity' C/W_ici (4.59e14 / 1.8e11 = 2550 for v5p)", with

- `B` the batch in tokens (all sequences together: "tokens are tokens"), `X` the chips the batch
  and the weights are sharded over, so `B / X` is the tokens each chip computes per step;
- `C` the chip's peak FLOP/s (bf16);
- `W_ici` the **bidirectional** ICI bandwidth of one link ("W=2 * 9e10 for 1D data parallelism
  over ICI" on v5p: 90 GB/s each way), the bandwidth a ring all-gather runs at along one mesh
  axis. Spread over several hardware mesh axes, the collectives get that bandwidth once per axis:
  "Both FSDP and pure Data Parallelism become bandwidth bound on TPUv5 when the batch size per
  device is less than 2550 / M_X, where M_X is the number of mesh axes."

Why (the Scaling Book's derivation, per layer of two matmuls `D x F`, bf16 weights): the forward
pass does `2 * 2 * (B / X) * D * F` FLOPs per chip and all-gathers `2 * D * F` bytes of each
of the two weights; an all-gather of `V` bytes along one ring takes about `V / W_ici`. So

    T_math  = 4 * B * D * F / (X * C)
    T_comms = 4 * D * F / W_ici            (per axis spanned: divided by M_X)

and `T_math > T_comms` exactly when `B / X > C / (M_X * W_ici)`. The backward pass has twice
the FLOPs and twice the bytes (an all-gather and a reduce-scatter per weight), the same ratio.
The model size cancels: the threshold is a property of the chip alone.

The figures are the book's own (`tpuready.calc.hardware`): `C` is
`Chip.peak_bf16_flops_per_second` and `W_ici` is `Chip.ici_link_bytes_per_second` (the vendor's
per-chip ICI figure over the chip's ports, both directions summed), the same `W` that
`tpuready.calc.ici` prices a ring all-gather with (`T = V / W` on one ring). The vendor figure
makes a v5p link 200 GB/s where the Scaling Book takes 180 GB/s, so the book's v5p threshold
is 2295 tokens per chip, about 10 % under the Scaling Book's 2550 (`SCALING_BOOK_V5P_TOKENS`).

One extension, from the same ring model (`tpuready.calc.ici`), not from the training page: a mesh
axis laid on a torus dimension without its wraparound link (a line: a v5e or v6e slice whose
side is under 16 chips, `Chip.slice_wraps`) gathers through one link per end instead of two
directions of a ring, half the bandwidth, so `wraparound=False` doubles the threshold.

All this is a bandwidth bound: latency, the attention FLOPs and imperfect overlap are left out,
so a real run needs somewhat more than the threshold. The threshold is per chip: a TPU v7 chip
is two devices (two TorchTPU ranks), each computing half the chip's tokens.
"""

from __future__ import annotations

from tpuready.calc.hardware import Chip, as_chip
from tpuready.validate import InputError, number, whole_number

__all__ = [
    "SCALING_BOOK_TRAINING",
    "SCALING_BOOK_V5P_TOKENS",
    "CommBoundError",
    "fsdp_compute_bound_tokens_per_chip",
    "fsdp_is_compute_bound",
]

SCALING_BOOK_TRAINING = "https://jax-ml.github.io/scaling-book/training/"
"""How to Scale Your Model, part 5, "How to Parallelize a Transformer for Training"."""

SCALING_BOOK_V5P_TOKENS = 2550
"""The Scaling Book's own v5p threshold, from its own figures: 4.59e14 FLOP/s over 1.8e11 B/s."""


class CommBoundError(InputError):
    """A chip, token count or axis count the FSDP threshold cannot use; the message says why."""


def _checked_chip(chip: Chip | str) -> tuple[Chip, float]:
    """The chip and its per-link ICI bandwidth (both directions), after checking it has one."""
    resolved = as_chip(chip, error=CommBoundError)
    link = resolved.ici_link_bytes_per_second
    if resolved.ici_topology is None or link is None:
        raise CommBoundError(
            f"chip {resolved.name!r} has no per-link ICI bandwidth in the table (it is not a TPU "
            "on a torus, or its vendor states no per-chip ICI figure): the FSDP threshold "
            "C / W_ici needs one; pass a TPU such as 'v5e', 'v6e', 'v5p' or 'v7'"
        )
    return resolved, link


def fsdp_compute_bound_tokens_per_chip(
    chip: Chip | str, *, axes: int = 1, wraparound: bool = True
) -> float:
    """Tokens per chip per step above which FSDP is compute-bound: `C / (axes * W_ici)`.

    The Scaling Book's rule (module docstring): `C` the chip's peak bf16 FLOP/s, `W_ici` one ICI
    link's bandwidth, both directions summed (`Chip.ici_link_bytes_per_second`), `axes` the
    hardware mesh axes the FSDP dimension spans (each adds its links' bandwidth; at most the
    torus's dimensions: 2 on v5e and v6e, 3 on v5p and v7). With `wraparound=False` the axes
    are lines, not rings, and the threshold doubles. At axes=1: v5e 1970, v6e 4590, v5p 2295
    (the Scaling Book's figures give it 2550), v7 11535 tokens per chip.
    """
    resolved, link = _checked_chip(chip)
    dimensions = resolved.torus_dimensions or 1
    axes = whole_number(
        "axes",
        axes,
        fix=f"count the torus dimensions the FSDP mesh axis spans, 1 to {dimensions}",
        error=CommBoundError,
    )
    if axes > dimensions:
        raise CommBoundError(
            f"axes must be at most {dimensions}, got {axes}: a {resolved.name} slice is a "
            f"{resolved.ici_topology} of {dimensions} dimensions"
        )
    if not isinstance(wraparound, bool):
        raise CommBoundError(
            f"wraparound must be True (rings) or False (lines), got {wraparound!r}: see "
            "Chip.slice_wraps for which sides of a slice close into rings"
        )
    bandwidth = axes * link * (1.0 if wraparound else 0.5)
    return resolved.peak_bf16_flops_per_second / bandwidth


def fsdp_is_compute_bound(
    tokens_per_chip: float, chip: Chip | str, *, axes: int = 1, wraparound: bool = True
) -> bool:
    """Whether `tokens_per_chip` (the tokens one chip computes per step: the global batch in
    tokens over the chips) exceeds `fsdp_compute_bound_tokens_per_chip(chip, axes=axes)`, as
    the Scaling Book's rule asks (strictly: at the threshold compute and communication tie)."""
    tokens = number(
        "tokens_per_chip",
        tokens_per_chip,
        fix="pass the tokens one chip computes per step (global batch tokens / chips)",
        error=CommBoundError,
    )
    return tokens > fsdp_compute_bound_tokens_per_chip(chip, axes=axes, wraparound=wraparound)
