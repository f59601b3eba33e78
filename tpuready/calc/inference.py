"""Serve a model on TPU chips: KV-cache bytes, how many sequences fit, and the decode roofline.

The model follows the Scaling Book's inference chapter ("All About Transformer Inference"):

- The KV cache holds, per token, a key and a value per layer and KV head:
  `2 x layers x kv_heads x head_dim x bytes`. vLLM's TPU runner stores `head_dim` padded to a
  multiple of 128 (its KV layout's last dimension, tpu-inference 0.32.0), so a head dim of 96
  costs the bytes of 128 there; a head dim of 64 is the exception, stored unpadded (its own
  kernel packs a token's key and value into one row of 128 lanes).
- A decode step generates one token for each of `batch` sequences. It reads every sequence's
  KV cache (`batch x context x kv_bytes_per_token`, always bandwidth-bound) and the weights
  once for the whole batch, and does `2 x active parameters` FLOPs per token:
  `step = KV bytes / bandwidth + max(2 x batch x active params / peak, weight bytes / bandwidth)`.
  The weight term turns compute-bound once `batch` passes the chip's ridge point (peak FLOP/s
  over HBM bandwidth, about 240 on TPU v5e in bf16); the KV term grows with the batch and never
  does, so tokens per second level off.
- A mixture of experts reads only the experts its batch routes to: with `k` of `E` experts per
  token chosen uniformly, a batch of `B` tokens touches `E (1 - (1 - k/E)^B)` experts per layer
  in expectation (an assumption: real routers are not uniform).
- The input embedding table is a gather: a step reads only the rows of its tokens, not the table
  (a tied table is read whole all the same, as the output head).
- The chips' devices (`Chip.devices_per_chip`: two per v7 chip) run attention in
  `attention_data_parallel` groups of `tensor_parallel = devices / attention_data_parallel`
  devices. A group splits the attention heads and keeps its own sequences' KV cache; when the
  group has more devices than the model has KV heads, each KV head (its cache and its K and V
  projections) is copied on `tensor_parallel / num_kv_heads` devices, as vLLM's
  `QKVParallelLinear` and tpu-inference's `get_padded_num_heads` do (`kv_head_replicas`). Every
  group holds all the weights but the experts; the experts are spread over every device
  (tensor-sharded, or expert parallel with `--enable-expert-parallel`: the same bytes per device).
  `attention_data_parallel=1` is tensor parallel over all the devices
  (`--tensor-parallel-size`); more groups is vLLM's `--data-parallel-size` with
  `--enable-expert-parallel`, or tpu-inference's `enable_dp_attention`. The communication between
  devices is left out, so the times are lower bounds, as every roofline here. Memory keeps
  `HBM_HEADROOM` (10 %) free, as `tpuready.calc.plan` does.
- A server's latencies (`serving_latency`) reuse the same step: the time to first token is the
  steps that prefill a prompt in chunks of the token budget beside the running decodes, the
  inter-token latency one decode step of `max_num_seqs` sequences (its docstring lists the
  assumptions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuready.calc.hardware import Chip, as_chip
from tpuready.calc.plan import HBM_HEADROOM, ModelConfig, checked_hbm_headroom
from tpuready.validate import InputError, number, whole_number

__all__ = [
    "TPU_HEAD_DIM_MULTIPLE",
    "TPU_PACKED_HEAD_DIM",
    "DecodeStep",
    "InferenceError",
    "ServingLatency",
    "decode_step",
    "experts_touched",
    "kv_bytes_per_token",
    "kv_head_replicas",
    "max_concurrent_sequences",
    "serving_latency",
    "tpu_head_dim",
    "weight_bytes_read",
]

TPU_HEAD_DIM_MULTIPLE = 128
"""vLLM's TPU KV cache pads the head dim to a multiple of 128 (tpu-inference 0.32.0's
`get_padded_head_dim`; vLLM-TorchTPU's `TPU_HEAD_SIZE_ALIGNMENT`)."""

