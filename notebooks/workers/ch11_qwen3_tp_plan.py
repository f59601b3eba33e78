"""Worker for chapter 11: shard a saved tiny Qwen3 with its own TP plan.

The notebook saves the model and starts `tp_plan_logits` with
`tpuready.runtime.launch.run_workers` on `smallest_world_size(2)` ranks (2 on a
CPU or a GPU, 4 on a TPU v5e or v6e host, which refuses 2); each rank returns
its logits. As a script it runs under the standard launcher (from the
repository root), each rank building and saving the same seeded model itself:

    torchrun --standalone --nproc-per-node=2 \\
        notebooks/workers/ch11_qwen3_tp_plan.py

(`--nproc-per-node=4` on a v5e or v6e host), and rank 0 prints a summary as
one JSON line.
"""

from __future__ import annotations

import json
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)
from tpuready.runtime.tiny_models import (
    TENSOR_PARALLEL_QWEN3,
    tiny_qwen3_config,
)

# A tiny Qwen3 with grouped-query attention (two query heads per KV head):
# every split size (heads, KV heads, MLP) divides by 2 and by 4 ranks, the
# counts `smallest_world_size(2)` gives (4 on a TPU v5e or v6e host). Column-
# wise k/v projections must give each rank whole KV heads.
QWEN3_SIZES = TENSOR_PARALLEL_QWEN3
SEED = 0
BATCH_SIZE, SEQ_LEN = 2, 12
# transformers names its layer styles; these are the torch styles they mean.
TORCH_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
# Styles that leave a module whole on every rank in a forward pass.
REPLICATED_STYLES = frozenset({"replicated_with_grad_allreduce"})


def _quiet_transformers() -> None:
    """Keep transformers' warnings, logs and progress bars out of the log."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_and_save_qwen3(model_dir: str) -> torch.nn.Module:
    """The seeded tiny Qwen3 in float32, saved (safetensors) in `model_dir`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    config = tiny_qwen3_config("tensor-parallel")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval().save_pretrained(model_dir)
    return model


def example_input_ids() -> torch.Tensor:
    """A fixed batch of token ids, the same in every process."""
    generator = torch.Generator().manual_seed(SEED)
    shape = (BATCH_SIZE, SEQ_LEN)
    return torch.randint(QWEN3_SIZES["vocab_size"], shape, generator=generator)


def torch_plan_from_transformers(tp_plan: dict[str, str]) -> dict[str, object]:
    """Translate a transformers `base_model_tp_plan` for `parallelize_module`.

    "colwise" and "rowwise" become torch styles; the q/k norms'
    "replicated_with_grad_allreduce" stays a plain module on every rank, which
    is what it is in a forward pass. Keys keep their `*` wildcards, which
    `parallelize_module` understands too.
    """
    unknown = sorted(
        set(tp_plan.values()) - set(TORCH_STYLES) - REPLICATED_STYLES
    )
    if unknown:
        raise ValueError(f"no torch style for transformers' styles {unknown}")
    return {
        f"model.{name}": TORCH_STYLES[style]()
        for name, style in tp_plan.items()
        if style in TORCH_STYLES
    }


def tp_plan_logits(
    rank: int, world_size: int, model_dir: str
) -> dict[str, object]:
    """Load `model_dir` sharded by the model's own TP plan, two ways; logits.

    First the one-line way, `tp_plan="auto"` (transformers applies the plan;
    it needs `accelerate`), then the same plan applied by hand: load whole,
    translate the styles, `parallelize_module`.
    """
    _quiet_transformers()
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    auto_model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        distributed_config=DistributedConfig(tp_plan="auto"),
    )
    device = rank_device()  # cpu here; cuda:<local rank> or tpu:0 elsewhere
    by_hand = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32
    ).to(device)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("tp",))
    plan = torch_plan_from_transformers(by_hand.config.base_model_tp_plan)
    parallelize_module(by_hand, mesh, plan)
    input_ids = example_input_ids().to(device)
    with torch.no_grad():
        logits = auto_model.eval()(input_ids).logits
        by_hand_logits = by_hand.eval()(input_ids).logits
    q_proj = auto_model.model.layers[0].self_attn.q_proj.weight
    return {
        "logits": logits.cpu().numpy(),
        "by_hand_logits": by_hand_logits.cpu().numpy(),
        "q_proj_local_shape": list(q_proj.to_local().shape),
        "q_proj_placements": str(q_proj.placements),
    }


def summarise(logits: np.ndarray, reference: np.ndarray) -> dict[str, object]:
    """Rank 0's printout: a checksum, the gap to `reference`."""
    return {
        "logits_sum": round(float(np.float64(logits).sum()), 5),
        "max_abs_difference": float(np.abs(logits - reference).max()),
    }


def _main() -> None:
    """Under torchrun: save, load sharded, rank 0 prints one JSON line."""
    _quiet_transformers()
    with tempfile.TemporaryDirectory() as model_dir:
        # Save before joining the group: once a group exists, transformers'
        # save_pretrained writes on rank 0 only, and each rank has its folder.
        model = build_and_save_qwen3(model_dir)
        init_rank()  # gloo, nccl or tpu_dist, and this rank's device
        rank, world_size = dist.get_rank(), dist.get_world_size()
        result = tp_plan_logits(rank, world_size, model_dir)
    with torch.no_grad():
        reference = model(example_input_ids()).logits.numpy()
    if rank == 0:
        print(json.dumps(summarise(result["logits"], reference)))
    dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(_main, __file__, nproc_per_node=2)
