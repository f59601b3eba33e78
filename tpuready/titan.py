"""A `tpuready.plan` plan as TorchTitan 0.3.0's command-line flags, and the flag a rejection names.

Taught in `notebooks/19_train_with_torchtitan.ipynb` ("Train with TorchTitan"). TorchTitan runs
in a venv of its own (`.venv-titan`, `requirements-titan.txt`); this module does not import it.

TorchTitan 0.3.0 builds its meshes from a world of ranks, in the order pp, dp_replicate,
dp_shard, cp, tp for the dense layers. Expert parallelism borrows its ranks from the dense
region: the experts' mesh is (dp_replicate, efsdp, ep) with efsdp = dp_shard x cp x tp / ep.
A plan's axes map onto that as follows (`titan_degrees`):

- `data` (replicated weights, all-reduced gradients) is `data_parallel_replicate_degree`;
- `fsdp` and `expert` together are `data_parallel_shard_degree`: a plan shards the dense
  weights and splits the batch over both, and so does TorchTitan's dp_shard;
- `expert` is also `expert_parallel_degree`, and TorchTitan's efsdp then equals the plan's
  fsdp x tensor;
- `tensor` is `tensor_parallel_degree`. TorchTitan splits attention and the dense FFN over it
  (with sequence parallelism on by default, so `seq_len` must divide by it) but not the
  experts, which it shards FSDP-style over efsdp, where a plan cuts each expert's FFN width.

The flags also carry the batch (`local_batch_size` per dp rank, `global_batch_size`), the
sequence length, activation checkpointing (`activation-checkpoint:full` when the plan
recomputes, `:none` when not) and `--training.disable_cuda_graphs`: TorchTitan 0.3.0 captures
CUDA graphs by default and refuses expert parallelism's all-to-all dispatcher under them;
a TPU has no CUDA graphs to capture.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tpuready.plan import AXES, Plan, PlanError
from tpuready.validate import InputError, whole_number

__all__ = [
    "TITAN_VERSION",
    "TitanConfigError",
    "TitanRejection",
    "raise_for_rejection",
    "rejected_flag",
    "titan_degrees",
    "titan_flags",
]

TITAN_VERSION = "0.3.0"
"""The TorchTitan release these flags are written for and checked against."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FLAG = re.compile(r"--[a-z][a-z0-9_.-]*[a-z0-9]")


class TitanConfigError(PlanError):
    """A plan that has no TorchTitan configuration; the message names the value and the flag."""


class TitanRejection(InputError):
    """TorchTitan refused a configuration; the message quotes it and names the flag to fix."""


def titan_degrees(mesh: Mapping[str, int]) -> dict[str, int]:
    """TorchTitan's parallelism degrees, by flag name, for a plan's mesh (a missing axis is 1)."""
    if not isinstance(mesh, Mapping):
        raise TitanConfigError(f"mesh must map axis names to sizes, got {mesh!r}: use plan.mesh")
    unknown = sorted(set(mesh) - set(AXES))
    if unknown:
        raise TitanConfigError(f"unknown mesh axes {unknown}; use names from {list(AXES)}")
    data, fsdp, expert, tensor = (
        whole_number(
            f"mesh[{axis!r}]",
            mesh.get(axis, 1),
            fix="pass a positive axis size",
            error=TitanConfigError,
        )
        for axis in AXES
    )
    return {
        "data_parallel_replicate_degree": data,
        "data_parallel_shard_degree": fsdp * expert,
        "tensor_parallel_degree": tensor,
        "expert_parallel_degree": expert,
    }


def titan_flags(plan: Plan, *, module: str, config: str) -> list[str]:
    """`python -m torchtitan.train`'s arguments for `plan`, with TorchTitan's config registry
    `module` and its function `config` (which supplies the model): the map in the docstring."""
    if not isinstance(plan, Plan):
        raise TitanConfigError(f"plan must be a tpuready.plan.Plan, got {plan!r}: use make_plan")
    for name, value in (("module", module), ("config", config)):
        if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
            raise TitanConfigError(
                f"{name} must be a Python name such as 'qwen3_235b', got {value!r}: "
                f"TorchTitan imports it for --{name}"
            )
    degrees = titan_degrees(plan.mesh)
    tensor = degrees["tensor_parallel_degree"]
    if plan.seq_len % tensor:
        raise TitanConfigError(
            f"seq_len={plan.seq_len} is not divisible by tensor={tensor}: TorchTitan's sequence "
            "parallelism splits --training.seq_len over --parallelism.tensor_parallel_degree"
        )
    batch_ranks = degrees["data_parallel_replicate_degree"] * degrees["data_parallel_shard_degree"]
    flags = ["--module", module, "--config", config]
    for name, degree in degrees.items():
        flags += [f"--parallelism.{name}", str(degree)]
    flags += [
        "--training.local_batch_size",
        str(plan.global_batch // batch_ranks),
        "--training.global_batch_size",
        str(plan.global_batch),
        "--training.seq_len",
        str(plan.seq_len),
        "--training.disable_cuda_graphs",
        "activation-checkpoint:full" if plan.recompute else "activation-checkpoint:none",
    ]
    return flags


def rejected_flag(message: str) -> str:
    """The flag a TorchTitan 0.3.0 error points at: the first flag the message names (tyro
    spells them with hyphens, the book with underscores); for `ParallelDims`' product check,
    the shard degree (the one TorchTitan fills from the world size); for a mesh that does not
    unflatten after that check passed, the expert degree (efsdp x ep is the only product left)."""
    if not isinstance(message, str):
        raise TypeError(f"message must be TorchTitan's error text, got {message!r}")
    named = _FLAG.search(message)
    if named:
        return named.group().replace("-", "_").replace("__", "--", 1)
    if message.startswith("Invalid parallel dims"):
        return "--parallelism.data_parallel_shard_degree"
    if "unflatten" in message:
        return "--parallelism.expert_parallel_degree"
    raise TitanRejection(f"no flag found in TorchTitan's message {message!r}: read it whole")


def raise_for_rejection(result: Mapping[str, object]) -> None:
    """Raise `TitanRejection` naming the flag when TorchTitan refused `result` (one case of
    `notebooks/titan/ch19_check.py`'s output); return quietly when it accepted it."""
    if result.get("accepted"):
        return
    message = str(result.get("message", ""))
    raise TitanRejection(
        f"TorchTitan {TITAN_VERSION} rejects it ({result.get('stage')}): {message} "
        f"Fix {rejected_flag(message)}."
    )
