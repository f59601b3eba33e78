"""Sharded checkpoints and a preemption drill, for chapter 15.

The chapter is `notebooks/15_checkpoints_and_preemption.ipynb`.
`train_worker` runs on every rank through `tpuready.runtime.launch.run_workers`
(the notebook), or under the standard launcher, where rank 0 prints the
result as one JSON line. Train to step 3 on 4 ranks, saving every 3 steps
under DIR, then resume on 2 ranks (4 on a TPU v5e or v6e host, which refuses
2) up to step 9, saving every 2 steps:

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch15_checkpoints.py DIR 3 3
    torchrun --standalone --nproc-per-node=2 \\
        notebooks/workers/ch15_checkpoints.py DIR 9 2

It trains an FSDP2 model with AdamW and saves model, optimizer and losses
with `torch.distributed.checkpoint`. It resumes from the latest complete
checkpoint, whatever number of ranks wrote it, and can kill one of its
ranks in the middle of a save (the preemption drill).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, init_device_mesh

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

# A small MLP. HIDDEN = 10 rows split over 4 ranks as 3, 3, 3 and 1:
# the checkpoint must cope with uneven shards too.
IN_FEATURES, HIDDEN, OUT_FEATURES = 8, 10, 4
BATCH_SIZE = 8  # the global batch: N ranks train on BATCH_SIZE / N rows each
LEARNING_RATE = 0.05
SEED = 0
MAX_STEPS = 16  # the loss history in a checkpoint has this fixed length
FINAL_PREFIX = "step-"
PARTIAL_SUFFIX = ".partial"


def build(world_size: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same seeded MLP on every rank, sharded with FSDP2 over all.

    The mesh comes first, on the device tpuready.runtime.launch chose for the
    rank; the model, built from the seed on the CPU, then moves there.
    """
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    mesh = init_device_mesh(device.type, (world_size,))
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, OUT_FEATURES),
    ).to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return model, optimizer


