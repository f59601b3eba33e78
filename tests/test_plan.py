"""`tpuready.calc.plan`: parameter counts, shard sizes, memory, bytes moved and bad input.

The tiny model below is small enough to count by hand; the comments show the counts. The
property tests check what a reader relies on when choosing a mesh: giving an axis more chips
never makes any chip need more memory.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import QWEN3_235B
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.calc.hardware import UnknownChipError, get_chip
from tpuready.calc.plan import (
    AXES,
    BYTES_PER_PARAM_STATE,
    CANDIDATE_AXIS_SHAPES,
    CANDIDATE_MESHES,
    HBM_HEADROOM,
    ModelConfig,
    Plan,
    PlanError,
    gather_stages,
    make_plan,
    shard_len,
)
from tpuready.runtime.tiny_models import tiny_qwen3_moe_config

property_settings = settings(max_examples=60)

# h=8, 2 heads of 4 (q_dim 8), 1 KV head (kv_dim 4), 4 experts of width 6, 2 per token.
TINY = ModelConfig(
    name="tiny",
    num_layers=1,
    hidden_size=8,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    num_experts=4,
    experts_per_token=2,
    expert_ffn_size=6,
    vocab_size=10,
)
# attention 2*8*8 + 2*8*4 + 2*4 (q, k norms) = 200; router 4*8 = 32; experts 4 * 3*8*6 = 576;
# layer norms 2*8 = 16 -> layer 824; embedding and head 2 * 10*8 = 160; final norm 8.
TINY_TOTAL = 824 + 160 + 8
TINY_ACTIVE = TINY_TOTAL - 2 * 144  # two unused experts of 144


def tiny_plan(**mesh: int):
    return make_plan(
        TINY,
        mesh,
        "v7",
        num_chips=math.prod(mesh.values()),
        global_batch=16,
        seq_len=4,
    )


def test_counts_of_the_tiny_model_by_hand():
    assert TINY.total_params == TINY_TOTAL
    assert TINY.active_params == TINY_ACTIVE
    # 6 N with N = 2*8*(8+4) + 32 + 2*144 + 80 = 592, plus 12 * 1 * 2 * 4 * seq_len.
    assert TINY.flops_per_token(seq_len=4) == 6 * 592 + 12 * 2 * 4 * 4


@pytest.mark.parametrize(
    ("length", "ways", "expected"),
    [(10, (3,), 4), (4096, (256, 32), 1), (7, (2, 2), 2), (12, (1, 1), 12), (3, (8,), 1)],
)
def test_shard_len_is_ceil_division_like_torch_chunk(length, ways, expected):
    assert shard_len(length, *ways) == expected
    chunks = [torch.empty(length)]
    for count in ways:
        chunks = list(torch.chunk(chunks[0], count))
    assert len(chunks[0]) == expected


def test_counts_match_a_transformers_model_built_on_meta():
    transformers = pytest.importorskip("transformers")
    config = tiny_qwen3_moe_config()  # 3 layers, 6 experts, 2 per token, untied
    model_config = ModelConfig.from_transformers(config, "small")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    expert_numel = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert model_config.total_params == total
    assert model_config.active_params == total - expert_numel * (6 - 2) // 6


def test_one_chip_holds_everything_and_moves_nothing():
    plan = tiny_plan(fsdp=1)
    assert plan.params_per_chip == TINY_TOTAL
    for name, size in BYTES_PER_PARAM_STATE.items():
        assert plan.state_bytes[name] == TINY_TOTAL * size
    assert set(plan.ici_bytes) == set(AXES)
    assert all(value == 0 for value in plan.ici_bytes.values())
    assert plan.times["ici"] == 0


def test_fsdp_of_two_halves_every_sharded_weight_by_hand():
    # The norms (2*4 + 2*8 + 8 = 32) stay whole; the other 960 parameters split in two.
    assert tiny_plan(fsdp=2).params_per_chip == 32 + 960 // 2


def test_tensor_and_expert_axes_split_heads_experts_and_tokens():
    two_kv_heads = dataclasses.replace(TINY, num_kv_heads=2)  # kv_dim 8
    plan = make_plan(two_kv_heads, {"tensor": 2, "expert": 2}, "v7", num_chips=4,
                     global_batch=16, seq_len=4)  # fmt: skip
    # Tokens split over expert (not tensor): 16 sequences * 4 tokens / 2.
    assert plan.tokens_per_chip == 32
    # q, o: 2 * (8/2/2)*8 = 32; k, v: 2 * (8/2) * (8/2) = 32; router 4 * 8/2 = 16;
    # experts 2 local * ((12/2)*8 + 8*(6/2)) = 144; vocab 2 * ceil(ceil(10/2)/2)*8 = 48;
    # norms 32.
    assert plan.params_per_chip == 32 + 32 + 16 + 144 + 48 + 32


def test_data_axis_all_reduces_fp32_gradients():
    plan = tiny_plan(data=2)
    # Ring all-reduce: each chip sends 2 (n-1)/n of the fp32 gradient.
    assert plan.ici_bytes["data"] == 2 * (1 / 2) * TINY_TOTAL * 4
    assert plan.ici_bytes["fsdp"] == 0


def test_nested_all_gather_stages_by_hand():
    # The last axis first: expert gathers 10 into 20, then fsdp gathers 20 into 80.
    assert gather_stages(10, [("fsdp", 4), ("expert", 2)]) == [("expert", 20), ("fsdp", 80)]


def test_data_axis_seconds_price_the_all_reduce_on_its_ring():
    # 64 chips of v7 as one 4x4x4 cube: data (4) takes the last side, a ring, so the
    # all-reduce of the fp32 gradients takes 2 (n-1)/n V / (2 links * W / 2).
    plan = make_plan(TINY, {"data": 4, "fsdp": 16}, "v7", num_chips=64, global_batch=64,
                     seq_len=4, slice_shape=(4, 4, 4))  # fmt: skip
    link = get_chip("v7").ici_link_bytes_per_second
    assert plan.layouts["data"].describe() == "4 (ring)"
    expected = 2 * (3 / 4) * plan.params_per_chip * 4 / link
    assert plan.ici_seconds["data"] == pytest.approx(expected)


def test_recomputation_saves_activations_and_costs_compute():
    deep = dataclasses.replace(TINY, num_layers=4)  # one layer saves nothing by recomputing
    plain = make_plan(deep, {"fsdp": 2}, "v7", num_chips=2, global_batch=4, seq_len=64,
                      recompute=False)  # fmt: skip
    again = make_plan(deep, {"fsdp": 2}, "v7", num_chips=2, global_batch=4, seq_len=64)
    assert again.activation_bytes < plain.activation_bytes
    assert again.flops_per_chip == pytest.approx(plain.flops_per_chip * 4 / 3)
    assert again.memory_bytes < plain.memory_bytes


def test_activations_tensor_bytes_and_hbm_traffic_by_hand():
    # Two layers, two KV heads (kv_dim 8), tensor=2 on 2 chips: 16 sequences of 4 tokens stay
    # whole on each chip (tensor does not split the batch), so 64 tokens.
    model = dataclasses.replace(TINY, num_layers=2, num_kv_heads=2)
    plans = {
        recompute: make_plan(
            model, {"tensor": 2}, "v7", num_chips=2, global_batch=16, seq_len=4, recompute=recompute
        )
        for recompute in (True, False)
    }
    plan = plans[True]
    assert plan.tokens_per_chip == 64
    # Per token and layer, in bf16: attention 4*8 + (2*8 + 2*8)/2 = 48, experts
    # 2 * (8 + 3*6/2) = 34, plus the fp32 router probabilities 4*4: 2*82 + 16 = 180 bytes.
    # Logits: 64 tokens * ceil(10/2) * 4 bytes = 1,280.
    # Without recomputation: 2 layers * 64 * 180 + 1,280 = 24,320.
    # With it: each layer's bf16 input 2 * 64 * 8*2 = 2,048, one layer's set 64 * 180 = 11,520,
    # and the logits: 14,848.
    assert plan.activation_bytes_full == 24_320
    assert plan.activation_bytes_recompute == 14_848
    assert plan.activation_bytes == 14_848 and plans[False].activation_bytes == 24_320
    # Tensor: all-reduces of 64 tokens * 8 * 2 bytes = 1,024 bytes, of which a ring of 2
    # receives 2 * (1/2) * 1,024 = 1,024; per layer 2 forward + 2 backward, and 2 more
    # forward when recomputing: 2 layers * 6 * 1,024 = 12,288, or 2 * 4 * 1,024 = 8,192.
    assert plan.ici_bytes == {"data": 0, "fsdp": 0, "expert": 0, "tensor": 12_288}
    assert plans[False].ici_bytes["tensor"] == 8_192
    # Parameters on a chip: per layer q, o 2 * 4*8 = 64, k, v 2 * 4*8 = 64, router 32,
    # experts 4 * (6*8 + 8*3) = 288, norms 2*4 + 2*8 = 24, so 472; embedding and head
    # 2 * 5*8 = 80; final norm 8: 2 * 472 + 80 + 8 = 1,032, all of them computed with.
    assert plan.params_per_chip == plan.compute_params_per_chip == 1_032
    # HBM: weights read in bf16 each pass (3 with recomputation) plus fp32 gradients written,
    # 1,032 * (2*3 + 4) = 10,320; the optimizer reads and writes 1,032 * (16 + 12 + 2) = 30,960;
    # activations written and read, 2 * 14,848 = 29,696. Without recomputation:
    # 1,032 * (2*2 + 4) + 30,960 + 2 * 24,320.
    assert plan.hbm_traffic_bytes == 10_320 + 30_960 + 29_696 == 70_976
    assert plans[False].hbm_traffic_bytes == 8_256 + 30_960 + 48_640 == 87_856


def test_step_time_is_the_slowest_roofline_term():
    plan = tiny_plan(fsdp=2, expert=2)
    assert plan.step_seconds == max(plan.times.values())
    assert plan.times[plan.bound] == plan.step_seconds
    chip = get_chip("v7")
    assert plan.times["compute"] == pytest.approx(
        plan.flops_per_chip / chip.peak_bf16_flops_per_second
    )
    assert 0 < plan.mfu <= 1


@pytest.mark.parametrize(
    ("mesh", "num_chips", "match"),
    [
        ({"fsdp": 4}, 8, "not the world size 8"),
        ({"tensor": 4}, 4, "num_heads=2 .* tensor=4"),
        ({"expert": 8}, 8, "num_experts=4 .* expert=8"),
        ({"fsdp": 2, "pipeline": 2}, 4, "unknown mesh axes \\['pipeline'\\]"),
        ({"fsdp": 0}, 1, "mesh\\['fsdp'\\] must be at least 1, got 0"),
    ],
)
def test_bad_mesh_fails_naming_the_value(mesh, num_chips, match):
    with pytest.raises(PlanError, match=match):
        make_plan(TINY, mesh, "v7", num_chips=num_chips, global_batch=64, seq_len=4)


def test_kv_heads_must_divide_by_tensor():
    wide = ModelConfig("wide", 1, 8, 4, 1, 2, 4, 2, 6, 10)
    with pytest.raises(PlanError, match=r"num_kv_heads=1 .* tensor=2"):
        make_plan(wide, {"tensor": 2}, "v7", num_chips=2, global_batch=2, seq_len=4)


def test_batch_must_split_over_the_batch_axes():
    with pytest.raises(PlanError, match=r"global_batch=6 .* = 4"):
        make_plan(TINY, {"fsdp": 2, "data": 2}, "v7", num_chips=4, global_batch=6, seq_len=4)


def test_unknown_hardware_fails_naming_it():
    with pytest.raises(UnknownChipError, match="'v99'"):
        make_plan(TINY, {"fsdp": 1}, "v99", num_chips=1, global_batch=1, seq_len=4)


def test_chip_without_interconnect_figure_fails_clearly():
    with pytest.raises(PlanError, match="TPU v4 has no per-chip ICI figure"):
        make_plan(TINY, {"fsdp": 1}, "v4", num_chips=1, global_batch=1, seq_len=4)


def test_bad_model_fails_naming_the_field():
    with pytest.raises(PlanError, match="hidden_size must be at least 1, got 0"):
        ModelConfig("bad", 1, 0, 2, 1, 4, 4, 2, 6, 10)
    with pytest.raises(PlanError, match="experts_per_token=5 exceeds num_experts=4"):
        ModelConfig("bad", 1, 8, 2, 1, 4, 4, 5, 6, 10)


# A model every power-of-two axis up to 8 divides: 8 heads, 8 KV heads, 16 experts.
SMALL = ModelConfig("small", 2, 64, 8, 8, 8, 16, 2, 24, 100)
powers = st.sampled_from([1, 2, 4])  # doubled, at most 8


@property_settings
@given(
    sizes=st.tuples(powers, powers, powers, powers),
    axis=st.sampled_from(AXES),
    recompute=st.booleans(),
)
def test_memory_per_chip_never_grows_when_an_axis_grows(sizes, axis, recompute):
    mesh = dict(zip(AXES, sizes, strict=True))
    grown = {**mesh, axis: mesh[axis] * 2}
    plans = [
        make_plan(
            SMALL,
            layout,
            "v7",
            num_chips=math.prod(layout.values()),
            global_batch=1024,
            seq_len=32,
            recompute=recompute,
        )
        for layout in (mesh, grown)
    ]
    before, after = plans
    assert after.memory_bytes <= before.memory_bytes
    assert after.params_per_chip <= before.params_per_chip
    assert after.activation_bytes <= before.activation_bytes


@property_settings
@given(sizes=st.tuples(powers, powers, powers, powers))
def test_an_axis_of_size_one_moves_nothing(sizes):
    mesh = dict(zip(AXES, sizes, strict=True))
    plan = make_plan(SMALL, mesh, "v7", num_chips=math.prod(sizes), global_batch=1024, seq_len=32)
    for name, size in mesh.items():
        assert (plan.ici_bytes[name] == 0) == (size == 1)


def test_state_is_fsdp2s_sixteen_bytes_a_parameter():
    # FSDP2 keeps the fp32 shard (the master copy), its fp32 gradient and AdamW's two fp32
    # moments; chapter 9 measures the same 16. A separate bf16 copy of the shard would be 18.
    assert sum(BYTES_PER_PARAM_STATE.values()) == 16
    assert set(BYTES_PER_PARAM_STATE) == {"params_fp32", "gradients_fp32", "adamw_fp32"}


def test_a_plan_fits_only_with_headroom_left() -> None:
    plan = make_plan(TINY, {"fsdp": 4}, "v5e", num_chips=4, global_batch=8, seq_len=128)
    assert plan.hbm_headroom == HBM_HEADROOM == 0.1
    # A Plan built by hand keeps the same headroom unless told otherwise.
    headroom_field = next(f for f in dataclasses.fields(Plan) if f.name == "hbm_headroom")
    assert headroom_field.default == HBM_HEADROOM
    assert plan.usable_hbm_bytes == plan.chip.hbm_bytes * 0.9
    # A plan using 95 % of HBM does not fit with the default 10 % kept free, fits without.
    almost_full = dataclasses.replace(
        plan,
        state_bytes={"all": int(0.95 * plan.chip.hbm_bytes) - plan.activation_bytes},
    )
    assert not almost_full.fits
    assert dataclasses.replace(almost_full, hbm_headroom=0.0).fits
    with pytest.raises(PlanError, match="hbm_headroom is a share of HBM below 1"):
        make_plan(
            TINY, {"fsdp": 4}, "v5e", num_chips=4, global_batch=8, seq_len=128, hbm_headroom=1
        )


def test_chapter_14s_candidates_each_plan_8192_chips_on_their_layout():
    # Chapters 14 and 21 read this one list: every mesh must plan for the announcement's 8,192
    # v7 chips, and a candidate with axis shapes must be laid out otherwise than by default.
    assert len(CANDIDATE_MESHES) == 7
    workload = {"num_chips": 8192, "global_batch": 8192, "seq_len": 4096}
    assert set(CANDIDATE_AXIS_SHAPES) <= set(CANDIDATE_MESHES)
    for label, mesh in CANDIDATE_MESHES.items():
        assert set(mesh) <= set(AXES), label
        assert math.prod(mesh.values()) == 8192, label
        shapes = CANDIDATE_AXIS_SHAPES.get(label)
        plan = make_plan(QWEN3_235B, mesh, "v7", axis_shapes=shapes, **workload)
        assert plan.mesh == mesh, label
        if shapes is not None:
            assert {axis: math.prod(shape) for axis, shape in shapes.items()} == mesh, label
            default = make_plan(QWEN3_235B, mesh, "v7", **workload)
            described = plan.layouts["expert"].describe()
            assert described != default.layouts["expert"].describe(), label
