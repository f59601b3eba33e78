"""Time device work honestly: wait until the device has made the whole result.

The one timing helper of the book's notebooks: chapter 1 (`01_device_agnostic_basics`, steps 3
and 4) teaches why a clock read right after a PyTorch call measures only the launch and times
tensor creation; chapter 16 (`16_static_shapes_and_recompiles`, step 4) times one compile
against a steady-state call; chapter 21 (`21_rooflines_and_mfu`, step 3) times a
training step for its MFU; chapter 27 (`27_capstone_port_the_script`, step 7) flags the steps of a
run that took much longer than the typical one (`slow_steps`), a compile no counter saw.

How `wait_for` waits, by device:

- CUDA (and every accelerator but TorchTPU): `torch.accelerator.synchronize()` blocks until
  all queued work is done. That is enough, and it copies nothing, so the timing is the work.
- TorchTPU 0.2.0: its documentation says only that `synchronize()` waits for pending
  device-to-host copies, so it alone proves nothing; its guide says to materialise a result. A
  fusing compiler (TorchTPU's `DEFER_AND_FUSE` eager mode, XLA under `torch.compile`)
  computes only what is read, so copying one element could let it compute one element, and
  copying the whole result would time the host link as well (a 1 MiB output takes longer to
  copy than a 512-square matmul takes to compute). So `wait_for` reads one number on the host
  that depends on every element of every tensor: the sum of their sums. Computing it needs
  every element; it costs one pass over the result on the device and one 4-byte copy.
- A CPU runs each operation to completion before the call returns: `wait_for` does nothing.

Where a rehearsal on the CPU differs from a device run: the CPU pays neither the
synchronize nor the sum. On a TPU the sum's pass over the output is inside the measured time
(small beside the work that made the output, unless that work is a copy itself), and under a
fusing mode the compiler may fuse the sum into the producer so that the output is never
written to device memory.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch
from torch.utils._pytree import tree_leaves  # torch 2.13 has no public pytree module

from tpuready.validate import InputError, number, whole_number

__all__ = [
    "EMULATED_NOTE",
    "TimingError",
    "TimingResult",
    "slow_steps",
    "time_call",
    "timing_note",
    "wait_for",
]

EMULATED_NOTE = " (emulated TPU: this CPU's time, not a TPU's)"


def timing_note() -> str:
    """What to print after a device timing: nothing, or under the emulated TPU
    (`tpuready.emulator`) a note that the clock timed this CPU playing a TPU, which says
    nothing about a TPU's speed."""
    from tpuready.emulator import is_emulated

    return EMULATED_NOTE if is_emulated() else ""


class TimingError(InputError):
    """Raised for a timing request that cannot be run (a count below its minimum, no callable);
    an `InputError`, so a `ValueError`."""


def _tensors_in(result: object) -> list[torch.Tensor]:
    """Every tensor in `result`: a tensor, or tensors nested in tuples, lists, sets and
    mappings (a module's output, such as a Hugging Face `ModelOutput`); other leaves are
    ignored. PyTorch's pytree walks the containers it knows; a container it leaves whole
    (a set, a `Mapping` that is not a dict, a subclass of list or tuple) is opened here."""
    found: list[torch.Tensor] = []
    for leaf in tree_leaves(result):
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        elif isinstance(leaf, Mapping):
            found += _tensors_in(list(leaf.values()))
        elif isinstance(leaf, tuple | list | set | frozenset):
            found += _tensors_in(list(leaf))
    return found


def wait_for(result: object) -> None:
    """Return once the device has made every tensor in `result` (CPU: no-op).

    On TorchTPU, whose synchronize() is documented to wait for copies, it
    first reads on the host one number computed from every element (the sum
    of the tensors' sums); then it calls torch.accelerator.synchronize(), all
    that CUDA needs. (Chapter 1 prints this function: keep it in 79 columns.)
    """
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return  # a CPU ran every operation before the call returned
    if accelerator.type == "tpu":
        sums = [_sum_of_every_element(t) for t in _tensors_in(result)]
        if sums:
            torch.stack(sums).sum().item()  # one number read on the host
    torch.accelerator.synchronize()


