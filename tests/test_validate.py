"""Bad input to every calculator: one error family, a message naming the argument and the value.

Each public function of `tpuready.calc.alignment`, `tpuready.calc.buckets`,
`tpuready.calc.packing`, `tpuready.calc.roofline`, `tpuready.calc.ici`, `tpuready.calc.plan`,
`tpuready.calc.serving` and `tpuready.calc.inference` gets a valid call, and hypothesis replaces
one argument at a time with a value no caller means (a bool, a float, a string, None, zero, a
negative, NaN). The call must raise an `InputError` (a `ValueError`) whose message names the
argument and the value; NumPy integers and floats must give the same answer as Python's.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import hypothesis
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc import (
    alignment,
    buckets,
    comm_bound,
    hardware,
    ici,
    inference,
    packing,
    plan,
    roofline,
    serving,
    titan,
)
from tpuready.calc.hardware import UnknownChipError, get_chip
from tpuready.runtime import host_launch, launch, timing
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
    ("rows_per_register", alignment.rows_per_register, {"itemsize": 2}),
    ("layout_padded_shape", alignment.layout_padded_shape, {"rows": 100, "columns": 64}),
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
    (
        "pack_documents",
        lambda num_rows, row_len: [
            t.tolist() for t in packing.pack_documents([[5, 6]], num_rows, row_len)
        ],
        {"num_rows": 2, "row_len": 8},
    ),
    (
        "plan_packed_batches",
        lambda num_rows, row_len: packing.plan_packed_batches([3, 1], num_rows, row_len),
        {"num_rows": 2, "row_len": 8},
    ),
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
        "lognormal_stream",
        serving.lognormal_stream,
        {"num_requests": 4, "rate": 0.5, "prompt_median": 64, "output_median": 8},
    ),
    (
        "kv_bytes_per_token",
        inference.kv_bytes_per_token,
        {"model": TINY_MOE, "bytes_per_value": 2, "tpu_layout": True},
    ),
    ("experts_touched", inference.experts_touched, {"model": TINY_MOE, "tokens": 8}),
    ("tpu_head_dim", inference.tpu_head_dim, {"head_dim": 96}),
    ("kv_head_replicas", inference.kv_head_replicas, {"num_kv_heads": 2, "tensor_parallel": 4}),
    (
        "max_concurrent_sequences",
        inference.max_concurrent_sequences,
        {
            "model": TINY_MOE,
            "chip": "v5e",
            "context_len": 1024,
            "chips": 2,
            "attention_data_parallel": 1,
            "bytes_per_param": 2,
        },
    ),
    (
        "fsdp_compute_bound_tokens_per_chip",
        comm_bound.fsdp_compute_bound_tokens_per_chip,
        {"chip": "v5p", "axes": 1},
    ),
    (
        "fsdp_is_compute_bound",
        comm_bound.fsdp_is_compute_bound,
        {"tokens_per_chip": 4096.0, "chip": "v6e", "axes": 1},
    ),
    (
        "host_launch_commands",
        host_launch.host_launch_commands,
        {"script": "train.py", "chip": "v6e", "num_hosts": 2, "port": 29500},
    ),
    (
        "decode_step",
        inference.decode_step,
        {
            "model": TINY_MOE,
            "chip": "v6e",
            "batch": 8,
            "context_len": 1024,
            "chips": 2,
            "attention_data_parallel": 2,
        },
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
    "rate",
    "tokens_per_chip",
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
    "script",
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
        (lambda chip: comm_bound.fsdp_compute_bound_tokens_per_chip(chip), "chip"),
        (lambda chip: host_launch.host_launch_commands("t.py", chip=chip, num_hosts=1), "chip"),
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
        hardware.NoPeakFigureError,
        titan.TitanConfigError,
        titan.TitanRejection,
        serving.ServingBucketError,
        inference.InferenceError,
        timing.TimingError,
        launch.LaunchInputError,
        comm_bound.CommBoundError,
        host_launch.HostLaunchError,
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


# --------------------------------------------------------------------------------------------
# Every public calculator, one bad value each: its module's InputError, naming the argument,
# the value and a fix. (name, argument as the message names it, bad value, the call.)

V5E_BUCKETS = serving.EngineBuckets.from_settings(512, 64)
PLAN = plan.make_plan(TINY_MOE, {"fsdp": 4}, "v5e", num_chips=4, global_batch=8, seq_len=128)
TINY_FIELDS = {name: getattr(TINY_MOE, name) for name in TINY_MOE.__dataclass_fields__}

BAD_INPUTS: list[tuple[str, str, object, Callable[[Any], object]]] = [
    # hardware
    ("hardware.get_chip", "chip", "v99", lambda v: get_chip(v)),  # "unknown chip 'v99'"
    ("hardware.as_chip", "chip", 5, lambda v: hardware.as_chip(v)),
    ("hardware.chip_for_device_name", "device_name", None,
     lambda v: hardware.chip_for_device_name("cuda", v)),
    ("hardware.chip_for_device_name", "device_type", 7,
     lambda v: hardware.chip_for_device_name(v, "TPU v6e")),
    ("hardware.device_peak_flops_per_second", "device", 5,
     lambda v: hardware.device_peak_flops_per_second(v)),
    ("hardware.device_peak_flops_per_second", "dtype", "bf16",
     lambda v: hardware.device_peak_flops_per_second("cuda", v)),
    ("hardware.tpu_ranks_per_host", "chip", 5, lambda v: hardware.tpu_ranks_per_host(v)),
    # comm_bound
    ("comm_bound.fsdp_compute_bound_tokens_per_chip", "axes", 0,
     lambda v: comm_bound.fsdp_compute_bound_tokens_per_chip("v5p", axes=v)),
    ("comm_bound.fsdp_compute_bound_tokens_per_chip", "chip", None,
     lambda v: comm_bound.fsdp_compute_bound_tokens_per_chip(v)),
    ("comm_bound.fsdp_is_compute_bound", "tokens_per_chip", -1.0,
     lambda v: comm_bound.fsdp_is_compute_bound(v, "v6e")),
    # ici
    ("ici.AxisLayout", "link_bytes_per_second", -1.0, lambda v: ici.AxisLayout(RING.pieces, v)),
    ("ici.TorusPiece", "size", 0, lambda v: ici.TorusPiece(v, True)),
    ("ici.bytes_received", "group_size", 2.5, lambda v: ici.bytes_received("all-gather", 1e9, v)),
    ("ici.bytes_received_formula", "kind", "broadcast", lambda v: ici.bytes_received_formula(v)),
    ("ici.check_total_bytes", "total_bytes", "1e9", lambda v: ici.check_total_bytes(v)),
    ("ici.collective_seconds", "total_bytes", math.nan,
     lambda v: ici.collective_seconds("all-gather", v, RING)),
    ("ici.default_slice_shape", "num_chips", True, lambda v: ici.default_slice_shape("v5e", v)),
    ("ici.layout_mesh", "slices", 0,
     lambda v: ici.layout_mesh("v5e", {"fsdp": 4}, (2, 2), slices=v)),
    # plan
    ("plan.ModelConfig", "tied_embeddings", "no",
     lambda v: plan.ModelConfig(**{**TINY_FIELDS, "tied_embeddings": v})),
    ("plan.ModelConfig", "num_layers", 2.0,
     lambda v: plan.ModelConfig(**{**TINY_FIELDS, "num_layers": v})),
    ("plan.ModelConfig.from_transformers", "name", 5,
     lambda v: plan.ModelConfig.from_transformers(object(), v)),
    ("plan.ModelConfig.flops_per_token", "seq_len", -1, lambda v: TINY_MOE.flops_per_token(v)),
    ("plan.checked_hbm_headroom", "hbm_headroom", 1.5, lambda v: plan.checked_hbm_headroom(v)),
    ("plan.gather_stages", "shard", -3, lambda v: plan.gather_stages(v, [("fsdp", 4)])),
    ("plan.make_plan", "global_batch", None,
     lambda v: plan.make_plan(TINY_MOE, {"fsdp": 4}, "v5e", num_chips=4, global_batch=v,
                              seq_len=128)),
    ("plan.shard_len", "length", "10", lambda v: plan.shard_len(v, 2)),
    # titan
    ("titan.titan_degrees", "devices_per_chip", 0,
     lambda v: titan.titan_degrees({"fsdp": 4}, devices_per_chip=v)),
    ("titan.titan_flags", "module", 42, lambda v: titan.titan_flags(PLAN, module=v, config="c")),
    ("titan.rejected_flag", "message", 42, lambda v: titan.rejected_flag(v)),
    ("titan.titan_degrees", "within_chip", "pipeline",
     lambda v: titan.titan_degrees({"fsdp": 4}, devices_per_chip=2, within_chip=v)),
    ("titan.chip_split_costs", "plan", "a plan", lambda v: titan.chip_split_costs(v)),
    ("titan.choose_within_chip", "plan", {"fsdp": 4}, lambda v: titan.choose_within_chip(v)),
    # buckets
    ("buckets.optimal_buckets", "lengths", 5, lambda v: buckets.optimal_buckets(v, 2)),
    ("buckets.optimal_buckets", "k", True, lambda v: buckets.optimal_buckets([3, 9, 40], v)),
    ("buckets.optimal_buckets", "lengths[1]", True, lambda v: buckets.optimal_buckets([3, v], 1)),
    ("buckets.optimal_buckets", "lengths[0]", False, lambda v: buckets.optimal_buckets([v], 1)),
    ("buckets.bucket_for", "buckets", 8, lambda v: buckets.bucket_for(3, v)),
    ("buckets.pad_to_bucket", "padding_side", "top",
     lambda v: buckets.pad_to_bucket([[1, 2]], (4, 8), padding_side=v)),
    ("buckets.padded_tokens", "buckets", "ab", lambda v: buckets.padded_tokens([3], v)),
    ("buckets.token_row", "row", ["a"], lambda v: buckets.token_row("row", v)),
    ("buckets.padding_stats", "lengths", 3.5, lambda v: buckets.padding_stats(v, (4, 8))),
    # packing
    ("packing.pack_documents", "num_rows", 0, lambda v: packing.pack_documents([[1, 2]], v, 8)),
    ("packing.pack_documents", "pad_value", -1,
     lambda v: packing.pack_documents([[1, 2]], 1, 8, pad_value=v)),
    ("packing.plan_packed_batches", "row_len", True,
     lambda v: packing.plan_packed_batches([3, 4], 2, v)),
    ("packing.plan_packed_batches", "lengths[1]", 2.5,
     lambda v: packing.plan_packed_batches([3, v], 2, 8)),
    # alignment
    ("alignment.round_up", "multiple", 0, lambda v: alignment.round_up(100, v)),
    ("alignment.tile_utilization", "tile", "128", lambda v: alignment.tile_utilization(100, v)),
    ("alignment.streamed_utilization", "rows", -3, lambda v: alignment.streamed_utilization(v)),
    ("alignment.matmul_tile_utilization", "k", 1.5,
     lambda v: alignment.matmul_tile_utilization(8, v, 8, 128)),
    ("alignment.layout_padded_shape", "rows", 0, lambda v: alignment.layout_padded_shape(v, 8)),
    ("alignment.rows_per_register", "itemsize", 8, lambda v: alignment.rows_per_register(v)),
    ("alignment.layout_utilization", "columns", None, lambda v: alignment.layout_utilization(8, v)),
    ("alignment.mxu_tile", "chip_name", 7, lambda v: alignment.mxu_tile(v)),
    ("alignment.padded_dims", "multiple", True, lambda v: alignment.padded_dims({"v": 3}, v)),
    ("alignment.recommend_padding", "dim", 0, lambda v: alignment.recommend_padding(v, 128)),
    # roofline
    ("roofline.Roofline", "bytes_per_second", 0.0, lambda v: roofline.Roofline("cpu", 1e12, v)),
    ("roofline.Roofline.from_chip", "chip", None, lambda v: roofline.Roofline.from_chip(v)),
    ("roofline.Roofline.attainable_flops_per_second", "intensity", -1.0,
     lambda v: V5E.attainable_flops_per_second(v)),
    ("roofline.Roofline.bound", "intensity", "high", lambda v: V5E.bound(v)),
    ("roofline.Roofline.min_tokens_for_compute_bound", "k", 0,
     lambda v: V5E.min_tokens_for_compute_bound(v, 8)),
    ("roofline.Roofline.seconds", "bytes_moved", math.inf, lambda v: V5E.seconds(1e9, v)),
    ("roofline.attainable_flops_per_second", "bytes_per_second", None,
     lambda v: roofline.attainable_flops_per_second(1.0, 1e12, v)),
    ("roofline.attention_bytes", "variant", "sparse",
     lambda v: roofline.attention_bytes(1, 1, 8, 8, 2, variant=v)),
    ("roofline.attention_flops", "seq_len", 0, lambda v: roofline.attention_flops(1, 1, v, 8)),
    ("roofline.attention_intensity", "heads", 1.0,
     lambda v: roofline.attention_intensity(1, v, 8, 8, 2)),
    ("roofline.bound", "intensity", math.nan, lambda v: roofline.bound(v, 1e12, 1e11)),
    ("roofline.elementwise_intensity", "num_inputs", 0,
     lambda v: roofline.elementwise_intensity(1, 2, num_inputs=v)),
    ("roofline.matmul_bytes", "bytes_per_element", "2",
     lambda v: roofline.matmul_bytes(8, 8, 8, v)),
    ("roofline.matmul_flops", "m", -8, lambda v: roofline.matmul_flops(v, 8, 8)),
    ("roofline.matmul_intensity", "n", None, lambda v: roofline.matmul_intensity(8, 8, v, 2)),
    ("roofline.mfu", "seconds", 0, lambda v: roofline.mfu(1e12, v, 1e12)),
    ("roofline.ridge_point_flops_per_byte", "peak_flops_per_second", True,
     lambda v: roofline.ridge_point_flops_per_byte(v, 1e11)),
    ("roofline.tokens_per_second", "num_chips", 2.5,
     lambda v: roofline.tokens_per_second(0.3, v, 1e15, 1e9)),
    # serving
    ("serving.EngineBuckets.from_settings", "max_num_seqs", 0,
     lambda v: serving.EngineBuckets.from_settings(512, v)),
    ("serving.EngineBuckets.padded_step", "num_tokens", 1.5,
     lambda v: V5E_BUCKETS.padded_step(v, 1)),
    ("serving.schedule", "prompt_tokens", -1,
     lambda v: serving.schedule([serving.Request(0, v, 3)], 16, 4)),
    ("serving.attention_request_buckets", "max_num_seqs", "64",
     lambda v: serving.attention_request_buckets(v)),
    ("serving.request_buckets", "max_num_seqs", 0, lambda v: serving.request_buckets(v)),
    ("serving.schedule", "max_num_seqs", None,
     lambda v: serving.schedule([serving.Request(0, 40, 3)], 16, v)),
    ("serving.schedule", "page_size", 0,
     lambda v: serving.schedule([serving.Request(0, 40, 3)], 16, 4, page_size=v)),
    ("serving.token_buckets", "min_bucket", 3, lambda v: serving.token_buckets(512, min_bucket=v)),
    ("serving.lognormal_stream", "seed", -1,
     lambda v: serving.lognormal_stream(4, 0.5, 64, 8, seed=v)),
    # inference
    ("inference.decode_step", "batch", 0, lambda v: inference.decode_step(TINY_MOE, "v6e", v, 64)),
    ("inference.experts_touched", "tokens", 0.5, lambda v: inference.experts_touched(TINY_MOE, v)),
    ("inference.kv_head_replicas", "tensor_parallel", 3,
     lambda v: inference.kv_head_replicas(2, v)),
    ("inference.kv_bytes_per_token", "bytes_per_value", -2,
     lambda v: inference.kv_bytes_per_token(TINY_MOE, bytes_per_value=v)),
    ("inference.max_concurrent_sequences", "hbm_headroom", 2.0,
     lambda v: inference.max_concurrent_sequences(TINY_MOE, "v5e", 64, hbm_headroom=v)),
    ("inference.tpu_head_dim", "head_dim", None, lambda v: inference.tpu_head_dim(v)),
    ("inference.weight_bytes_read", "batch", True,
     lambda v: inference.weight_bytes_read(TINY_MOE, v)),
]  # fmt: skip

# Public callables of tpuready.calc that take no number or string (records the calculators
# return, the table itself, a mapping or list of flags) or are checked where they are used,
# each with why it is not in BAD_INPUTS.
NOT_IN_THE_TABLE = {
    "hardware.Chip": "a row of the table, checked by its own tests in test_hardware",
    "hardware.Chip.slice_wraps": "takes a slice shape, checked by layout_mesh",
    "hardware.all_chips": "no argument",
    "hardware.known_names": "no argument",
    "ici.AxisLayout.describe": "no argument",
    "ici.TorusPiece.describe": "no argument",
    "plan.Plan": "what make_plan returns",
    "titan.raise_for_rejection": "takes TorchTitan's result mapping",
    "titan.titan_options": "takes a list of flags",
    "titan.ChipSplit": "what chip_split_costs returns",
    "buckets.PaddingStats": "what padding_stats returns",
    "packing.PackedBatch": "what pack_documents returns",
    "alignment.PaddingAdvice": "what recommend_padding returns",
    "roofline.AttentionVariant": "a Literal type",
    "roofline.Bound": "a Literal type",
    "serving.EngineBuckets": "what EngineBuckets.from_settings returns",
    "serving.EngineBuckets.compiled_graphs": "no argument",
    "serving.Schedule": "what schedule returns",
    "serving.Request": "a record: schedule checks it, naming the request's index (row above)",
    "inference.DecodeStep": "what decode_step returns",
}
CALC_MODULES = (
    hardware,
    comm_bound,
    ici,
    plan,
    titan,
    buckets,
    packing,
    alignment,
    roofline,
    serving,
    inference,
)


def _public_callables() -> set[str]:
    """'module.name' and 'module.Class.method' for every public callable of tpuready.calc."""
    found = set()
    for module in CALC_MODULES:
        short = module.__name__.rsplit(".", 1)[1]
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                continue
            if not callable(value) and not hasattr(value, "__origin__"):
                continue
            found.add(f"{short}.{name}")
            for attribute, member in vars(value).items() if isinstance(value, type) else ():
                function = getattr(member, "__func__", member)
                if not attribute.startswith("_") and inspect.isfunction(function):
                    found.add(f"{short}.{name}.{attribute}")
    return found


def test_every_public_calculator_gets_a_bad_value() -> None:
    covered = {name for name, *_ in BAD_INPUTS}
    assert _public_callables() - covered - set(NOT_IN_THE_TABLE) == set()
    assert covered | set(NOT_IN_THE_TABLE) <= _public_callables()  # no stale row


@pytest.mark.parametrize(
    ("name", "argument", "value", "call"),
    BAD_INPUTS,
    ids=[f"{name}-{argument}" for name, argument, *_ in BAD_INPUTS],
)
def test_bad_input_raises_its_modules_error_naming_argument_value_and_fix(
    name: str, argument: str, value: object, call: Callable[[Any], object]
) -> None:
    with pytest.raises(InputError) as raised:
        call(value)
    error = raised.value
    module = CALC_MODULES[
        [m.__name__.rsplit(".", 1)[1] for m in CALC_MODULES].index(name.split(".")[0])
    ]
    assert type(error).__module__ == module.__name__, f"{type(error)} is not {module.__name__}'s"
    message = str(error)
    assert argument in message, message
    shown = "nan" if isinstance(value, float) and math.isnan(value) else repr(value)
    assert shown in message, message
    # A fix: words after the value ("...got 0: pass ..."), or the choices to pick from.
    after = message.split(shown, 1)[1]
    assert re.search(r"[:;].*\w{3}", after) or "one of [" in message, message
