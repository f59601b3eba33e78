"""Tests for tpuready.inspection.check: the book's relative error and the bf16-passes model of
TorchTPU."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tpuready.inspection.check import (
    BFLOAT16_UNIT_ROUNDOFF,
    FLOAT32_UNIT_ROUNDOFF,
    MATMUL_PASSES,
    TF32_UNIT_ROUNDOFF,
    device_matmul_unit_roundoff,
    emulate_bf16_matmul_passes,
    matmul_unit_roundoff,
    power_of_ten,
    relative_error,
)

shapes = st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=3).map(tuple)
# Magnitudes where float32 and bfloat16 are normal numbers (no subnormals, no overflow), so
# rounding to them has a relative error of at most their unit roundoff.
normal_magnitudes = st.floats(min_value=1e-30, max_value=1e30)
signs = st.sampled_from([-1.0, 1.0])


@st.composite
def tensors(draw: st.DrawFn, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A float64 tensor of normal, nonzero values (so its norm is never 0)."""
    shape = draw(shapes) if shape is None else shape
    size = math.prod(shape)
    magnitudes = draw(st.lists(normal_magnitudes, min_size=size, max_size=size))
    sign_list = draw(st.lists(signs, min_size=size, max_size=size))
    values = [sign * magnitude for sign, magnitude in zip(sign_list, magnitudes, strict=True)]
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


