"""`tpuready.calc.roofline`: intensities worked by hand, roofline properties, MFU, bad input.

The hand-worked cases write each count out in full, so a wrong formula cannot pass by agreeing
with itself. The last tests check the module against chapter 14's plan: the book's assumed run
(the announcement's 28 % MFU, taken at the bf16 peak on all of its 8,192 TPU v7x chips) gives
the same tokens per second through both modules, which fails if the plan's MFU counted other
FLOPs or another peak than `tokens_per_second` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from conftest import QWEN3_235B
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc.hardware import all_chips, get_chip
from tpuready.calc.plan import make_plan
from tpuready.calc.roofline import (
    Roofline,
    RooflineError,
    attainable_flops_per_second,
    attention_bytes,
    attention_flops,
    attention_intensity,
    bound,
    elementwise_intensity,
    matmul_bytes,
    matmul_flops,
    matmul_intensity,
    mfu,
    ridge_point_flops_per_byte,
    tokens_per_second,
)

positive_rates = st.floats(min_value=1e3, max_value=1e19, allow_nan=False, allow_infinity=False)
intensities = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
sizes = st.integers(min_value=1, max_value=10**5)


# ---------------------------------------------------------------------------------------------
# Hand-worked cases


def test_square_bf16_matmul_by_hand() -> None:
    # 4096^3 in bf16: 2 * 4096^3 FLOPs = 137,438,953,472; three 4096 x 4096 matrices of 2 bytes
    # = 3 * 16,777,216 * 2 = 100,663,296 bytes; 137,438,953,472 / 100,663,296 = 4096 / 3.
    assert matmul_flops(4096, 4096, 4096) == 137_438_953_472
    assert matmul_bytes(4096, 4096, 4096, 2) == 100_663_296
    assert matmul_intensity(4096, 4096, 4096, 2) == pytest.approx(1365.3333333333333, rel=1e-15)


def test_matrix_vector_product_is_about_one_flop_per_byte_in_bf16() -> None:
    # (1 x 1000) @ (1000 x 1000): 2,000,000 FLOPs over (1000 + 1,000,000 + 1000) * 2 bytes.
    assert matmul_intensity(1, 1000, 1000, 2) == pytest.approx(2_000_000 / 2_004_000)


def test_rectangular_float32_matmul_by_hand() -> None:
    # (2 x 3) @ (3 x 5) in float32: 60 FLOPs; (6 + 15 + 10) * 4 = 124 bytes.
    assert matmul_flops(2, 3, 5) == 60
    assert matmul_bytes(2, 3, 5, 4) == 124
    assert matmul_intensity(2, 3, 5, 4) == pytest.approx(60 / 124)


def test_flash_attention_by_hand() -> None:
    # batch 2, 3 heads, 8 tokens, head dim 4: 4 * 2*3 * 64 * 4 = 6144 FLOPs; Q, K, V, O are
    # 4 * 2*3*8*4 = 768 elements, 1536 bytes in bf16 -> 4 = seq_len / 2 bytes.
    assert attention_flops(2, 3, 8, 4) == 6144
    assert attention_bytes(2, 3, 8, 4, 2) == 1536
    assert attention_intensity(2, 3, 8, 4, 2) == pytest.approx(4.0)


def test_naive_attention_by_hand() -> None:
    # The same plus scores and probabilities written and read: 4 * 2*3 * 8*8 = 1536 elements
    # more, 2304 elements = 4608 bytes; 6144 / 4608 = 4/3 = S d / ((S + d) * 2) = 32 / 24.
    assert attention_bytes(2, 3, 8, 4, 2, variant="naive") == 4608
    assert attention_intensity(2, 3, 8, 4, 2, variant="naive") == pytest.approx(4 / 3)


def test_naive_attention_tends_to_head_dim_over_bytes_for_long_sequences() -> None:
    long = attention_intensity(1, 1, 10**6, 128, 2, variant="naive")
    assert 63 < long < 64  # 128 / 2 from below
    assert attention_intensity(1, 1, 10**6, 128, 2) == pytest.approx(500_000)


def test_elementwise_by_hand() -> None:
    # bf16 add: 1 FLOP per element, read 2 tensors and write 1: 1 / 6 FLOPs per byte.
    assert elementwise_intensity(1, 2, num_inputs=2, num_outputs=1) == pytest.approx(1 / 6)
    # float32 in-place scale: 1 FLOP, read 1, write 1: 1 / 8.
    assert elementwise_intensity(1, 4) == pytest.approx(0.125)


def test_roofline_by_hand() -> None:
    # Peak 100, bandwidth 10: ridge at 10. Intensity 2 -> 20 (memory); 50 -> 100 (compute).
    assert ridge_point_flops_per_byte(100.0, 10.0) == 10.0
    assert attainable_flops_per_second(2.0, 100.0, 10.0) == 20.0
    assert attainable_flops_per_second(50.0, 100.0, 10.0) == 100.0
    assert bound(2.0, 100.0, 10.0) == "memory"
    assert bound(10.0, 100.0, 10.0) == "compute"
    assert bound(50.0, 100.0, 10.0) == "compute"


def test_roofline_from_a_chip_uses_its_hardware_figures() -> None:
    v6e = get_chip("v6e")
    line = Roofline.from_chip("v6e")
    assert line == Roofline.from_chip(v6e)
    assert line.peak_flops_per_second == 918e12
    assert line.bytes_per_second == 1638e9
    assert line.ridge_point_flops_per_byte == pytest.approx(918e12 / 1638e9)
    assert line.ridge_point_flops_per_byte == pytest.approx(v6e.ridge_point_flops_per_byte)
    # The 4096 cube (1365 FLOPs per byte) is compute-bound on v6e, a 128-token matmul is not.
    assert line.bound(matmul_intensity(4096, 4096, 4096, 2)) == "compute"
    assert line.bound(matmul_intensity(128, 4096, 4096, 2)) == "memory"


def test_every_chip_in_the_table_gives_a_roofline() -> None:
    for chip in all_chips():
        line = Roofline.from_chip(chip)
        assert line.name == chip.name
        assert line.attainable_flops_per_second(1e9) == chip.peak_bf16_flops_per_second


def test_roofline_seconds_is_the_longer_of_compute_and_memory() -> None:
    line = Roofline("toy", peak_flops_per_second=100.0, bytes_per_second=10.0)
    assert line.seconds(flops=1000.0, bytes_moved=50.0) == 10.0  # compute: 10 s, memory 5 s
    assert line.seconds(flops=100.0, bytes_moved=50.0) == 5.0  # compute: 1 s, memory 5 s


def test_mfu_by_hand() -> None:
    # 6e12 FLOPs in 0.5 s on a 24e12 FLOP/s peak: 6e12 / 12e12 = 0.5.
    assert mfu(6e12, 0.5, 24e12) == pytest.approx(0.5)


def test_mfu_of_exactly_the_peak_is_one() -> None:
    # 1e12 FLOPs in 1 s on a 1e12 FLOP/s peak: every cycle did model work.
    assert mfu(1e12, 1.0, 1e12) == 1.0


def test_mfu_above_one_is_refused_with_its_inputs_and_the_likely_cause() -> None:
    # Chapter 21's mistake on an accelerator: a CPU's measured peak (about 1e11 FLOP/s)
    # against the step time of a GPU that did 6e12 FLOPs in 0.02 s (3e14 FLOP/s).
    with pytest.raises(RooflineError) as error:
        mfu(6e12, 0.02, 1e11)
    message = str(error.value)
    for named in ("model_flops=6000000000000.0", "seconds=0.02", "peak_flops_per_second="):
        assert named in message
    assert "MFU of 3e+03 is above 1" in message
    assert "the peak of another device" in message
    assert "more chips than the peak counts" in message


def test_a_per_chip_peak_for_a_many_chip_step_is_refused() -> None:
    # 64 chips of 197e12 FLOP/s did 6e15 FLOPs in 1 s: 6e15 / 1.2608e16 = 47.6 % of all of
    # them, but 30 times the peak of one.
    v5e_peak = get_chip("v5e").peak_bf16_flops_per_second
    assert mfu(6e15, 1.0, 64 * v5e_peak) == pytest.approx(0.4759, abs=1e-4)
    with pytest.raises(RooflineError, match=r"MFU of 30\.5 is above 1"):
        mfu(6e15, 1.0, v5e_peak)


def test_tokens_per_second_by_hand() -> None:
    # 40 % of 2 chips of 1e15 = 8e14 FLOP/s over 4e9 FLOPs a token: 200,000 tokens a second.
    assert tokens_per_second(0.4, 2, 1e15, 4e9) == pytest.approx(200_000)


# ---------------------------------------------------------------------------------------------
# Properties


@given(intensity=intensities, peak=positive_rates, bandwidth=positive_rates)
def test_attainable_never_exceeds_peak_or_the_memory_slope(
    intensity: float, peak: float, bandwidth: float
) -> None:
    attainable = attainable_flops_per_second(intensity, peak, bandwidth)
    assert attainable <= peak
    assert attainable <= intensity * bandwidth
    assert attainable in (peak, intensity * bandwidth)


@given(low=intensities, high=intensities, peak=positive_rates, bandwidth=positive_rates)
def test_attainable_is_monotone_in_intensity(
    low: float, high: float, peak: float, bandwidth: float
) -> None:
    low, high = sorted((low, high))
    assert attainable_flops_per_second(low, peak, bandwidth) <= attainable_flops_per_second(
        high, peak, bandwidth
    )


@given(peak=positive_rates, bandwidth=positive_rates)
def test_both_limits_meet_at_the_ridge_point(peak: float, bandwidth: float) -> None:
    ridge = ridge_point_flops_per_byte(peak, bandwidth)
    assert ridge * bandwidth == pytest.approx(peak, rel=1e-12)
    assert attainable_flops_per_second(ridge, peak, bandwidth) == pytest.approx(peak, rel=1e-12)
    assert bound(ridge * 1.01, peak, bandwidth) == "compute"
    assert bound(ridge * 0.99, peak, bandwidth) == "memory"
    # Below the ridge, the memory slope is the limit: half the intensity, half the FLOP/s.
    half = attainable_flops_per_second(ridge / 2, peak, bandwidth)
    assert half == pytest.approx(peak / 2, rel=1e-12)


@given(m=sizes, k=sizes, n=sizes)
def test_matmul_intensity_grows_with_each_dimension(m: int, k: int, n: int) -> None:
    base = matmul_intensity(m, k, n, 2)
    assert matmul_intensity(m + 1, k, n, 2) > base
    assert matmul_intensity(m, k + 1, n, 2) > base
    assert matmul_intensity(m, k, n + 1, 2) > base
    # 2 m k n / (2 (m k + k n + m n)) = 1 / (1/m + 1/k + 1/n): below the smallest side.
    assert base == pytest.approx(1 / (1 / m + 1 / k + 1 / n), rel=1e-12)
    assert base < min(m, k, n)


@given(seq_len=st.integers(1, 10**5), head_dim=st.integers(1, 1024))
def test_flash_attention_never_moves_more_than_naive(seq_len: int, head_dim: int) -> None:
    flash = attention_intensity(1, 1, seq_len, head_dim, 2)
    naive = attention_intensity(1, 1, seq_len, head_dim, 2, variant="naive")
    assert flash == pytest.approx(seq_len / 2)
    assert naive < flash


@given(flops=positive_rates, seconds=st.floats(1e-6, 1e6), peak=positive_rates)
def test_mfu_is_at_most_one_whenever_it_returns(flops: float, seconds: float, peak: float) -> None:
    try:
        utilisation = mfu(flops, seconds, peak)
    except RooflineError as error:
        assert flops / seconds > peak * (1 - 1e-12), error  # refused only above the peak
        assert "above 1" in str(error)
    else:
        assert 0 < utilisation <= 1
        assert utilisation == pytest.approx(flops / (seconds * peak), rel=1e-12)


@given(mfu_value=st.floats(0.01, 1.0), chips=st.integers(1, 10**5))
def test_tokens_per_second_scales_linearly(mfu_value: float, chips: int) -> None:
    one = tokens_per_second(mfu_value, 1, 1e15, 1e9)
    assert tokens_per_second(mfu_value, chips, 1e15, 1e9) == pytest.approx(chips * one)


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: matmul_intensity(0, 4, 4, 2), "m must be at least 1, got 0"),
        (lambda: matmul_intensity(4, 4.5, 4, 2), "k must be a whole number"),
        (lambda: matmul_intensity(4, 4, True, 2), "n must be a whole number"),
        (lambda: matmul_intensity(4, 4, 4, 0), "bytes_per_element must be a finite number"),
        (lambda: attention_intensity(1, 0, 8, 4, 2), "heads must be at least 1, got 0"),
        (lambda: attention_intensity(1, 1, 8, 4, 2, "sparse"), "'sparse'"),
        (lambda: elementwise_intensity(-1, 2), "flops_per_element must be a finite number"),
        (lambda: elementwise_intensity(1, 2, num_inputs=0), "num_inputs must be at least 1"),
        (lambda: attainable_flops_per_second(0, 1e12, 1e9), "intensity must be a finite"),
        (lambda: attainable_flops_per_second(1, math.inf, 1e9), "got inf"),
        (lambda: bound(1, 1e12, math.nan), "bytes_per_second must be a finite"),
        (lambda: bound("1", 1e12, 1e9), "intensity must be a number, got '1'"),
        (lambda: mfu(1e12, 0, 1e12), "seconds must be a finite number above zero, got 0"),
        (lambda: tokens_per_second(28, 8192, 1e15, 1e11), "write 28 % as 0.28"),
        (lambda: tokens_per_second(0.28, 0, 1e15, 1e11), "num_chips must be at least 1"),
        (lambda: Roofline("", 1e12, 1e9), "name must be a non-empty string"),
        (lambda: Roofline("cpu", -1.0, 1e9), "peak_flops_per_second must be a finite"),
        (
            lambda: Roofline.from_chip(42),
            "chip must be a tpuready.calc.hardware.Chip or a chip name",
        ),
    ],
)
def test_bad_input_names_the_value(call: Callable[[], object], message: str) -> None:
    with pytest.raises(RooflineError) as error:
        call()
    assert message in str(error.value)


def test_unknown_chip_name_is_refused_by_the_hardware_table() -> None:
    with pytest.raises(ValueError, match="unknown chip 'v9'"):
        Roofline.from_chip("v9")


# ---------------------------------------------------------------------------------------------
# The announcement, through this module and through chapter 14's plan

ANNOUNCED_CHIPS, ANNOUNCED_MFU = 8192, 0.28
GLOBAL_BATCH, SEQ_LEN = 8192, 4096  # chapter 14's workload


@pytest.mark.parametrize(
    "mesh", [{"fsdp": 256, "expert": 32}, {"data": 2, "fsdp": 64, "expert": 16, "tensor": 4}]
)
def test_announced_mfu_gives_chapter_14s_tokens_per_second(mesh: dict[str, int]) -> None:
    v7 = get_chip("v7")
    plan = make_plan(
        QWEN3_235B,
        mesh,
        v7,
        num_chips=ANNOUNCED_CHIPS,
        global_batch=GLOBAL_BATCH,
        seq_len=SEQ_LEN,
    )
    # A plan's throughput scales with its MFU, so rescaling it to 28 % gives the run's figure.
    from_plan = plan.tokens_per_second * ANNOUNCED_MFU / plan.mfu
    from_roofline = tokens_per_second(
        ANNOUNCED_MFU,
        ANNOUNCED_CHIPS,
        v7.peak_bf16_flops_per_second,
        QWEN3_235B.flops_per_token(SEQ_LEN),
    )
    assert math.isclose(from_roofline, from_plan, rel_tol=1e-12)
    assert 31e6 < from_roofline < 32e6  # chapter 14 prints 31,638,502


def test_mfu_of_a_planned_step_matches_the_plan() -> None:
    plan = make_plan(
        QWEN3_235B,
        {"fsdp": 256, "expert": 32},
        "v7",
        num_chips=ANNOUNCED_CHIPS,
        global_batch=GLOBAL_BATCH,
        seq_len=SEQ_LEN,
    )
    total_peak = ANNOUNCED_CHIPS * plan.chip.peak_bf16_flops_per_second
    ours = mfu(plan.model_flops_per_step, plan.step_seconds, total_peak)
    assert math.isclose(ours, plan.mfu, rel_tol=1e-12)


@given(
    k=st.integers(min_value=64, max_value=20_000),
    n=st.integers(min_value=64, max_value=20_000),
    chip=st.sampled_from(["v4", "v5e", "v5p", "v6e", "v7", "h100"]),
)
def test_min_tokens_for_compute_bound_is_the_first_m_at_the_ridge(k: int, n: int, chip: str):
    line = Roofline.from_chip(chip)
    ridge = line.ridge_point_flops_per_byte
    try:
        fewest = line.min_tokens_for_compute_bound(k, n)
    except RooflineError as error:
        # Only a weight too small to reach the ridge even with infinitely many tokens.
        assert 2 * k * n / (2 * (k + n)) <= ridge, error
        return
    assert matmul_intensity(fewest, k, n, 2) >= ridge * (1 - 1e-12)
    if fewest > 1:
        assert matmul_intensity(fewest - 1, k, n, 2) < ridge


def test_min_tokens_for_a_large_weight_is_about_the_ridge_point():
    for chip in ("v5e", "v6e", "v7"):
        line = Roofline.from_chip(chip)
        fewest = line.min_tokens_for_compute_bound(2**20, 2**20)
        # m = R k n / (k n - R (k + n)) = R (1 + 2 R / k + ...) for k = n: just above R.
        assert line.ridge_point_flops_per_byte <= fewest <= line.ridge_point_flops_per_byte * 1.01
    with pytest.raises(RooflineError, match="never reaches"):
        Roofline.from_chip("v6e").min_tokens_for_compute_bound(256, 256)


def test_min_tokens_is_exact_where_the_root_is_a_whole_number() -> None:
    """On v6e a 1125 x 1125 weight reaches the ridge at exactly 153,000 rows: a float solve
    rounded that up to 153,001 (found by the property test above)."""
    line = Roofline.from_chip("v6e")
    assert line.min_tokens_for_compute_bound(1125, 1125) == 153_000
    assert matmul_intensity(153_000, 1125, 1125, 2) == line.ridge_point_flops_per_byte