TPU_PACKED_HEAD_DIM = 64
"""The head dim both TPU runners store unpadded: `kernel_hd64` packs a token's key and value
into one row of 128 lanes (tpu-inference 0.32.0's `get_padded_head_dim`; vLLM-TorchTPU 0.29.0's
attention adapter)."""


class InferenceError(InputError):
    """A serving estimate was given a value it cannot use; the message names it."""


def tpu_head_dim(head_dim: int) -> int:
    """The head dim vLLM's TPU KV cache stores: a multiple of 128, except 64, kept as it is."""
    size = whole_number("head_dim", head_dim, fix="read it from config.json", error=InferenceError)
    if size == TPU_PACKED_HEAD_DIM:
        return size
    return math.ceil(size / TPU_HEAD_DIM_MULTIPLE) * TPU_HEAD_DIM_MULTIPLE


def _checked_layout(tpu_layout: object) -> bool:
    if not isinstance(tpu_layout, bool):
        raise InferenceError(
            f"tpu_layout must be True or False, got {tpu_layout!r}: True counts vLLM's TPU "
            "layout (head dim padded as tpu_head_dim says), False the head dim as it is"
        )
    return tpu_layout


def kv_bytes_per_token(
    model: ModelConfig, *, bytes_per_value: float = 2, tpu_layout: bool = False
) -> float:
    """Bytes of KV cache one token takes over all layers: keys and values of each KV head, with
    the head dim as vLLM's TPU layout stores it (`tpu_head_dim`) when `tpu_layout`."""
    size = number(
        "bytes_per_value", bytes_per_value, fix="2 for bf16, 1 for fp8", error=InferenceError
    )
    head_dim = tpu_head_dim(model.head_dim) if _checked_layout(tpu_layout) else model.head_dim
    return 2 * model.num_layers * model.num_kv_heads * head_dim * size


def experts_touched(model: ModelConfig, tokens: int) -> float:
    """Experts per layer that `tokens` tokens route to, in expectation under uniform routing."""
    count = whole_number("tokens", tokens, fix="count the batch's tokens", error=InferenceError)
    e, k = model.num_experts, model.experts_per_token
    return e * (1 - (1 - k / e) ** count)


def _expert_params(model: ModelConfig) -> int:
    """The experts' parameters, spread over every device (none for a dense model)."""
    return (
        model.num_layers * model.num_experts * model.params_per_expert
        if model.num_experts > 1
        else 0
    )


def _params_read(model: ModelConfig, tokens: int) -> float:
    """Parameters a step of `tokens` tokens reads: all but the experts it leaves untouched and
    the rows of an untied input embedding table that no token looks up."""
    untouched = model.num_experts - experts_touched(model, tokens)
    unread_rows = 0 if model.tied_embeddings else max(model.vocab_size - tokens, 0)
    return (
        model.total_params
        - model.num_layers * untouched * model.params_per_expert
        - unread_rows * model.hidden_size
    )


def weight_bytes_read(model: ModelConfig, batch: int, *, bytes_per_param: float = 2) -> float:
    """Weight bytes one decode step of `batch` tokens reads: all but the experts the batch
    leaves untouched, with only the rows of the input embedding table its tokens look up."""
    size = number(
        "bytes_per_param", bytes_per_param, fix="2 for bf16, 1 for int8", error=InferenceError
    )
    return _params_read(model, batch) * size


def kv_head_replicas(num_kv_heads: int, tensor_parallel: int) -> int:
    """Copies of each KV head over `tensor_parallel` devices: 1 when they divide the KV heads,
    `tensor_parallel / num_kv_heads` when they are a multiple of them (vLLM's
    `QKVParallelLinear`, tpu-inference's `get_padded_num_heads`); any other size is refused."""
    heads = whole_number(
        "num_kv_heads", num_kv_heads, fix="read num_key_value_heads from config.json",
        error=InferenceError,
    )  # fmt: skip
    devices = whole_number(
        "tensor_parallel", tensor_parallel, fix="the devices one attention group splits over",
        error=InferenceError,
    )  # fmt: skip
    if heads % devices == 0:
        return 1
    if devices % heads == 0:
        return devices // heads
    raise InferenceError(
        f"tensor_parallel={devices} neither divides nor is a multiple of num_kv_heads={heads}: "
        "vLLM and tpu-inference refuse it; use a divisor or a multiple of the KV heads"
    )