@st.composite
def pairs_of_tensors(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of the SAME shape, drawn independently, so the difference is never trivial."""
    shape = draw(shapes)
    return draw(tensors(shape)), draw(tensors(shape))


# --- relative_error: worked examples -------------------------------------------------------


def test_relative_error_is_the_frobenius_ratio() -> None:
    expected = torch.tensor([[3.0, 0.0], [0.0, 4.0]])  # norm 5
    actual = torch.tensor([[3.0, 0.0], [0.0, 3.0]])  # difference norm 1
    assert relative_error(actual, expected) == pytest.approx(0.2, rel=1e-12)
    assert relative_error(expected, expected.clone()) == 0.0


def test_relative_error_follows_the_scale_not_each_element() -> None:
    # An elementwise ratio would be 1e5 at the first element; the whole-tensor ratio is tiny.
    expected = torch.tensor([1e-8, 1.0], dtype=torch.float64)
    actual = torch.tensor([1e-3, 1.0], dtype=torch.float64)
    assert relative_error(actual, expected) == pytest.approx(1e-3, rel=1e-4)


def test_relative_error_is_not_symmetric() -> None:
    # The reference sets the scale: swapping the arguments changes the denominator.
    small, large = torch.tensor([1.0]), torch.tensor([2.0])
    assert relative_error(small, large) == pytest.approx(0.5)
    assert relative_error(large, small) == pytest.approx(1.0)


def test_relative_error_accepts_mixed_dtypes_and_ignores_gradients() -> None:
    expected = torch.linspace(-3, 3, 101, requires_grad=True)
    actual = expected.detach().bfloat16()
    error = relative_error(actual, expected)
    assert 0.0 < error <= 2.0**-8  # bf16 rounds each value by at most u = 2**-8
    assert expected.dtype == torch.float32 and actual.dtype == torch.bfloat16


def test_relative_error_of_integers_and_complex_numbers() -> None:
    assert relative_error(torch.tensor([3, 4]), torch.tensor([3, 5])) == pytest.approx(
        1 / math.sqrt(34)
    )
    expected = torch.tensor([3 + 4j])
    assert relative_error(expected * 1j, expected) == pytest.approx(math.sqrt(2))


def test_non_finite_actual_gives_infinity() -> None:
    expected = torch.ones(3)
    assert relative_error(torch.tensor([1.0, math.nan, 1.0]), expected) == math.inf
    assert relative_error(torch.tensor([1.0, -math.inf, 1.0]), expected) == math.inf


def test_non_finite_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="expected holds NaN or infinite values"):
        relative_error(torch.ones(2), torch.tensor([1.0, math.inf]))


@pytest.mark.parametrize("reference", [torch.zeros(2, 3), torch.empty(0, 3)])
def test_zero_reference_is_refused_by_shape(reference: torch.Tensor) -> None:
    shape = re.escape(str(tuple(reference.shape)))
    with pytest.raises(ValueError, match=rf"expected has norm 0 .*shape {shape}"):
        relative_error(torch.ones_like(reference), reference)


def test_non_tensors_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"expected must be a torch\.Tensor, got list"):
        relative_error(torch.ones(2), [1.0, 1.0])  # type: ignore[arg-type]


# --- relative_error: properties --------------------------------------------------------------


@settings(max_examples=60)
@given(pair=pairs_of_tensors())
def test_relative_error_times_reference_norm_is_the_distance(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    actual, expected = pair
    error = relative_error(actual, expected)
    distance = math.dist(actual.flatten().tolist(), expected.flatten().tolist())
    assert error * float(expected.norm()) == pytest.approx(distance, rel=1e-9)
    assert error >= 0.0


@settings(max_examples=60)
@given(expected=tensors(), fraction=st.floats(min_value=-10.0, max_value=10.0))
def test_scaling_the_reference_by_one_plus_t_gives_abs_t(
    expected: torch.Tensor, fraction: float
) -> None:
    assert relative_error(expected * (1 + fraction), expected) == pytest.approx(
        abs(fraction), rel=1e-9, abs=1e-15
    )


@settings(max_examples=60)
@given(pair=pairs_of_tensors(), exponent=st.integers(min_value=-20, max_value=20))
def test_relative_error_is_scale_invariant(
    pair: tuple[torch.Tensor, torch.Tensor], exponent: int
) -> None:
    actual, expected = pair
    factor = 2.0**exponent  # a power of two scales exactly in floating point
    assert relative_error(actual * factor, expected * factor) == pytest.approx(
        relative_error(actual, expected), rel=1e-12
    )


@settings(max_examples=60)
@given(expected=tensors())
def test_rounding_is_bounded_by_the_unit_roundoff(expected: torch.Tensor) -> None:
    # Rounding to nearest moves every normal value by at most u |x|, so the ratio is <= u.
    assert relative_error(expected.float(), expected) <= 2.0**-24
    assert relative_error(expected.bfloat16(), expected) <= 2.0**-8


@settings(max_examples=40)
@given(first=shapes, second=shapes)
def test_shape_mismatch_names_both_shapes(first: tuple[int, ...], second: tuple[int, ...]) -> None:
    assume(first != second)
    with pytest.raises(ValueError, match="shape mismatch") as caught:
        relative_error(torch.ones(first), torch.ones(second))
    assert f"actual has shape {first}" in str(caught.value)
    assert f"expected has shape {second}" in str(caught.value)


# --- the bf16-passes model of TorchTPU's float32 matmuls ------------------------------------


def test_one_pass_equals_rounding_inputs_to_bf16() -> None:
    torch.manual_seed(0)
    left, right = torch.randn(8, 16), torch.randn(16, 4)
    expected = left.bfloat16().float() @ right.bfloat16().float()
    with emulate_bf16_matmul_passes():  # the default is TorchTPU's: one pass
        modelled = left @ right
    assert torch.equal(modelled, expected)
    assert not torch.equal(left @ right, expected)


@pytest.mark.parametrize("passes", sorted(MATMUL_PASSES))
def test_passes_sum_the_products_of_bf16_pieces(passes: int) -> None:
    torch.manual_seed(0)
    left, right = torch.randn(8, 16), torch.randn(16, 4)
    left_pieces, right_pieces = [], []
    for tensor, pieces in ((left, left_pieces), (right, right_pieces)):
        for _ in range(3):
            pieces.append(tensor.bfloat16().float())
            tensor = tensor - pieces[-1]
    expected = sum(left_pieces[i] @ right_pieces[j] for i, j in MATMUL_PASSES[passes])
    with emulate_bf16_matmul_passes(passes):
        modelled = torch.matmul(left, right)
    assert torch.equal(modelled, expected)


def test_more_passes_get_closer_to_float64() -> None:
    torch.manual_seed(0)
    left, right = torch.randn(64, 64), torch.randn(64, 64)
    exact = left.double() @ right.double()
    errors = []
    for passes in sorted(MATMUL_PASSES):
        with emulate_bf16_matmul_passes(passes):
            errors.append(relative_error(left @ right, exact))
    assert errors[0] > 100 * errors[1] > 0
    assert errors[1] > 10 * errors[2]
    assert errors[0] <= 2.0**-8  # one pass: about one bf16 rounding of the inputs
    assert errors[2] < 4 * relative_error(left @ right, exact)  # six: float32's own error


def test_passes_must_be_one_three_or_six() -> None:
    expected_message = r"passes must be one of \[1, 3, 6\], got 4"
    with pytest.raises(ValueError, match=expected_message), emulate_bf16_matmul_passes(4):
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


@given(st.integers(min_value=-30, max_value=30), st.floats(min_value=-0.39, max_value=0.39))
def test_power_of_ten_is_the_nearest_power_away_from_the_midpoints(exponent, offset):
    assert power_of_ten(10.0 ** (exponent + offset)) == exponent


@given(st.integers(min_value=-30, max_value=30), st.floats(min_value=-0.09, max_value=0.09))
def test_power_of_ten_refuses_values_near_a_midpoint(exponent, offset):
    with pytest.raises(ValueError, match="midpoint"):
        power_of_ten(10.0 ** (exponent + 0.5 + offset))


def test_power_of_ten_quotes_both_cpus_ratios_alike():
    # Chapter 1's ratio, as two CPUs measured it.
    assert power_of_ten(11_396.0) == power_of_ten(8_200.0) == 4


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_power_of_ten_refuses_values_without_a_logarithm(bad):
    with pytest.raises(ValueError, match="positive and finite"):
        power_of_ten(bad)


def test_power_of_ten_refuses_non_numbers():
    with pytest.raises(TypeError, match="number"):
        power_of_ten("1e4")


def _one_pass(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    return left.bfloat16().float() @ right.bfloat16().float()


@pytest.mark.parametrize("batch", [(), (3,)])
def test_the_backward_pass_runs_in_bf16_passes_too(batch: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    left = torch.randn(*batch, 16, 32, requires_grad=True)
    right = torch.randn(32, 8, requires_grad=True)  # broadcast over the batch
    grad = torch.randn(*batch, 16, 8)
    with emulate_bf16_matmul_passes(1):
        product = left @ right
    product.backward(grad)
    # TorchTPU's backward: gradient times each operand, each a one-pass matmul.
    expected_left = _one_pass(grad, right.detach().t())
    expected_right = _one_pass(left.detach().transpose(-1, -2), grad).sum_to_size(right.shape)
    assert torch.equal(left.grad, expected_left)
    assert torch.equal(right.grad, expected_right)
    # ... which is not the float32 gradient a plain backward would give.
    assert not torch.equal(
        right.grad, (left.detach().transpose(-1, -2) @ grad).sum_to_size(right.shape)
    )


def test_a_linear_layer_trains_under_the_emulation_with_one_pass_gradients() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 8)
    inputs, grad = torch.randn(16, 32), torch.randn(16, 8)
    with emulate_bf16_matmul_passes(1):
        output = layer(inputs)
    output.backward(grad)
    assert torch.equal(layer.weight.grad, _one_pass(grad.t(), inputs))
    assert torch.equal(layer.bias.grad, grad.sum(0))


# --- the unit roundoff of a float32 matmul ------------------------------------------------


def test_unit_roundoff_per_pass_count() -> None:
    assert matmul_unit_roundoff(None) == FLOAT32_UNIT_ROUNDOFF == 2.0**-24
    assert matmul_unit_roundoff(1) == BFLOAT16_UNIT_ROUNDOFF == 2.0**-8
    assert matmul_unit_roundoff(3) == 2.0**-16  # two bf16 pieces
    assert matmul_unit_roundoff(6) == FLOAT32_UNIT_ROUNDOFF  # three pieces, capped at float32


@pytest.mark.parametrize("passes", [0, 2, 4, True, "1", 1.0])
def test_unit_roundoff_refuses_other_pass_counts(passes: object) -> None:
    with pytest.raises(ValueError, match="passes must be one of"):
        matmul_unit_roundoff(passes)


@given(st.sampled_from(sorted(MATMUL_PASSES)), st.sampled_from(sorted(MATMUL_PASSES)))
def test_more_passes_never_round_coarser(fewer: int, more: int) -> None:
    assume(fewer <= more)
    assert FLOAT32_UNIT_ROUNDOFF <= matmul_unit_roundoff(more) <= matmul_unit_roundoff(fewer)


@pytest.fixture
def restored_matmul_precision():
    """Put both precision APIs back as they were after the test."""
    legacy = torch.get_float32_matmul_precision()
    settings_before = {
        "cuda": torch.backends.cuda.matmul.fp32_precision,
        "cpu": torch.backends.mkldnn.matmul.fp32_precision,
    }
    yield
    torch.set_float32_matmul_precision(legacy)
    torch.backends.cuda.matmul.fp32_precision = settings_before["cuda"]
    torch.backends.mkldnn.matmul.fp32_precision = settings_before["cpu"]


def test_device_unit_roundoff_follows_either_precision_api(restored_matmul_precision) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert device_matmul_unit_roundoff(cpu) == FLOAT32_UNIT_ROUNDOFF  # the default
    torch.set_float32_matmul_precision("high")  # the old API writes both backends
    assert device_matmul_unit_roundoff(cpu) == TF32_UNIT_ROUNDOFF
    assert device_matmul_unit_roundoff(cuda) == TF32_UNIT_ROUNDOFF
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # now the APIs disagree
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()
    assert device_matmul_unit_roundoff(cpu) == BFLOAT16_UNIT_ROUNDOFF
    assert device_matmul_unit_roundoff(cuda) == TF32_UNIT_ROUNDOFF
    torch.backends.cuda.matmul.fp32_precision = "none"  # unset, old getter raises: float32
    assert device_matmul_unit_roundoff(cuda) == FLOAT32_UNIT_ROUNDOFF


def test_device_unit_roundoff_on_a_tpu_is_one_pass() -> None:
    # A fresh process: naming the PrivateUse1 backend "tpu" cannot be undone.
    script = (
        "import torch\n"
        "from tpuready.inspection.check import device_matmul_unit_roundoff\n"
        "torch.utils.rename_privateuse1_backend('tpu')\n"
        "torch.set_float32_matmul_precision('highest')\n"
        "print(device_matmul_unit_roundoff(torch.device('tpu')))\n"
    )
    printed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert float(printed) == BFLOAT16_UNIT_ROUNDOFF


def test_device_unit_roundoff_refuses_a_string() -> None:
    with pytest.raises(TypeError, match=r"device must be a torch\.device"):
        device_matmul_unit_roundoff("cpu")
