"""Chapter 10: finish an FSDP2 training script
(`notebooks/10_fsdp2_training_script.ipynb`).

What a real training script adds to `fully_shard`, each checked against the
plain sharded run of chapter 9's `ch09_fsdp`: a bfloat16 mixed-precision
policy, `reshard_after_forward`, gradient clipping on DTensor gradients,
explicit prefetching, `torch.compile` of each block, and a transformers model
sharded layer by layer, with and without activation checkpointing.
`practice_worker` runs on every rank through
`tpuready.runtime.launch.run_workers` (the notebook), or under the standard
launcher, where rank 0 prints JSON:

    torchrun --standalone --nproc-per-node=2 \\
        notebooks/workers/ch10_fsdp_practice.py
"""

from __future__ import annotations

import itertools
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from tpuready.runtime.device import compile_backend_for
from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)
from tpuready.runtime.tiny_models import TINY_QWEN3, tiny_qwen3_config

try:  # imported as workers.ch10_fsdp_practice (the notebook, the tests)
    from workers import ch09_fsdp
except ImportError:  # run as a script: torchrun puts this folder on the path
    import ch09_fsdp

MAX_NORM = 0.1  # small enough that this step's gradients get clipped
# A tiny Qwen3 from its config: 2 decoder layers, tied embeddings.
QWEN3_CONFIG = {
    **TINY_QWEN3,  # tpuready's tiny sizes: 2 layers of width 32
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}
QWEN3_BATCH, QWEN3_SEQ_LEN = 4, 16


