"""A `tpuready.calc.plan` plan as TorchTitan 0.3.0's command-line flags, and the flag a rejection
names.

Taught in `notebooks/19_train_with_torchtitan.ipynb` ("Train with TorchTitan"). TorchTitan runs
in a venv of its own (`.venv-titan`, `requirements-titan.txt`); this module does not import it.

TorchTitan 0.3.0 builds its meshes from a world of ranks, in the order pp, dp_replicate,
dp_shard, cp, tp for the dense layers. Expert parallelism borrows its ranks from the dense
region: the experts' mesh is (dp_replicate, efsdp, ep) with efsdp = dp_shard x cp x tp / ep.
A rank is a device, and a plan counts chips: a TPU v7 chip is two devices. A plan's axes map
onto that as follows (`titan_degrees`):

- `data` (replicated weights, all-reduced gradients) is `data_parallel_replicate_degree`;
- `fsdp` and `expert` together are `data_parallel_shard_degree`: a plan shards the dense
  weights and splits the batch over both, and so does TorchTitan's dp_shard;
- `tensor` is `tensor_parallel_degree`. TorchTitan splits attention and the dense FFN over it
  but not the experts when expert parallelism is on (it shards them FSDP-style over efsdp and
  reuses tp to split tokens), so a plan with both has no TorchTitan equivalent and is refused;
- the devices of one chip are `context_parallel_degree`: they split each of the chip's
  sequences (twice the shard degree would need twice the sequences), and FSDP shards the
  dense weights over dp_shard x cp;
- `expert` times the devices per chip is `expert_parallel_degree`: each device holds half of
  its chip's experts, the expert group spans the plan's `expert` chips and efsdp equals the
  plan's `fsdp`, so each chip stores and gathers the plan's experts. With `expert` 1 it is 1.
- `pipeline_parallel_degree` is 1: a plan has no pipeline axis.

What a chip stores is then the plan's; what it moves is not quite: each device gathers whole
dense layers for its half of the sequences (twice the plan's dense gathers per chip), and
attention's keys and values pass between a chip's devices. The plan counts neither.

The flags also carry the batch (`local_batch_size` per dp rank, `global_batch_size`), the
sequence length, activation checkpointing (`activation-checkpoint:full` when the plan
recomputes, `:none` when not) and `--training.disable_cuda_graphs`: TorchTitan 0.3.0 captures
CUDA graphs by default and refuses expert parallelism's all-to-all dispatcher under them; a
TPU has no CUDA graphs to capture. With context parallelism they name the load balancer that
TorchTitan documents for FlexAttention, Qwen3's attention (`ptrr`; its default, `headtail`,
is for SDPA), and the sequence length must divide as TorchTitan's trainer (tp x 2 cp) and
PyTorch's context-parallel block masks (cp x 128) require.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from tpuready.calc.plan import AXES, Plan, PlanError
from tpuready.validate import InputError, whole_number

__all__ = [
    "TITAN_VERSION",
    "TitanConfigError",
    "TitanRejection",
    "raise_for_rejection",
    "rejected_flag",
    "titan_degrees",
    "titan_flags",
    "titan_options",
]

TITAN_VERSION = "0.3.0"
"""The TorchTitan release these flags are written for and checked against."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"{_NAME}(\.{_NAME})*")  # a module path: --module imports it
_FUNCTION = re.compile(_NAME)  # a function in it: --config looks it up with getattr
_FLAG = re.compile(r"--[a-z][a-z0-9_.-]*[a-z0-9]")
_SUBCOMMAND = re.compile(r"[a-z][a-z0-9-]*:[a-z0-9_-]+")  # activation-checkpoint:full
_SUGGESTED = re.compile(r"Perhaps you meant:?\s*(--[a-z][a-z0-9_.-]*[a-z0-9])")


class TitanConfigError(PlanError):
    """A plan that has no TorchTitan configuration; the message names the value and the flag."""


class TitanRejection(InputError):
    """TorchTitan refused a configuration; the message quotes it and names the flag to fix."""


def titan_degrees(mesh: Mapping[str, int], *, devices_per_chip: int = 1) -> dict[str, int]:
    """TorchTitan's six parallelism degrees, by flag name in its mesh order, for a plan's mesh
    (a missing axis is 1) on chips of `devices_per_chip` devices (`Chip.devices_per_chip`)."""
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
    devices = whole_number(
        "devices_per_chip",
        devices_per_chip,
        fix="pass the chip's devices_per_chip from tpuready.calc.hardware",
        error=TitanConfigError,
    )
    if expert > 1 and tensor > 1:
        raise TitanConfigError(
            f"mesh['expert']={expert} with mesh['tensor']={tensor} has no TorchTitan "
            f"{TITAN_VERSION} equivalent: with expert parallelism it shards the experts over "
            "efsdp and reuses tensor_parallel_degree to split tokens, not each expert's width; "
            "plan without one of them"
        )
    return {
        "pipeline_parallel_degree": 1,
        "data_parallel_replicate_degree": data,
        "data_parallel_shard_degree": fsdp * expert,
        "context_parallel_degree": devices,
        "tensor_parallel_degree": tensor,
        "expert_parallel_degree": expert * devices if expert > 1 else 1,
    }


