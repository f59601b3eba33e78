"""`tpu_dist` under the emulator: real collectives between real processes, through gloo.

TorchTPU registers the process-group backend `tpu_dist` (alias `tpu`), which
`init_process_group()` picks for the `tpu` device, and needs launch variables set in the parent
of its ranks (`torch.tpu.distributed.set_tpu_launch_env`), for a rank count its host allows.
The emulator keeps those rules and moves the bytes with gloo: each collective on `tpu` tensors
hands gloo CPU views of them, so results land in the device tensors, and DTensor, FSDP2, DDP
and DeviceMesh on `init_device_mesh("tpu", ...)` work as they would there.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from tpuready.emulator import memory
from tpuready.emulator.findings import report
from tpuready.emulator.host import TORCHTPU
from tpuready.emulator.state import state

__all__ = [
    "LAUNCH_VARIABLE",
    "create_backend",
    "register",
    "set_tpu_launch_env",
    "spmd_safe",
    "topology_aware_mesh",
]

BACKEND_NAMES = ("tpu_dist", "tpu")
LAUNCH_VARIABLE = "TPUREADY_EMULATED_TPU_LAUNCH"  # "nnodes,nproc_per_node", set in the parent
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def set_tpu_launch_env(nnodes: int = 1, nproc_per_node: int = 1) -> None:
    """Set what the ranks of a job need, in their parent: TorchTPU's rank-count rule applies."""
    from tpuready.calc.hardware import TPU_RANKS_PER_HOST

    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    host = state().host
    allowed = TPU_RANKS_PER_HOST.get(host.generation or "", ())
    if host.model == TORCHTPU and (nproc_per_node not in allowed or nproc_per_node > host.devices):
        fits = [count for count in allowed if count <= host.devices]
        report().record("refused", f"set_tpu_launch_env(nproc_per_node={nproc_per_node})")
        raise RuntimeError(
            f"No TPU topology found for count: {nproc_per_node} (emulated {host.describe()}: "
            f"a {host.generation} host runs {', '.join(map(str, fits))} ranks)"
        )
    if host.model != TORCHTPU and nproc_per_node > host.devices:
        raise RuntimeError(
            f"{nproc_per_node} ranks per host but the emulated {host.describe()} has "
            f"{host.devices} devices"
        )
    os.environ[LAUNCH_VARIABLE] = f"{nnodes},{nproc_per_node}"


def spmd_safe(function: Callable[..., Any]) -> Callable[..., Any]:
    """TorchTPU's marker for code every rank runs alike; the emulator runs it unchanged."""
    return function


def topology_aware_mesh(
    mesh_shape: tuple[int, ...],
    dcn_mesh_shape: tuple[int, ...] | None = None,
    mesh_dim_names: tuple[str, ...] | None = None,
) -> Any:
    """A DeviceMesh on `tpu` of `mesh_shape` (times `dcn_mesh_shape` across slices, axis by
    axis). The emulator does not model the torus: the ranks are laid out in order."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(mesh_shape)
    if dcn_mesh_shape is not None:
        if len(dcn_mesh_shape) != len(shape):
            raise ValueError(
                f"dcn_mesh_shape {tuple(dcn_mesh_shape)} must have as many axes as mesh_shape "
                f"{shape}"
            )
        shape = tuple(a * b for a, b in zip(dcn_mesh_shape, shape, strict=True))
    return init_device_mesh("tpu", shape, mesh_dim_names=mesh_dim_names)


def create_backend(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    """Make one rank's `tpu_dist` backend: a gloo group, after TorchTPU's launch checks."""
    host = state().host
    if host.model == TORCHTPU and world_size > 1 and state().launch_environment is None:
        report().record("refused", "tpu_dist without set_tpu_launch_env")
        raise RuntimeError(
            "Check failed: client != nullptr (emulated TorchTPU: this rank has no launch "
            "environment; call torch.tpu.distributed.set_tpu_launch_env(nnodes=..., "
            "nproc_per_node=...) in the parent before starting the ranks, as "
            "tpuready.runtime.launch.prepare_launch_environment does)"
        )
    return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "tpu":
        return memory.cpu_view(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _serve_the_cpu_too(group: Any) -> None:
    """Let `group`'s `tpu_dist` backend take the CPU views a collective hands gloo. A group made
    by `init_process_group()` with no backend has a backend for `tpu` only (PyTorch gives it
    the accelerator's), and gloo's CPU kernel asks the group for its CPU one."""
    group = torch.distributed.ProcessGroup.unbox(group)
    cpu, tpu = torch.device("cpu"), torch.device("tpu")
    try:
        group._get_backend(cpu)
    except RuntimeError:
        backend = group._get_backend(tpu)
        group._register_backend(cpu, torch.distributed.ProcessGroup.BackendType.CUSTOM, backend)


def _collective(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """A c10d collective on `tpu` tensors: gloo's CPU kernel, over CPU views of them."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.ScriptObject):
            _serve_the_cpu_too(value)
            break
    cpu_args = [_on_cpu(value) for value in args]
    cpu_kwargs = {name: _on_cpu(value) for name, value in kwargs.items()}
    result = op.redispatch(_CPU_KEYS, *cpu_args, **cpu_kwargs)
    return _back(result, args)


def _back(result: Any, args: tuple[Any, ...]) -> Any:
    """Hand back the caller's device tensors where the CPU kernel returned their views."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    lists = [a for a in args if isinstance(a, list)]
    if not isinstance(result, tuple):
        return result
    first = result[0]
    if isinstance(first, list) and lists:
        return (lists[0], *result[1:])
    if isinstance(first, torch.Tensor) and tensors:
        return (tensors[0], *result[1:])
    return result


_LIBRARIES: list[torch.library.Library] = []


def register() -> None:
    """Register `tpu_dist` and `tpu` as backends, and the collectives' `tpu` kernels."""
    import torch.distributed as dist

    # TorchTPU reads its launch variables when the process starts: set in the parent, before
    # the rank was started, or not at all (setting them in the rank itself comes too late).
    state().launch_environment = os.environ.get(LAUNCH_VARIABLE)
    if not dist.is_available():
        return
    for name in BACKEND_NAMES:
        dist.Backend.register_backend(name, create_backend, devices=["cpu", "tpu"])
    dist.Backend.default_device_backend_map["tpu"] = "tpu_dist"
    library = torch.library.Library("c10d", "IMPL")
    for qualified in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        namespace, name = qualified.split("::")
        if namespace != "c10d":
            continue
        packet = getattr(torch.ops.c10d, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                library.impl(
                    name if overload == "default" else f"{name}.{overload}",
                    _kernel_for(op),
                    "PrivateUse1",
                )
    _LIBRARIES.append(library)


def _kernel_for(op: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _collective(op, *args, **kwargs)

    return kernel
