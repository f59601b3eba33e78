"""A `tpuready.calc.plan` plan as TorchTitan 0.3.0's command-line flags, and the flag a rejection
names.

Taught in `notebooks/26_train_with_torchtitan.ipynb` ("Train with TorchTitan"). TorchTitan runs
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
- the devices of one chip split its work (twice the shard degree would need twice the
  sequences), either as `context_parallel_degree` (`within_chip="context"`, `titan_degrees`'
  default, which sees no plan): they split each of the chip's sequences, and FSDP shards the
  dense weights over dp_shard x cp; or as a factor of `tensor_parallel_degree`
  (`within_chip="tensor"`);
- `expert` times the devices per chip is `expert_parallel_degree`: each device holds half of
  its chip's experts, the expert group spans the plan's `expert` chips and efsdp equals the
  plan's `fsdp`, so each chip stores and gathers the plan's experts. With `expert` 1 it is 1.
- `pipeline_parallel_degree` is 1: a plan has no pipeline axis.

What a chip stores is then the plan's; what it moves is not quite. With `context` each device
gathers whole dense layers for its half of the sequences (twice the plan's dense gathers per
chip), and attention's keys and values pass between a chip's devices. With `tensor` (Megatron-
style heads with sequence parallelism; with expert parallelism TorchTitan splits the MoE's
tokens over tp) the chip gathers the plan's dense layers, and the hidden state passes between
its devices. The plan counts neither.

`chip_split_costs` prices the two splits per training step and chip (`ChipSplit`): the bytes
that cross the ICI and the die-to-die link inside the chip, and the memory per device. It
counts, per layer and for each of the chip's tokens T (h the hidden size, kv the key or value
width, d the devices per chip, each collective receiving (d - 1) / d of its array):

- context: an all-gather of the keys and values (T x 2 kv, bf16) in each forward pass (two
  with recomputation; TorchTitan gathers them whole for FlexAttention) and a reduce-scatter of
  their gradients in the backward; every device gathers the whole dense layers (d times the
  plan's dense gathers per chip), holds two of them whole, and keeps the gathered keys and
  values for the backward of every layer it keeps activations for;
- tensor: sequence parallelism's all-gather before the attention's projections and
  reduce-scatter after them (T x h, bf16), in each forward pass and in the backward, plus
  four for the embedding and the output head; each device gathers 1/d of the dense layers
  (the plan's gathers per chip) and keeps the gathered attention input (T x h) for the backward.

The activations stay inside the chip. Where the dense gathers travel (bf16 all-gathers forward
and backward, fp32 gradient reduce-scatters) depends on the collective's ring; the model
assumes rings in rank order, with a chip's devices consecutive ranks (the launcher's job,
chapter 26). Then with `context` one FSDP ring visits a chip's d devices in turn: one of its
links per chip crosses the ICI and d - 1 stay inside the chip, each carrying about a whole
dense layer, so the chip receives the plan's dense gathers over the ICI and d - 1 times them
over the die-to-die link. With `tensor` each of d rings visits one device per chip and carries
1/d of the layers: the plan's dense gathers over the ICI, none over the die-to-die link. Both
splits then move the same dense bytes over the ICI (the experts' traffic, the plan's either
way, is left out of both). A runtime that rings otherwise moves `context`'s extra copies over
the ICI instead.

`choose_within_chip` picks `tensor` for a plan without a tensor axis when d divides the
model's attention and key-value heads (TorchTitan's Qwen3 requires it of tp), and the tensor
split moves no more bytes over the ICI, fewer over the die-to-die link, and fits a device's
memory; else `context`, which also serves every plan with a tensor axis (the model prices
none). `titan_flags` writes that choice unless told otherwise.

The rest of a device's memory is the plan's per chip over d: either split halves every
activation and every shard. Bytes only, not time: Google states no bandwidth for the
die-to-die link, and the model leaves out what overlaps with compute (FSDP prefetches its
gathers a layer ahead; TorchTitan's async tensor parallelism, under `torch.compile`, pipelines
tp's collectives with its matmuls).

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
from dataclasses import dataclass

from tpuready.calc.plan import AXES, Plan, PlanError
from tpuready.validate import InputError, one_of, whole_number

__all__ = [
    "CHECKPOINT_ASYNC_MODES",
    "TITAN_VERSION",
    "WITHIN_CHIP",
    "ChipSplit",
    "TitanConfigError",
    "TitanRejection",
    "chip_split_costs",
    "choose_within_chip",
    "raise_for_rejection",
    "rejected_flag",
    "titan_degrees",
    "titan_flags",
    "titan_options",
    "titan_run_flags",
]

TITAN_VERSION = "0.3.0"
"""The TorchTitan release these flags are written for and checked against."""

WITHIN_CHIP: tuple[str, ...] = ("context", "tensor")
"""The TorchTitan degree a chip's devices can split its work over: `context_parallel_degree`
or `tensor_parallel_degree` (`choose_within_chip` picks one for a plan)."""

CHECKPOINT_ASYNC_MODES: tuple[str, ...] = ("disabled", "async", "async_with_pinned_mem")
"""TorchTitan 0.3.0's `--checkpoint.async_mode` values (its DCP checkpointer's `Literal`)."""

BF16, FP32 = 2, 4

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


def titan_degrees(
    mesh: Mapping[str, int], *, devices_per_chip: int = 1, within_chip: str = "context"
) -> dict[str, int]:
    """TorchTitan's six parallelism degrees, by flag name in its mesh order, for a plan's mesh
    (a missing axis is 1) on chips of `devices_per_chip` devices (`Chip.devices_per_chip`),
    split over the degree `within_chip` names (`WITHIN_CHIP`)."""
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
    within_chip = one_of("within_chip", within_chip, WITHIN_CHIP, error=TitanConfigError)
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
        "context_parallel_degree": devices if within_chip == "context" else 1,
        "tensor_parallel_degree": tensor * (devices if within_chip == "tensor" else 1),
        "expert_parallel_degree": expert * devices if expert > 1 else 1,
    }


def titan_flags(
    plan: Plan,
    *,
    module: str,
    config: str,
    within_chip: str | None = None,
    run_flags: Sequence[str] = (),
) -> list[str]:
    """`python -m torchtitan.train`'s arguments for `plan` on its chip's devices, split over
    `within_chip` (`WITHIN_CHIP`; by default `choose_within_chip(plan)`), with TorchTitan's
    config registry `module` and its function `config` (which supplies the model): the map in
    the module docstring. `run_flags` (`titan_run_flags`) go before the activation-checkpoint
    subcommand, which comes last: tyro applies every flag after a subcommand to it, and
    TorchTitan rejects the run flags there ("Unrecognized or misplaced options")."""
    _require_split_plan(plan)
    if isinstance(run_flags, str) or not all(isinstance(flag, str) for flag in run_flags):
        raise TitanConfigError(
            f"run_flags must be a list of strings, got {run_flags!r}: use titan_run_flags"
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
    if within_chip is None:
        within_chip = choose_within_chip(plan)
    degrees = titan_degrees(
        plan.mesh, devices_per_chip=plan.chip.devices_per_chip, within_chip=within_chip
    )
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
        *run_flags,
        "activation-checkpoint:full" if plan.recompute else "activation-checkpoint:none",
    ]
    return flags


def titan_run_flags(
    *,
    dump_folder: str,
    checkpoint_interval: int,
    checkpoint_folder: str = "checkpoint",
    async_mode: str = "async",
    compile_backend: str = "tpu",
) -> list[str]:
    """TorchTitan 0.3.0's flags for a run's output, checkpoints and compilation, appended to
    `titan_flags`' (taught in chapter 26, step 6):

    - `--dump_folder`: where the trainer writes; every host must see the same folder;
    - `--checkpoint.enable`, `--checkpoint.folder` (relative to the dump folder),
      `--checkpoint.interval` (steps between saves) and `--checkpoint.async_mode`
      (`CHECKPOINT_ASYNC_MODES`; 'async' stages the save on the host in a thread, over a gloo
      group; 'async_with_pinned_mem' also pins the staging memory);
    - `--compile.enable` and `--compile.backend`: TorchTitan passes the backend to
      `torch.compile` by name (default 'inductor', which TorchTPU 0.2.0 refuses for TPU
      inputs), so the default here is TorchTPU's, 'tpu'. `--compile.components` keeps
      TorchTitan's default, the model and the loss."""
    for name, value in (
        ("dump_folder", dump_folder),
        ("checkpoint_folder", checkpoint_folder),
        ("compile_backend", compile_backend),
    ):
        if not isinstance(value, str) or not value.strip() or value.startswith("-"):
            raise TitanConfigError(
                f"{name} must be a non-empty string that is not a flag, got {value!r}"
            )
    interval = whole_number(
        "checkpoint_interval",
        checkpoint_interval,
        fix="pass the steps between checkpoints, such as 500",
        error=TitanConfigError,
    )
    async_mode = one_of("async_mode", async_mode, CHECKPOINT_ASYNC_MODES, error=TitanConfigError)
    return [
        "--dump_folder",
        dump_folder,
        "--checkpoint.enable",
        "--checkpoint.folder",
        checkpoint_folder,
        "--checkpoint.interval",
        str(interval),
        "--checkpoint.async_mode",
        async_mode,
        "--compile.enable",
        "--compile.backend",
        compile_backend,
    ]