@dataclass(frozen=True)
class _Layout:
    """How a replica's devices split the model: attention groups, KV copies, per-device figures."""

    devices: int
    groups: int
    tensor_parallel: int
    kv_replicas: int
    hbm_bytes: float
    bytes_per_second: float
    flops_per_second: float
    group_params: float
    """Parameters every attention group holds whole (all but the experts; KV copies included)."""
    expert_params: float


def _layout(
    model: ModelConfig, chip: Chip, chips: object, attention_data_parallel: object
) -> _Layout:
    count = whole_number("chips", chips, fix="the chips serving one replica", error=InferenceError)
    groups = whole_number(
        "attention_data_parallel", attention_data_parallel,
        fix="1 for tensor parallel attention, or the attention data-parallel groups",
        error=InferenceError,
    )  # fmt: skip
    devices = count * chip.devices_per_chip
    if devices % groups:
        raise InferenceError(
            f"attention_data_parallel={groups} does not divide the {devices} devices of {count} "
            f"{chip.name} chips ({chip.devices_per_chip} a chip): pick a divisor of {devices}"
        )
    tensor = devices // groups
    if model.num_heads % tensor:
        raise InferenceError(
            f"{model.name}: its {model.num_heads} attention heads do not split over "
            f"tensor_parallel={tensor} devices (chips={count}, attention_data_parallel="
            f"{groups}): vLLM refuses it; raise attention_data_parallel or change chips"
        )
    replicas = kv_head_replicas(model.num_kv_heads, tensor)
    kv_projections = model.num_layers * 2 * model.hidden_size * model.kv_dim
    experts = _expert_params(model)
    return _Layout(
        devices=devices,
        groups=groups,
        tensor_parallel=tensor,
        kv_replicas=replicas,
        hbm_bytes=chip.hbm_bytes / chip.devices_per_chip,
        bytes_per_second=chip.hbm_bytes_per_second / chip.devices_per_chip,
        flops_per_second=chip.peak_bf16_flops_per_second / chip.devices_per_chip,
        group_params=model.total_params - experts + (replicas - 1) * kv_projections,
        expert_params=experts,
    )


def max_concurrent_sequences(
    model: ModelConfig,
    chip: Chip | str,
    context_len: int,
    *,
    chips: int = 1,
    attention_data_parallel: int = 1,
    bytes_per_param: float = 2,
    kv_bytes_per_value: float = 2,
    tpu_layout: bool = True,
    hbm_headroom: float = HBM_HEADROOM,
) -> int:
    """Sequences of `context_len` tokens whose KV cache fits on `chips` chips beside the
    weights, with attention split as `attention_data_parallel` says (0 when the weights alone
    do not fit)."""
    chip = as_chip(chip, error=InferenceError)
    length = whole_number(
        "context_len", context_len, fix="tokens per sequence", error=InferenceError
    )
    layout = _layout(model, chip, chips, attention_data_parallel)
    headroom = checked_hbm_headroom(hbm_headroom, error=InferenceError)
    size = number(
        "bytes_per_param", bytes_per_param, fix="2 for bf16, 1 for int8", error=InferenceError
    )
    params_per_device = (
        layout.group_params / layout.tensor_parallel + layout.expert_params / layout.devices
    )
    free_per_group = layout.tensor_parallel * (
        layout.hbm_bytes * (1 - headroom) - params_per_device * size
    )
    per_sequence = (
        length
        * layout.kv_replicas
        * kv_bytes_per_token(model, bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout)
    )
    return layout.groups * max(0, math.floor(free_per_group / per_sequence))


