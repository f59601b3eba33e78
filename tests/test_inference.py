"""tpuready.calc.inference: KV-cache bytes, sequences that fit, and the decode roofline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc.hardware import get_chip
from tpuready.calc.inference import (
    InferenceError,
    decode_step,
    experts_touched,
    kv_bytes_per_token,
    kv_head_replicas,
    max_concurrent_sequences,
    tpu_head_dim,
    weight_bytes_read,
)
from tpuready.calc.plan import HBM_HEADROOM, ModelConfig
from tpuready.validate import InputError

# LLaMA-2 13B as the Scaling Book's inference chapter sizes it (40 layers and heads, no GQA).
LLAMA2_13B = ModelConfig(
    name="llama-2-13b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40,
    head_dim=128, num_experts=1, experts_per_token=1, expert_ffn_size=13824, vocab_size=32000,
)  # fmt: skip
# Qwen3-235B-A22B from its config.json (chapter 14's model).
QWEN3_235B = ModelConfig(
    name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4,
    head_dim=128, num_experts=128, experts_per_token=8, expert_ffn_size=1536,
    vocab_size=151936,
)  # fmt: skip


def test_kv_bytes_per_token_is_keys_and_values_per_layer_and_kv_head() -> None:
    assert kv_bytes_per_token(LLAMA2_13B) == 2 * 40 * 40 * 128 * 2  # 819,200 bytes
    assert kv_bytes_per_token(QWEN3_235B) == 2 * 94 * 4 * 128 * 2  # GQA: 4 KV heads of 64
    assert kv_bytes_per_token(QWEN3_235B, bytes_per_value=1) == 2 * 94 * 4 * 128


@pytest.mark.parametrize(
    ("head_dim", "stored"),
    [(32, 128), (64, 64), (80, 128), (96, 128), (128, 128), (192, 256), (256, 256)],
)
def test_a_tpu_kv_cache_pads_the_head_dim_to_128_but_packs_64(head_dim: int, stored: int) -> None:
    """tpu-inference 0.32.0's get_padded_head_dim, read from the wheel."""
    assert tpu_head_dim(head_dim) == stored
    small = ModelConfig("small", 2, 256, 4, 2, head_dim, 1, 1, 512, 1000)
    assert kv_bytes_per_token(small) == 2 * 2 * 2 * head_dim * 2
    assert kv_bytes_per_token(small, tpu_layout=True) == 2 * 2 * 2 * stored * 2


def test_the_layout_flag_is_a_bool() -> None:
    with pytest.raises(InferenceError, match="tpu_layout must be True or False, got 128"):
        kv_bytes_per_token(LLAMA2_13B, tpu_layout=128)


# The Scaling Book's table for LLaMA-2 13B on 8 TPU v5e at 8,192 tokens of context: step time
# (ms) and tokens/s by batch. It rounds the pod's figures (1,600 TFLOP/s, 6.5 TiB/s) and reads
# the whole input embedding table every step; this module uses the hardware table's v5e and
# reads only the rows the batch looks up, so with the table's read added back the two agree to
# within 1 %.
SCALING_BOOK_LLAMA = {1: (4.98, 200.61), 8: (12.13, 659.30), 16: (20.30, 787.99),
                      32: (36.65, 873.21), 64: (69.33, 923.13), 240: (249.09, 963.53)}  # fmt: skip


@pytest.mark.parametrize("batch", SCALING_BOOK_LLAMA)
def test_the_decode_roofline_reproduces_the_scaling_books_llama_table(batch: int) -> None:
    step = decode_step(LLAMA2_13B, "v5e", batch, 8192, chips=8, tpu_layout=False)
    table = 2 * LLAMA2_13B.embedding_params / (8 * get_chip("v5e").hbm_bytes_per_second)
    milliseconds, tokens_per_second = SCALING_BOOK_LLAMA[batch]
    assert math.isclose((step.seconds + table) * 1e3, milliseconds, rel_tol=0.01)
    assert math.isclose(batch / (step.seconds + table), tokens_per_second, rel_tol=0.01)
    assert step.bound == "memory"  # the KV reads dominate long before the ridge point