def _sum_of_every_element(tensor: torch.Tensor) -> torch.Tensor:
    """One float32 number that needs every element of `tensor` (bool, int, complex too)."""
    values = tensor.detach()
    if values.is_complex():
        values = values.abs()
    return values.sum(dtype=torch.float32)


def _count(name: str, value: object, minimum: int) -> int:
    """`value` as an int if it is a whole number >= `minimum`, else a `TimingError` naming it."""
    return whole_number(
        name,
        value,
        minimum=minimum,
        fix=f"pass a count of calls, {minimum} or more",
        error=TimingError,
    )


@dataclass(frozen=True)
class TimingResult:
    """The wall-clock seconds of each timed call, in the order they ran."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, tuple) or not self.seconds:
            raise TimingError(f"seconds must be a non-empty tuple, got {self.seconds!r}")
        for index, sample in enumerate(self.seconds):
            number(
                f"seconds[{index}]",
                sample,
                fix="pass each call's measured seconds",
                allow_zero=True,
                error=TimingError,
            )

    @property
    def median(self) -> float:
        """The middle sample (mean of the two middle ones for an even count): robust to a
        stray slow call, so it describes a typical call."""
        return statistics.median(self.seconds)

    @property
    def minimum(self) -> float:
        """The fastest sample: what the hardware does when nothing else gets in the way."""
        return min(self.seconds)


def time_call(
    fn: Callable[..., Any], *args: Any, warmup: int = 1, repeats: int = 5, **kwargs: Any
) -> TimingResult:
    """Time `fn(*args, **kwargs)` `repeats` times after `warmup` untimed calls, each time
    until `wait_for` has its output (so `fn` cannot take arguments named `warmup` or
    `repeats`)."""
    if not callable(fn):
        raise TimingError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
    warmup = _count("warmup", warmup, 0)
    repeats = _count("repeats", repeats, 1)
    for _ in range(warmup):  # first calls pay one-off costs: allocation, compilation
        wait_for(fn(*args, **kwargs))
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()  # work queued before this call is not timed
    samples = []
    for _ in range(repeats):
        start = perf_counter()
        wait_for(fn(*args, **kwargs))
        samples.append(perf_counter() - start)
    return TimingResult(tuple(samples))


def slow_steps(seconds: Sequence[float], *, factor: float = 3.0) -> list[int]:
    """The indices of the steps that took more than `factor` times the median step, in order.

    A compile shows up in a training run's step times even where no counter sees it (TorchTPU's
    DEFER_AND_FUSE eager mode also compiles; its compilation cache keys on shapes, scalar values,
    dtypes and the op sequence, and whether fused eager mode keys the same way is not
    documented): the step that compiled takes many times a steady step. The median is the
    yardstick, so fewer than half the steps may be slow for the answer to mean anything; the
    first step, which pays every one-off cost, is flagged like any other. Taught in
    `notebooks/27_capstone_port_the_script.ipynb`.
    """
    if isinstance(seconds, str | bytes) or not isinstance(seconds, Sequence) or not seconds:
        raise TimingError(
            f"seconds must be a non-empty sequence of step times, got {seconds!r}: pass each "
            "step's measured seconds, in order"
        )
    times = [
        number(
            f"seconds[{index}]",
            value,
            fix="pass each step's measured seconds",
            allow_zero=True,
            error=TimingError,
        )
        for index, value in enumerate(seconds)
    ]
    factor = number("factor", factor, fix="pass a ratio above 1, such as 3.0", error=TimingError)
    if factor <= 1:
        raise TimingError(
            f"factor must be above 1, got {factor!r}: a factor of 1 or less flags typical steps; "
            "pass a ratio such as 3.0"
        )
    typical = statistics.median(times)
    return [index for index, value in enumerate(times) if value > factor * typical]