@dataclass(frozen=True)
class DecodeStep:
    """One decode step's roofline: its parts in seconds, and tokens per second."""

    batch: int
    kv_seconds: float
    weight_seconds: float
    compute_seconds: float

    @property
    def seconds(self) -> float:
        """KV reads, then the larger of the weight reads and the matmuls (perfect overlap)."""
        return self.kv_seconds + max(self.weight_seconds, self.compute_seconds)

    @property
    def tokens_per_second(self) -> float:
        """One token per sequence per step."""
        return self.batch / self.seconds

    @property
    def bound(self) -> str:
        """'compute' once the matmuls outlast the weight reads, else 'memory'."""
        return "compute" if self.compute_seconds > self.weight_seconds else "memory"


def decode_step(
    model: ModelConfig,
    chip: Chip | str,
    batch: int,
    context_len: int,
    *,
    chips: int = 1,
    attention_data_parallel: int = 1,
    bytes_per_param: float = 2,
    kv_bytes_per_value: float = 2,
    tpu_layout: bool = True,
) -> DecodeStep:
    """The roofline of one decode step for `batch` sequences of `context_len` tokens on `chips`
    chips, attention split as `attention_data_parallel` says, at the busiest device's share of
    the bytes and FLOPs and its peak bf16 FLOP/s and HBM bandwidth."""
    size = whole_number("batch", batch, fix="sequences decoded together", error=InferenceError)
    return _engine_step(
        model, chip, size, context_len, 0, chips=chips,
        attention_data_parallel=attention_data_parallel, bytes_per_param=bytes_per_param,
        kv_bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout,
    )  # fmt: skip


