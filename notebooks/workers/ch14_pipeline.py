"""Chapter 14, step 7: pipeline parallelism on CPU ranks.

In `notebooks/14_planning_8192_chips.ipynb`: a small stack of layers, cut
into one stage per rank and trained one step with
`torch.distributed.pipelining` under GPipe and 1F1B. Each rank reports the
loss of each microbatch (the last stage), its gradients, and the most
activation bytes autograd held at once for its stage: the memory the two
schedules differ in. `pipeline_worker` runs on every rank through
`tpuready.runtime.launch.run_workers` (the notebook), or under the standard
launcher:

    torchrun --standalone --nproc-per-node=2 notebooks/workers/ch14_pipeline.py

where rank 1 (the last stage) prints one JSON line.
"""

from __future__ import annotations

import json
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
)

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

WIDTH, NUM_LAYERS = 32, 8
BATCH_SIZE = 16
MICROBATCH_COUNTS = (4, 8)  # each divides the batch
SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
SEED = 0


def build_layers() -> list[nn.Module]:
    """The whole model as a list of layers, seeded: the same on every rank."""
    torch.manual_seed(SEED)
    blocks = [
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        for _ in range(NUM_LAYERS)
    ]
    return [*blocks, nn.Linear(WIDTH, 1)]


def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """One global batch of inputs and regression targets."""
    generator = torch.Generator().manual_seed(SEED + 1)
    inputs = torch.randn(BATCH_SIZE, WIDTH, generator=generator)
    return inputs, torch.randn(BATCH_SIZE, 1, generator=generator)


def stage_bounds(num_stages: int) -> list[int]:
    """Where each stage's layers start, and the end: an even share each."""
    num = NUM_LAYERS + 1  # the blocks and the output layer
    return [round(i * num / num_stages) for i in range(num_stages + 1)]


def stage_layers(stage: int, num_stages: int) -> nn.Sequential:
    """Stage `stage` of `num_stages`: its share of the layers, in order."""
    bounds = stage_bounds(num_stages)
    return nn.Sequential(*build_layers()[bounds[stage] : bounds[stage + 1]])


def whole_model_name(stage: int, num_stages: int, name: str) -> str:
    """A stage's parameter name ("0.0.weight") as the whole model's
    ("4.0.weight"): the layer index shifts by the stage's first layer."""
    index, rest = name.split(".", 1)
    return f"{int(index) + stage_bounds(num_stages)[stage]}.{rest}"


class _Saved:
    """What autograd keeps for a saved tensor: the tensor, in an object a
    weak reference can watch."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedBytes:
    """Saved-tensor hooks that track the activation bytes autograd holds for
    backward, and the most it held at once. Tensors that share a parameter's
    storage (a weight a matmul saves) are not activations: they are skipped.
    """

    def __init__(self, parameters: list[nn.Parameter]) -> None:
        self.live = self.peak = 0
        self._parameter_storages = {
            p.untyped_storage().data_ptr() for p in parameters
        }

    def pack(self, tensor: torch.Tensor) -> object:
        if tensor.untyped_storage().data_ptr() in self._parameter_storages:
            return _Saved(tensor)
        size = tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        holder = _Saved(tensor)  # freed when autograd drops the saved tensor
        weakref.finalize(holder, self._release, size)
        return holder

    def unpack(self, holder: _Saved) -> torch.Tensor:
        return holder.tensor

    def _release(self, size: int) -> None:
        self.live -= size


def run_schedule(
    rank: int, world_size: int, schedule: str, microbatches: int
) -> dict:
    """Two training steps of the pipeline under `schedule` ("GPipe", "1F1B"),
    the batch cut into `microbatches`; the activation bytes of the second."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}"
        )
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    module = stage_layers(rank, world_size).to(device)
    stage = PipelineStage(module, rank, world_size, device)
    runner = SCHEDULES[schedule](
        stage, n_microbatches=microbatches, loss_fn=F.mse_loss
    )
    inputs, targets = make_batch()

    def step(losses: list[torch.Tensor]) -> None:
        if rank == 0:
            runner.step(inputs.to(device))
        elif rank == world_size - 1:
            runner.step(target=targets.to(device), losses=losses)
        else:
            runner.step()

    # The first step also runs a forward of one microbatch to infer the
    # stages' shapes, and keeps what it saved: measure the second step.
    step([])
    module.zero_grad()
    losses: list[torch.Tensor] = []
    saved = SavedBytes(list(module.parameters()))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        step(losses)
    return {
        "losses": [loss.item() for loss in losses],
        "gradients": {
            whole_model_name(rank, world_size, name): parameter.grad.cpu()
            for name, parameter in module.named_parameters()
        },
        "peak_saved_bytes": saved.peak,
        "device_type": device.type,  # where this rank computed
    }


def pipeline_worker(rank: int, world_size: int) -> dict[str, dict[int, dict]]:
    """`run_schedule` for each schedule and microbatch count: one launch."""
    return {
        schedule: {
            count: run_schedule(rank, world_size, schedule, count)
            for count in MICROBATCH_COUNTS
        }
        for schedule in SCHEDULES
    }


def _main() -> None:
    """Under torchrun: join, run every schedule, the last stage prints JSON."""
    init_rank()  # gloo, nccl or tpu_dist, and this rank's device
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = pipeline_worker(rank, world_size)
    if rank == world_size - 1:
        summary = {
            schedule: {
                count: {
                    "losses": result["losses"],
                    "peak_saved_bytes": result["peak_saved_bytes"],
                }
                for count, result in by_count.items()
            }
            for schedule, by_count in results.items()
        }
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(_main, __file__, nproc_per_node=2)
