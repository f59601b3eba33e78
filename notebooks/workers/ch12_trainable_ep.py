"""Expert parallelism you can train, and a dropless exchange, over real ranks.

Taught in `notebooks/12_expert_parallel.ipynb` (step 7) and
`notebooks/13_balance_or_drop_nothing.ipynb`, on the layer, router and
buffers of `ch12_expert_parallel.py`:

- `expert_parallel_gradients` runs the capacity layer forward and backward,
  with either `dist.all_to_all_single` (which writes into its output and
  records no gradient) or `all_to_all_single_autograd` from
  `torch.distributed._functional_collectives` (a gradient, and it compiles
  with `torch.compile(fullgraph=True)`, as TorchTPU needs), adds Switch
  Transformer's load-balancing loss over all ranks' tokens, and returns the
  gradients the notebook compares with transformers' layer on one process.
- `dropless_moe` sends every (token, choice) pair, with uneven split sizes
  that the ranks first exchange and read on the host.

The file runs unchanged under the standard launcher (rank 0 prints JSON):

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch12_trainable_ep.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional_collectives
import torch.nn.functional as F

from tpuready.inspection.syncs import HostSyncCounter
from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

if not __package__:  # run as a script by torchrun: make `workers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workers.ch12_expert_parallel import (
    HIDDEN_SIZE,
    NUM_EXPERTS,
    NUM_TOKENS,
    SEED,
    TOP_K,
    AllToAllRecorder,
    all_to_all,
    expert_capacity,
    expert_parallel_layer,
    make_tokens,
    moe_weights,
)

# Each expert can take every token of a rank: nothing is ever dropped, so
# the layer equals transformers' for every token (capacity = tokens per rank).
NO_DROP_FACTOR = NUM_EXPERTS / TOP_K
# transformers' Qwen3MoeConfig default router_aux_loss_coef.
AUX_LOSS_COEF = 0.001

Exchange = Callable[[torch.Tensor, list[int]], torch.Tensor]


def exchange_with_gradient(
    send: torch.Tensor, splits: list[int]
) -> torch.Tensor:
    """The all-to-all that records a gradient: its backward is the reverse
    all-to-all, which carries each gradient back to the rank it came from.
    PyTorch's functional collective, the one torch.compile can trace
    (`torch.distributed.nn.functional.all_to_all_single` refuses to)."""
    return functional_collectives.all_to_all_single_autograd(
        send, splits, splits, dist.group.WORLD
    )


def _check_divides(world_size: int, num_tokens: int) -> None:
    """Every rank needs whole experts and as many tokens as the others, or
    the ranks' buffers differ in shape and the all-to-all hangs."""
    if NUM_EXPERTS % world_size or num_tokens % world_size:
        raise ValueError(
            f"world_size {world_size} must divide the {NUM_EXPERTS} experts "
            f"and the {num_tokens} tokens: use 1, 2, 4 or 8 ranks"
        )


def router_probabilities(
    tokens: torch.Tensor, router_weight: torch.Tensor
) -> torch.Tensor:
    """The router's float32 softmax over experts, as Qwen3MoeTopKRouter."""
    return F.softmax(
        F.linear(tokens, router_weight), dtype=torch.float, dim=-1
    )


