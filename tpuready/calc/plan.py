"""Plan a training run: per-chip memory, bytes moved per mesh axis and a roofline step time.

Taught in `notebooks/14_planning_8192_chips.ipynb` ("Plan a run of Qwen3-235B on a TPU v7x pod").

A plan takes a mixture-of-experts transformer (`ModelConfig`, built from a transformers config
with `ModelConfig.from_transformers`), a mesh (axis sizes by name, from `AXES`), a chip from
`tpuready.calc.hardware`, a global batch and a sequence length. The layout it assumes:

- `data` replicates the weights (HSDP's replicate axis); gradients are all-reduced over it.
- `fsdp` shards every weight; `expert` shards the experts and, FSDP-style, every other weight.
- `tensor` splits attention heads, each expert's FFN width and the vocabulary (Megatron style).
- Dense weights are cut along their widest dimension: q and o projections along the heads, the
  embedding and output head along the vocabulary (by `fsdp`, `expert` and `tensor` together);
  k, v and the router along the hidden size (by `fsdp` and `expert`; `tensor` splits k, v's heads).
- Norm weights are replicated everywhere. The batch is split over `data`, `fsdp` and `expert`.

Shards follow `torch.chunk` (ceil division, the rule DTensor uses), and every per-chip figure is
for the chip holding the largest shards (rank 0), so it matches what DTensor gives that rank.

Memory per chip, as FSDP2 with a bf16 `MixedPrecisionPolicy` keeps it: the shard of every
parameter in fp32 (which is also the master copy), its fp32 gradient and AdamW's two fp32
moments, 16 bytes a parameter (chapter 9 measures them); bf16 copies exist only for gathered
layers, two at a time (FSDP computes with one and prefetches the next); plus activations. The
activation model counts, in bf16 per token and layer, what backward keeps: without recomputation
the residual and normed inputs of both blocks (4h), q, k, v and the attention output (2 q_dim +
2 kv_dim, split over `tensor`; flash attention keeps no score matrix), per routed copy of a
token the expert input, gate/up output and activated product (k (h + 3 I / tensor)), plus fp32
router probabilities (E); with full recomputation only each layer's input (h) plus one layer's
full set. The fp32 logits of the chip's tokens (vocabulary split over `tensor`) are added in
both cases. A plan fits when that total stays within the HBM less `hbm_headroom` (default
`HBM_HEADROOM`, 10 %, an assumption) for what the model does not count.

The collectives of a step: FSDP all-gathers (bf16, forward and backward) and a reduce-scatter
(fp32) on the sharding axes, an fp32 all-reduce on `data`, two all-reduces per layer forward and
two backward on `tensor`, and two all-to-alls per layer forward and two backward on `expert`
(balanced routing). Recomputation repeats the forward collectives on `tensor` and `expert`.
`ici_bytes` is what one chip receives per axis (ring algorithms,
`tpuready.calc.ici.bytes_received`); `ici_seconds` prices each collective on the axis's place in the
slice (`tpuready.calc.ici`: the mesh laid on a torus of `slice_shape`, last axis on the last
dimension, per-link bandwidth, an all-to-all priced by its busiest link, the first axis over the
data-centre network when `slices` > 1). Axes are charged one after another (their collectives run at
different points of the step). The roofline step time is the largest of compute at peak bf16, HBM
traffic at full bandwidth and the ICI time: it assumes perfect overlap of the three, so it is a
lower bound for this layout and this traffic. A run that moves less (gradients reduced in bf16,
weights kept gathered for the backward pass, collectives of different axes overlapped) or lays
its mesh out otherwise can be faster.

`CANDIDATE_MESHES` and `CANDIDATE_AXIS_SHAPES` are the meshes of 8,192 chips chapter 14 compares
(and chapter 21 takes the fastest of).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuready.calc.hardware import Chip, as_chip
from tpuready.calc.ici import (
    AxisLayout,
    IciModelError,
    bytes_received,
    collective_seconds,
    default_slice_shape,
    layout_mesh,
)
from tpuready.validate import InputError, number, whole_number

__all__ = [
    "AXES",
    "BYTES_PER_PARAM_STATE",
    "CANDIDATE_AXIS_SHAPES",
    "CANDIDATE_MESHES",
    "HBM_HEADROOM",
    "ModelConfig",
    "Plan",
    "PlanError",
    "checked_hbm_headroom",
    "gather_stages",
    "make_plan",
    "shard_len",
]

AXES: tuple[str, ...] = ("data", "fsdp", "expert", "tensor")
"""Mesh axes a plan knows, in the order the notebook builds its DeviceMesh."""

BF16, FP32 = 2, 4
# Bytes each parameter of the chip's shard costs under FSDP2: the fp32 sharded parameter (the
# master copy), its fp32 gradient, AdamW's exp_avg and exp_avg_sq in fp32.
BYTES_PER_PARAM_STATE: dict[str, int] = {
    "params_fp32": FP32,
    "gradients_fp32": FP32,
    "adamw_fp32": 2 * FP32,
}


CANDIDATE_MESHES: dict[str, dict[str, int]] = {
    "fsdp": {"fsdp": 8192},
    "fsdp+ep": {"fsdp": 256, "expert": 32},
    "dp+fsdp+ep": {"data": 2, "fsdp": 128, "expert": 32},
    "fsdp+ep+tp": {"fsdp": 128, "expert": 16, "tensor": 4},
    "ep=128": {"fsdp": 64, "expert": 128},
    "ep=8 2x2x2": {"fsdp": 1024, "expert": 8},
    "ep=64 cube": {"fsdp": 128, "expert": 64},
}
"""Chapter 14's seven meshes of 8,192 chips, by label (chapters 14 and 21 read this one list)."""