def test_decode_turns_compute_bound_near_the_ridge_point_when_the_kv_cache_is_small() -> None:
    v5e = get_chip("v5e")
    ridge = v5e.peak_bf16_flops_per_second / v5e.hbm_bytes_per_second  # about 240
    read = weight_bytes_read(LLAMA2_13B, 256) / 2  # parameters read (embedding rows looked up)
    turn = ridge * read / LLAMA2_13B.active_matmul_params  # 2 bytes over 2 FLOPs a weight
    assert decode_step(LLAMA2_13B, v5e, math.floor(turn), 1).bound == "memory"
    assert decode_step(LLAMA2_13B, v5e, math.ceil(turn) + 1, 1).bound == "compute"


@given(st.integers(min_value=1, max_value=100_000))
def test_a_batch_touches_between_k_and_all_experts_and_more_with_more_tokens(tokens: int) -> None:
    touched = experts_touched(QWEN3_235B, tokens)
    assert 8 - 1e-9 <= touched <= 128
    assert experts_touched(QWEN3_235B, tokens + 1) >= touched
    assert experts_touched(LLAMA2_13B, tokens) == 1  # a dense model is one expert, always used


def test_one_token_reads_the_active_weights_and_a_large_batch_reads_them_all() -> None:
    """All but the input embedding table, a gather of one row per token (at most all rows)."""
    table = QWEN3_235B.embedding_params - QWEN3_235B.hidden_size  # the rows one token skips
    assert weight_bytes_read(QWEN3_235B, 1) == pytest.approx(2 * (QWEN3_235B.active_params - table))
    assert weight_bytes_read(QWEN3_235B, 1_000_000) == pytest.approx(2 * QWEN3_235B.total_params)


def test_a_tied_embedding_table_is_read_whole_as_the_output_head() -> None:
    tied = ModelConfig("tied", 2, 256, 4, 2, 64, 1, 1, 512, 1000, tied_embeddings=True)
    untied = ModelConfig("untied", 2, 256, 4, 2, 64, 1, 1, 512, 1000)
    assert weight_bytes_read(tied, 3) == 2 * tied.total_params
    assert weight_bytes_read(untied, 3) == 2 * (untied.total_params - (1000 - 3) * 256)


