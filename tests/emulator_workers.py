"""Workers for tests/test_emulator.py: run by `run_workers` on the emulated TPU and on the CPU.

Each returns plain lists and numbers, so a run on the emulated `tpu` device and a run of gloo
on the CPU can be compared exactly: the emulator moves the same bytes through gloo.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tpuready.runtime.launch import rank_device


def collectives(rank: int, world_size: int) -> dict[str, Any]:
    """Every collective the book's chapters use, on this rank's device."""
    device = rank_device()
    base = torch.arange(4, dtype=torch.float32, device=device) + 10 * rank
    results: dict[str, Any] = {"device": str(device), "backend": dist.get_backend()}

    summed = base.clone()
    dist.all_reduce(summed)
    results["all_reduce"] = summed.tolist()

    maximum = base.clone()
    dist.all_reduce(maximum, op=dist.ReduceOp.MAX)
    results["all_reduce_max"] = maximum.tolist()

    gathered = [torch.empty_like(base) for _ in range(world_size)]
    dist.all_gather(gathered, base)
    results["all_gather"] = [t.tolist() for t in gathered]

    into = torch.empty(world_size * 4, device=device)
    dist.all_gather_into_tensor(into, base)
    results["all_gather_into_tensor"] = into.tolist()

    scattered = torch.empty(4 // world_size * 1, device=device)
    dist.reduce_scatter_tensor(scattered, base)
    results["reduce_scatter_tensor"] = scattered.tolist()

    broadcast = base.clone()
    dist.broadcast(broadcast, src=world_size - 1)
    results["broadcast"] = broadcast.tolist()

    exchanged = torch.empty_like(base)
    dist.all_to_all_single(exchanged, base)
    results["all_to_all_single"] = exchanged.tolist()

    received = torch.empty_like(base)
    send = dist.isend(base, dst=(rank + 1) % world_size)
    dist.recv(received, src=(rank - 1) % world_size)
    send.wait()
    results["send_recv"] = received.tolist()

    dist.barrier()
    return results


def sharded_training(rank: int, world_size: int) -> dict[str, Any]:
    """A DTensor matmul and two FSDP2 AdamW steps, with the memory the emulator holds
    while a forward pass has gathered the parameters and after it has resharded them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tpuready import emulator

    device = rank_device()
    mesh = init_device_mesh(device.type, (world_size,))
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(8, 6, generator=generator)
    right = torch.randn(6, 4, generator=generator)
    rows = distribute_tensor(left.to(device), mesh, [Shard(0)])
    product = rows @ distribute_tensor(right.to(device), mesh, [Replicate()])
    results: dict[str, Any] = {"dtensor_matmul": product.full_tensor().cpu().tolist()}

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)
    ).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    held: dict[str, int] = {}

    def during_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        if emulator.is_emulated():
            held.setdefault("during", emulator.memory_allocated())

    model[2].register_forward_hook(during_forward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    inputs = torch.randn(4, 6, generator=generator).to(device)
    losses = []
    for _ in range(2):
        loss = model(inputs).square().mean()
        if emulator.is_emulated():
            held.setdefault("after", emulator.memory_allocated())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    results["losses"] = losses
    results["memory"] = held
    return results


def bind_every_rank_to_index_0(rank: int, world_size: int) -> str:
    """The bug the multi-device host catches: every rank on the first device."""
    torch.accelerator.set_device_index(0)
    return str(torch.ones(2, device="tpu").device)