CANDIDATE_AXIS_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "ep=8 2x2x2": {"fsdp": (8, 8, 16), "expert": (2, 2, 2)},
    "ep=64 cube": {"fsdp": (4, 4, 8), "expert": (4, 4, 4)},
}
"""`make_plan`'s `axis_shapes` for the candidates not on the default layout: chips along each
dimension of the 16 x 16 x 32 slice of 8,192 v7 chips (the expert axis on a block)."""

HBM_HEADROOM = 0.1
"""The share of a chip's HBM a plan keeps free by default: an assumption, not a vendor figure.
The model counts weights, state and activations; the compiler's temporaries (a matmul's
workspace, a collective's buffers), the runtime and fragmentation take memory it does not
count, so a plan that fills the last percent of HBM would not run."""


class PlanError(InputError):
    """Raised for a mesh, model or batch that cannot form a plan; the message names the value."""


def checked_hbm_headroom(value: object, *, error: type[InputError] = PlanError) -> float:
    """`value` as the share of HBM to keep free, 0 or more and below 1, else `error` naming it."""
    share = number(
        "hbm_headroom", value, fix="pass a share such as 0.1", allow_zero=True, error=error
    )
    if share >= 1:
        raise error(f"hbm_headroom is a share of HBM below 1, got {value!r}: pass 0.1")
    return share


