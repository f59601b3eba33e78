"""Time device work honestly: wait for a result by copying all of it to the host.

The one timing helper of the book's notebooks: chapter 1 (`01_device_agnostic_basics`, steps 3
and 4) teaches why a clock read right after a PyTorch call measures only the launch and times
tensor creation; chapter 11 (`11_static_shapes_and_recompiles`, step 4) times one compile
against a steady-state call; chapter 15 (`15_rooflines_mfu_and_profiling`, steps 2 and 4)
times the peak matmul and a training step for its MFU.

Why a copy, and why of the whole result:

- TorchTPU 0.2.0's `torch.accelerator.synchronize()` waits only for pending device-to-host
  copies, not for queued computation, so it alone proves nothing on a TPU. Copying a result to
  the host (`.cpu()`) waits for the work that produces it on TorchTPU and CUDA alike.
  `wait_for` still calls `synchronize()` as well: on CUDA it also waits for work on other
  streams, and on TorchTPU it waits for copies already queued.
- A fusing compiler (TorchTPU's `DEFER_AND_FUSE` eager mode, XLA under `torch.compile`)
  computes only what is read. Copying one element (`result.flatten()[:1].cpu()`) may let it
  compute one element. A reduction read on the host (`result.sum().item()`) needs every
  element, but it changes the program being timed: the compiler can fuse the sum into the
  producer, so the output is never written to device memory (its write goes uncounted) and the
  sum's own work is counted instead. Copying the full result times exactly the program that
  produces the full output, plus one copy.

Where a CPU rehearsal differs from a device run:

- On a CPU each operation finishes before the call returns, so `wait_for` does nothing (it
  copies nothing and synchronizes nothing) and the time is the work alone.
- On an accelerator the host copy is inside the measured time: the output's bytes over the
  link between device and host, which the CPU rehearsal never pays. Time enough work that the
  copy is small beside it, for example a whole training step that returns its loss rather than
  one small kernel that returns a large tensor; otherwise the device timing over-counts by the
  copy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

__all__ = ["TimingError", "TimingResult", "time_call", "wait_for"]


class TimingError(ValueError):
    """Raised for a timing request that cannot be run (a count below its minimum, no callable)."""


def _tensors_in(result: object) -> list[torch.Tensor]:
    """Every tensor in `result`: a tensor, or tensors nested in tuples, lists, sets and
    mappings (a module's output, such as a Hugging Face `ModelOutput`); other leaves are
    ignored."""
    found: list[torch.Tensor] = []
    pending = [result]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, tuple | list | set | frozenset):
            pending.extend(item)
    return found


def wait_for(result: object) -> None:
    """Return once the device has made every tensor in `result` (CPU: no-op).

    On an accelerator it copies each tensor to the host in full, then calls
    `torch.accelerator.synchronize()`: the module docstring says why both,
    and why the whole tensor. (Chapter 1 prints this function: keep it within
    79 columns.)
    """
    if not torch.accelerator.is_available():
        return  # a CPU ran every operation before the call returned
    for tensor in _tensors_in(result):
        tensor.detach().cpu()
    torch.accelerator.synchronize()


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TimingError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise TimingError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class TimingResult:
    """The wall-clock seconds of each timed call, in the order they ran."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, tuple) or not self.seconds:
            raise TimingError(f"seconds must be a non-empty tuple, got {self.seconds!r}")
        for sample in self.seconds:
            if isinstance(sample, bool) or not isinstance(sample, int | float):
                raise TimingError(f"every sample must be a number of seconds, got {sample!r}")
            if not math.isfinite(sample) or sample < 0:
                raise TimingError(f"every sample must be finite and >= 0, got {sample!r}")

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