def top_k_weights(
    probabilities: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts and their renormalised weights (norm_topk_prob=True)."""
    weights, experts = torch.topk(probabilities, TOP_K, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


def balance_sums(
    probabilities: torch.Tensor, experts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per expert, over this rank's tokens: assignments routed to it and
    summed router probability. Compare-and-sum, not bincount: no host sync."""
    expert_ids = torch.arange(NUM_EXPERTS, device=experts.device)
    counts = (experts.reshape(-1, 1) == expert_ids).sum(dim=0).float()
    return counts, probabilities.sum(dim=0)


def load_balancing_loss(
    counts: torch.Tensor, probability_sums: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, as transformers' Qwen3-MoE
    computes it: E * sum_e f_e P_e, with f_e the share of tokens routed to
    expert e (counts / tokens; the shares add up to k) and P_e its mean
    router probability. Only P_e has a gradient, which moves probability
    away from the experts with more than their share. The value is no
    measure of balance (even routing gives k, uneven can give less): watch
    the loads themselves."""
    return NUM_EXPERTS * torch.sum(
        (counts / num_tokens) * (probability_sums / num_tokens)
    )


def capacity_layer(
    tokens: torch.Tensor,
    weights: dict[str, torch.Tensor],
    world_size: int,
    capacity: int,
    exchange: Exchange,
) -> dict[str, torch.Tensor]:
    """`expert_parallel_layer` behind the router, keeping the probabilities
    for the load-balancing loss: differentiable wherever `exchange` is.
    Returns this rank's output, the router probabilities, the chosen experts
    and the experts' outputs as they came back (the second exchange's)."""
    probabilities = router_probabilities(tokens, weights["gate.weight"])
    route_weights, experts = top_k_weights(probabilities)
    layer = expert_parallel_layer(
        tokens,
        route_weights,
        experts,
        weights["gate_up_proj"],
        weights["down_proj"],
        world_size,
        capacity,
        exchange,
    )
    return {
        "output": layer["output"],
        "probabilities": probabilities,
        "experts": experts,
        "returned": layer["returned"],
    }


def _local_parameters(
    rank: int, world_size: int, seed: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """This rank's trainable weights: the whole router, its own experts."""
    experts_per_rank = NUM_EXPERTS // world_size
    mine = slice(rank * experts_per_rank, (rank + 1) * experts_per_rank)
    full = moe_weights(seed)
    local = {
        "gate.weight": full["gate.weight"],
        "gate_up_proj": full["experts.gate_up_proj"][mine],
        "down_proj": full["experts.down_proj"][mine],
    }
    return {
        name: weight.to(device).clone().requires_grad_()
        for name, weight in local.items()
    }


def _gradient_or_none(tensor: torch.Tensor) -> list | None:
    """A gradient as nested lists, or None where autograd never reached."""
    return None if tensor.grad is None else tensor.grad.tolist()


def expert_parallel_gradients(
    rank: int,
    world_size: int,
    with_gradient: bool = True,
    aux_loss_coef: float = AUX_LOSS_COEF,
    seed: int = SEED,
    num_tokens: int = NUM_TOKENS,
) -> dict[str, object]:
    """One training step's backward pass of the expert-parallel layer.

    The loss is the mean over all tokens of the squared output, plus
    `aux_loss_coef` times the load-balancing loss of all ranks' tokens (the
    per-expert counts summed over the ranks before the product). Nothing
    is dropped (NO_DROP_FACTOR), so the gradients must equal transformers'
    layer's on one process. Returns this rank's token gradients, the router
    gradient it holds after the all-reduce, its experts' gradients (None where
    none arrived), and how many all-to-alls ran forward and backward.
    """
    _check_divides(world_size, num_tokens)
    torch.set_num_threads(1)
    device = rank_device()
    weights = _local_parameters(rank, world_size, seed, device)
    tokens = make_tokens(seed, num_tokens).chunk(world_size)[rank].to(device)
    tokens.requires_grad_()
    capacity = expert_capacity(len(tokens), TOP_K, NUM_EXPERTS, NO_DROP_FACTOR)
    exchange = exchange_with_gradient if with_gradient else all_to_all

    with AllToAllRecorder(rank) as forward_calls:
        layer = capacity_layer(tokens, weights, world_size, capacity, exchange)
    output = layer["output"]
    counts, probability_sums = balance_sums(
        layer["probabilities"], layer["experts"]
    )
    # The batch's loss is E sum_e (C_e / T)(P_e / T) over all ranks' tokens.
    # The counts C_e carry no gradient: sum them over the ranks first. P_e is
    # a sum over the ranks, so with the batch's counts each rank's own
    # probability sums give its part of the loss, and the parts add up.
    dist.all_reduce(counts)
    aux_part = load_balancing_loss(counts, probability_sums, num_tokens)
    # This rank's part of the mean over all tokens; the ranks' parts add up.
    loss = output.pow(2).sum() / (num_tokens * HIDDEN_SIZE)
    with AllToAllRecorder(rank) as backward_calls:
        (loss + aux_loss_coef * aux_part).backward()
    aux_loss = aux_part.detach().clone()
    dist.all_reduce(aux_loss)  # the batch's loss, to report
    # The router is replicated: each rank holds the gradient of its own
    # tokens, and the ranks sum them, as DDP or FSDP would.
    dist.all_reduce(weights["gate.weight"].grad)
    return {
        "rank": rank,
        # Does the experts' output that came back carry a gradient path?
        "exchange_has_grad_fn": layer["returned"].grad_fn is not None,
        "token_gradients": tokens.grad.tolist(),
        "router_gradient": weights["gate.weight"].grad.tolist(),
        "gate_up_gradient": _gradient_or_none(weights["gate_up_proj"]),
        "down_gradient": _gradient_or_none(weights["down_proj"]),
        "aux_loss": aux_loss.item(),
        "forward_all_to_alls": len(forward_calls.bytes_to_others),
        "backward_all_to_alls": len(backward_calls.bytes_to_others),
        "device_type": device.type,
    }


def compiled_exchange_gradient(
    rank: int, world_size: int
) -> dict[str, object]:
    """Compile a function around `exchange_with_gradient` with fullgraph=True
    (as a TorchTPU step is compiled) and check its backward: an all-to-all
    moves rows without changing them, so the gradient of sum(y ** 2) is 2x."""
    torch.set_num_threads(1)
    device = rank_device()
    splits = [2] * world_size
    rows = torch.arange(2 * world_size * HIDDEN_SIZE, dtype=torch.float32)
    x = (rows.view(2 * world_size, HIDDEN_SIZE) + 100 * rank).to(device)
    x.requires_grad_()

    def sum_of_squares(send: torch.Tensor) -> torch.Tensor:
        return exchange_with_gradient(send * 1.0, splits).pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(
        sum_of_squares, backend="aot_eager", fullgraph=True
    )
    compiled(x).backward()
    return {
        "gradient_is_2x": bool(torch.equal(x.grad, 2 * x.detach())),
        "device_type": device.type,
    }


def gradients_both_ways(
    rank: int, world_size: int
) -> dict[str, dict[str, object]]:
    """`expert_parallel_gradients` with each exchange: one launch, not two."""
    return {
        name: expert_parallel_gradients(rank, world_size, with_gradient=flag)
        for name, flag in (("all_to_all_single", False), ("autograd", True))
    }


def _split_rows(rows: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """`rows` cut into consecutive pieces of the given (host) sizes."""
    return list(torch.split(rows, sizes))


@dataclass(frozen=True)
class Dispatched:
    """What `dropless_dispatch` sent and received, for the way back."""

    received: torch.Tensor  # rows from every peer, peer by peer
    receive_table: list[list[int]]  # [peer][local expert]: rows received
    send_sizes: list[int]  # rows sent to each peer
    receive_sizes: list[int]  # rows received from each peer
    order: torch.Tensor  # the sort by expert: row i is pair order[i]


def dropless_dispatch(
    tokens: torch.Tensor, experts: torch.Tensor, world_size: int
) -> Dispatched:
    """Send every (token, choice) pair to its expert's rank: uneven splits."""
    experts_per_rank = NUM_EXPERTS // world_size
    flat_experts = experts.reshape(-1)  # pair t * TOP_K + c: token t
    order = torch.argsort(flat_experts, stable=True)  # pairs by expert
    send = tokens[order // TOP_K]  # each peer's pairs form one run
    expert_ids = torch.arange(NUM_EXPERTS, device=experts.device)
    rows_per_expert = (flat_experts.unsqueeze(1) == expert_ids).sum(dim=0)
    # Each peer learns how many rows each of its experts gets from me.
    incoming = torch.empty_like(rows_per_expert)
    dist.all_to_all_single(incoming, rows_per_expert)
    # The host reads both tables: all_to_all_single takes Python lists.
    send_table = rows_per_expert.view(world_size, experts_per_rank).tolist()
    receive_table = incoming.view(world_size, experts_per_rank).tolist()
    send_sizes = [sum(row) for row in send_table]
    receive_sizes = [sum(row) for row in receive_table]
    received = send.new_empty(sum(receive_sizes), HIDDEN_SIZE)
    dist.all_to_all_single(received, send, receive_sizes, send_sizes)
    return Dispatched(
        received, receive_table, send_sizes, receive_sizes, order
    )


def dropless_experts(
    dispatched: Dispatched, gate_up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """This rank's experts on the rows they received, each on however many
    arrived; the results in the order the rows came in."""
    world_size = len(dispatched.receive_sizes)
    # Regroup what arrived, peer by peer, into one run per local expert.
    pieces = [
        _split_rows(piece, sizes)
        for piece, sizes in zip(
            _split_rows(dispatched.received, dispatched.receive_sizes),
            dispatched.receive_table,
            strict=True,
        )
    ]
    outputs_by_peer: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
    for local in range(len(gate_up_proj)):
        rows = torch.cat([peer_pieces[local] for peer_pieces in pieces])
        gate, up = F.linear(rows, gate_up_proj[local]).chunk(2, dim=-1)
        result = F.linear(F.silu(gate) * up, down_proj[local])
        sizes = [peer_sizes[local] for peer_sizes in dispatched.receive_table]
        for peer, part in enumerate(_split_rows(result, sizes)):
            outputs_by_peer[peer].append(part)
    return torch.cat([torch.cat(parts) for parts in outputs_by_peer])


def dropless_combine(
    expert_rows: torch.Tensor,
    dispatched: Dispatched,
    route_weights: torch.Tensor,
) -> torch.Tensor:
    """The reverse all-to-all, then each token's router-weighted sum."""
    returned = expert_rows.new_empty(sum(dispatched.send_sizes), HIDDEN_SIZE)
    dist.all_to_all_single(
        returned,
        expert_rows,
        dispatched.send_sizes,  # what each peer sends back, I sent it
        dispatched.receive_sizes,
    )
    unsorted = torch.empty_like(returned)
    unsorted[dispatched.order] = returned  # undo the sort: pair order again
    pairs = unsorted.view(-1, TOP_K, HIDDEN_SIZE)  # (tokens, choices, hidden)
    return (pairs * route_weights.unsqueeze(-1)).sum(dim=1)


def dropless_moe(
    rank: int,
    world_size: int,
    seed: int = SEED,
    num_tokens: int = NUM_TOKENS,
    token_seed: int | None = None,
) -> dict[str, object]:
    """The layer with no capacity: every (token, choice) pair is sent.

    `dropless_dispatch` sorts the pairs by expert, so each peer's pairs form
    one run of the send buffer; the ranks first exchange how many rows each
    of their experts will get (a small all-to-all), then read those counts
    on the host to give `all_to_all_single` its uneven split sizes.
    `dropless_combine` sends the results back. Returns this rank's output,
    the host syncs the forward pass made, and the rows it sent and received.
    """
    _check_divides(world_size, num_tokens)
    torch.set_num_threads(1)
    experts_per_rank = NUM_EXPERTS // world_size
    mine = slice(rank * experts_per_rank, (rank + 1) * experts_per_rank)
    device = rank_device()
    weights = {name: w.to(device) for name, w in moe_weights(seed).items()}
    batch_seed = seed if token_seed is None else token_seed
    tokens = make_tokens(batch_seed, num_tokens).chunk(world_size)[rank]
    tokens = tokens.to(device)

    with torch.no_grad(), HostSyncCounter() as syncs:
        probabilities = router_probabilities(tokens, weights["gate.weight"])
        route_weights, experts = top_k_weights(probabilities)
        dispatched = dropless_dispatch(tokens, experts, world_size)
        expert_rows = dropless_experts(
            dispatched,
            weights["experts.gate_up_proj"][mine],
            weights["experts.down_proj"][mine],
        )
        output = dropless_combine(expert_rows, dispatched, route_weights)
    return {
        "rank": rank,
        "output": output.tolist(),
        "host_syncs": syncs.accelerator_count,
        "host_syncs_by_call": syncs.by_call(),
        "rows_sent": dispatched.send_sizes,
        "rows_received": dispatched.receive_sizes,
        "device_type": device.type,
    }


def dropless_batches(
    rank: int, world_size: int, seeds: tuple[int, ...] = (SEED,)
) -> list[dict[str, object]]:
    """`dropless_moe` on the tokens of each seed (other batches, other
    routings; the weights stay seed 0's): one launch for all of them."""
    return [dropless_moe(rank, world_size, token_seed=seed) for seed in seeds]


def main() -> None:
    """Under torchrun: both runs on this rank; rank 0 prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = {
        "gradients": gradients_both_ways(rank, world_size),
        "compiled": compiled_exchange_gradient(rank, world_size),
        "dropless": dropless_batches(rank, world_size),
    }
    gathered: list[dict[str, object] | None] = [None] * world_size
    dist.all_gather_object(gathered, result)
    if rank == 0:
        print(json.dumps(gathered))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=4)