def this_rank_batch(
    rank: int, world_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of ch09_fsdp's first global batch, on `device`."""
    tokens, targets = ch09_fsdp.make_batches(1)[0]
    return (
        tokens.chunk(world_size)[rank].to(device),
        targets.chunk(world_size)[rank].to(device),
    )


def block_bytes_after_forward(
    model: ch09_fsdp.TinyTransformer,
    reshard_after_forward: bool,
    rank: int,
    world_size: int,
) -> int:
    """Bytes the blocks' parameters hold on this rank after a forward pass."""
    for block in model.blocks:
        block.set_reshard_after_forward(reshard_after_forward)
    tokens, _ = ch09_fsdp.make_batches(1)[0]
    model(tokens.chunk(world_size)[rank])  # forward only, no backward
    return ch09_fsdp.local_bytes(list(model.blocks.parameters()))


def clip_after_one_backward(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor
) -> dict:
    """Clip the gradients of one step to MAX_NORM; the norms before, after."""
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    # The standard call works on DTensor gradients: each rank sums the
    # squares of its shards, and the total is all-reduced for it.
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    gradients = [p.grad for p in model.parameters()]
    after = torch.nn.utils.get_total_norm(gradients)
    returns = type(norm).__name__
    if isinstance(norm, DTensor):  # a replicated DTensor: read it whole
        norm, after = norm.full_tensor(), after.full_tensor()
    return {"before": norm.item(), "after": after.item(), "returns": returns}


def prefetch_next_blocks(model: ch09_fsdp.TinyTransformer) -> None:
    """Ask each block to start the next one's all-gather (forward) and the
    previous one's (backward) before it computes its own."""
    blocks = list(model.blocks)
    for block, following in itertools.pairwise(blocks):
        block.set_modules_to_forward_prefetch([following])
        following.set_modules_to_backward_prefetch([block])


def shard_transformers_model(model: nn.Module, mesh: DeviceMesh) -> int:
    """`fully_shard` each decoder layer, then the root; returns the layers.

    transformers lists the layer class in `_no_split_modules` (the attribute
    accelerate's device maps read too); the root takes the embeddings and the
    output head, which stay together when they are tied.
    """
    layer_classes = set(model._no_split_modules)
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(layers)


def saved_bytes_and_loss(
    model: nn.Module, input_ids: torch.Tensor
) -> tuple[int, torch.Tensor]:
    """Bytes autograd saves for backward in one forward; the loss."""
    saved = 0

    def count(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        loss = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    return saved, loss.loss


def tiny_qwen3() -> nn.Module:
    """The tiny Qwen3, freshly initialised from seed 0 (the same everywhere).

    transformers is imported here, not at the top: the notebook imports this
    module to print its functions, and only the ranks need transformers.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_qwen3_config(**QWEN3_CONFIG))


def qwen3_run(
    mesh: DeviceMesh, rank: int, world_size: int, checkpointing: bool
) -> dict:
    """One forward and backward of the sharded tiny Qwen3 on this rank's
    sequences; the bytes saved, the loss and this rank's gradient shards."""
    device = torch.device(mesh.device_type)
    model = tiny_qwen3()  # the same weights on every rank and in every run
    model.train()
    if checkpointing:  # transformers' own switch, non-reentrant (its default)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    layers = shard_transformers_model(model.to(device), mesh)
    generator = torch.Generator().manual_seed(1)
    shape = (QWEN3_BATCH, QWEN3_SEQ_LEN)
    input_ids = torch.randint(
        0, QWEN3_CONFIG["vocab_size"], shape, generator=generator
    )
    mine = input_ids.chunk(world_size)[rank].to(device)
    saved, loss = saved_bytes_and_loss(model, mine)
    loss.backward()
    reported = loss.detach().float()
    dist.all_reduce(reported, op=dist.ReduceOp.AVG)
    gradients = [p.grad.to_local().detach().cpu() for p in model.parameters()]
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    return {
        "saved_bytes": saved,
        "loss": reported.item(),
        "layers": layers,
        "tied": tied,
        "gradients": gradients,
        "input_ids": input_ids,
    }


def qwen3_reference_loss(input_ids: torch.Tensor) -> float:
    """The same tiny Qwen3, unsharded, on the whole batch in one process."""
    model = tiny_qwen3()
    with torch.no_grad():
        return model(input_ids=input_ids, labels=input_ids).loss.item()


def practice_worker(rank: int, world_size: int) -> dict:
    """Each knob on ch09_fsdp's sharded model, then the tiny Qwen3."""
    device_type = rank_device().type  # "cuda", "tpu" or "cpu": tpuready chose
    mesh = init_device_mesh(device_type, (world_size,))
    batches = ch09_fsdp.make_batches()
    plain = ch09_fsdp.build_sharded_model(mesh)
    plain_losses, _ = ch09_fsdp.train(plain, batches, rank, world_size)
    # Then a forward with each setting (the training is over).
    block_bytes = {
        reshard: block_bytes_after_forward(plain, reshard, rank, world_size)
        for reshard in (True, False)
    }
    # The same steps with parameters all-gathered and used in bfloat16.
    bf16_policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    bf16_losses, _ = ch09_fsdp.train(
        ch09_fsdp.build_sharded_model(mesh, mp_policy=bf16_policy),
        batches,
        rank,
        world_size,
    )
    clipped = clip_after_one_backward(
        ch09_fsdp.build_sharded_model(mesh),
        *this_rank_batch(rank, world_size, torch.device(device_type)),
    )
    # The same step unsharded, in this process, on the whole batch.
    unsharded = ch09_fsdp.TinyTransformer(**ch09_fsdp.CONFIG).to(device_type)
    ch09_fsdp.init_weights(unsharded)
    clipped_unsharded = clip_after_one_backward(
        unsharded, *this_rank_batch(0, 1, torch.device(device_type))
    )
    prefetching = ch09_fsdp.build_sharded_model(mesh)
    prefetch_next_blocks(prefetching)
    prefetch_losses, _ = ch09_fsdp.train(
        prefetching, batches, rank, world_size
    )
    compiled = ch09_fsdp.build_sharded_model(mesh)
    backend = compile_backend_for(torch.device(device_type))
    for block in compiled.blocks:  # after fully_shard: FSDP's hooks stay eager
        block.compile(backend=backend, dynamic=False)
    counters.clear()
    compiled_losses, _ = ch09_fsdp.train(compiled, batches, rank, world_size)
    graphs = counters["stats"]["unique_graphs"]
    graph_breaks = dict(counters["graph_break"])
    qwen3 = qwen3_run(mesh, rank, world_size, checkpointing=False)
    checkpointed = qwen3_run(mesh, rank, world_size, checkpointing=True)
    gradient_difference = max(
        (a - b).abs().max().item()
        for a, b in zip(
            qwen3["gradients"], checkpointed["gradients"], strict=True
        )
    )
    return {
        "rank": rank,
        "device_type": device_type,  # where this rank computed
        "plain_losses": plain_losses,
        "bf16_losses": bf16_losses,
        "block_bytes_after_forward": block_bytes,
        "clipped": clipped,
        "clipped_unsharded": clipped_unsharded,
        "prefetch_losses": prefetch_losses,
        "compiled_losses": compiled_losses,
        "compiled_graphs": graphs,
        "compiled_graph_breaks": graph_breaks,
        "qwen3_layers": qwen3["layers"],
        "qwen3_tied": qwen3["tied"],
        "qwen3_loss": qwen3["loss"],
        "qwen3_checkpointed_loss": checkpointed["loss"],
        "qwen3_reference_loss": qwen3_reference_loss(qwen3["input_ids"]),
        "qwen3_saved_bytes": qwen3["saved_bytes"],
        "qwen3_checkpointed_saved_bytes": checkpointed["saved_bytes"],
        "qwen3_gradient_difference": gradient_difference,
        "qwen3_largest_gradient": max(
            g.abs().max().item() for g in qwen3["gradients"]
        ),
    }


def main() -> None:
    """Under torchrun: join the group, run the worker, rank 0 prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = practice_worker(rank, world_size)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(result))


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=2)
