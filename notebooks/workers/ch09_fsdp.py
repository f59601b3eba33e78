"""Chapter 9: FSDP2 on a small transformer (`notebooks/09_fsdp2.ipynb`).

`fsdp_worker` runs on every rank through `tpuready.runtime.launch.run_workers`
(the notebook), or under the standard launcher, where rank 0 prints one JSON
line:

    torchrun --standalone --nproc-per-node=4 notebooks/workers/ch09_fsdp.py
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

# Every width is a multiple of 4, so each parameter splits evenly over 1, 2
# or 4 ranks and FSDP2 pads no shard.
CONFIG = {"vocab": 64, "dim": 32, "heads": 4, "blocks": 3, "seq_len": 16}
BATCH_SIZE = 8  # the global batch: N ranks train on BATCH_SIZE / N each
NUM_STEPS = 4
LEARNING_RATE = 1e-2
SEED = 0


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(dim)
        # No bias: softmax ignores a shift shared by all keys, so a key bias
        # gets an exactly-zero gradient, and AdamW would turn its rounding
        # noise into full-size steps.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, dim = x.shape
        qkv = self.qkv(self.attn_norm(x))
        qkv = qkv.view(batch, seq_len, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attended = attended.transpose(1, 2).reshape(batch, seq_len, dim)
        x = x + self.proj(attended)
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    """Embeddings, a few blocks, a final norm, an output layer."""

    def __init__(
        self, vocab: int, dim: int, heads: int, blocks: int, seq_len: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.empty(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.output(self.norm(x))


def full_initial_weights(
    model: nn.Module, seed: int = SEED
) -> dict[str, torch.Tensor]:
    """Every parameter's whole initial value, the same on every rank.

    Drawn from one seeded CPU generator in parameter order, so the value does
    not depend on how the model is sharded; LayerNorms start at 1 and 0.
    """
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, parameter in model.named_parameters():
        if "norm" in name:
            fill = 1.0 if name.endswith("weight") else 0.0
            weights[name] = torch.full(parameter.shape, fill)
        else:
            std = 0.02 if parameter.dim() > 1 else 0.01
            noise = torch.randn(parameter.shape, generator=generator)
            weights[name] = noise * std
    return weights


@torch.no_grad()
def init_weights(model: nn.Module, seed: int = SEED) -> None:
    """Fill the parameters in place; a sharded one gets its own shard."""
    for name, full in full_initial_weights(model, seed).items():
        parameter = model.get_parameter(name)
        if isinstance(parameter, DTensor):
            # Every rank holds `full`: src_data_rank=None keeps this rank's
            # slice and sends nothing.
            full = distribute_tensor(
                full,
                parameter.device_mesh,
                parameter.placements,
                src_data_rank=None,
            )
        parameter.copy_(full)


def make_batches(
    num_steps: int = NUM_STEPS,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Global batches of counting sequences: (tokens, next tokens).

    Start and stride come from a seed (the same on every rank); the next
    token is predictable, so the loss falls.
    """
    generator = torch.Generator().manual_seed(SEED + 1)
    shape = (num_steps, BATCH_SIZE, 1)
    starts = torch.randint(CONFIG["vocab"], shape, generator=generator)
    strides = torch.randint(1, 4, shape, generator=generator)
    positions = torch.arange(CONFIG["seq_len"] + 1)
    sequences = (starts + strides * positions) % CONFIG["vocab"]
    return [(seq[:, :-1], seq[:, 1:]) for seq in sequences]


