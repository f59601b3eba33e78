"""`torch.tpu` under the emulator: TorchTPU 0.2.0's public surface, as its reference notes list it.

On the TorchTPU host model the CUDA-style device calls (`is_available`, `device_count`,
`current_device`, `set_device`, `device`, `set_stream`, `current_stream`, `synchronize`,
`initial_seed`, `get_rng_state`) raise a RuntimeError naming the `torch.accelerator`
replacement, as TorchTPU 0.2.0 does when they are called from user code;
`TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1` turns the error into a one-time warning. torch's own
modules count as the backend's side: `torch.accelerator.device_count()`, the portable call the
notes recommend, itself calls `torch.tpu.device_count()`. (Whether TorchTPU also lets
`torch.serialization` or `torch.utils.checkpoint` through is not documented; here they pass.)
On the multi-device host model they work, as `torch.cuda`'s do.

What TorchTPU has and a CPU cannot model (its ops, optimizers, Pallas) raises
`NotImplementedError` saying so, rather than pretending; its profiler configuration adds
nothing to torch.profiler's CPU trace.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tpuready.accelerator_api import TORCH_TPU_REFUSED_CALLS, equivalent_for
from tpuready.emulator.findings import place_in_user_code, report
from tpuready.emulator.host import TORCHTPU
from tpuready.emulator.state import PASSES_FOR_PRECISION, state

__all__ = ["DEVICE_NAME", "LEGACY_CALLS", "build_module"]

DEVICE_NAME = "Emulated TPU (CPU)"
ALLOW_LEGACY_VARIABLE = "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"


def _portable_spelling(name: str) -> str:
    """What the error for the refused `torch.tpu.<name>` names instead: the book's table's
    replacement, but for `get_rng_state`, whose replacement there (the device module's) is
    this same refused call on TorchTPU."""
    if name == "get_rng_state":
        return (
            "torch.get_rng_state() for the CPU's generator, or a torch.Generator() of your own "
            "(its get_state() works on any host)"
        )
    entry = equivalent_for(name)
    if entry is None:
        raise KeyError(f"tpuready.accelerator_api has no replacement for torch.cuda.{name}")
    return entry.replacement


# Each call TorchTPU refuses (the book's list in tpuready.accelerator_api) and what to use.
LEGACY_CALLS: dict[str, str] = {
    name: _portable_spelling(name) for name in sorted(TORCH_TPU_REFUSED_CALLS)
}
_EMULATOR_DIR = str(Path(__file__).parent)
_TORCH_DIR = str(Path(torch.__file__).parent)
_warned: set[str] = set()


def _refuse_legacy(name: str) -> None:
    """Raise (or warn once, with TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1) for a legacy call."""
    frame: types.FrameType | None = sys._getframe(2)
    while (frame is not None and frame.f_code.co_filename.startswith(_EMULATOR_DIR)) or (
        frame is not None and frame.f_code.co_filename.endswith("contextlib.py")
    ):
        frame = frame.f_back
    caller = frame.f_code.co_filename if frame is not None else ""
    if state().host.model != TORCHTPU or caller.startswith(_TORCH_DIR):
        return
    message = (
        f"torch.tpu.{name}() is a CUDA-style device call that TorchTPU 0.2.0 refuses: use "
        f"{LEGACY_CALLS[name]} (set {ALLOW_LEGACY_VARIABLE}=1 to allow it with a warning)"
    )
    if os.environ.get(ALLOW_LEGACY_VARIABLE) == "1":
        if name not in _warned:
            _warned.add(name)
            warnings.warn(message, UserWarning, stacklevel=3)
        return
    report().record("refused", f"torch.tpu.{name}()", place_in_user_code(frame))
    raise RuntimeError(message)


class EagerMode(enum.Enum):
    """TorchTPU's eager modes; the emulator runs every one op by op, as DEFER_NEVER does."""

    DEFER_NEVER = "DEFER_NEVER"
    DEFER_AND_FUSE = "DEFER_AND_FUSE"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"


class Precision(enum.Enum):
    """Float32 matmul precision: bf16 passes per matmul (DEFAULT 1, HIGH 3, HIGHEST 6)."""

    DEFAULT = 1
    HIGH = 3
    HIGHEST = 6


class _DeviceProperties(types.SimpleNamespace):
    """What `get_device_properties` gives: a name and the memory; no peak FLOP/s, by design."""


def _not_emulated(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{what} is part of TorchTPU that the emulated TPU does not model (it runs "
            "nothing of a TPU's): run it on a TPU, or leave it out of the CPU rehearsal"
        )

    return refuse


class _NotEmulatedModule(types.ModuleType):
    """A submodule whose every attribute is a function that says it is not emulated."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _not_emulated(f"{self.__name__}.{name}")


def build_module() -> types.ModuleType:
    """The `torch.tpu` module the emulator registers."""
    module = types.ModuleType("torch.tpu", __doc__)
    host_state = state()

    # --- legacy device calls: refused under TorchTPU, CUDA-like on a multi-device host ----
    def is_available() -> bool:
        _refuse_legacy("is_available")
        return True

    def device_count() -> int:
        _refuse_legacy("device_count")
        return host_state.device_count

    def current_device() -> int:
        """0, the index every emulated tensor reports: torch's own modules (FSDP2, DeviceMesh,
        DTensor) build `tpu:<current_device()>` and compare it with tensors' devices. The
        index a rank bound is `torch.accelerator.current_device_index()`."""
        _refuse_legacy("current_device")
        return 0

    def set_device(device: int | str | torch.device) -> None:
        _refuse_legacy("set_device")
        # The emulator's own set_device: it applies the host's rules.
        set_device_index(_index_of(device))  # tpuready: ignore[set-device-index]

    @contextlib.contextmanager
    def device(index: int | str | torch.device | None) -> Iterator[None]:
        _refuse_legacy("device")
        previous = host_state.current_index
        if index is not None:
            set_device_index(_index_of(index))  # tpuready: ignore[set-device-index]
        try:
            yield
        finally:
            host_state.current_index = previous

    def set_stream(stream: Any) -> None:
        _refuse_legacy("set_stream")

    def current_stream(device: Any = None) -> Any:
        _refuse_legacy("current_stream")
        return torch.accelerator.current_stream()

    def synchronize(device: Any = None) -> None:
        _refuse_legacy("synchronize")

    def initial_seed() -> int:
        _refuse_legacy("initial_seed")
        return host_state.generator.initial_seed()

    def get_rng_state(device: Any = "tpu") -> torch.Tensor:
        _refuse_legacy("get_rng_state")
        return host_state.generator.get_state()

    # --- the documented surface ----------------------------------------------------------
    def is_initialized() -> bool:
        return host_state.initialized

    def _is_in_bad_fork() -> bool:
        return False

    def _lazy_init() -> None:
        host_state.initialized = True

    def get_device_name(device: Any = None) -> str:
        return DEVICE_NAME

    def get_device_properties(device: Any = None) -> _DeviceProperties:
        from tpuready.emulator import memory

        return _DeviceProperties(name=DEVICE_NAME, total_memory=memory.host_memory_bytes())

    def manual_seed(seed: int) -> None:
        host_state.generator.manual_seed(int(seed))

    def manual_seed_all(seed: int) -> None:
        host_state.generator.manual_seed(int(seed))

    def seed() -> None:
        host_state.generator.seed()

    def seed_all() -> None:
        host_state.generator.seed()

    def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
        host_state.generator.set_state(new_state)

    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    def set_eager_mode(mode: EagerMode) -> None:
        if not isinstance(mode, EagerMode):
            raise TypeError(f"mode must be a torch.tpu.EagerMode, got {mode!r}")
        host_state.eager_mode = mode.value

    @contextlib.contextmanager
    def eager_mode(mode: EagerMode) -> Iterator[None]:
        previous = host_state.eager_mode
        set_eager_mode(mode)
        try:
            yield
        finally:
            host_state.eager_mode = previous

    @contextlib.contextmanager
    def precision(level: Precision) -> Iterator[None]:
        if not isinstance(level, Precision):
            raise TypeError(f"level must be a torch.tpu.Precision, got {level!r}")
        stack = host_state.local.__dict__.setdefault("precision_stack", [])
        stack.append(level.value)
        try:
            yield
        finally:
            stack.pop()

    def allow_excess_precision(allowed: bool = True) -> None:
        return None

    @contextlib.contextmanager
    def stream(stream_: Any) -> Iterator[None]:
        yield

    def default_stream(device: Any = None) -> torch.Stream:
        return torch.accelerator.current_stream()

    # --- torch.tpu.distributed, torch.tpu.compiler --------------------------------------
    from tpuready.emulator import distributed

    distributed_module = types.ModuleType("torch.tpu.distributed", distributed.__doc__)
    # vars(...).update: a module built here declares no attributes for the type checker
    vars(distributed_module).update(
        set_tpu_launch_env=distributed.set_tpu_launch_env,
        topology_aware_mesh=distributed.topology_aware_mesh,
        spmd_safe=distributed.spmd_safe,
    )
    compiler_module = types.ModuleType("torch.tpu.compiler")

    @contextlib.contextmanager
    def custom_compiler_options(options: dict[str, Any]) -> Iterator[None]:
        if not isinstance(options, dict):
            raise TypeError(f"options must be a dict, got {options!r}")
        yield

    vars(compiler_module).update(custom_compiler_options=custom_compiler_options)

    for name, value in dict(locals()).items():
        if callable(value) and not name.startswith("__") and name not in ("module",):
            setattr(module, name, value)
    vars(module).update(
        EagerMode=EagerMode,
        Precision=Precision,
        Stream=torch.Stream,  # one stream per device: the emulator runs ops in order
        Event=torch.Event,
        distributed=distributed_module,
        compiler=compiler_module,
    )
    for name in ("ops", "optimizers", "pallas"):
        setattr(module, name, _NotEmulatedModule(f"torch.tpu.{name}"))
    profiler_module = types.ModuleType("torch.tpu.profiler")

    def TpuProfilerConfig(**options: Any) -> Any:
        """The emulator has no device timeline to add: a default experimental config, so that
        torch.profiler records what it records on the CPU (the emulator's operators)."""
        return torch._C._profiler._ExperimentalConfig()

    vars(profiler_module).update(TpuProfilerConfig=TpuProfilerConfig)
    vars(module).update(profiler=profiler_module, is_emulated=True)
    # `from torch.tpu.distributed import set_tpu_launch_env` works as it does on TorchTPU.
    module.__path__ = []
    for name in ("distributed", "compiler", "profiler", "ops", "optimizers", "pallas"):
        sys.modules[f"torch.tpu.{name}"] = getattr(module, name)
    return module


def _index_of(device: int | str | torch.device) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = torch.device(device)
    if parsed.type != "tpu":
        raise ValueError(f"expected a tpu device or index, got {device!r}")
    return parsed.index or 0


def set_device_index(index: int) -> None:
    """`torch.accelerator.set_device_index` on the emulated TPU."""
    host_state = state()
    if host_state.host.model == TORCHTPU:
        if index != 0:
            report().record("refused", f"set_device({index})")
            raise RuntimeError(
                f"TorchTPU shows each process one device, tpu:0: set_device({index}) is refused. "
                "Start one process per device (torchrun, tpuready.runtime.launch.run_workers) "
                "and keep every rank on tpu:0"
            )
        return
    host_state.check_index(index)
    host_state.claim(index)
    host_state.current_index = index
    host_state.initialized = True


def set_float32_matmul_precision(original: Any) -> Any:
    """Wrap torch's setter: TorchTPU remaps its levels to bf16 passes (high = 3, highest = 6)."""

    def remapped(precision: str) -> None:
        original(precision)
        state().passes = PASSES_FOR_PRECISION[precision]

    remapped.__doc__ = original.__doc__
    remapped.__wrapped__ = original  # type: ignore[attr-defined]  # read by inspect.unwrap
    return remapped
