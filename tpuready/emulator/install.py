"""Install the emulated TPU in this process: what `tpuready.emulator.load` does once.

The order matters (torch's own helper for Python backends says so): rename `PrivateUse1` to
`tpu`, register the device module, the hooks and the device guard, then the kernels.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from tpuready.emulator import compile as emulated_compile
from tpuready.emulator import device_module, distributed, findings, kernels, memory, state
from tpuready.emulator.host import Host

__all__ = ["install"]


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """What PyTorch asks a backend: built, available, has a context."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def _accelerator_calls() -> None:
    """Route torch.accelerator's device-index calls through the emulated host's rules."""
    host_state = state.state()

    # These serve torch.accelerator's index calls: the host's rules apply inside.
    # Parameters named as torch._C names them, so each function fits the slot it fills.
    def set_index(device_index: int) -> None:
        if device_index >= 0:
            device_module.set_device_index(device_index)  # tpuready: ignore[set-device-index]

    def get_index() -> int:
        return host_state.current_index

    def exchange(device_index: int) -> int:
        previous = host_state.current_index
        if device_index >= 0 and device_index != previous:
            device_module.set_device_index(device_index)  # tpuready: ignore[set-device-index]
        return previous

    def synchronize(device_index: int = -1) -> None:
        return None  # every emulated operator has finished when it returns

    torch._C._accelerator_setDeviceIndex = set_index
    torch._C._accelerator_getDeviceIndex = get_index
    torch._C._accelerator_exchangeDevice = exchange
    torch._C._accelerator_maybeExchangeDevice = exchange
    torch._C._accelerator_synchronizeDevice = synchronize


def _device_storages() -> None:
    """`torch.UntypedStorage(n, device="tpu")` (torch.load's route to a device) would ask C++
    for a `tpu` allocator, which a Python backend cannot register: make it a device tensor's."""
    original_new: Callable[..., Any] = torch.UntypedStorage.__new__

    def __new__(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and torch.device(device).type == "tpu":
            if len(args) == 1 and isinstance(args[0], int) and not kwargs:
                return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
            cpu = original_new(cls, *args, **kwargs)
            return torch.empty(0, dtype=torch.uint8).set_(cpu).to(device).untyped_storage()
        return original_new(cls, *args, device=device, **kwargs)

    torch.UntypedStorage.__new__ = __new__  # type: ignore[method-assign]  # patched on purpose
    original_resize = torch.UntypedStorage.resize_

    def resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        """FSDP2 frees and refills unsharded parameters by resizing their storages; a
        `PrivateUse1` storage needs a C++ hook for that, so the emulator resizes it here."""
        if self.device.type != "tpu":
            return original_resize(self, size)
        memory.resize_storage(self, int(size))
        return self

    # patched on purpose; torch's stub types resize_ on the base class, _StorageBase
    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]  # patched


def _hide_from_dynamo() -> None:
    """Keep Dynamo out of the emulator's Python code, as it stays out of a C++ backend's.

    A graph break runs the rest of a call eagerly, and Dynamo tries to compile every new Python
    frame that starts meanwhile: the emulator's kernels would be traced as user code (a
    spurious break at `sys._getframe` in the report's code). Every function of the emulator is
    skipped, with what it calls; the patched `torch.compile` only itself, since it calls the
    compiled function, which Dynamo must see."""
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )

    from tpuready.emulator import compile as emulated_compile

    modules = (device_module, distributed, findings, kernels, memory, state, sys.modules[__name__])
    for module, recursive in [(m, True) for m in modules] + [(emulated_compile, False)]:
        nested = _FrameAction.SKIP if recursive else _FrameAction.DEFAULT
        strategy = _FrameExecStrategy(_FrameAction.SKIP, nested)
        for code in _code_objects(module):
            set_code_exec_strategy(code, strategy)


def _code_objects(module: Any) -> list[Any]:
    """Every code object a module defines: its functions, methods and the functions in them."""
    import inspect
    import types

    found: list[types.CodeType] = []
    pending = [
        value.__code__
        for value in vars(module).values()
        if inspect.isfunction(value) and value.__module__ == module.__name__
    ]
    for value in vars(module).values():
        if inspect.isclass(value) and value.__module__ == module.__name__:
            pending += [
                member.__code__ for member in vars(value).values() if inspect.isfunction(member)
            ]
    while pending:
        code = pending.pop()
        found.append(code)
        pending += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def install(host: Host) -> None:
    """Register everything; see `tpuready.emulator`'s docstring for what it emulates."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    state.install(host)
    _setup_privateuseone_for_python_backend(
        rename="tpu",
        backend_module=device_module.build_module(),
        hook=_Hooks(),
        device_guard=_DeviceGuard(),
    )
    kernels.register()
    _device_storages()
    distributed.register()
    emulated_compile.patch_compile()
    _accelerator_calls()
    torch.set_float32_matmul_precision = device_module.set_float32_matmul_precision(
        torch.set_float32_matmul_precision
    )
    torch.set_autocast_dtype("tpu", torch.bfloat16)
    findings.count_each_print_once()
    findings.print_at_exit(host.describe())
    _hide_from_dynamo()
