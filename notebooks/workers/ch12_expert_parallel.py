"""Expert parallelism for a tiny Qwen3-MoE layer, over real ranks.

Taught in `notebooks/12_expert_parallel.ipynb`. Each rank holds
`NUM_EXPERTS / world_size` experts and a slice of the tokens. One
`all_to_all_single` sends every token to the ranks of its top-k experts,
through buffers of a fixed capacity per expert (what does not fit is
dropped); a second one brings the experts' outputs back. The routing
reproduces transformers' `Qwen3MoeTopKRouter` (softmax in float32, top-k,
renormalised), and `moe_weights` returns a state dict in the layout of
`Qwen3MoeSparseMoeBlock`, so the notebook can load the same weights into
transformers' layer and compare.

The file runs unchanged under the standard launcher (rank 0 prints JSON):

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch12_expert_parallel.py
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tpuready.inspection.syncs import HostSyncCounter
from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

# The layer: transformers' Qwen3MoeConfig fields of the same names, kept tiny.
HIDDEN_SIZE = 32  # hidden_size
NUM_EXPERTS = 8  # num_experts
TOP_K = 2  # num_experts_per_tok
EXPERT_SIZE = 64  # moe_intermediate_size
NUM_TOKENS = 256  # tokens over all ranks, split evenly
SEED = 0
CAPACITY_FACTOR = 1.25


def moe_weights(seed: int = SEED) -> dict[str, torch.Tensor]:
    """Seeded weights, named and shaped as in Qwen3MoeSparseMoeBlock."""
    generator = torch.Generator().manual_seed(seed)
    router = torch.randn(NUM_EXPERTS, HIDDEN_SIZE, generator=generator)
    gate_up = torch.randn(
        NUM_EXPERTS, 2 * EXPERT_SIZE, HIDDEN_SIZE, generator=generator
    )
    down = torch.randn(
        NUM_EXPERTS, HIDDEN_SIZE, EXPERT_SIZE, generator=generator
    )
    return {
        "gate.weight": router / math.sqrt(HIDDEN_SIZE),
        "experts.gate_up_proj": gate_up / math.sqrt(HIDDEN_SIZE),
        "experts.down_proj": down / math.sqrt(EXPERT_SIZE),
    }


def make_tokens(
    seed: int = SEED, num_tokens: int = NUM_TOKENS
) -> torch.Tensor:
    """Hidden states of `num_tokens` tokens, all leaning one shared way.

    The shared direction makes some experts popular, as real hidden states do.
    """
    generator = torch.Generator().manual_seed(seed + 1)
    shared_direction = torch.randn(HIDDEN_SIZE, generator=generator)
    tokens = torch.randn(num_tokens, HIDDEN_SIZE, generator=generator)
    return tokens + 0.2 * shared_direction


def route(
    tokens: torch.Tensor, router_weight: torch.Tensor, top_k: int = TOP_K
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-MoE's router: float32 softmax, top-k, weights renormalised.

    Returns `(weights, experts)`, both of shape (tokens, top_k), as
    Qwen3MoeTopKRouter does with `norm_topk_prob=True`.
    """
    logits = F.linear(tokens, router_weight)
    probabilities = F.softmax(logits, dtype=torch.float, dim=-1)
    weights, experts = torch.topk(probabilities, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


def expert_capacity(
    num_tokens: int, top_k: int, num_experts: int, capacity_factor: float
) -> int:
    """Slots per expert per rank: ceil(factor * tokens * top_k / experts)."""
    if capacity_factor <= 0:
        raise ValueError(
            f"capacity_factor must be positive, got {capacity_factor!r}: "
            "1.0 gives each expert its average load, more leaves headroom"
        )
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def assign_slots(
    experts: torch.Tensor, num_experts: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each (token, choice)'s slot in its expert's buffer, and whether kept.

    First come, first served in token order: the n-th assignment to an
    expert gets slot n-1, and assignments past `capacity` are dropped. No
    shape depends on the data, so a TPU needs no host sync for it.
    """
    # (tokens * top_k, experts): one row per assignment. A comparison, not
    # F.one_hot, whose range check reads the ids on a CPU (chapter 19).
    expert_ids = torch.arange(num_experts, device=experts.device)
    one_hot = (experts.reshape(-1, 1) == expert_ids).long()
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1
    position = position.view_as(experts)
    return position, position < capacity


def dispatch(
    tokens: torch.Tensor,
    experts: torch.Tensor,
    position: torch.Tensor,
    kept: torch.Tensor,
    capacity: int,
) -> torch.Tensor:
    """Copy kept (token, choice) pairs into an (experts, slots, hidden) buffer.

    Slots nobody fills stay zero.
    """
    num_experts = NUM_EXPERTS
    # One extra slot per expert catches the dropped assignments; it is cut
    # off before sending.
    buffer = tokens.new_zeros(num_experts, capacity + 1, tokens.shape[-1])
    slot = torch.where(kept, position, capacity)
    token_index = torch.arange(len(tokens), device=tokens.device)
    token_index = token_index.unsqueeze(1).expand_as(experts)
    buffer[experts.reshape(-1), slot.reshape(-1)] = tokens[
        token_index.reshape(-1)
    ]
    return buffer[:, :capacity].contiguous()


def run_experts(
    buffer: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """Qwen3-MoE's SwiGLU experts on a (local experts, slots, hidden) input."""
    gate, up = torch.bmm(buffer, gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    return torch.bmm(F.silu(gate) * up, down_proj.transpose(1, 2))


def combine(
    expert_outputs: torch.Tensor,
    experts: torch.Tensor,
    position: torch.Tensor,
    kept: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Sum each token's expert outputs, router-weighted; dropped ones add 0."""
    num_experts, capacity, hidden = expert_outputs.shape
    padded = torch.cat(
        [expert_outputs, expert_outputs.new_zeros(num_experts, 1, hidden)], 1
    )
    # (tokens, top_k, hidden); a dropped choice picks the zero slot.
    picked = padded[experts, torch.where(kept, position, capacity)]
    return (picked * weights.unsqueeze(-1)).sum(dim=1)


def all_to_all(send: torch.Tensor, splits: list[int]) -> torch.Tensor:
    """`dist.all_to_all_single` into a new tensor: `splits[p]` rows to rank p.

    It fills its output in place, and autograd records nothing (step 7).
    """
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, splits, splits)
    return received


def expert_parallel_layer(
    tokens: torch.Tensor,
    route_weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    world_size: int,
    capacity: int,
    exchange: Callable[[torch.Tensor, list[int]], torch.Tensor] = all_to_all,
) -> dict[str, torch.Tensor]:
    """One rank's layer after its router: dispatch, its experts, combine.

    `gate_up_proj` and `down_proj` hold this rank's experts only; `exchange`
    is the all-to-all (`all_to_all`, or one that records a gradient).
    """
    experts_per_rank = NUM_EXPERTS // world_size
    # Pack: (experts, capacity, hidden), experts in order, so the buffers of
    # each peer's experts form one contiguous chunk of dim 0.
    position, kept = assign_slots(experts, NUM_EXPERTS, capacity)
    send = dispatch(tokens, experts, position, kept, capacity)
    # Dispatch: every peer gets its experts' buffers, and sends me mine.
    splits = [experts_per_rank] * world_size
    received = exchange(send, splits)
    # received[peer * experts_per_rank + e]: the peer's tokens for my e-th
    # expert. Each expert's slots from every peer, in one batch.
    by_expert = received.view(
        world_size, experts_per_rank, capacity, HIDDEN_SIZE
    )
    by_expert = by_expert.transpose(0, 1).reshape(
        experts_per_rank, -1, HIDDEN_SIZE
    )
    outputs = run_experts(by_expert, gate_up_proj, down_proj)
    # Combine: back in peer order, the reverse exchange (same splits), and
    # each token's outputs from the slots it left in, router-weighted.
    by_peer = outputs.view(experts_per_rank, world_size, capacity, HIDDEN_SIZE)
    by_peer = by_peer.transpose(0, 1).reshape(
        NUM_EXPERTS, capacity, HIDDEN_SIZE
    )
    returned = exchange(by_peer.contiguous(), splits)
    output = combine(returned, experts, position, kept, route_weights)
    return {
        "output": output,
        "kept": kept,
        "send": send,
        "received": by_expert,
        "returned": returned,
    }


class AllToAllRecorder(TorchDispatchMode):
    """Record the bytes each all-to-all sends to other ranks (dispatcher view).

    `CommDebugMode` (chapter 8) counts collectives but not their bytes;
    this mode reads the input buffer and split sizes of every
    `c10d.alltoall_base_` call, which is what `all_to_all_single` runs, and
    of the functional collective `_c10d_functional.all_to_all_single`.
    """

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.bytes_to_others: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        send = splits = None
        if packet is torch.ops.c10d.alltoall_base_:
            send, splits = args[1], args[4]  # (output, input, group, out, in)
        elif packet is torch.ops._c10d_functional.all_to_all_single:
            send, splits = args[0], args[2]  # (input, out sizes, in sizes, g)
        if send is not None:
            bytes_per_row = send[0].nbytes
            own_rows = splits[self.rank]
            self.bytes_to_others.append(send.nbytes - own_rows * bytes_per_row)
        return func(*args, **(kwargs or {}))


def expert_parallel_moe(
    rank: int,
    world_size: int,
    capacity_factor: float = CAPACITY_FACTOR,
    seed: int = SEED,
    num_tokens: int = NUM_TOKENS,
) -> dict[str, object]:
    """One rank of the expert-parallel layer: route, then the layer above.

    Returns this rank's outputs for its own tokens, which choices were kept,
    the capacity, the bytes each all-to-all sent to other ranks (as the
    dispatcher saw them), how many tokens each of its experts received, and
    the host syncs from routing to combine: none, since every split size is
    known in advance (the collective itself may still block the host: gloo's
    does, and a count of calls cannot see that).
    """
    if NUM_EXPERTS % world_size or num_tokens % world_size:
        raise ValueError(
            f"world_size {world_size} must divide {NUM_EXPERTS} experts "
            f"and {num_tokens} tokens"
        )
    # Nothing from a rank may reach the caller's screen.
    # The same kernels under torchrun and run_workers; 4 ranks share 2 cores.
    torch.set_num_threads(1)
    experts_per_rank = NUM_EXPERTS // world_size
    mine = slice(rank * experts_per_rank, (rank + 1) * experts_per_rank)
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    weights = {
        name: weight.to(device) for name, weight in moe_weights(seed).items()
    }
    # Every rank makes all the tokens from the seed and keeps its own slice.
    tokens = make_tokens(seed, num_tokens).chunk(world_size)[rank].to(device)

    capacity = expert_capacity(
        len(tokens), TOP_K, NUM_EXPERTS, capacity_factor
    )
    with HostSyncCounter() as syncs, AllToAllRecorder(rank) as recorder:
        route_weights, experts = route(tokens, weights["gate.weight"])
        layer = expert_parallel_layer(
            tokens,
            route_weights,
            experts,
            weights["experts.gate_up_proj"][mine],
            weights["experts.down_proj"][mine],
            world_size,
            capacity,
        )
    output, kept = layer["output"], layer["kept"]
    # A filled slot holds a token (never all zero); an empty one is zeros.
    filled = (layer["received"].abs().sum(dim=-1) > 0).view(
        experts_per_rank, world_size, capacity
    )
    return {
        "rank": rank,
        "experts_held": list(range(NUM_EXPERTS))[mine],
        # Lists, not tensors: a tensor sent to the caller travels as shared
        # memory, which a rank that exits right after reporting may free
        # before the caller has read it.
        "output": output.tolist(),
        "kept": kept.tolist(),
        "capacity": capacity,
        "send_buffer_bytes": layer["send"].nbytes,
        "bytes_to_others": recorder.bytes_to_others,
        "tokens_per_local_expert": filled.sum(dim=(1, 2)).tolist(),
        "host_syncs": syncs.accelerator_count,
        "host_syncs_by_call": syncs.by_call(),
        "device_type": device.type,  # where this rank computed
    }


def summarize(results: list[dict[str, object]]) -> dict[str, object]:
    """A run's launcher-independent facts, JSON-ready (torchrun prints it)."""
    outputs = torch.tensor(
        [row for result in results for row in result["output"]]
    )
    return {
        "world_size": len(results),
        "capacity": [result["capacity"] for result in results],
        "dropped": [
            int((~torch.tensor(result["kept"])).sum()) for result in results
        ],
        "bytes_to_others": [result["bytes_to_others"] for result in results],
        "tokens_per_local_expert": [
            result["tokens_per_local_expert"] for result in results
        ],
        "host_syncs": [result["host_syncs"] for result in results],
        "output_sha256": hashlib.sha256(outputs.numpy().tobytes()).hexdigest(),
    }


def main() -> None:
    """Under torchrun: join the group, run this rank; rank 0 prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = expert_parallel_moe(rank, world_size)
    gathered: list[dict[str, object] | None] = [None] * world_size
    dist.all_gather_object(gathered, result)
    if rank == 0:
        print(json.dumps(summarize(gathered)))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=4)
