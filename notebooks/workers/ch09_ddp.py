"""Chapter 9's DDP baseline: examples/ddp_cuda_only.py, ported.

`ddp_worker` runs on every rank through `tpuready.runtime.launch.run_workers`
(the notebook), or under the standard launcher, where rank 0 prints one JSON
line:

    torchrun --standalone --nproc-per-node=2 notebooks/workers/ch09_ddp.py

What changed from the CUDA script: `tpuready.runtime.launch.init_rank` joins
the group and picks the device, once per process, for any host (nccl and
`cuda:<local rank>` with a GPU per rank, tpu_dist and `tpu:0` on a TPU, where
each process sees its one device as index 0, else gloo on the CPU), and the
worker reads it with `rank_device()`; tensors move with `.to(device)`, never
`.to(local_rank)`; DDP gets no `device_ids`; and every rank reads the loss,
none alone.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

NUM_EPOCHS = 3
BATCH_SIZE = 32  # per rank, as in the CUDA script


def ddp_worker(
    rank: int, world_size: int, num_epochs: int = NUM_EPOCHS
) -> dict:
    """Train the script's model under DDP; return losses and weights."""
    device = rank_device()  # cuda:<local rank>, tpu:0 or cpu: tpuready chose
    torch.manual_seed(0)
    features = torch.randn(512, 16)
    targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    dataset = TensorDataset(features, targets)
    sampler = DistributedSampler(dataset)  # rank, world size: from the group
    loader = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        sampler=sampler,
        pin_memory=device.type != "cpu",  # no copy to make on the CPU
    )
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model = DDP(model.to(device))  # no device_ids: the module's one device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    epoch_losses = []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        for batch_features, batch_targets in loader:
            batch_features = batch_features.to(device)
            batch_targets = batch_targets.to(device, non_blocking=True)
            prediction = model(batch_features)
            loss = nn.functional.mse_loss(prediction, batch_targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # Every rank takes part: no `if rank == 0:` around a device read.
        last_loss = loss.detach()
        dist.all_reduce(last_loss, op=dist.ReduceOp.AVG)
        epoch_losses.append(last_loss.item())
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {
        "rank": rank,
        "steps": num_epochs * len(loader),
        "losses": epoch_losses,
        "weights": weights.cpu().tolist(),
    }


def main() -> None:
    """Under torchrun: join the group, run the worker, rank 0 prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = ddp_worker(rank, world_size)
    backend = str(dist.get_backend_config())
    dist.destroy_process_group()
    if rank == 0:
        summary = {"world_size": world_size, "backend": backend}
        print(json.dumps({**summary, "losses": result["losses"]}))


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=2)