@given(
    chips=st.sampled_from([1, 2, 4, 8, 16, 32]),
    groups_log2=st.integers(min_value=0, max_value=6),
    context=st.integers(min_value=1, max_value=131_072),
    chip=st.sampled_from(["v5e", "v5p", "v6e", "v7"]),
)
def test_the_sequences_that_fit_fill_each_attention_group_and_one_more_would_not(
    chips: int, groups_log2: int, context: int, chip: str
) -> None:
    """Each of the `groups` attention groups holds all weights but the experts (split over its
    devices), its share of the experts, and its own sequences' cache; Qwen3's 4 KV heads are
    copied when a group has more devices than that."""
    figures = get_chip(chip)
    devices = chips * figures.devices_per_chip
    groups = min(2**groups_log2, devices)
    group_devices = devices // groups
    copies = max(1, group_devices // 4)
    fit = max_concurrent_sequences(
        QWEN3_235B, chip, context, chips=chips, attention_data_parallel=groups
    )
    assert fit % groups == 0  # every group holds the same number of sequences
    experts = QWEN3_235B.num_layers * 128 * QWEN3_235B.params_per_expert
    kv_projections = QWEN3_235B.num_layers * 2 * QWEN3_235B.hidden_size * QWEN3_235B.kv_dim
    group_weights = 2 * (
        QWEN3_235B.total_params - experts + (copies - 1) * kv_projections
        + experts * group_devices / devices
    )  # fmt: skip
    usable = group_devices * figures.hbm_bytes / figures.devices_per_chip * (1 - HBM_HEADROOM)
    per_sequence = copies * context * kv_bytes_per_token(QWEN3_235B, tpu_layout=True)
    per_group = fit // groups
    if group_weights > usable:
        assert fit == 0
    else:
        assert group_weights + per_group * per_sequence <= usable
        assert usable < group_weights + (per_group + 1) * per_sequence


@given(
    kv_heads=st.integers(min_value=1, max_value=64),
    factor=st.integers(min_value=1, max_value=16),
    divides=st.booleans(),
)
def test_kv_heads_are_split_or_copied_never_both(kv_heads: int, factor: int, divides: bool):
    """Each device keeps max(1, kv_heads / devices) KV heads: split when the devices divide the
    heads, copied when they are a multiple of them."""
    if divides:
        if kv_heads % factor:
            return
        devices = kv_heads // factor
    else:
        devices = kv_heads * factor
    copies = kv_head_replicas(kv_heads, devices)
    per_device = max(1, kv_heads // devices)
    assert devices * per_device == kv_heads * copies  # every head, on `copies` devices
    assert (copies == 1) == (devices <= kv_heads)


def test_a_tensor_parallel_size_that_splits_no_kv_head_evenly_is_refused() -> None:
    with pytest.raises(InferenceError, match="tensor_parallel=6 neither divides"):
        kv_head_replicas(4, 6)


# Qwen3-235B-A22B on TPU v7 (two devices a chip) at 4,096 tokens (chapter 24). Tensor parallel
# attention over all the devices copies its 4 KV heads 2, 4 and 8 times; data-parallel attention
# in groups of 4 devices copies none. (Without the copied K and V projections' weights the
# tensor-parallel batches would be 172, 321 and 396, as issue 37's review computed.)
QWEN_ON_V7 = {4: (171, 324), 8: (320, 1224), 16: (395, 3024)}


@pytest.mark.parametrize("chips", QWEN_ON_V7)
def test_copied_kv_heads_shrink_the_batch_and_data_parallel_attention_recovers_it(chips: int):
    tensor_fit, data_fit = QWEN_ON_V7[chips]
    devices = 2 * chips
    assert max_concurrent_sequences(QWEN3_235B, "v7", 4096, chips=chips) == tensor_fit
    assert (
        max_concurrent_sequences(
            QWEN3_235B, "v7", 4096, chips=chips, attention_data_parallel=devices // 4
        )
        == data_fit
    )
    # Per sequence, tensor parallel reads the copies too: the KV time is `copies` times longer.
    tensor = decode_step(QWEN3_235B, "v7", 64, 4096, chips=chips)
    data = decode_step(
        QWEN3_235B, "v7", 64, 4096, chips=chips, attention_data_parallel=devices // 4
    )
    assert tensor.kv_seconds == pytest.approx(data.kv_seconds * devices / 4)


def test_per_chip_tokens_fall_with_copied_kv_heads_and_rise_with_data_parallel_attention():
    def per_chip(chips: int, groups: int) -> float:
        fit = max_concurrent_sequences(
            QWEN3_235B, "v7", 4096, chips=chips, attention_data_parallel=groups
        )
        return (
            decode_step(
                QWEN3_235B, "v7", fit, 4096, chips=chips, attention_data_parallel=groups
            ).tokens_per_second
            / chips
        )

    tensor = [per_chip(chips, 1) for chips in (4, 8, 16)]
    data = [per_chip(chips, 2 * chips // 4) for chips in (4, 8, 16)]
    assert tensor == sorted(tensor, reverse=True)
    assert data == sorted(data)


def test_a_layout_the_engine_refuses_is_named() -> None:
    with pytest.raises(InferenceError, match="attention_data_parallel=3 does not divide"):
        max_concurrent_sequences(QWEN3_235B, "v7", 4096, chips=4, attention_data_parallel=3)
    with pytest.raises(InferenceError, match="64 attention heads do not split"):
        decode_step(QWEN3_235B, "v7", 8, 4096, chips=64)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: decode_step(LLAMA2_13B, "v5e", 0, 8192), "batch must be at least 1"),
        (lambda: decode_step(LLAMA2_13B, "v9", 1, 8192), "v9"),
        (lambda: max_concurrent_sequences(LLAMA2_13B, "v5e", 1.5), "context_len"),
        (lambda: kv_bytes_per_token(LLAMA2_13B, bytes_per_value=0), "bytes_per_value"),
        (lambda: max_concurrent_sequences(LLAMA2_13B, "v5e", 8, hbm_headroom=1.5), "below 1"),
        (lambda: max_concurrent_sequences(LLAMA2_13B, "v5e", 8, bytes_per_param=-2), "bytes_per"),
    ],
)
def test_bad_input_is_named(call, named: str) -> None:
    with pytest.raises(InputError, match=named):
        call()


def test_experts_touched_matches_a_simulated_uniform_router() -> None:
    """Each token picks 8 distinct experts of 128 at random; count the distinct ones a batch
    of 16 hits, over many batches."""
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((4000, 16, 128)), axis=-1)[..., :8]  # 8 distinct per token
    touched = [len(np.unique(batch)) for batch in picks]
    assert np.mean(touched) == pytest.approx(experts_touched(QWEN3_235B, 16), rel=0.01)
