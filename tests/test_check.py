"""Tests for tpuready.check: parity reports, default tolerances and the bf16-passes model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.check import (
    MATMUL_PASSES,
    ParityReport,
    Tolerance,
    compare_tensors,
    default_tolerance,
    emulate_bf16_matmul_passes,
    matmul_in_bf16_passes,
    split_into_bf16,
)

FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
shapes = st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=3).map(tuple)
finite_values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def tensors(draw, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    shape = draw(shapes)
    values = draw(st.lists(finite_values, min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


# --- default_tolerance ------------------------------------------------------------------------


def test_default_tolerance_matches_torch_testing_defaults() -> None:
    assert default_tolerance(torch.float32) == Tolerance(rtol=1.3e-6, atol=1e-5)
    assert default_tolerance(torch.bfloat16) == Tolerance(rtol=1.6e-2, atol=1e-5)
    assert default_tolerance(torch.float16) == Tolerance(rtol=1e-3, atol=1e-5)


def test_default_tolerance_loosens_as_precision_drops() -> None:
    rtols = [default_tolerance(dtype).rtol for dtype in FLOAT_DTYPES]
    assert rtols == sorted(rtols)
    assert len(set(rtols)) == len(rtols)


def test_default_tolerance_is_a_few_units_of_rounding() -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        machine_epsilon = torch.finfo(dtype).eps
        assert machine_epsilon <= default_tolerance(dtype).rtol <= 16 * machine_epsilon


def test_default_tolerance_rejects_unknown_dtype_by_name() -> None:
    with pytest.raises(ValueError, match=r"torch\.int64.*supported dtypes: torch\.float64"):
        default_tolerance(torch.int64)


@pytest.mark.parametrize("bad", [-1e-3, math.nan, math.inf])
def test_tolerance_rejects_negative_or_non_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="rtol must be finite and >= 0"):
        Tolerance(rtol=bad, atol=0.0)


def test_tolerance_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match="atol must be a number, got '1e-3'"):
        Tolerance(rtol=0.0, atol="1e-3")  # type: ignore[arg-type]


# --- compare_tensors: worked examples ------------------------------------------------------------


def test_report_measures_abs_and_scale_relative_error() -> None:
    reference = torch.tensor([1.0, -4.0, 2.0])
    candidate = torch.tensor([1.0, -4.0, 2.02])
    report = compare_tensors(reference, candidate, rtol=0.0, atol=0.05)
    assert report.max_abs_error == pytest.approx(0.02, rel=1e-5)
    assert report.max_rel_error == pytest.approx(0.02 / 4.0, rel=1e-5)
    assert report.passed
    assert report.num_elements == 3
    assert report.num_mismatched == 0


def test_relative_error_does_not_explode_near_zero() -> None:
    reference = torch.tensor([1e-8, 1.0], dtype=torch.float64)
    candidate = torch.tensor([1e-3, 1.0], dtype=torch.float64)
    assert compare_tensors(reference, candidate).max_rel_error == pytest.approx(1e-3, rel=1e-4)


def test_failed_report_counts_mismatches_and_says_so() -> None:
    reference = torch.zeros(4)
    candidate = torch.tensor([0.0, 1.0, 0.0, -1.0])
    report = compare_tensors(reference, candidate)
    assert not report.passed
    assert report.num_mismatched == 2
    assert report.max_rel_error == math.inf  # an all-zero reference has no scale
    assert str(report).startswith("FAILED (2 of 4): max abs error 1.00e+00")


def test_report_string_when_passed() -> None:
    report = compare_tensors(torch.ones(2), torch.ones(2))
    assert str(report) == (
        "passed: max abs error 0.00e+00, max rel error 0.00e+00 (rtol 1.3e-06, atol 1.0e-05)"
    )


def test_explicit_rtol_atol_override_the_dtype_default() -> None:
    report = compare_tensors(torch.ones(3), torch.ones(3) * 1.1, rtol=0.2)
    assert report.tolerance == Tolerance(rtol=0.2, atol=1e-5)
    assert report.passed
    assert not compare_tensors(torch.ones(3), torch.ones(3) * 1.1).passed


def test_nan_matches_nan_and_infinities_must_agree() -> None:
    reference = torch.tensor([math.nan, math.inf, 1.0])
    assert compare_tensors(reference, reference.clone()).passed
    flipped = torch.tensor([math.nan, -math.inf, 1.0])
    report = compare_tensors(reference, flipped)
    assert not report.passed
    assert report.num_mismatched == 1
    assert report.max_abs_error == math.inf
    nan_for_number = torch.tensor([math.nan, math.inf, math.nan])
    assert compare_tensors(reference, nan_for_number).num_mismatched == 1


def test_empty_tensors_pass() -> None:
    report = compare_tensors(torch.empty(0, 3), torch.empty(0, 3))
    assert report.passed
    assert report.max_abs_error == 0.0


def test_mixed_dtypes_need_an_explicit_dtype() -> None:
    reference = torch.linspace(-2, 2, 17)
    candidate = reference.bfloat16()
    expected_message = r"reference is torch\.float32, candidate is torch\.bfloat16"
    with pytest.raises(TypeError, match=expected_message):
        compare_tensors(reference, candidate)
    report = compare_tensors(reference, candidate, dtype=torch.bfloat16)
    assert report.tolerance == default_tolerance(torch.bfloat16)
    assert report.passed


def test_integer_tensors_need_dtype_or_exact_tolerance() -> None:
    tokens = torch.tensor([3, 1, 4])
    with pytest.raises(TypeError, match=r"torch\.int64; pass dtype="):
        compare_tensors(tokens, tokens)
    assert compare_tensors(tokens, tokens, dtype=torch.int64, rtol=0.0, atol=0.0).passed
    assert not compare_tensors(tokens, tokens + 1, dtype=torch.int64, rtol=0.0, atol=0.0).passed


def test_non_tensors_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"candidate must be a torch\.Tensor, got list"):
        compare_tensors(torch.ones(2), [1.0, 1.0])  # type: ignore[arg-type]


def test_no_broadcasting() -> None:
    expected_message = r"reference has shape \(3,\), candidate has shape \(1, 3\)"
    with pytest.raises(ValueError, match=expected_message):
        compare_tensors(torch.ones(3), torch.ones(1, 3))


def test_inputs_are_not_modified_and_gradients_are_ignored() -> None:
    reference = torch.ones(3, requires_grad=True)
    candidate = torch.full((3,), 2.0)
    report = compare_tensors(reference, candidate)
    assert report.max_abs_error == 1.0
    assert reference.dtype == torch.float32
    assert torch.equal(candidate, torch.full((3,), 2.0))


# --- compare_tensors: properties -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(tensor=tensors(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_a_tensor_always_matches_itself(tensor: torch.Tensor, dtype: torch.dtype) -> None:
    tensor = tensor.to(dtype)
    report = compare_tensors(tensor, tensor.clone())
    assert report.passed
    assert report.max_abs_error == 0.0
    assert report.max_rel_error == 0.0
    assert report.num_elements == tensor.numel()


@settings(max_examples=60, deadline=None)
@given(
    reference=tensors(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    fraction=st.floats(min_value=-0.9, max_value=0.9),
)
def test_perturbation_within_tolerance_passes(
    reference: torch.Tensor, dtype: torch.dtype, fraction: float
) -> None:
    tolerance = default_tolerance(dtype)
    bound = tolerance.atol + tolerance.rtol * reference.abs()
    candidate = reference + fraction * bound
    report = compare_tensors(reference, candidate, dtype=dtype)
    assert report.passed, report
    assert report.max_abs_error <= float(bound.max())


@settings(max_examples=60, deadline=None)
@given(
    reference=tensors(),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    factor=st.floats(min_value=1.1, max_value=100.0),
    sign=st.sampled_from([-1.0, 1.0]),
    data=st.data(),
)
def test_perturbation_beyond_tolerance_fails(
    reference: torch.Tensor, dtype: torch.dtype, factor: float, sign: float, data: st.DataObject
) -> None:
    tolerance = default_tolerance(dtype)
    index = data.draw(st.integers(min_value=0, max_value=reference.numel() - 1))
    candidate = reference.clone().flatten()
    candidate[index] += sign * factor * (tolerance.atol + tolerance.rtol * abs(candidate[index]))
    report = compare_tensors(reference, candidate.reshape(reference.shape), dtype=dtype)
    assert not report.passed
    assert report.num_mismatched == 1


@settings(max_examples=40, deadline=None)
@given(first=shapes, second=shapes)
def test_shape_errors_are_symmetric_and_name_both_shapes(
    first: tuple[int, ...], second: tuple[int, ...]
) -> None:
    if first == second:
        assert compare_tensors(torch.zeros(first), torch.zeros(second)).passed
        return
    messages = []
    for reference_shape, candidate_shape in ((first, second), (second, first)):
        with pytest.raises(ValueError, match="shape mismatch") as caught:
            compare_tensors(torch.zeros(reference_shape), torch.zeros(candidate_shape))
        assert f"reference has shape {reference_shape}" in str(caught.value)
        assert f"candidate has shape {candidate_shape}" in str(caught.value)
        messages.append(str(caught.value))
    assert messages[0] != messages[1]


@settings(max_examples=40, deadline=None)
@given(reference=tensors(), candidate_noise=tensors())
def test_errors_are_symmetric_in_absolute_terms(
    reference: torch.Tensor, candidate_noise: torch.Tensor
) -> None:
    if candidate_noise.shape != reference.shape:
        candidate_noise = torch.zeros_like(reference)
    candidate = reference + candidate_noise
    forward = compare_tensors(reference, candidate)
    backward = compare_tensors(candidate, reference)
    assert forward.max_abs_error == backward.max_abs_error
    assert isinstance(forward, ParityReport)


# --- the bf16-passes model of TorchTPU's float32 matmuls ----------------------------------------


@settings(max_examples=40, deadline=None)
@given(tensor=tensors(dtype=torch.float32), num_pieces=st.integers(min_value=1, max_value=3))
def test_bf16_pieces_are_bf16_values(tensor: torch.Tensor, num_pieces: int) -> None:
    pieces = split_into_bf16(tensor, num_pieces)
    assert len(pieces) == num_pieces
    for piece in pieces:
        assert piece.dtype == torch.float32
        assert torch.equal(piece, piece.bfloat16().float())


def test_three_bf16_pieces_rebuild_a_float32_exactly() -> None:
    torch.manual_seed(0)
    tensor = torch.randn(1000)
    high, middle, low = split_into_bf16(tensor, 3)
    assert torch.equal(high + middle + low, tensor)
    assert not torch.equal(high, tensor)


def test_split_rejects_bad_piece_count() -> None:
    with pytest.raises(ValueError, match="num_pieces must be an int >= 1, got 0"):
        split_into_bf16(torch.ones(2), 0)


def test_one_pass_equals_rounding_inputs_to_bf16() -> None:
    torch.manual_seed(0)
    left, right = torch.randn(8, 16), torch.randn(16, 4)
    expected = left.bfloat16().float() @ right.bfloat16().float()
    assert torch.equal(matmul_in_bf16_passes(left, right, 1), expected)


def test_more_passes_get_closer_to_float64() -> None:
    torch.manual_seed(0)
    left, right = torch.randn(64, 64), torch.randn(64, 64)
    exact = left.double() @ right.double()
    errors = [
        compare_tensors(exact, matmul_in_bf16_passes(left, right, passes).double()).max_abs_error
        for passes in sorted(MATMUL_PASSES)
    ]
    assert errors[0] > 100 * errors[1] > 0
    assert errors[1] > 10 * errors[2]
    float32_error = compare_tensors(exact, (left @ right).double()).max_abs_error
    assert errors[2] < 4 * float32_error


def test_passes_must_be_one_three_or_six() -> None:
    with pytest.raises(ValueError, match=r"passes must be one of \[1, 3, 6\], got 2"):
        matmul_in_bf16_passes(torch.ones(2, 2), torch.ones(2, 2), 2)
    with pytest.raises(ValueError, match="got 4"), emulate_bf16_matmul_passes(4):
        pass


def test_emulation_reroutes_matmul_linear_and_operator_then_restores() -> None:
    torch.manual_seed(0)
    inputs, weight = torch.randn(5, 32), torch.randn(8, 32)
    rounded = inputs.bfloat16().float() @ weight.bfloat16().float().t()
    with emulate_bf16_matmul_passes(1):
        via_linear = torch.nn.functional.linear(inputs, weight)
        via_operator = inputs @ weight.t()
        via_matmul = torch.matmul(inputs, weight.t())
        via_method = inputs.matmul(weight.t())
    for result in (via_linear, via_operator, via_matmul, via_method):
        assert torch.equal(result, rounded)
    assert not torch.equal(inputs @ weight.t(), rounded)


def test_emulation_keeps_bias_and_leaves_other_dtypes_alone() -> None:
    torch.manual_seed(0)
    weight, bias, inputs = torch.randn(4, 16), torch.randn(4), torch.randn(3, 16)
    expected = inputs.bfloat16().float() @ weight.bfloat16().float().t() + bias
    with emulate_bf16_matmul_passes(1):
        output = torch.nn.functional.linear(inputs, weight, bias)
        double_output = torch.nn.functional.linear(inputs.double(), weight.double(), bias.double())
    assert torch.equal(output, expected)
    exact_double = torch.nn.functional.linear(inputs.double(), weight.double(), bias.double())
    assert torch.equal(double_output, exact_double)
