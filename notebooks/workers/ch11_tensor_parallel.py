"""Workers for chapter 11 (tensor parallelism): a tiny transformer, its plans.

The notebook builds the same model for its single-device reference and starts
`run_all_layouts` with `tpuready.runtime.launch.run_workers`; ranks return
results and print nothing. As a script, the file runs the same function under
the standard launcher (from the repository root):

    torchrun --standalone --nproc-per-node=4 \
        notebooks/workers/ch11_tensor_parallel.py

and rank 0 prints a summary as one JSON line.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

# The model every rank builds and the batch it sees: small, for 2 CPU cores.
MODEL_SIZES = {"dim": 64, "num_heads": 8, "hidden_dim": 256, "num_layers": 2}
BATCH_SIZE, SEQ_LEN = 4, 16
SEED = 0
LAYOUTS = ("tp", "sp", "2d")
# The collectives CommDebugMode counts here: DTensor's functional ones and
# FSDP's c10d all-gather.
COLLECTIVE_NAMES = frozenset(
    {
        "all_reduce",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "_allgather_base_",
    }
)


class Attention(nn.Module):
    """Multi-head self-attention; its head count follows q_proj's width."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // num_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds its share of heads.
        shape = (batch, seq_len, -1, self.head_dim)
        q, k, v = (
            proj(x).view(shape).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))


class MLP(nn.Module):
    """A SwiGLU feed-forward block, as in Llama and Qwen3."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """A pre-norm block: RMSNorm, attention, RMSNorm, MLP, with residuals."""

    def __init__(self, dim: int, num_heads: int, hidden_dim: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, num_heads)
        self.mlp_norm = nn.RMSNorm(dim)
        self.mlp = MLP(dim, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyTransformer(nn.Module):
    """Blocks on embeddings (no vocabulary: blocks are the topic)."""

    def __init__(
        self, dim: int, num_heads: int, hidden_dim: int, num_layers: int
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Block(dim, num_heads, hidden_dim) for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build_model_and_batch() -> tuple[TinyTransformer, torch.Tensor]:
    """The seeded model and batch, the same on every rank, notebook too."""
    torch.manual_seed(SEED)
    model = TinyTransformer(**MODEL_SIZES)
    inputs = torch.randn(BATCH_SIZE, SEQ_LEN, MODEL_SIZES["dim"])
    return model, inputs


def tensor_parallel_plan() -> dict[str, object]:
    """Megatron-style plan: q/k/v and gate/up by columns, o/down by rows."""
    return {
        "attention.q_proj": ColwiseParallel(),
        "attention.k_proj": ColwiseParallel(),
        "attention.v_proj": ColwiseParallel(),
        "attention.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def sequence_parallel_plan() -> dict[str, object]:
    """The TP plan plus sequence parallelism: norms see a sequence shard."""
    return {
        "attention_norm": SequenceParallel(),
        # One all-gather of the normalised sequence, shared by q, k and v.
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "attention.q_proj": ColwiseParallel(),
        "attention.k_proj": ColwiseParallel(),
        "attention.v_proj": ColwiseParallel(),
        # A reduce-scatter back to a sequence shard instead of an all-reduce.
        "attention.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp_norm": SequenceParallel(),
        "mlp": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def full_gradients(model: nn.Module) -> dict[str, np.ndarray]:
    """Every parameter's gradient whole (DTensor gradients are gathered)."""
    gradients = {}
    for name, parameter in model.named_parameters():
        gradient = parameter.grad
        if isinstance(gradient, DTensor):
            gradient = gradient.full_tensor()
        gradients[name] = gradient.detach().cpu().numpy().copy()
    return gradients


def checksum(array: np.ndarray) -> float:
    """A position-weighted sum: a shard put in the wrong place changes it, and
    its terms cancel less than a plain sum's do."""
    values = np.asarray(array, dtype=np.float64).ravel()
    return float((values * np.arange(1, values.size + 1)).sum())


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def collective_counts(comm_mode: CommDebugMode) -> dict[str, int]:
    """CommDebugMode's counts keyed by short name, e.g. "all_reduce"."""
    return {
        op.__name__: count
        for op, count in sorted(comm_mode.get_comm_counts().items(), key=str)
    }