@dataclass(frozen=True)
class ChipSplit:
    """One way of splitting each chip's work between its devices, per training step and chip:
    the model in the module docstring (rings in rank order, a chip's devices consecutive)."""

    within_chip: str
    activation_bytes: float
    """Activation bytes the chip's devices receive from each other (die-to-die)."""
    ici_bytes: float
    """Dense-weight bytes the chip receives over the ICI (bf16 all-gathers forward and
    backward, fp32 gradient reduce-scatters); the experts' traffic, equal under either split,
    is left out."""
    die_to_die_bytes: float
    """Bytes the chip's devices receive from each other: the activations plus the dense
    gathers' hops inside the chip."""
    memory_bytes_per_device: float
    """Weights, optimizer state, gathered layers and activations on one device."""


def _require_split_plan(plan: Plan) -> None:
    if not isinstance(plan, Plan):
        raise TitanConfigError(
            f"plan must be a tpuready.calc.plan.Plan, got {plan!r}: use make_plan"
        )


def chip_split_costs(plan: Plan) -> dict[str, ChipSplit]:
    """What splitting each chip's work between its devices over context parallelism or over
    tensor parallelism costs `plan` per step, by `WITHIN_CHIP` name, for a plan without a
    tensor axis on a chip of two or more devices (the module docstring's model)."""
    _require_split_plan(plan)
    devices = plan.chip.devices_per_chip
    if devices < 2:
        raise TitanConfigError(
            f"plan.chip is {plan.chip.name}, devices_per_chip={devices}: a chip of one device "
            "has no work to split; plan on a chip of two devices, such as 'v7'"
        )
    if plan.mesh.get("tensor", 1) > 1:
        raise TitanConfigError(
            f"plan.mesh['tensor']={plan.mesh['tensor']}: chip_split_costs models a plan "
            "without a tensor axis; plan with tensor 1"
        )
    model, tokens = plan.model, plan.tokens_per_chip
    share = (devices - 1) / devices  # of a gathered array, what comes from the others
    forward_passes = 2 if plan.recompute else 1
    kept_layers = 1 if plan.recompute else model.num_layers  # layers whose activations stay
    keys_values = tokens * 2 * model.kv_dim * BF16
    hidden = tokens * model.hidden_size * BF16
    dense_layer = model.attention_params_per_layer + model.router_params_per_layer
    head = 0 if model.tied_embeddings else model.embedding_params
    dense = model.num_layers * dense_layer + model.embedding_params + head
    gathers = dense * (2 * BF16 + FP32)  # all-gathered forward and backward, fp32 gradients
    base = plan.memory_bytes / devices
    # Each device receives share of every collective's array; the chip, devices times that.
    context_activations = devices * model.num_layers * (forward_passes + 1) * share * keys_values
    tensor_activations = (
        devices * (model.num_layers * (2 * forward_passes + 2) + 4) * share * hidden
    )
    return {
        # One ring through the chip's devices in turn: one hop a chip over the ICI, the
        # other devices - 1 inside it, each a whole copy of the dense gathers.
        "context": ChipSplit(
            within_chip="context",
            activation_bytes=context_activations,
            ici_bytes=gathers,
            die_to_die_bytes=context_activations + (devices - 1) * gathers,
            # Two whole gathered dense layers instead of 2 / devices of them, and the
            # gathered keys and values.
            memory_bytes_per_device=base
            + 2 * share * dense_layer * BF16
            + kept_layers * share * keys_values,
        ),
        # devices rings of one device a chip, each carrying 1 / devices of the layers.
        "tensor": ChipSplit(
            within_chip="tensor",
            activation_bytes=tensor_activations,
            ici_bytes=gathers,
            die_to_die_bytes=tensor_activations,
            memory_bytes_per_device=base + kept_layers * share * hidden,
        ),
    }