def local_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes this rank holds for `tensors`: a DTensor counts its shard."""
    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        total += tensor.numel() * tensor.element_size()
    return total


def memory_by_kind(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, int]:
    """Bytes of parameters, gradients, AdamW moments and step counters."""
    parameters = list(model.parameters())
    states = list(optimizer.state.values())
    moments = [s[key] for s in states for key in ("exp_avg", "exp_avg_sq")]
    gradients = [p.grad for p in parameters if p.grad is not None]
    return {
        "parameters": local_bytes(parameters),
        "gradients": local_bytes(gradients),
        "optimizer": local_bytes(moments),
        "step counters": local_bytes([s["step"] for s in states]),
    }


def train(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    rank: int = 0,
    world_size: int = 1,
) -> tuple[list[float], torch.optim.Optimizer]:
    """AdamW on this rank's slice of each batch; returns global mean losses.

    Each rank's loss is the mean over its own sequences and FSDP2 averages
    gradients over the ranks: the update the whole batch gives one process.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    device = next(model.parameters()).device  # a shard's device, if sharded
    losses = []
    for tokens, targets in batches:
        tokens = tokens.chunk(world_size)[rank].to(device)
        targets = targets.chunk(world_size)[rank].to(device)
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        # set_to_none=False keeps the gradients' memory, to measure it.
        optimizer.zero_grad(set_to_none=False)
        reported = loss.detach().float()
        if world_size > 1:
            dist.all_reduce(reported, op=dist.ReduceOp.AVG)
        losses.append(reported.item())
    return losses, optimizer


def shard_model(
    model: TinyTransformer,
    mesh: DeviceMesh,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> TinyTransformer:
    """`fully_shard` each block, then the root (it takes the rest)."""
    mp_policy = mp_policy or MixedPrecisionPolicy()  # float32 throughout
    for block in model.blocks:
        fully_shard(
            block,
            mesh=mesh,
            reshard_after_forward=reshard_after_forward,
            mp_policy=mp_policy,
        )
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def build_sharded_model(
    mesh: DeviceMesh,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> TinyTransformer:
    """Build on meta, shard, allocate this rank's shards, initialise."""
    with torch.device("meta"):  # shapes only: no memory, no random numbers
        model = TinyTransformer(**CONFIG)
    shard_model(model, mesh, reshard_after_forward, mp_policy)
    model.to_empty(device=mesh.device_type)  # this rank's shards, unset
    init_weights(model)  # after sharding: each rank writes its own shards
    return model


def fsdp_worker(
    rank: int, world_size: int, num_steps: int = NUM_STEPS
) -> dict:
    """Train the sharded model; report losses, weights and bytes per rank.

    Bytes are measured at each sharding degree that divides `world_size`:
    a 2-D mesh (replicate, shard) shards over its second dimension (HSDP).
    """
    device_type = rank_device().type  # "cuda", "tpu" or "cpu": tpuready chose
    mesh = init_device_mesh(device_type, (world_size,))
    model = build_sharded_model(mesh)
    meta_left = sum(p.is_meta for p in model.parameters())
    batches = make_batches(num_steps)
    losses, optimizer = train(model, batches, rank, world_size)
    memory = {world_size: memory_by_kind(model, optimizer)}
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    # full_tensor() all-gathers each parameter: every rank must call it.
    final_weights = {
        name: p.detach().full_tensor().cpu().tolist()
        for name, p in model.named_parameters()
    }
    for shard_size in range(2, world_size):
        if world_size % shard_size == 0:
            mesh_2d = init_device_mesh(
                device_type,
                (world_size // shard_size, shard_size),
                mesh_dim_names=("replicate", "shard"),
            )
            hsdp_model = build_sharded_model(mesh_2d)
            _, hsdp_opt = train(hsdp_model, batches[:1], rank, world_size)
            memory[shard_size] = memory_by_kind(hsdp_model, hsdp_opt)
    return {
        "rank": rank,
        "device_type": device_type,  # where this rank computed
        "losses": losses,
        "memory": memory,
        "meta_left": meta_left,
        "sharded": sharded,
        "final_weights": final_weights if rank == 0 else None,
    }


def main() -> None:
    """Under torchrun: join the group, run the worker, rank 0 prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = fsdp_worker(rank, world_size)
    dist.destroy_process_group()
    if rank == 0:
        keys = ("losses", "memory", "final_weights")
        print(json.dumps({key: result[key] for key in keys}))


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=4)
