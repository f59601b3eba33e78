"""An emulated TorchTPU on the CPU: run your code on a `tpu` device before you have a TPU.

    TPUREADY_EMULATE_TPU=1 python train.py
    python -m tpuready.emulator train.py    # the same, also where TorchTPU is installed

With the variable set, `import torch` loads this emulator through PyTorch's backend autoload
(the `torch.backends` entry point of the `tpuready` package), as it loads TorchTPU on a TPU VM:
`torch.accelerator.current_accelerator()` is `tpu`, and every operator on a `tpu` tensor runs on
the CPU, over memory the emulator owns. It emulates what the book's reference notes on TorchTPU
0.2.0 document (`shared/reference/torchtpu-0.2.0.md`) and nothing more: the refused CUDA-style
calls, one device per process, float32 matmuls as bf16 passes, bfloat16 autocast, the patched
`torch.compile`, `tpu_dist` and the launch rules. It never tells you a TPU's speed, memory,
compile time or numerics beyond the matmul passes. The reference page "The emulated TPU" lists
each behaviour with its line in the notes; `report()` says what would hurt on a real chip.

Taught in chapter 2 ("Rehearse your port on an emulated TPU"); CI runs every notebook on it.
"""

from __future__ import annotations

import os
import sys

from tpuready.emulator.host import ENVIRONMENT_VARIABLE, Host

__all__ = [
    "DEVICE_NAME",
    "ENVIRONMENT_VARIABLE",
    "Host",
    "emulated_host",
    "install_host",
    "is_emulated",
    "load",
    "memory_allocated",
    "report",
]

DEVICE_NAME = "Emulated TPU (CPU)"
_LOADED: Host | None = None


def is_emulated() -> bool:
    """True when this process's `tpu` device is the emulator (never on a real TPU)."""
    return _LOADED is not None


def emulated_host() -> Host | None:
    """The host the emulator pretends to be in this process, or None when it is not loaded."""
    return _LOADED


def report():
    """What would hurt on a real TPU so far: see `tpuready.emulator.findings.EmulationReport`."""
    from tpuready.emulator.findings import report as current

    return current()


def memory_allocated(index: int | None = None) -> int:
    """Bytes the emulated device holds now (all devices, or `index`'s): the CPU memory behind
    live `tpu` storages. FSDP2's reshard frees unsharded parameters, and this count drops."""
    from tpuready.emulator.memory import allocated_bytes

    return allocated_bytes(index)


def _other_backend() -> str | None:
    """The name of another `PrivateUse1` backend present here (TorchTPU first), if any."""
    import torch

    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        return f"the {name!r} backend is already loaded"
    from importlib.metadata import entry_points

    others = [
        e.name for e in entry_points(group="torch.backends") if e.value.split(":")[0] != __name__
    ]
    if others:
        return f"another torch backend is installed ({', '.join(sorted(others))})"
    return None


def load() -> None:
    """The `torch.backends` entry point: install the emulator when TPUREADY_EMULATE_TPU asks."""
    from tpuready.emulator.host import host_from_environment

    host = host_from_environment()
    if host is None or _LOADED is not None:
        return
    other = _other_backend()
    if other is not None:
        print(
            f"tpuready: {ENVIRONMENT_VARIABLE}={os.environ[ENVIRONMENT_VARIABLE]} is ignored: "
            f"{other}; to rehearse here anyway, run the script with "
            "`python -m tpuready.emulator script.py`",
            file=sys.stderr,
        )
        return
    install_host(host)


def install_host(host: Host) -> None:
    """Install the emulated TPU for `host` now (`load` does it from the environment; the
    `python -m tpuready.emulator` launcher does it before the script it runs)."""
    global _LOADED
    from tpuready.emulator import install

    install.install(host)
    _LOADED = host
