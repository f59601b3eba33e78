"""A small training script for CUDA GPUs only: the "before" of chapter 2.

It stops at once on a machine without a CUDA GPU.
`python -m tpuready audit-source` lists every line that ties it to CUDA;
train_portable.py in this folder is the same script ported.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    assert torch.cuda.is_available(), "this script needs a CUDA GPU"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    features = torch.randn(512, 16)
    targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    dataset = TensorDataset(features, targets)
    loader = DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        pin_memory=True,
    )

    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(5):
        for batch_features, batch_targets in loader:
            batch_features = batch_features.cuda(non_blocking=True)
            batch_targets = batch_targets.to("cuda", non_blocking=True)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = nn.functional.mse_loss(
                    model(batch_features), batch_targets
                )
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.cuda.synchronize()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