def choose_within_chip(plan: Plan) -> str:
    """The `WITHIN_CHIP` split `titan_flags` writes for `plan` by default: 'tensor' for a plan
    without a tensor axis whose heads and key-value heads the chip's devices divide, when that
    split moves no more bytes over the ICI, fewer over the die-to-die link and fits a device's
    memory (`chip_split_costs`); else 'context'."""
    _require_split_plan(plan)
    devices, model = plan.chip.devices_per_chip, plan.model
    if (
        devices < 2
        or plan.mesh.get("tensor", 1) > 1
        or model.num_heads % devices
        or model.num_kv_heads % devices
    ):
        return "context"
    costs = chip_split_costs(plan)
    context, tensor = costs["context"], costs["tensor"]
    usable = plan.chip.per_device_hbm_bytes * (1 - plan.hbm_headroom)
    better = (
        tensor.ici_bytes <= context.ici_bytes
        and tensor.die_to_die_bytes < context.die_to_die_bytes
        and tensor.memory_bytes_per_device <= usable
    )
    return "tensor" if better else "context"


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
    `notebooks/titan/ch26_check.py`'s output); return quietly when it accepted it."""
    if result.get("accepted"):
        return
    message = str(result.get("message", ""))
    raise TitanRejection(
        f"TorchTitan {TITAN_VERSION} rejects it ({result.get('stage')}): {message} "
        f"Fix {rejected_flag(message)}."
    )
