"""Chapter 11, step 7: shard the vocabulary (11_tensor_parallel.ipynb).

Chapter 11's blocks between a token embedding and an output head, both split
along the vocabulary, and the loss computed two ways: on logits gathered
whole, and on the vocabulary shards with `loss_parallel`. The notebook starts
`vocab_parallel_worker` with `tpuready.runtime.launch.run_workers`; as a script
it runs under the standard launcher (from the repository root):

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch11_vocab_parallel.py

and rank 0 prints a summary as one JSON line.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

try:  # imported as workers.ch11_vocab_parallel (the notebook, the tests)
    from workers import ch11_tensor_parallel as blocks
except ImportError:  # run as a script: torchrun puts this folder on the path
    import ch11_tensor_parallel as blocks

VOCAB_SIZE = 256  # divides by 1, 2 and 4 ranks
HEADS = ("gathered", "loss_parallel")


class LanguageModel(nn.Module):
    """A token embedding, chapter 11's blocks, a final norm, an output head."""

    def __init__(self, vocab_size: int = VOCAB_SIZE) -> None:
        super().__init__()
        dim = blocks.MODEL_SIZES["dim"]
        self.embed = nn.Embedding(vocab_size, dim)
        self.body = blocks.TinyTransformer(**blocks.MODEL_SIZES)
        self.norm = nn.RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.body(self.embed(input_ids))))


def build_language_model_and_batch() -> tuple[
    LanguageModel, torch.Tensor, torch.Tensor
]:
    """The seeded model, its input ids and next-token targets, everywhere."""
    torch.manual_seed(blocks.SEED)
    model = LanguageModel()
    generator = torch.Generator().manual_seed(blocks.SEED + 1)
    shape = (blocks.BATCH_SIZE, blocks.SEQ_LEN + 1)
    tokens = torch.randint(0, VOCAB_SIZE, shape, generator=generator)
    return model, tokens[:, :-1], tokens[:, 1:]


def next_token_loss(
    logits: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The mean cross-entropy over every position."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def vocab_parallel_plan(head: str) -> dict[str, object]:
    """The embedding and output head split along the vocabulary.

    "gathered" all-gathers the logits for an ordinary loss; "loss_parallel"
    keeps them sharded over the vocabulary, as a DTensor, for
    `loss_parallel`.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    logits_layout = (
        ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        if head == "loss_parallel"
        else ColwiseParallel(output_layouts=Replicate())
    )
    return {
        # An embedding's rows are the vocabulary: each rank holds V/N rows,
        # looks up the ids in its range (zeros for the rest), and an
        # all-reduce adds the partial embeddings.
        "embed": RowwiseParallel(input_layouts=Replicate()),
        # The head's output features are the vocabulary: V/N logits a rank.
        "lm_head": logits_layout,
    }


def run_head(rank: int, world_size: int, head: str) -> dict[str, object]:
    """One forward, loss and backward with the vocabulary split `head`'s way.

    Returns the loss, the gradients gathered whole, the logits' shape on this
    rank, and the collectives of the forward pass and the loss, with sizes.
    """
    model, input_ids, targets = build_language_model_and_batch()
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    model = model.to(device)
    input_ids, targets = input_ids.to(device), targets.to(device)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    for block in model.body.layers:
        parallelize_module(block, mesh, blocks.tensor_parallel_plan())
    parallelize_module(model, mesh, vocab_parallel_plan(head))
    with CommDebugMode() as comm_mode, blocks.CollectiveSizes() as sizes:
        logits = model(input_ids)
        after_forward = len(sizes.records)
        if head == "loss_parallel":
            # The loss and its backward both inside the context: cross-entropy
            # on vocabulary shards, with no logits gathered.
            with loss_parallel():
                loss = next_token_loss(logits, targets)
                loss_value = loss.full_tensor().item()
                loss_type = type(loss).__name__
        else:
            loss = next_token_loss(logits, targets)
            loss_value, loss_type = loss.item(), type(loss).__name__
    if head == "loss_parallel":
        with loss_parallel():
            loss.backward()
    else:
        loss.backward()
    return {
        "loss": loss_value,
        "loss_type": loss_type,
        "gradients": blocks.full_gradients(model),
        "local_logits_shape": list(blocks.local_part(logits).shape),
        "local_embedding_shape": list(
            blocks.local_part(model.embed.weight).shape
        ),
        "collectives": blocks.collective_counts(comm_mode),
        "forward_sizes": sizes.records[:after_forward],
        "loss_sizes": sizes.records[after_forward:],
        "device_type": device.type,  # where this rank computed
    }


def vocab_parallel_worker(
    rank: int, world_size: int
) -> dict[str, dict[str, object]]:
    """`run_head` both ways: logits gathered, then `loss_parallel`."""
    return {head: run_head(rank, world_size, head) for head in HEADS}


def _main() -> None:
    """Under torchrun: join, run both ways, rank 0 prints one JSON line."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = vocab_parallel_worker(rank, world_size)
    summary = {
        head: {
            "loss": values["loss"],
            "embed_gradient_checksum": blocks.checksum(
                values["gradients"]["embed.weight"]
            ),
            "loss_sizes": values["loss_sizes"],
        }
        for head, values in result.items()
    }
    if rank == 0:
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(_main, __file__, nproc_per_node=4)
