"""A typical DDP script for CUDA GPUs, as found: chapter 9's "before".

Launched with `torchrun --nproc-per-node=4 ddp_cuda_only.py`, one process
per GPU. `python -m tpuready audit-source` lists every line that ties it to
CUDA; notebooks/workers/ch09_ddp.py is the same training, ported.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    features = torch.randn(512, 16)
    targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    dataset = TensorDataset(features, targets)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(
        dataset, batch_size=32, sampler=sampler, pin_memory=True
    )

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch_features, batch_targets in loader:
            batch_features = batch_features.to(local_rank)
            batch_targets = batch_targets.cuda(local_rank, non_blocking=True)
            prediction = model(batch_features)
            loss = nn.functional.mse_loss(prediction, batch_targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
            torch.save(model.module.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
