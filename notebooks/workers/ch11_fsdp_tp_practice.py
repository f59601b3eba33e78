"""Chapter 11, step 4: clip and compile on the 2-D mesh (`11_*.ipynb`).

The 2-D layout of `ch11_tensor_parallel`, as a training script needs it:
each block compiled, then the gradients clipped. The TP plan leaves the norms'
weights whole, so FSDP shards them over `dp` alone: the parameters live on
two meshes, and `clip_grad_norm_` cannot stack their norms. `clip_on_meshes`
computes one norm per mesh and combines them. `fsdp_tp_practice` runs on every
rank through `tpuready.runtime.launch.run_workers` (the notebook), or under the
standard launcher, where rank 0 prints JSON:

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch11_fsdp_tp_practice.py
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from tpuready.runtime.device import compile_backend_for
from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

try:  # imported as workers.ch11_fsdp_tp_practice (the notebook, the tests)
    from workers import ch11_tensor_parallel as blocks
except ImportError:  # run as a script: torchrun puts this folder on the path
    import ch11_tensor_parallel as blocks

MAX_NORM = 0.1  # below this step's gradient norm, so clipping scales them


def by_mesh(
    parameters: Iterable[nn.Parameter],
) -> dict[DeviceMesh, list[nn.Parameter]]:
    """The parameters grouped by the mesh their DTensors live on."""
    groups: dict[DeviceMesh, list[nn.Parameter]] = {}
    for parameter in parameters:
        if not isinstance(parameter, DTensor):
            raise TypeError(
                "by_mesh groups DTensor parameters; shard the model first, "
                f"got a {type(parameter).__name__}"
            )
        groups.setdefault(parameter.device_mesh, []).append(parameter)
    return groups


def clip_on_meshes(
    parameters: Iterable[nn.Parameter], max_norm: float
) -> torch.Tensor:
    """`clip_grad_norm_` for parameters on several meshes: returns the norm.

    One norm per mesh (a replicated DTensor, read whole), the total as the
    norm of those norms, then each group scaled by the same factor.
    """
    groups = by_mesh(parameters)
    per_mesh = [
        torch.nn.utils.get_total_norm([p.grad for p in group]).full_tensor()
        for group in groups.values()
    ]
    total = torch.linalg.vector_norm(torch.stack(per_mesh))
    for group in groups.values():  # one scale per mesh: foreach ops need one
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def fsdp_tp_practice(rank: int, world_size: int) -> dict[str, object]:
    """The 2-D layout with each block compiled: one step, then clipping.

    Returns the meshes the parameters live on, the graphs compiled, what
    `clip_grad_norm_` raised, the norm before and after `clip_on_meshes`,
    and every clipped gradient gathered whole.
    """
    model, inputs = blocks.build_model_and_batch()
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    model, inputs = model.to(device), inputs.to(device)
    mesh = init_device_mesh(
        device.type, (2, world_size // 2), mesh_dim_names=("dp", "tp")
    )
    backend = compile_backend_for(device)
    for block in model.layers:  # TorchTitan's order: TP, compile, FSDP
        parallelize_module(block, mesh["tp"], blocks.tensor_parallel_plan())
        block.compile(backend=backend, dynamic=False)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    meshes = {  # named by their axes: "dp", "dp/tp"
        "/".join(group_mesh.mesh_dim_names or ()): len(group)
        for group_mesh, group in by_mesh(model.parameters()).items()
    }
    counters.clear()
    local_inputs = inputs.chunk(2, dim=0)[mesh.get_local_rank("dp")]
    model(local_inputs).pow(2).mean().backward()  # as in ch11_tensor_parallel
    graphs = counters["stats"]["unique_graphs"]
    graph_breaks = dict(counters["graph_break"])
    try:  # one stack of every parameter's norm: mixed meshes refuse it
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        standard_clip_error = None
    except RuntimeError as error:
        standard_clip_error = type(error).__name__
    norm_before = clip_on_meshes(model.parameters(), MAX_NORM).item()
    norm_after = math.hypot(
        *(
            torch.nn.utils.get_total_norm([p.grad for p in group])
            .full_tensor()
            .item()
            for group in by_mesh(model.parameters()).values()
        )
    )
    return {
        "meshes": meshes,
        "compiled_graphs": graphs,
        "graph_breaks": graph_breaks,
        "standard_clip_error": standard_clip_error,
        "norm_before": norm_before,
        "norm_after": norm_after,
        "clipped_gradients": blocks.full_gradients(model),
        "device_type": device.type,  # where this rank computed
    }


def _main() -> None:
    """Under torchrun: join, run the practice, rank 0 prints one JSON line."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = fsdp_tp_practice(rank, world_size)
    summary = {
        key: value
        for key, value in result.items()
        if key != "clipped_gradients"
    }
    summary["clipped_gradient_checksums"] = {
        name: blocks.checksum(gradient)
        for name, gradient in result["clipped_gradients"].items()
    }
    if rank == 0:
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(_main, __file__, nproc_per_node=4)