class CollectiveSizes(TorchDispatchMode):
    """Record each collective's name and the bytes of its whole tensor.

    CommDebugMode counts collectives but keeps no sizes; this mode (the
    pattern of chapter 3) sees the same calls. The whole tensor is the larger
    of input and output: the summed activation of an all-reduce, the gathered
    output of an all-gather, the input of a reduce-scatter.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            # Let DTensor run first and turn the op into plain tensor ops and
            # collectives, which this mode then sees (as CommDebugMode does).
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in COLLECTIVE_NAMES:
            tensors = [
                a for a in (args[0], out) if isinstance(a, torch.Tensor)
            ]
            size = max(t.numel() * t.element_size() for t in tensors)
            self.records.append((func.overloadpacket.__name__, size))
        return out


def run_layout(rank: int, world_size: int, layout: str) -> dict[str, object]:
    """One forward and backward under `layout`: "tp", "sp" or "2d".

    Returns the outputs (the whole batch), every gradient gathered whole, the
    forward pass's collectives (counts and sizes) and rank-local shapes.
    """
    model, inputs = build_model_and_batch()
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    model, inputs = model.to(device), inputs.to(device)
    if layout in ("tp", "sp"):
        mesh = init_device_mesh(
            device.type, (world_size,), mesh_dim_names=("tp",)
        )
        plan = (
            tensor_parallel_plan()
            if layout == "tp"
            else sequence_parallel_plan()
        )
        for block in model.layers:
            parallelize_module(block, mesh, plan)
        local_inputs = inputs
        if layout == "sp":  # each rank starts with its slice of the sequence
            local_inputs = inputs.chunk(world_size, dim=1)[rank]
    elif layout == "2d":
        mesh = init_device_mesh(
            device.type, (2, world_size // 2), mesh_dim_names=("dp", "tp")
        )
        for block in model.layers:
            parallelize_module(block, mesh["tp"], tensor_parallel_plan())
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        # Data parallel: each dp group sees its own part of the batch.
        local_inputs = inputs.chunk(2, dim=0)[mesh.get_local_rank("dp")]
    else:
        raise ValueError(f"layout must be 'tp', 'sp' or '2d', got {layout!r}")

    with CommDebugMode() as comm_mode, CollectiveSizes() as sizes:
        outputs = model(local_inputs)
    forward_counts = collective_counts(comm_mode)
    # The mean over this rank's slice. Slices have equal sizes, so the mean
    # of their means (what FSDP's gradient averaging computes) is the mean
    # over the batch. Sequence slices: the ranks' losses add up, so divide.
    loss = outputs.pow(2).mean()
    if layout == "sp":
        loss = loss / world_size
    loss.backward()

    gathered = [torch.empty_like(outputs) for _ in range(world_size)]
    dist.all_gather(gathered, outputs.detach().contiguous())
    if layout == "sp":
        full_outputs = torch.cat(gathered, dim=1)
    elif layout == "2d":
        full_outputs = torch.cat(gathered[:: world_size // 2], dim=0)
    else:
        full_outputs = gathered[0]
    return {
        "outputs": full_outputs.cpu().numpy(),
        "gradients": full_gradients(model),
        "forward_collectives": forward_counts,
        "forward_collective_sizes": sizes.records,
        "local_weight_shapes": {
            name: list(local_part(module.weight).shape)
            for name, module in model.layers[0].named_modules()
            if isinstance(module, nn.Linear)
        },
        "local_input_shape": list(local_inputs.shape),
        "device_type": device.type,  # where this rank computed
    }


def run_all_layouts(
    rank: int, world_size: int
) -> dict[str, dict[str, object]]:
    """`run_layout` for "tp", "sp" and "2d": one launch instead of three."""
    return {layout: run_layout(rank, world_size, layout) for layout in LAYOUTS}


def summarise(
    result: dict[str, dict[str, object]],
) -> dict[str, dict[str, object]]:
    """What rank 0 prints under torchrun: per layout, a checksum and counts."""
    return {
        layout: {
            "outputs_sum": round(
                float(np.float64(values["outputs"]).sum()), 6
            ),
            "forward_collectives": values["forward_collectives"],
        }
        for layout, values in result.items()
    }


def _main() -> None:
    """Under torchrun: join, run every layout, rank 0 prints one JSON line."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    summary = summarise(run_all_layouts(rank, world_size))
    if rank == 0:
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(_main, __file__, nproc_per_node=4)
