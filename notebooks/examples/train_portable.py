"""The script of train_cuda_only.py, ported: it runs on CUDA, TorchTPU, MPS
or the CPU.

The device is chosen once with `torch.accelerator`; every tensor and the
model follow it. Mixed precision uses bfloat16 on `device.type`, which needs
no loss scaling, and memory is pinned only when an accelerator will read it.
`python -m tpuready audit-source` finds nothing here. On a laptop CPU it
trains in a few seconds and prints one loss per epoch.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    device = torch.accelerator.current_accelerator(
        check_available=True
    ) or torch.device("cpu")
    torch.manual_seed(0)
    features = torch.randn(512, 16)
    targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    dataset = TensorDataset(features, targets)
    pin_memory = torch.accelerator.is_available()
    loader = DataLoader(
        dataset, batch_size=64, shuffle=True, pin_memory=pin_memory
    )

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(
        device
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    print(f"training on {device.type}")
    for epoch in range(5):
        for batch_features, batch_targets in loader:
            batch_features = batch_features.to(device, non_blocking=True)
            batch_targets = batch_targets.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(
                    model(batch_features), batch_targets
                )
            loss.backward()
            optimizer.step()
        # `.item()` waits for the device: no explicit synchronize is needed.
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
