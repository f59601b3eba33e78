"""The map from CUDA-only calls to their device-agnostic `torch.accelerator` equivalents.

One table serves the book twice: chapter 1 (`notebooks/01_device_agnostic_basics.ipynb`)
renders it for the reader, and the source audit suggests its replacements.
Facts about TorchTPU come from its 0.2.0 wheel (see the book's setup page).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CUDA_TO_ACCELERATOR",
    "TORCH_TPU_REFUSED_CALLS",
    "AcceleratorEquivalent",
    "equivalent_for",
    "markdown_table",
]

# In TorchTPU 0.2.0 these `torch.tpu.<name>` calls raise a RuntimeError from user code
# (TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1 turns the error into a one-time warning).
# `initial_seed` and `get_rng_state` are refused on torch >= 2.13.
TORCH_TPU_REFUSED_CALLS: frozenset[str] = frozenset(
    {
        "is_available",
        "device_count",
        "current_device",
        "set_device",
        "device",
        "set_stream",
        "current_stream",
        "synchronize",
        "initial_seed",
        "get_rng_state",
    }
)


@dataclass(frozen=True)
class AcceleratorEquivalent:
    """One CUDA-only call and the spelling that works on every accelerator."""

    cuda_call: str
    replacement: str
    note: str = ""

    @property
    def name(self) -> str:
        """The attribute name under `torch.cuda`, e.g. `synchronize`."""
        return self.cuda_call.removeprefix("torch.cuda.").split("(")[0].split(".")[0]

    @property
    def refused_by_torch_tpu(self) -> bool:
        """True when `torch.tpu.<name>` raises in TorchTPU 0.2.0 instead of working."""
        return self.name in TORCH_TPU_REFUSED_CALLS


CUDA_TO_ACCELERATOR: tuple[AcceleratorEquivalent, ...] = (
    AcceleratorEquivalent(
        "torch.cuda.is_available()",
        "torch.accelerator.is_available()",
        "False on a CPU-only machine",
    ),
    AcceleratorEquivalent("torch.cuda.device_count()", "torch.accelerator.device_count()"),
    AcceleratorEquivalent(
        "torch.cuda.current_device()", "torch.accelerator.current_device_index()"
    ),
    AcceleratorEquivalent(
        "torch.cuda.set_device(i)",
        "torch.accelerator.set_device_index(i)",
        "TorchTPU runs one process per device: every rank sees its device as index 0",
    ),
    AcceleratorEquivalent(
        "torch.cuda.device(i)", "torch.accelerator.device_index(i)", "a context manager"
    ),
    AcceleratorEquivalent("torch.cuda.synchronize()", "torch.accelerator.synchronize()"),
    AcceleratorEquivalent("torch.cuda.current_stream()", "torch.accelerator.current_stream()"),
    AcceleratorEquivalent("torch.cuda.set_stream(s)", "torch.accelerator.set_stream(s)"),
    AcceleratorEquivalent(
        "torch.cuda.Stream()", "torch.Stream(device=device)", "generic stream class"
    ),
    AcceleratorEquivalent(
        "torch.cuda.Event()", "torch.Event(device=device)", "generic event class"
    ),
    AcceleratorEquivalent(
        "torch.cuda.manual_seed(s)", "torch.manual_seed(s)", "seeds the CPU and every device"
    ),
    AcceleratorEquivalent("torch.cuda.manual_seed_all(s)", "torch.manual_seed(s)"),
    AcceleratorEquivalent("torch.cuda.initial_seed()", "torch.initial_seed()"),
    AcceleratorEquivalent(
        "torch.cuda.get_rng_state()",
        "torch.get_rng_state()",
        "or torch.random.fork_rng(device_type=device.type) around the code",
    ),
    AcceleratorEquivalent("torch.cuda.empty_cache()", "torch.accelerator.empty_cache()"),
    AcceleratorEquivalent("torch.cuda.memory_allocated()", "torch.accelerator.memory_allocated()"),
    AcceleratorEquivalent(
        "torch.cuda.max_memory_allocated()", "torch.accelerator.max_memory_allocated()"
    ),
    AcceleratorEquivalent(
        "torch.cuda.reset_peak_memory_stats()", "torch.accelerator.reset_peak_memory_stats()"
    ),
    AcceleratorEquivalent("torch.cuda.memory_stats()", "torch.accelerator.memory_stats()"),
    AcceleratorEquivalent("torch.cuda.memory_reserved()", "torch.accelerator.memory_reserved()"),
    AcceleratorEquivalent(
        "torch.cuda.max_memory_reserved()", "torch.accelerator.max_memory_reserved()"
    ),
    AcceleratorEquivalent(
        "torch.cuda.reset_accumulated_memory_stats()",
        "torch.accelerator.reset_accumulated_memory_stats()",
    ),
    AcceleratorEquivalent(
        "torch.cuda.mem_get_info()", "torch.accelerator.get_memory_info()", "(free, total) bytes"
    ),
    AcceleratorEquivalent(
        "torch.cuda.OutOfMemoryError", "torch.OutOfMemoryError", "raised by every backend"
    ),
    AcceleratorEquivalent(
        "torch.cuda.get_device_capability()", "torch.accelerator.get_device_capability()"
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.autocast()",
        "torch.amp.autocast(device_type=device.type, dtype=torch.bfloat16)",
        "torch.cuda.amp is deprecated; on TorchTPU autocast defaults to bfloat16",
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.custom_fwd", "torch.amp.custom_fwd(device_type=device.type)"
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.custom_bwd", "torch.amp.custom_bwd(device_type=device.type)"
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.GradScaler()",
        "torch.amp.GradScaler(device.type)",
        "bfloat16 needs no loss scaling",
    ),
)

_BY_NAME: dict[str, AcceleratorEquivalent] = {}
for _entry in CUDA_TO_ACCELERATOR:
    _key = _entry.cuda_call.removeprefix("torch.cuda.").split("(")[0]
    _BY_NAME[_key] = _entry


def equivalent_for(cuda_attribute: str) -> AcceleratorEquivalent | None:
    """Return the entry for `torch.cuda.<cuda_attribute>` (e.g. "synchronize" or
    "amp.autocast"), or None when the table has no portable replacement for it."""
    if not isinstance(cuda_attribute, str) or not cuda_attribute:
        raise ValueError(
            f"cuda_attribute must be a non-empty name such as 'synchronize', got {cuda_attribute!r}"
        )
    return _BY_NAME.get(cuda_attribute.removeprefix("torch.cuda."))


def markdown_table() -> str:
    """The table as Markdown, with a column marking the calls TorchTPU 0.2.0 refuses."""
    lines = [
        "| CUDA-only call | Device-agnostic call | `torch.tpu.<same>` in TorchTPU 0.2.0 | Note |",
        "|---|---|---|---|",
    ]
    for entry in CUDA_TO_ACCELERATOR:
        refused = "raises RuntimeError" if entry.refused_by_torch_tpu else ""
        lines.append(f"| `{entry.cuda_call}` | `{entry.replacement}` | {refused} | {entry.note} |")
    return "\n".join(lines)
