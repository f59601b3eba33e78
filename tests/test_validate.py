"""Bad input to every calculator: one error family, a message naming the argument and the value.

Each public function of `tpuready.calc.alignment`, `tpuready.calc.buckets`,
`tpuready.calc.roofline`, `tpuready.calc.ici`, `tpuready.calc.plan`, `tpuready.calc.serving` and
`tpuready.calc.inference` gets a valid call, and hypothesis replaces one argument at a time with a
value no caller means (a bool, a float, a string, None, zero, a negative, NaN). The call must raise
an `InputError` (a `ValueError`) whose message names the argument and the value; NumPy integers and
floats must give the same answer as Python's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import hypothesis
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc import alignment, buckets, ici, inference, plan, roofline, serving
from tpuready.calc.hardware import UnknownChipError, get_chip
from tpuready.validate import InputError, number, one_of, whole_number

TINY_MOE = plan.ModelConfig(
    name="tiny",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    num_experts=4,
    experts_per_token=2,
    expert_ffn_size=32,
    vocab_size=1000,
)
RING = ici.AxisLayout((ici.TorusPiece(4, True),), 45e9)
V5E = roofline.Roofline.from_chip("v5e")

# (what, function, keyword arguments that work). Every argument named here is a whole number
# (a size or a count) unless listed in NUMBERS below.
CALLS: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
    ("round_up", alignment.round_up, {"value": 100, "multiple": 128}),
    ("tile_utilization", alignment.tile_utilization, {"dim": 100, "tile": 128}),
    (
        "matmul_tile_utilization",
        alignment.matmul_tile_utilization,
        {"m": 100, "k": 256, "n": 384, "tile": 128},
    ),
    ("recommend_padding", alignment.recommend_padding, {"dim": 151_936, "multiple": 256}),
    ("optimal_buckets", buckets.optimal_buckets, {"lengths": [3, 9, 40], "k": 2}),
    ("bucket_for", buckets.bucket_for, {"length": 5, "buckets": (4, 8)}),
    ("matmul_flops", roofline.matmul_flops, {"m": 8, "k": 16, "n": 32}),
    ("matmul_bytes", roofline.matmul_bytes, {"m": 8, "k": 16, "n": 32, "bytes_per_element": 2}),
    (
        "attention_flops",
        roofline.attention_flops,
        {"batch": 2, "heads": 4, "seq_len": 128, "head_dim": 64},
    ),
    (
        "attention_bytes",
        roofline.attention_bytes,
        {"batch": 2, "heads": 4, "seq_len": 128, "head_dim": 64, "bytes_per_element": 2},
    ),
    (
        "elementwise_intensity",
        roofline.elementwise_intensity,
        {"flops_per_element": 1, "bytes_per_element": 2, "num_inputs": 2, "num_outputs": 1},
    ),
    (
        "attainable_flops_per_second",
        roofline.attainable_flops_per_second,
        {"intensity": 10.0, "peak_flops_per_second": 1e12, "bytes_per_second": 1e11},
    ),
    (
        "ridge_point_flops_per_byte",
        roofline.ridge_point_flops_per_byte,
        {"peak_flops_per_second": 1e12, "bytes_per_second": 1e11},
    ),
    ("mfu", roofline.mfu, {"model_flops": 1e12, "seconds": 2.0, "peak_flops_per_second": 1e12}),
    (
        "tokens_per_second",
        roofline.tokens_per_second,
        {
            "mfu": 0.3,
            "num_chips": 8,
            "peak_flops_per_second_per_chip": 1e15,
            "flops_per_token": 1e9,
        },
    ),
    (
        "Roofline",
        roofline.Roofline,
        {"name": "cpu", "peak_flops_per_second": 6e10, "bytes_per_second": 1.2e10},
    ),
    (
        "bytes_received",
        ici.bytes_received,
        {"kind": "all-gather", "total_bytes": 1e9, "group_size": 4},
    ),
    (
        "collective_seconds",
        ici.collective_seconds,
        {"kind": "all-to-all", "total_bytes": 1e9, "layout": RING},
    ),
    ("default_slice_shape", ici.default_slice_shape, {"chip": "v7", "num_chips": 64}),
    (
        "layout_mesh",
        ici.layout_mesh,
        {"chip": "v5e", "mesh": {"fsdp": 4}, "slice_shape": (2, 2), "slices": 1},
    ),
    ("streamed_utilization", alignment.streamed_utilization, {"rows": 100}),
    (
        "layout_padded_shape",
        alignment.layout_padded_shape,
        {"rows": 100, "columns": 64, "rows_per_sublane": 2},
    ),
    ("layout_utilization", alignment.layout_utilization, {"rows": 100, "columns": 64}),
    ("padded_dims", alignment.padded_dims, {"dims": {"vocab": 50_257}, "multiple": 256}),
    ("mxu_tile", alignment.mxu_tile, {"chip_name": "v7"}),
    (
        "matmul_intensity",
        roofline.matmul_intensity,
        {"m": 8, "k": 16, "n": 32, "bytes_per_element": 2},
    ),
    (
        "attention_intensity",
        roofline.attention_intensity,
        {"batch": 2, "heads": 4, "seq_len": 128, "head_dim": 64, "bytes_per_element": 2},
    ),
    (
        "bound",
        roofline.bound,
        {"intensity": 10.0, "peak_flops_per_second": 1e12, "bytes_per_second": 1e11},
    ),
    (
        "min_tokens_for_compute_bound",
        lambda k, n, bytes_per_element: V5E.min_tokens_for_compute_bound(k, n, bytes_per_element),
        {"k": 8192, "n": 8192, "bytes_per_element": 2},
    ),
    ("padded_tokens", buckets.padded_tokens, {"lengths": [3, 9, 40], "buckets": (16, 64)}),
    ("padding_stats", buckets.padding_stats, {"lengths": [3, 9, 40], "buckets": (16, 64)}),
    ("TorusPiece", ici.TorusPiece, {"size": 4, "wraps": True, "stride": 2}),
    ("AxisLayout", ici.AxisLayout, {"pieces": RING.pieces, "link_bytes_per_second": 45e9}),
    ("shard_len", lambda length, ways: plan.shard_len(length, ways), {"length": 10, "ways": 3}),
    (
        "make_plan",
        plan.make_plan,
        {
            "model": TINY_MOE,
            "mesh": {"fsdp": 4},
            "chip": "v5e",
            "num_chips": 4,
            "global_batch": 8,
            "seq_len": 128,
        },
    ),
    (
        "token_buckets",
        serving.token_buckets,
        {"max_num_batched_tokens": 512, "min_bucket": 16, "compilation_sizes": [48]},
    ),
    ("request_buckets", serving.request_buckets, {"max_num_seqs": 64}),
    ("attention_request_buckets", serving.attention_request_buckets, {"max_num_seqs": 64}),
    (
        "schedule",
        lambda **kwargs: {k: v.tolist() for k, v in vars(serving.schedule(**kwargs)).items()},
        {"requests": [serving.Request(0, 40, 3)], "max_num_batched_tokens": 16, "max_num_seqs": 4},
    ),
    (
        "kv_bytes_per_token",
        inference.kv_bytes_per_token,
        {"model": TINY_MOE, "bytes_per_value": 2, "tpu_layout": True},
    ),
    ("experts_touched", inference.experts_touched, {"model": TINY_MOE, "tokens": 8}),
    ("tpu_head_dim", inference.tpu_head_dim, {"head_dim": 96}),
    (
        "max_concurrent_sequences",
        inference.max_concurrent_sequences,
        {"model": TINY_MOE, "chip": "v5e", "context_len": 1024, "chips": 2, "bytes_per_param": 2},
    ),
    (
        "decode_step",
        inference.decode_step,
        {"model": TINY_MOE, "chip": "v6e", "batch": 8, "context_len": 1024, "chips": 2},
    ),
]
# The arguments that are real numbers (a rate, a byte count), not whole numbers.
NUMBERS = {
    "bytes_per_element",
    "flops_per_element",
    "intensity",
    "peak_flops_per_second",
    "bytes_per_second",
    "model_flops",
    "seconds",
    "mfu",
    "peak_flops_per_second_per_chip",
    "flops_per_token",
    "total_bytes",
    "link_bytes_per_second",
    "bytes_per_value",
    "bytes_per_param",
}
# Arguments of other kinds, with their own tests below.
OTHER = {
    "lengths",
    "buckets",
    "kind",
    "layout",
    "chip",
    "chip_name",
    "name",
    "wraps",
    "pieces",
    "model",
    "mesh",
    "dims",
    "slice_shape",
    "compilation_sizes",
    "requests",
    "tpu_layout",
}

WHOLE_ARGUMENTS = [
    (what, argument)
    for what, _, kwargs in CALLS
    for argument in kwargs
    if argument not in NUMBERS | OTHER
]
NUMBER_ARGUMENTS = [
    (what, argument) for what, _, kwargs in CALLS for argument in kwargs if argument in NUMBERS
]
FUNCTIONS = {what: (function, kwargs) for what, function, kwargs in CALLS}

# Values that are never a size or a count: Python counts True as 1 and 4.0 equals 4, but a
# caller passing them has a bug upstream.
NOT_WHOLE = st.one_of(
    st.booleans(),
    st.just(np.True_),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.none(),
    st.integers(max_value=0),
    st.just([4]),
)
NOT_A_RATE = st.one_of(
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.floats(max_value=0.0),
    st.just(math.nan),
    st.just(math.inf),
    st.just(-math.inf),
)


def _call(what: str, argument: str, value: object) -> None:
    function, kwargs = FUNCTIONS[what]
    function(**{**kwargs, argument: value})


def _assert_names(error: InputError, argument: str, value: object) -> None:
    message = str(error)
    assert argument in message, message
    shown = repr(int(value)) if isinstance(value, int) and not isinstance(value, bool) else None
    assert (shown or repr(value)) in message or (
        isinstance(value, float) and math.isnan(value) and "nan" in message
    ), message


def test_every_valid_call_works() -> None:
    for _what, function, kwargs in CALLS:
        function(**kwargs)  # the baseline each bad value is measured against


@pytest.mark.parametrize(("what", "argument"), WHOLE_ARGUMENTS)
@given(value=NOT_WHOLE)
def test_a_bad_size_or_count_is_one_error_naming_it(what: str, argument: str, value: object):
    with pytest.raises(InputError) as raised:
        _call(what, argument, value)
    _assert_names(raised.value, argument, value)


@pytest.mark.parametrize(("what", "argument"), NUMBER_ARGUMENTS)
@given(value=NOT_A_RATE)
def test_a_bad_rate_or_amount_is_one_error_naming_it(what: str, argument: str, value: object):
    if argument == "total_bytes" and value == 0.0:
        return  # no bytes is a valid collective: it takes no time
    with pytest.raises(InputError) as raised:
        _call(what, argument, value)
    _assert_names(raised.value, argument, value)


@pytest.mark.parametrize(("what", "argument"), WHOLE_ARGUMENTS)
@given(size=st.integers(min_value=1, max_value=64))
def test_numpy_integers_give_what_python_ints_give(what: str, argument: str, size: int):
    function, kwargs = FUNCTIONS[what]
    try:
        expected = function(**{**kwargs, argument: size})
    except InputError:
        return  # a size that does not fit this call (a mesh of the wrong world size)
    assert function(**{**kwargs, argument: np.int64(size)}) == expected


@pytest.mark.parametrize(("what", "argument"), NUMBER_ARGUMENTS)
def test_numpy_floats_give_what_python_floats_give(what: str, argument: str):
    function, kwargs = FUNCTIONS[what]
    value = float(kwargs[argument])
    assert function(**{**kwargs, argument: np.float64(value)}) == function(
        **{**kwargs, argument: value}
    )


@given(kind=st.one_of(st.text(max_size=12), st.none(), st.integers()))
def test_an_unknown_collective_names_the_choices(kind: object):
    if kind in ici.COLLECTIVES:
        return
    with pytest.raises(ici.IciModelError, match="kind must be one of"):
        ici.collective_seconds(kind, 1e9, RING)
    with pytest.raises(ici.IciModelError, match="all-to-all"):
        ici.bytes_received(kind, 1e9, 4)


@pytest.mark.parametrize("layout", [None, 4, (ici.TorusPiece(4, True),)])
def test_collective_seconds_needs_a_layout(layout: object):
    with pytest.raises(ici.IciModelError, match="layout must be an AxisLayout"):
        ici.collective_seconds("all-gather", 1e9, layout)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda chip: alignment.mxu_tile(chip), "chip_name"),
        (lambda chip: roofline.Roofline.from_chip(chip), "chip"),
        (lambda chip: ici.default_slice_shape(chip, 4), "chip"),
        (
            lambda chip: plan.make_plan(
                TINY_MOE, {"fsdp": 4}, chip, num_chips=4, global_batch=8, seq_len=128
            ),
            "chip",
        ),
    ],
)
@pytest.mark.parametrize("chip", [None, 5, ["v5e"]])
def test_a_chip_that_is_neither_a_chip_nor_a_name_is_named(call, named: str, chip: object):
    with pytest.raises(InputError, match=f"{named} must be a tpuready.calc.hardware.Chip"):
        call(chip)


def test_an_unknown_chip_name_is_in_the_family():
    with pytest.raises(UnknownChipError) as raised:
        plan.make_plan(TINY_MOE, {"fsdp": 4}, "v99", num_chips=4, global_batch=8, seq_len=128)
    assert isinstance(raised.value, InputError)


@pytest.mark.parametrize(
    ("mesh", "match"),
    [
        ({"fsdp": True, "expert": 4}, r"mesh\['fsdp'\] must be a whole number, got True"),
        ({"fsdp": 2.0, "expert": 2}, r"mesh\['fsdp'\] must be a whole number, got 2\.0"),
        ([("fsdp", 4)], "mesh must be a mapping"),
    ],
)
def test_a_bad_mesh_names_the_axis(mesh: object, match: str):
    with pytest.raises(plan.PlanError, match=match):
        plan.make_plan(TINY_MOE, mesh, "v5e", num_chips=4, global_batch=8, seq_len=128)


def test_make_plan_refuses_a_fractional_or_textual_sequence_length():
    for value in (4.5, "4", 128.0):
        with pytest.raises(plan.PlanError, match=f"seq_len must be a whole number, got {value!r}"):
            plan.make_plan(TINY_MOE, {"fsdp": 4}, "v5e", num_chips=4, global_batch=8, seq_len=value)
    with pytest.raises(plan.PlanError, match="recompute must be True or False"):
        plan.make_plan(
            TINY_MOE, {"fsdp": 4}, "v5e", num_chips=4, global_batch=8, seq_len=128, recompute=1
        )


@given(
    field=st.sampled_from(["num_layers", "hidden_size", "num_experts", "vocab_size"]),
    value=NOT_WHOLE,
)
def test_a_bad_model_field_is_named(field: str, value: object):
    fields = {name: getattr(TINY_MOE, name) for name in TINY_MOE.__dataclass_fields__}
    with pytest.raises(plan.PlanError) as raised:
        plan.ModelConfig(**{**fields, field: value})
    _assert_names(raised.value, field, value)


@given(
    length=st.integers(min_value=1, max_value=10**6), ways=st.lists(st.integers(1, 64), max_size=4)
)
def test_shard_len_is_the_largest_torch_chunk(length: int, ways: list[int]):
    expected = length
    for count in ways:
        expected = len(torch.arange(expected).chunk(count)[0])
    assert plan.shard_len(length, *ways) == expected


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 0), r"ways\[0\] must be at least 1, got 0"),
        ((-10, 3), "length must be at least 1, got -10"),
    ],
)
def test_shard_len_refuses_what_torch_chunk_refuses(args: tuple[int, int], match: str):
    with pytest.raises(plan.PlanError, match=match):
        plan.shard_len(*args)


@pytest.mark.parametrize(
    ("sequences", "match"),
    [
        ([[1.5, 2.0]], r"sequences\[0\] must hold integer token ids, got dtype torch.float32"),
        ([torch.tensor([1.0, 2.0])], r"sequences\[0\] must hold integer token ids"),
        (
            [[1, 2], [[3, 4], [5, 6]]],
            r"sequences\[1\] must be one row of token ids, got shape \(2, 2\)",
        ),
        ([torch.ones(2, 3, dtype=torch.long)], r"sequences\[0\] must be one row"),
        ([[True, False]], "got dtype torch.bool"),
    ],
)
def test_pad_to_bucket_refuses_what_it_would_silently_mangle(sequences: list, match: str):
    with pytest.raises(buckets.BucketError, match=match):
        buckets.pad_to_bucket(sequences, (4, 8))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"padding_side": "top"}, "padding_side must be one of"),
        ({"pad_value": -1}, "pad_value must be at least 0"),
        ({"pad_value": 0.5}, "pad_value must be a whole number"),
    ],
)
def test_pad_to_bucket_refuses_bad_options(kwargs: dict, match: str):
    with pytest.raises(buckets.BucketError, match=match):
        buckets.pad_to_bucket([[1, 2]], (4, 8), **kwargs)


@given(bad=NOT_WHOLE)
def test_a_bad_bucket_is_named_by_its_index(bad: object):
    with pytest.raises(buckets.BucketError) as raised:
        buckets.bucket_for(3, (4, bad) if not isinstance(bad, list) else (4, *bad, 2))
    assert "buckets[1]" in str(raised.value) or "strictly increasing" in str(raised.value)


def test_numpy_lengths_and_buckets_work_as_lists():
    lengths = np.array([3, 9, 40])
    assert buckets.optimal_buckets(lengths, np.int64(2)) == buckets.optimal_buckets([3, 9, 40], 2)
    assert buckets.bucket_for(np.int32(5), np.array([4, 8])) == 8


def test_every_calculator_error_is_one_family():
    for error in (
        alignment.AlignmentError,
        buckets.BucketError,
        roofline.RooflineError,
        ici.IciModelError,
        plan.PlanError,
        UnknownChipError,
    ):
        assert issubclass(error, InputError) and issubclass(error, ValueError)


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            lambda: whole_number("n", 2.0, fix="use 2"),
            "n must be a whole number, got 2.0 (float): use 2",
        ),
        (
            lambda: whole_number("n", -1, minimum=0, fix="count"),
            "n must be at least 0, got -1: count",
        ),
        (
            lambda: number("rate", "1", fix="a float"),
            "rate must be a number, got '1' (str): a float",
        ),
        (
            lambda: number("rate", 0, fix="above 0"),
            "rate must be a finite number above zero, got 0: above 0",
        ),
        (
            lambda: number("b", -1.0, fix="bytes", allow_zero=True),
            "b must be a finite number at least zero, got -1.0: bytes",
        ),
        (
            lambda: one_of("side", "up", ("left", "right")),
            "side must be one of ['left', 'right'], got 'up' (str)",
        ),
    ],
)
def test_the_messages_say_argument_value_and_fix(check: Callable[[], object], message: str):
    with pytest.raises(InputError) as raised:
        check()
    assert str(raised.value) == message


def test_what_is_valid_passes_through_converted():
    assert (
        whole_number("n", np.int16(7), fix="") == 7
        and type(whole_number("n", np.int16(7), fix="")) is int
    )
    assert number("rate", np.float32(0.5), fix="") == 0.5
    assert number("b", 0, fix="", allow_zero=True) == 0.0
    assert get_chip("v5e") is alignment.hardware.as_chip("v5e")


@pytest.mark.parametrize("dims", [[("vocab", 3)], "vocab", None])
def test_padded_dims_needs_a_mapping(dims: object) -> None:
    with pytest.raises(alignment.AlignmentError, match="dims must map names to sizes"):
        alignment.padded_dims(dims, 128)


def test_a_number_too_large_for_a_float_is_refused_as_infinite() -> None:
    with pytest.raises(InputError, match="must be a finite number"):
        number("rate", 10**400, fix="pass a rate")


def test_a_kernel_may_do_no_flops_or_move_no_bytes() -> None:
    assert V5E.seconds(0, 1e9) == 1e9 / V5E.bytes_per_second
    assert V5E.seconds(1e12, 0) == 1e12 / V5E.peak_flops_per_second
    with pytest.raises(roofline.RooflineError, match="flops must be a finite number at least"):
        V5E.seconds(-1, 1e9)


@pytest.mark.parametrize("wraps", ["yes", 1, None])
def test_a_torus_piece_wraps_or_not(wraps: object) -> None:
    with pytest.raises(ici.IciModelError, match="wraps must be True"):
        ici.TorusPiece(4, wraps)


@pytest.mark.parametrize("dcn", [-1.0, "fast", math.nan])
def test_a_dcn_bandwidth_is_checked_when_given(dcn: object) -> None:
    with pytest.raises(ici.IciModelError, match="dcn_bytes_per_second"):
        ici.AxisLayout(RING.pieces, 45e9, dcn_bytes_per_second=dcn)


def test_no_property_test_has_a_wall_clock_deadline() -> None:
    # conftest.py loads a profile without Hypothesis's 200 ms deadline: a busy machine must not
    # fail a test about values.
    assert hypothesis.settings.default.deadline is None
