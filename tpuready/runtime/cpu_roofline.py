"""Measure this CPU's roofline: its peak float32 FLOP/s and its memory bandwidth.

Taught in `notebooks/reference_measuring_this_cpu.ipynb` ("Measuring this CPU"), which writes
the same two measurements out cell by cell; chapter 21 (`21_rooflines_and_mfu`) calls
`measure_cpu_roofline` for this CPU's line among the chips' rooflines and the peak of its MFU,
and chapter 22 (`22_profile_a_training_step`) calls `measure_peak_flops_per_second` for the
peak its profiled matmuls are held to.

The peak is the best of a few runs of a large float32 matmul (its intensity is far above any
CPU's ridge point, so it runs near peak); the bandwidth the best of a few runs of a large add
(far below it, so it runs at memory speed). The best, not the median: other programs on a shared
machine can only slow a run down. The tensors live on the CPU whatever device a notebook
chose, and the figures are those of the threads torch uses (one under the book's Makefile).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from tpuready.calc.roofline import Roofline
from tpuready.runtime.timing import TimingError
from tpuready.validate import whole_number

__all__ = [
    "best_seconds",
    "measure_bytes_per_second",
    "measure_cpu_roofline",
    "measure_peak_flops_per_second",
]


def _count(name: str, value: object, fix: str) -> int:
    return whole_number(name, value, minimum=1, fix=fix, error=TimingError)


def best_seconds(run: Callable[[], object], num_repeats: int) -> float:
    """The shortest of `num_repeats` wall-clock timings of `run()`."""
    if not callable(run):
        raise TimingError(f"run must be callable, got {run!r} ({type(run).__name__})")
    num_repeats = _count("num_repeats", num_repeats, "pass a count of runs, 1 or more")
    timings = []
    for _ in range(num_repeats):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return min(timings)


def measure_peak_flops_per_second(side: int = 1024, num_repeats: int = 10) -> float:
    """This CPU's float32 matmul FLOP/s: the best of `num_repeats` products of side `side`."""
    side = _count("side", side, "pass the side of the square matmul, such as 1024")
    left, right = torch.randn(side, side), torch.randn(side, side)
    product = torch.empty(side, side)
    torch.mm(left, right, out=product)  # warm-up
    seconds = best_seconds(lambda: torch.mm(left, right, out=product), num_repeats)
    return 2 * side**3 / seconds


def measure_bytes_per_second(num_elements: int = 2**25, num_repeats: int = 5) -> float:
    """This CPU's memory bandwidth: the best of `num_repeats` float32 adds of `num_elements`."""
    num_elements = _count("num_elements", num_elements, "pass a count of elements, such as 2**25")
    first, second = torch.randn(num_elements), torch.randn(num_elements)
    total = torch.empty(num_elements)
    torch.add(first, second, out=total)  # warm-up
    seconds = best_seconds(lambda: torch.add(first, second, out=total), num_repeats)
    return 3 * 4 * num_elements / seconds  # reads two float32 tensors, writes one


def measure_cpu_roofline(name: str = "this CPU") -> Roofline:
    """This CPU's roofline: the measured float32 matmul peak and add bandwidth, named `name`."""
    return Roofline(name, measure_peak_flops_per_second(), measure_bytes_per_second())