def shard_len(length: int, *ways: int) -> int:
    """Length of the largest shard (rank 0's) after splitting `length` `ways[0]` ways, then that
    shard `ways[1]` ways, and so on: `torch.chunk`'s ceil division, as DTensor shards."""
    length = whole_number(
        "length", length, fix="pass a dimension size such as 4096", error=PlanError
    )
    for index, count in enumerate(ways):
        count = whole_number(
            f"ways[{index}]", count, fix="pass a mesh axis size such as 8", error=PlanError
        )
        length = -(-length // count)
    return length


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer whose every MLP is a mixture of experts
    (a dense model is one expert, always chosen, with no router)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    experts_per_token: int
    expert_ffn_size: int
    vocab_size: int
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "num_experts",
            "experts_per_token",
            "expert_ffn_size",
            "vocab_size",
        ):
            whole_number(
                f"{self.name}: {name}",
                getattr(self, name),
                fix="read it from the model's config.json",
                error=PlanError,
            )
        if not isinstance(self.tied_embeddings, bool):  # "no" would count as tied
            raise PlanError(
                f"{self.name}: tied_embeddings must be True or False, got "
                f"{self.tied_embeddings!r} ({type(self.tied_embeddings).__name__}): read "
                "tie_word_embeddings from the model's config.json"
            )
        if self.num_heads % self.num_kv_heads:
            raise PlanError(
                f"{self.name}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.experts_per_token > self.num_experts:
            raise PlanError(
                f"{self.name}: experts_per_token={self.experts_per_token} exceeds "
                f"num_experts={self.num_experts}"
            )

    @classmethod
    def from_transformers(cls, config: Any, name: str | None = None) -> ModelConfig:
        """Read a transformers Qwen3-MoE (or dense Qwen3/Llama-style) config."""
        if name is not None and not isinstance(name, str):
            raise PlanError(
                f"name must be a string or None, got {name!r} ({type(name).__name__}): pass a "
                "label such as 'qwen3-30b-a3b', or leave it out for the config's model_type"
            )
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        num_experts = getattr(config, "num_experts", None)
        if num_experts:
            if (
                getattr(config, "mlp_only_layers", None)
                or getattr(config, "decoder_sparse_step", 1) != 1
            ):
                raise PlanError(
                    "only configs whose every layer is a mixture of experts are supported, got "
                    f"mlp_only_layers={config.mlp_only_layers!r}, "
                    f"decoder_sparse_step={config.decoder_sparse_step!r}"
                )
            experts = (num_experts, config.num_experts_per_tok, config.moe_intermediate_size)
        else:
            experts = (1, 1, config.intermediate_size)
        return cls(
            name=name or getattr(config, "model_type", "model"),  # type: ignore[arg-type]  # a str; mypy keeps None beside Any
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            num_experts=experts[0],
            experts_per_token=experts[1],
            expert_ffn_size=experts[2],
            vocab_size=config.vocab_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def q_dim(self) -> int:
        """Width of the query projection: heads times head dimension."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: KV heads times head dimension."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projections (no biases) plus the q and k norms."""
        h = self.hidden_size
        return 2 * h * self.q_dim + 2 * h * self.kv_dim + 2 * self.head_dim

    @property
    def router_params_per_layer(self) -> int:
        """The router's linear layer (none for a dense model)."""
        return self.num_experts * self.hidden_size if self.num_experts > 1 else 0

    @property
    def params_per_expert(self) -> int:
        """Gate, up and down projections of one expert (SwiGLU)."""
        return 3 * self.hidden_size * self.expert_ffn_size

    @property
    def params_per_layer(self) -> int:
        """Every weight of one decoder layer, the two RMSNorms included."""
        return (
            self.attention_params_per_layer
            + self.router_params_per_layer
            + self.num_experts * self.params_per_expert
            + 2 * self.hidden_size
        )

    @property
    def embedding_params(self) -> int:
        """The input embedding table (vocabulary times hidden size)."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All parameters: layers, embeddings, the final norm and the untied output head."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return (
            self.num_layers * self.params_per_layer
            + self.embedding_params
            + head
            + self.hidden_size
        )

    @property
    def active_params(self) -> int:
        """Parameters one token uses: everything but the experts it is not routed to."""
        unused = self.num_experts - self.experts_per_token
        return self.total_params - self.num_layers * unused * self.params_per_expert

    @property
    def active_matmul_params(self) -> int:
        """Active parameters that multiply a token (no embedding lookup, no norms): the N of
        6N."""
        per_layer = (
            2 * self.hidden_size * (self.q_dim + self.kv_dim)
            + self.router_params_per_layer
            + self.experts_per_token * self.params_per_expert
        )
        return self.num_layers * per_layer + self.embedding_params

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, forward and backward: 6 N + 12 L heads head_dim S (PaLM's
        formula; N = `active_matmul_params`, the attention term counts the full score matrix)."""
        seq_len = whole_number(
            "seq_len", seq_len, fix="pass the tokens per sequence", error=PlanError
        )
        attention = 12 * self.num_layers * self.num_heads * self.head_dim * seq_len
        return 6 * self.active_matmul_params + attention


@dataclass(frozen=True)
class Plan:
    """One plan's figures for the most loaded chip (rank 0), in bytes, FLOPs and seconds."""

    model: ModelConfig
    mesh: Mapping[str, int]
    chip: Chip
    global_batch: int
    seq_len: int
    recompute: bool
    params_per_chip: int
    compute_params_per_chip: int
    tokens_per_chip: int
    state_bytes: Mapping[str, int]
    activation_bytes_full: int
    activation_bytes_recompute: int
    ici_bytes: Mapping[str, float]
    ici_seconds: Mapping[str, float]
    layouts: Mapping[str, AxisLayout]
    slice_shape: tuple[int, ...]
    slices: int
    hbm_traffic_bytes: float
    flops_per_chip: float
    model_flops_per_step: float
    times: Mapping[str, float] = field(default_factory=dict)
    hbm_headroom: float = HBM_HEADROOM

    @property
    def activation_bytes(self) -> int:
        """Activations under this plan's recomputation setting."""
        return self.activation_bytes_recompute if self.recompute else self.activation_bytes_full

    @property
    def memory_bytes(self) -> int:
        """Weights, master copy, gradients, optimizer state and activations on one chip."""
        return sum(self.state_bytes.values()) + self.activation_bytes

    @property
    def usable_hbm_bytes(self) -> float:
        """The chip's HBM less the `hbm_headroom` share kept free (see `HBM_HEADROOM`)."""
        return self.chip.hbm_bytes * (1 - self.hbm_headroom)

    @property
    def fits(self) -> bool:
        """Whether `memory_bytes` fits in the HBM left after the headroom."""
        return self.memory_bytes <= self.usable_hbm_bytes

    @property
    def step_seconds(self) -> float:
        """Roofline step time: the slowest of compute, HBM and ICI, assuming full overlap."""
        return max(self.times.values())

    @property
    def bound(self) -> str:
        """What limits the step: 'compute', 'hbm' or 'ici'."""
        return max(self.times, key=self.times.__getitem__)

    @property
    def tokens_per_second(self) -> float:
        """Tokens the whole run trains per second at the roofline step time."""
        return self.global_batch * self.seq_len / self.step_seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation at the roofline step time (recomputation not counted)."""
        num_chips = math.prod(self.mesh.values())
        peak = num_chips * self.chip.peak_bf16_flops_per_second
        return self.model_flops_per_step / (self.step_seconds * peak)


def _check_mesh(mesh: Mapping[str, int], num_chips: int) -> dict[str, int]:
    """All four axes with their sizes (1 where absent), after checking names and sizes."""
    if not isinstance(mesh, Mapping):
        raise PlanError(
            f"mesh must be a mapping of axis names to sizes, got {mesh!r}: pass e.g. "
            "{'fsdp': 256, 'expert': 32}"
        )
    unknown = sorted(set(mesh) - set(AXES))
    if unknown:
        raise PlanError(f"unknown mesh axes {unknown}; use names from {list(AXES)}")
    sizes = {
        name: whole_number(
            f"mesh[{name!r}]", size, fix="pass a positive axis size", error=PlanError
        )
        for name, size in mesh.items()
    }
    full = {name: sizes.get(name, 1) for name in AXES}
    if math.prod(full.values()) != num_chips:
        raise PlanError(
            f"mesh {dict(mesh)} has {math.prod(full.values())} chips, "
            f"not the world size {num_chips}"
        )
    return full


def _param_groups(model: ModelConfig, mesh: Mapping[str, int]) -> dict[str, int]:
    """Rank 0's parameters by how they are sharded: 'dense' (attention, router, embeddings:
    over `fsdp`, `expert` and `tensor`), 'experts' (experts over `expert`, their hidden dim
    over `fsdp`, their FFN width over `tensor`) and 'replicated' (the norms); 'vocab' is the
    embedding and output head's part of 'dense'. Where two axes cut one dimension, the first
    in `AXES` cuts first, as in DTensor."""
    h, f, e, t = model.hidden_size, mesh["fsdp"], mesh["expert"], mesh["tensor"]
    # q and o: their q_dim side cut by fsdp, expert and tensor in turn; k and v: kv_dim by
    # tensor, hidden by fsdp and expert; the router's hidden dim by fsdp and expert.
    h_dense = shard_len(h, f, e)
    attention = 2 * shard_len(model.q_dim, f, e, t) * h + 2 * shard_len(model.kv_dim, t) * h_dense
    router = model.num_experts * h_dense if model.num_experts > 1 else 0
    # Embedding and output head: the vocabulary cut by fsdp, expert and tensor in turn.
    vocab = shard_len(model.vocab_size, f, e, t) * h * (1 if model.tied_embeddings else 2)
    h_expert = shard_len(h, f)
    one_expert = shard_len(2 * model.expert_ffn_size, t) * h_expert + h_expert * shard_len(
        model.expert_ffn_size, t
    )
    experts = shard_len(model.num_experts, e) * one_expert
    norms = 2 * model.head_dim + 2 * h
    return {
        "dense": model.num_layers * (attention + router) + vocab,
        "vocab": vocab,
        "experts": model.num_layers * experts,
        "replicated": model.num_layers * norms + h,
    }


def _activation_bytes(model: ModelConfig, mesh: Mapping[str, int], tokens: int) -> tuple[int, int]:
    """(bytes without recomputation, bytes with full recomputation) for `tokens` on one chip."""
    h, t, k = model.hidden_size, mesh["tensor"], model.experts_per_token
    attention = 4 * h + (2 * model.q_dim + 2 * model.kv_dim) // t
    moe = k * (h + 3 * model.expert_ffn_size // t)
    per_token_layer = BF16 * (attention + moe) + FP32 * model.num_experts
    logits = tokens * shard_len(model.vocab_size, t) * FP32
    full = model.num_layers * tokens * per_token_layer + logits
    recompute = model.num_layers * tokens * h * BF16 + tokens * per_token_layer + logits
    return full, recompute


def gather_stages(shard: int, axes: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(axis, elements gathered there) for gathering `shard` elements over nested `axes`, the
    last axis first: each stage gathers what the previous ones have, times its size."""
    stages = []
    gathered = whole_number("shard", shard, fix="pass a shard's element count", error=PlanError)
    for name, size in reversed(axes):
        gathered *= whole_number(
            f"axis {name!r}", size, fix="pass each axis as (name, size)", error=PlanError
        )
        stages.append((name, gathered))
    return stages


def make_plan(
    model: ModelConfig,
    mesh: Mapping[str, int],
    chip: Chip | str,
    *,
    num_chips: int,
    global_batch: int,
    seq_len: int,
    recompute: bool = True,
    slice_shape: Sequence[int] | None = None,
    slices: int = 1,
    axis_shapes: Mapping[str, Sequence[int]] | None = None,
    hbm_headroom: float = HBM_HEADROOM,
) -> Plan:
    """Per-chip memory, ICI bytes and seconds per mesh axis and a roofline step time for one
    training step of `global_batch` sequences of `seq_len` tokens, on `slices` slices of
    `slice_shape` chips (default: `tpuready.calc.ici.default_slice_shape`), the mesh laid on them by
    `tpuready.calc.ici.layout_mesh` (`axis_shapes` as there; models: the module docstring)."""
    chip = as_chip(chip, error=PlanError)
    num_chips = whole_number(
        "num_chips", num_chips, fix="pass the world size, such as 8192", error=PlanError
    )
    global_batch = whole_number(
        "global_batch", global_batch, fix="pass the sequences per step", error=PlanError
    )
    seq_len = whole_number("seq_len", seq_len, fix="pass the tokens per sequence", error=PlanError)
    if not isinstance(recompute, bool):
        raise PlanError(f"recompute must be True or False, got {recompute!r}")
    hbm_headroom = checked_hbm_headroom(hbm_headroom, error=PlanError)
    full_mesh = _check_mesh(mesh, num_chips)
    try:
        if slice_shape is None:
            slices = whole_number("slices", slices, fix="pass 1 for one slice", error=IciModelError)
            slice_shape = default_slice_shape(chip, num_chips // slices)
        layouts = layout_mesh(chip, full_mesh, slice_shape, slices=slices, axis_shapes=axis_shapes)
    except IciModelError as error:
        raise PlanError(str(error)) from error
    data, fsdp, expert, tensor = (full_mesh[name] for name in AXES)
    for what, count in (
        ("num_heads", model.num_heads),
        ("num_kv_heads", model.num_kv_heads),
    ):
        if count % tensor:
            raise PlanError(f"{what}={count} of {model.name} is not divisible by tensor={tensor}")
    if model.num_experts % expert:
        raise PlanError(
            f"num_experts={model.num_experts} of {model.name} is not divisible by expert={expert}"
        )
    batch_ways = data * fsdp * expert
    if global_batch % batch_ways:
        raise PlanError(
            f"global_batch={global_batch} sequences is not a positive multiple of "
            f"data x fsdp x expert = {batch_ways}"
        )

    groups = _param_groups(model, full_mesh)
    params = groups["dense"] + groups["experts"] + groups["replicated"]
    # What one chip multiplies with: its shards gathered over the FSDP axes.
    gathered = _param_groups(model, {**full_mesh, "fsdp": 1, "expert": 1})
    compute_params = gathered["dense"] + gathered["replicated"]
    compute_params += _param_groups(model, {**full_mesh, "fsdp": 1})["experts"]
    # FSDP holds two gathered layers in bf16: the one computing and the one prefetched.
    gathered_layer = (compute_params - gathered["vocab"]) // model.num_layers
    tokens = global_batch * seq_len // batch_ways
    state = {name: params * size for name, size in BYTES_PER_PARAM_STATE.items()}
    state["gathered_layers_bf16"] = 2 * gathered_layer * BF16
    full, recomputed = _activation_bytes(model, full_mesh, tokens)

    ici: dict[str, float] = dict.fromkeys(AXES, 0.0)
    ici_seconds: dict[str, float] = dict.fromkeys(AXES, 0.0)

    def charge(axis: str, kind: str, total_bytes: float, count: int = 1) -> None:
        ici[axis] += count * bytes_received(kind, total_bytes, full_mesh[axis])
        ici_seconds[axis] += count * collective_seconds(kind, total_bytes, layouts[axis])

    # FSDP: the dense and the expert weights gathered in bf16 forward and backward, their
    # gradients reduce-scattered in fp32; then data, tensor and expert.
    dense, experts = groups["dense"], groups["experts"]
    for shard, axes in ((dense, [("fsdp", fsdp), ("expert", expert)]), (experts, [("fsdp", fsdp)])):
        for name, elements in gather_stages(shard, axes):
            charge(name, "all-gather", elements * BF16, count=2)
            charge(name, "reduce-scatter", elements * FP32)
    charge("data", "all-reduce", params * FP32)
    forward_passes = 2 if recompute else 1
    collectives = 2 * forward_passes + 2  # per layer: forward (again if recomputed) + backward
    activation = tokens * model.hidden_size * BF16
    charge("tensor", "all-reduce", activation, count=model.num_layers * collectives)
    dispatched = activation * model.experts_per_token  # what one chip sends to the experts
    charge("expert", "all-to-all", dispatched * expert, count=model.num_layers * collectives)

    # HBM: weights read each pass and gradients written, the optimizer's read and write of the
    # shard, saved activations written once and read once. Operand re-reads are ignored.
    activations = recomputed if recompute else full
    hbm = (
        compute_params * (BF16 * (forward_passes + 1) + FP32)
        + params * (4 * FP32 + 3 * FP32 + BF16)
        + 2 * activations
    )
    model_flops = global_batch * seq_len * model.flops_per_token(seq_len)
    flops_per_chip = model_flops / num_chips * (4 / 3 if recompute else 1)
    times = {
        "compute": flops_per_chip / chip.peak_bf16_flops_per_second,
        "hbm": hbm / chip.hbm_bytes_per_second,
        "ici": sum(ici_seconds.values()),
    }
    return Plan(
        model=model,
        mesh={name: size for name, size in full_mesh.items() if name in mesh},
        chip=chip,
        global_batch=global_batch,
        seq_len=seq_len,
        recompute=recompute,
        params_per_chip=params,
        compute_params_per_chip=compute_params,
        tokens_per_chip=tokens,
        state_bytes=state,
        activation_bytes_full=full,
        activation_bytes_recompute=recomputed,
        ici_bytes=ici,
        ici_seconds=ici_seconds,
        layouts=layouts,
        slice_shape=tuple(slice_shape),
        slices=slices,
        hbm_traffic_bytes=hbm,
        flops_per_chip=flops_per_chip,
        model_flops_per_step=model_flops,
        times=times,
        hbm_headroom=hbm_headroom,
    )
