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
- Weights and the KV cache are split evenly over `chips` (tensor or expert parallel); the
  communication between them is left out, so the times are lower bounds, as every roofline here.
  Memory keeps `HBM_HEADROOM` (10 %) free, as `tpuready.calc.plan` does.
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
    "decode_step",
    "experts_touched",
    "kv_bytes_per_token",
    "max_concurrent_sequences",
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


def weight_bytes_read(model: ModelConfig, batch: int, *, bytes_per_param: float = 2) -> float:
    """Weight bytes one decode step reads: all but the experts the batch leaves untouched."""
    size = number(
        "bytes_per_param", bytes_per_param, fix="2 for bf16, 1 for int8", error=InferenceError
    )
    untouched = model.num_experts - experts_touched(model, batch)
    return (model.total_params - model.num_layers * untouched * model.params_per_expert) * size


def max_concurrent_sequences(
    model: ModelConfig,
    chip: Chip | str,
    context_len: int,
    *,
    chips: int = 1,
    bytes_per_param: float = 2,
    kv_bytes_per_value: float = 2,
    tpu_layout: bool = True,
    hbm_headroom: float = HBM_HEADROOM,
) -> int:
    """Sequences of `context_len` tokens whose KV cache fits on `chips` chips beside the
    weights (0 when the weights alone do not fit)."""
    chip = as_chip(chip, error=InferenceError)
    length = whole_number(
        "context_len", context_len, fix="tokens per sequence", error=InferenceError
    )
    count = whole_number("chips", chips, fix="the chips serving one replica", error=InferenceError)
    headroom = checked_hbm_headroom(hbm_headroom, error=InferenceError)
    size = number(
        "bytes_per_param", bytes_per_param, fix="2 for bf16, 1 for int8", error=InferenceError
    )
    usable = count * chip.hbm_bytes * (1 - headroom)
    free = usable - model.total_params * size
    per_sequence = length * kv_bytes_per_token(
        model, bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout
    )
    return max(0, math.floor(free / per_sequence))


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
    bytes_per_param: float = 2,
    kv_bytes_per_value: float = 2,
    tpu_layout: bool = True,
) -> DecodeStep:
    """The roofline of one decode step for `batch` sequences of `context_len` tokens on `chips`
    chips, at their peak bf16 FLOP/s and HBM bandwidth."""
    chip = as_chip(chip, error=InferenceError)
    size = whole_number("batch", batch, fix="sequences decoded together", error=InferenceError)
    length = whole_number(
        "context_len", context_len, fix="tokens per sequence", error=InferenceError
    )
    count = whole_number("chips", chips, fix="the chips serving one replica", error=InferenceError)
    bandwidth = count * chip.hbm_bytes_per_second
    kv = (
        size
        * length
        * kv_bytes_per_token(model, bytes_per_value=kv_bytes_per_value, tpu_layout=tpu_layout)
    )
    flops = 2 * size * model.active_matmul_params
    return DecodeStep(
        batch=size,
        kv_seconds=kv / bandwidth,
        weight_seconds=weight_bytes_read(model, size, bytes_per_param=bytes_per_param) / bandwidth,
        compute_seconds=flops / (count * chip.peak_bf16_flops_per_second),
    )