def batch(
    step: int, rank: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of global batch `step`, drawn from a seed per step.

    A resumed run sees exactly the batches the interrupted one would have.
    """
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(BATCH_SIZE, IN_FEATURES, generator=generator)
    targets = torch.randn(BATCH_SIZE, OUT_FEATURES, generator=generator)
    device = rank_device()
    return (
        inputs.chunk(world_size)[rank].to(device),
        targets.chunk(world_size)[rank].to(device),
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    rank: int,
    world_size: int,
) -> torch.Tensor:
    """One AdamW step on this rank's rows; returns the global mean loss."""
    inputs, targets = batch(step, rank, world_size)
    loss = F.mse_loss(model(inputs), targets)
    loss.backward()  # FSDP2 averages the gradients over the ranks
    optimizer.step()
    optimizer.zero_grad()
    reported = loss.detach().clone()
    dist.all_reduce(reported, op=dist.ReduceOp.AVG)
    return reported


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    """Model and optimizer state, unsharded, on rank 0's CPU (else None).

    Every rank must call it: it all-gathers each sharded tensor. The copy
    matters: tensors that were never sharded (AdamW's step counts) come back
    as the optimizer's own, which the next step would change in place.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=options
    )
    if dist.get_rank() != 0:
        return None
    return copy.deepcopy({"model": model_state, "optimizer": optimizer_state})


def shard_rows(model: nn.Module) -> int:
    """How many rows of the first layer's weight this rank holds."""
    weight = model[0].weight
    if not isinstance(weight, DTensor):
        raise TypeError(f"expected a sharded DTensor, got {type(weight)}")
    return weight.to_local().shape[0]


def digest(state: Any) -> str:
    """A short SHA-256 of every tensor's bytes and other value, by key."""
    hasher = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().reshape(-1)
            hasher.update(f"{tensor.dtype}{tuple(value.shape)}".encode())
            hasher.update(tensor.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                hasher.update(repr(key).encode())
                visit(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        else:
            hasher.update(repr(value).encode())

    visit(state)
    return hasher.hexdigest()[:16]


def checkpoint_name(step: int) -> str:
    """The folder name of the complete checkpoint taken after `step`."""
    return f"{FINAL_PREFIX}{step:05d}"


def latest_complete_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None.

    Only folders named exactly `step-NNNNN` count. A save goes to
    `step-NNNNN.partial` and is renamed once every rank has written, so a
    half-written checkpoint is never chosen.
    """
    pattern = re.compile(rf"{re.escape(FINAL_PREFIX)}(\d+)")
    steps = [
        int(match.group(1))
        for path in Path(root).iterdir()
        if path.is_dir() and (match := pattern.fullmatch(path.name))
    ]
    return Path(root, checkpoint_name(max(steps))) if steps else None


class KilledWhileWritingWriter(FileSystemWriter):
    """A FileSystemWriter killed (SIGKILL) right after writing its shard.

    It plays a preemption that lands mid-save: this rank's data file is on
    disk; the checkpoint's metadata is not.
    """

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        """Write this rank's shard as usual, then die without a word."""
        written = super().write_data(plan, planner)
        written.wait()
        os.kill(os.getpid(), signal.SIGKILL)
        return written  # never reached


def save_checkpoint(
    root: Path,
    step: int,
    state: dict[str, Any],
    killed_while_writing: bool = False,
) -> None:
    """Save `state` to `root/step-NNNNN.partial`, then rename it."""
    partial = root / (checkpoint_name(step) + PARTIAL_SUFFIX)
    writer_type = (
        KilledWhileWritingWriter if killed_while_writing else FileSystemWriter
    )
    # dcp.save returns once every rank has written its shard and rank 0
    # has written the metadata that indexes them.
    dcp.save(state, storage_writer=writer_type(partial))
    if dist.get_rank() == 0:  # a file operation, no tensor: safe to diverge
        os.replace(partial, root / checkpoint_name(step))  # atomic
    dist.barrier()  # nobody goes on before the checkpoint is complete


def train_worker(
    rank: int,
    world_size: int,
    root: str,
    num_steps: int,
    every: int,
    kill: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Train to `num_steps`, saving every `every` steps; resume if it can.

    The run starts from the latest complete checkpoint under `root`,
    whatever number of ranks saved it. `kill=(rank, step)` kills that rank
    (SIGKILL) in the middle of saving that step's checkpoint. The losses
    are saved too, so a resumed run returns the whole curve. Rank 0 also
    returns the full state as loaded and at the end.
    """
    if num_steps > MAX_STEPS:
        raise ValueError(f"num_steps must be <= {MAX_STEPS}, got {num_steps}")
    model, optimizer = build(world_size)
    losses = torch.zeros(MAX_STEPS)  # a fixed shape: step s at index s - 1
    done = torch.zeros((), dtype=torch.int64)  # the last step done
    loaded = None
    latest = latest_complete_checkpoint(root)
    if latest is not None:
        # This run's own sharded state: its DTensors tell dcp.load which
        # slice of each tensor this rank reads. get_state_dict also creates
        # AdamW's state, so there is room to load it.
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "losses": losses,
            "step": done,
        }
        dcp.load(state, checkpoint_id=latest)  # in place, losses too
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        loaded = full_state(model, optimizer)
    resumed_from = int(done)
    for step in range(resumed_from + 1, num_steps + 1):
        losses[step - 1] = train_step(model, optimizer, step, rank, world_size)
        if step % every == 0:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state = {
                "model": model_state,
                "optimizer": optimizer_state,
                "losses": losses,
                "step": torch.tensor(step),
            }
            killed = kill == (rank, step)
            save_checkpoint(Path(root), step, state, killed)
    return {
        "resumed_from": resumed_from,
        "losses": losses[:num_steps].tolist(),
        "shard_rows": shard_rows(model),
        "loaded": loaded,
        "final": full_state(model, optimizer),
    }


def main() -> None:
    """Under torchrun: arguments ROOT NUM_STEPS EVERY; rank 0 prints JSON."""
    root, num_steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = train_worker(rank, world_size, root, num_steps, every)
    dist.destroy_process_group()
    if rank == 0:
        loaded = result["loaded"]
        summary = {
            "world_size": world_size,
            "resumed_from": result["resumed_from"],
            "losses": result["losses"],
            "loaded_digest": None if loaded is None else digest(loaded),
            "final_digest": digest(result["final"]),
        }
        print(json.dumps(summary))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_torchrun_main(main, __file__, nproc_per_node=4)