def _engine_step(
    model: ModelConfig,
    chip: Chip | str,
    size: int,
    context_len: object,
    prefill_tokens: int,
    *,
    chips: object,
    attention_data_parallel: object,
    bytes_per_param: object,
    kv_bytes_per_value: float,
    tpu_layout: bool,
) -> DecodeStep:
    """One engine step: `size` decoding sequences of `context_len` tokens, plus
    `prefill_tokens` prompt tokens on the busiest attention group (their matmuls and the
    weights they read; their own attention is left out)."""
    chip = as_chip(chip, error=InferenceError)
    length = whole_number(
        "context_len", context_len, fix="tokens per sequence", error=InferenceError
    )
    layout = _layout(model, chip, chips, attention_data_parallel)
    param_bytes = number(
        "bytes_per_param", bytes_per_param, fix="2 for bf16, 1 for int8", error=InferenceError
    )
    group_batch = -(-size // layout.groups)  # the busiest attention group's sequences
    group_tokens = group_batch + prefill_tokens
    kv = (
        group_batch
        * length
        * layout.kv_replicas
        * kv_bytes_per_token(model, bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout)
        / layout.tensor_parallel
    )
    moe = model.num_experts > 1
    unread_rows = 0 if model.tied_embeddings else max(model.vocab_size - group_tokens, 0)
    experts_read = (
        model.num_layers * experts_touched(model, size + prefill_tokens) * model.params_per_expert
        if moe
        else 0
    )
    params_read = (layout.group_params - unread_rows * model.hidden_size) / layout.tensor_parallel
    params_read += experts_read / layout.devices
    expert_matmul = model.num_layers * model.experts_per_token * model.params_per_expert
    group_matmul = (
        model.active_matmul_params
        - (expert_matmul if moe else 0)
        + (layout.kv_replicas - 1) * model.num_layers * 2 * model.hidden_size * model.kv_dim
    )
    flops = 2 * group_tokens * group_matmul / layout.tensor_parallel
    flops += 2 * (size + prefill_tokens) * (expert_matmul if moe else 0) / layout.devices
    return DecodeStep(
        batch=size,
        kv_seconds=kv / layout.bytes_per_second,
        weight_seconds=params_read * param_bytes / layout.bytes_per_second,
        compute_seconds=flops / layout.flops_per_second,
    )


@dataclass(frozen=True)
class ServingLatency:
    """A server's latencies by roofline (a model, not a measurement): the time to first token
    of one prompt, and the inter-token latency of the running requests with and without a
    prompt chunk beside them."""

    prompt_tokens: int
    chunk_tokens: int
    """Prompt tokens one step prefills: the token budget less the running requests' decodes."""
    prefill_steps: tuple[DecodeStep, ...]
    """The steps that prefill the prompt, one per chunk, each beside the running decodes."""
    decode: DecodeStep
    """A step of `max_num_seqs` decodes alone: the steady inter-token latency."""

    @property
    def ttft_seconds(self) -> float:
        """Time to first token: the prompt's chunks, one engine step each (queueing left out)."""
        return sum(step.seconds for step in self.prefill_steps)

    @property
    def itl_seconds(self) -> float:
        """Inter-token latency of a running request while no prompt is being prefilled."""
        return self.decode.seconds

    @property
    def prefill_itl_seconds(self) -> float:
        """Inter-token latency of the running requests during a step with a full prompt chunk:
        what a larger token budget costs the requests already decoding."""
        return self.prefill_steps[0].seconds

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second of the steady decode: `max_num_seqs / itl_seconds`."""
        return self.decode.tokens_per_second


def serving_latency(
    model: ModelConfig,
    chip: Chip | str,
    *,
    prompt_tokens: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    context_len: int,
    chips: int = 1,
    attention_data_parallel: int = 1,
    bytes_per_param: float = 2,
    kv_bytes_per_value: float = 2,
    tpu_layout: bool = True,
) -> ServingLatency:
    """Time to first token, inter-token latency and decode throughput of a server running
    `max_num_seqs` requests of `context_len` tokens with a step budget of
    `max_num_batched_tokens` tokens, by the roofline of `decode_step`.

    Assumptions (a model, not a measurement): the server is full, so a new prompt runs beside
    `max_num_seqs - 1` decoding requests (it takes the last slot); each step gives every decode
    one token first and the prompt the rest of the budget (vLLM's V1 scheduler with chunked
    prefill), one chunk per step; each step reads the weights once and the decodes' KV cache,
    and computes `2 x matmul parameters` FLOPs per token (the prompt's own attention, its FLOPs
    and its reads of its earlier chunks' cache, is left out, as are queueing, communication,
    padding to buckets and the host's time), so every time is a lower bound. The steady
    inter-token latency is one `decode_step` of `max_num_seqs` sequences."""
    prompt = whole_number(
        "prompt_tokens", prompt_tokens, fix="tokens in the prompt", error=InferenceError
    )
    budget = whole_number(
        "max_num_batched_tokens", max_num_batched_tokens,
        fix="pass the engine's --max-num-batched-tokens", error=InferenceError,
    )  # fmt: skip
    running = whole_number(
        "max_num_seqs", max_num_seqs, fix="pass the engine's --max-num-seqs", error=InferenceError
    )
    if budget < running:
        raise InferenceError(
            f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({running}): vLLM "
            "refuses a budget that cannot give every running request a token; raise "
            "--max-num-batched-tokens or lower --max-num-seqs"
        )

    def step(decoding: int, prefill: int) -> DecodeStep:
        return _engine_step(
            model, chip, decoding, context_len, prefill, chips=chips,
            attention_data_parallel=attention_data_parallel, bytes_per_param=bytes_per_param,
            kv_bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout,
        )  # fmt: skip

    decodes = running - 1
    chunk = budget - decodes
    full, rest = divmod(prompt, chunk)
    chunks = [chunk] * full + ([rest] if rest else [])
    steps = {size: step(decodes, size) for size in set(chunks)}
    return ServingLatency(
        prompt_tokens=prompt,
        chunk_tokens=chunk,
        prefill_steps=tuple(steps[size] for size in chunks),
        decode=step(running, 0),
    )
