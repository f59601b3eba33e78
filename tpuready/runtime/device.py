"""One device variable and one seed: the two lines every chapter starts with.

Taught in `notebooks/01_device_agnostic_basics.ipynb`; later chapters call these so
that the choice is made the same way everywhere.
"""

from __future__ import annotations

import random

import torch

__all__ = ["choose_device", "compile_backend_for", "seed_everything"]


def choose_device() -> torch.device:
    """The accelerator this process may use (CUDA, MPS, XPU, TorchTPU's `tpu`, ...), else CPU.

    `torch.accelerator.current_accelerator(check_available=True)` returns None on a
    CPU-only machine, so the CPU is the explicit fallback.
    """
    return torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")


def compile_backend_for(device: torch.device) -> str | None:
    """The `torch.compile` backend the book counts graphs with on `device` (chapters 10, 11, 16, 17,
    19 and 20).

    "aot_eager" on a CPU and on CUDA: it captures the same graphs as any backend without
    generating code, so counting is cheap. None on a TPU, meaning torch.compile's own default,
    as if no `backend=` were written: TorchTPU's "tpu" backend, the one whose compiles the
    counts stand for there (it refuses `backend="inductor"` for TPU tensors).
    """
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device, got {device!r}")
    return None if device.type == "tpu" else "aot_eager"


def seed_everything(seed: int = 0) -> None:
    """Seed Python's and torch's generators (CPU and every device) in one place."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every accelerator's generator
