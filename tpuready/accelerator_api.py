"""The map from CUDA-only calls to their device-agnostic `torch.accelerator` equivalents.

One table serves the book twice: chapter 2
(`notebooks/02_train_save_and_audit_on_any_device.ipynb`) renders it for the reader, and the
source audit suggests its replacements.
For every call the table also says what the same name under `torch.tpu` is in TorchTPU 0.2.0:
refused with a RuntimeError, in its public API, or not in its public API (where nothing more is
known, the table says so rather than leave a blank). Facts about TorchTPU come from its 0.2.0
wheel (see the book's setup page); facts about torch are those of torch 2.13, checked by
`tests/test_accelerator_api.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CUDA_TO_ACCELERATOR",
    "NOT_PUBLIC",
    "PUBLIC",
    "RAISES",
    "TORCH_TPU_PUBLIC_NAMES",
    "TORCH_TPU_REFUSED_CALLS",
    "TORCH_TPU_REFUSED_FROM_TORCH_2_13",
    "AcceleratorEquivalent",
    "equivalent_for",
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
TORCH_TPU_REFUSED_FROM_TORCH_2_13: frozenset[str] = frozenset({"initial_seed", "get_rng_state"})

# The public names of `torch.tpu` in TorchTPU 0.2.0, as read from its wheel (the book's
# reference notes): a name in neither set is not in 0.2.0's public API.
TORCH_TPU_PUBLIC_NAMES: frozenset[str] = frozenset(
    {
        "EagerMode",
        "eager_mode",
        "set_eager_mode",
        "Precision",
        "precision",
        "allow_excess_precision",
        "get_device_name",
        "get_device_properties",
        "manual_seed",
        "manual_seed_all",
        "set_rng_state",
        "get_amp_supported_dtype",
        "Stream",
        "Event",
        "stream",
        "default_stream",
        "is_initialized",
        "compiler",
        "distributed",
        "ops",
        "optimizers",
        "pallas",
        "profiler",
    }
)

# The three things the table can say about `torch.tpu.<same name>`.
RAISES = "raises RuntimeError"
PUBLIC = "in 0.2.0's public API"
NOT_PUBLIC = "not in 0.2.0's public API"

_MEMORY_NOTE = (
    "needs the backend's allocator statistics; whether TorchTPU 0.2.0 provides them is not "
    "recorded (its public `torch.tpu.get_device_properties` gives `total_memory`)"
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

    @property
    def torch_tpu_status(self) -> str:
        """What `torch.tpu.<name>` is in TorchTPU 0.2.0: refused, public, or not public."""
        if self.refused_by_torch_tpu:
            if self.name in TORCH_TPU_REFUSED_FROM_TORCH_2_13:
                return f"{RAISES} (on torch >= 2.13)"
            return RAISES
        return PUBLIC if self.name in TORCH_TPU_PUBLIC_NAMES else NOT_PUBLIC


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
        "torch.cuda.manual_seed(s)",
        "torch.manual_seed(s)",
        "seeds the CPU and every device; `torch.cuda.manual_seed` seeds the current GPU only",
    ),
    AcceleratorEquivalent(
        "torch.cuda.manual_seed_all(s)", "torch.manual_seed(s)", "also seeds the CPU"
    ),
    AcceleratorEquivalent(
        "torch.cuda.initial_seed()",
        "torch.initial_seed()",
        "the CPU generator's seed, which equals every device's after `torch.manual_seed(s)`",
    ),
    AcceleratorEquivalent(
        "torch.cuda.get_rng_state()",
        "torch.get_device_module(device).get_rng_state()",
        "the device's generator (`torch.get_rng_state()` is the CPU's); `torch.cpu` has no "
        "`get_rng_state`, so on a CPU call `torch.get_rng_state()`. On TorchTPU 0.2.0 with "
        "torch >= 2.13 the device's module is `torch.tpu`, whose `get_rng_state` raises. "
        "To restore random state around a block on every device, fork the CPU generator "
        'alone with `torch.random.fork_rng(devices=[])` (with `device_type="cpu"` torch '
        "2.13 raises AttributeError), or pass the random calls a `torch.Generator()` of "
        "their own, whose `get_state()` works on any host; reseed the device's generator "
        "with `torch.manual_seed(s)` for what must draw on the device",
    ),
    AcceleratorEquivalent(
        "torch.cuda.empty_cache()", "torch.accelerator.empty_cache()", _MEMORY_NOTE
    ),
    AcceleratorEquivalent(
        "torch.cuda.memory_allocated()", "torch.accelerator.memory_allocated()", _MEMORY_NOTE
    ),
    AcceleratorEquivalent(
        "torch.cuda.max_memory_allocated()",
        "torch.accelerator.max_memory_allocated()",
        _MEMORY_NOTE,
    ),
    AcceleratorEquivalent(
        "torch.cuda.reset_peak_memory_stats()",
        "torch.accelerator.reset_peak_memory_stats()",
        _MEMORY_NOTE,
    ),
    AcceleratorEquivalent(
        "torch.cuda.memory_stats()", "torch.accelerator.memory_stats()", _MEMORY_NOTE
    ),
    AcceleratorEquivalent(
        "torch.cuda.memory_reserved()", "torch.accelerator.memory_reserved()", _MEMORY_NOTE
    ),
    AcceleratorEquivalent(
        "torch.cuda.max_memory_reserved()",
        "torch.accelerator.max_memory_reserved()",
        _MEMORY_NOTE,
    ),
    AcceleratorEquivalent(
        "torch.cuda.reset_accumulated_memory_stats()",
        "torch.accelerator.reset_accumulated_memory_stats()",
        _MEMORY_NOTE,
    ),
    AcceleratorEquivalent(
        "torch.cuda.mem_get_info()",
        "torch.accelerator.get_memory_info()",
        "(free, total) bytes; " + _MEMORY_NOTE,
    ),
    AcceleratorEquivalent(
        "torch.cuda.OutOfMemoryError",
        "torch.OutOfMemoryError",
        "`torch.cuda.OutOfMemoryError` is this same class; which error TorchTPU 0.2.0 raises "
        "when HBM runs out is not recorded",
    ),
    AcceleratorEquivalent(
        "torch.cuda.get_device_capability()",
        "torch.accelerator.get_device_capability()",
        "in torch 2.13 it returns a dict (`supported_dtypes`), not CUDA's (major, minor); no "
        "portable call gives a compute capability. TorchTPU 0.2.0 has "
        "`torch.tpu.get_device_properties` (name, total_memory)",
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.autocast()",
        "torch.amp.autocast(device_type=device.type)",
        "`torch.cuda.amp` is deprecated; each device keeps its default, float16 on CUDA as "
        "before and bfloat16 on TorchTPU, which is what --fix writes and what the GradScaler "
        "advice assumes",
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.custom_fwd", "torch.amp.custom_fwd(device_type=device.type)"
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.custom_bwd", "torch.amp.custom_bwd(device_type=device.type)"
    ),
    AcceleratorEquivalent(
        "torch.cuda.amp.GradScaler()",
        'torch.amp.GradScaler(device.type, enabled=device.type == "cuda")',
        "loss scaling is for float16 autocast, CUDA's default; a TPU autocasts to bfloat16, "
        "which needs none, and an enabled scaler there needs loss-scaling kernels that torch "
        "2.13 has no generic fallback for",
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