def titan_flags(plan: Plan, *, module: str, config: str) -> list[str]:
    """`python -m torchtitan.train`'s arguments for `plan` on its chip's devices, with
    TorchTitan's config registry `module` and its function `config` (which supplies the
    model): the map in the module docstring."""
    if not isinstance(plan, Plan):
        raise TitanConfigError(
            f"plan must be a tpuready.calc.plan.Plan, got {plan!r}: use make_plan"
        )
    for name, value, pattern, example in (
        ("module", module, _MODULE, "qwen3_235b"),
        ("config", config, _FUNCTION, "qwen3_235b_a22b"),
    ):
        if not isinstance(value, str) or not pattern.fullmatch(value):
            kind, use = {
                "module": ("module", "imports it"),
                "config": ("function", "looks it up in the module"),
            }[name]
            raise TitanConfigError(
                f"{name} must be a Python {kind} name such as {example!r}, got {value!r}: "
                f"TorchTitan {use} for --{name}"
            )
    degrees = titan_degrees(plan.mesh, devices_per_chip=plan.chip.devices_per_chip)
    tensor, context = degrees["tensor_parallel_degree"], degrees["context_parallel_degree"]
    # The trainer's rule (sequence parallelism over tp, load balancing over 2 cp) and, with
    # context parallelism, PyTorch's block masks (cp x 128, FlexAttention's block size).
    divisor = tensor * 2 * context if context > 1 else tensor
    divisor = math.lcm(divisor, 128 * context) if context > 1 else divisor
    if plan.seq_len % divisor:
        raise TitanConfigError(
            f"seq_len={plan.seq_len} is not divisible by {divisor}: --training.seq_len must "
            f"divide by --parallelism.tensor_parallel_degree {tensor} (sequence parallelism) "
            f"and, with --parallelism.context_parallel_degree {context} above 1, by 2 x and "
            "128 x that degree (load balancing, FlexAttention's blocks); pick such a length"
        )
    batch_ranks = degrees["data_parallel_replicate_degree"] * degrees["data_parallel_shard_degree"]
    flags = ["--module", module, "--config", config]
    for name, degree in degrees.items():
        flags += [f"--parallelism.{name}", str(degree)]
    if context > 1:
        flags += ["--parallelism.context_parallel_load_balancer", "ptrr"]
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


def titan_options(flags: Sequence[str]) -> dict[str, str]:
    """`flags` as TorchTitan reads them: `--name value` and `--name=value` pairs by name with
    underscores (tyro takes hyphens too), a switch as '' and the subcommand as its own key."""
    if isinstance(flags, str) or not all(isinstance(flag, str) for flag in flags):
        raise TypeError(f"flags must be a list of strings, got {flags!r}: use titan_flags")
    options, index = {}, 0
    while index < len(flags):
        flag, index = flags[index], index + 1
        if not flag.startswith("--"):
            options[flag] = ""  # the subcommand, e.g. activation-checkpoint:full
            continue
        name, equals, value = flag.partition("=")
        name = "--" + name[2:].replace("-", "_")
        following = flags[index] if index < len(flags) else "--"
        # A value follows its flag; a switch is followed by a flag or the subcommand.
        if not equals and not following.startswith("--") and not _SUBCOMMAND.fullmatch(following):
            value, index = following, index + 1
        options[name] = value
    return options


def rejected_flag(message: str) -> str:
    """The flag a TorchTitan 0.3.0 error points at: the one tyro suggests ("Perhaps you meant"),
    else the first flag the message names (tyro spells them with hyphens, the book with
    underscores); `--module` or `--config` when TorchTitan cannot find them; for
    `ParallelDims`' product check, the shard degree (the one TorchTitan fills from the world
    size); for a mesh that does not unflatten after that check passed, the expert degree
    (efsdp x ep is the only product left)."""
    if not isinstance(message, str):
        raise TitanConfigError(
            f"message must be TorchTitan's error text, got {message!r} "
            f"({type(message).__name__}): pass result['message'] of a check"
        )
    named = _SUGGESTED.search(message) or _FLAG.search(message)
    if named:
        return "--" + named.group(named.lastindex or 0)[2:].replace("-", "_")
    if message.startswith("Cannot import module"):
        return "--module"
    if message.startswith("Config function"):
        return "--config"
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
