"""tpuready.calc.comm_bound: the tokens per chip above which FSDP is compute-bound (chapter 28),
the Scaling Book's `B / X > C / W_ici`, with the book's own chip figures."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc import ici
from tpuready.calc.comm_bound import (
    SCALING_BOOK_V5P_TOKENS,
    CommBoundError,
    fsdp_compute_bound_tokens_per_chip,
    fsdp_is_compute_bound,
)
from tpuready.calc.hardware import CHIPS, UnknownChipError, get_chip

# The chips with a per-link ICI figure: the ones the threshold is defined for.
TORUS_CHIPS = [chip for chip in CHIPS if chip.ici_link_bytes_per_second is not None]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("v5e", 1970.0), ("v6e", 4590.0), ("v5p", 2295.0), ("v7", 11535.0)],
)
def test_the_threshold_of_each_tpu(name: str, expected: float):
    # peak bf16 FLOP/s over one link, both directions: 197e12 / 100e9, 918e12 / 200e9, ...
    assert fsdp_compute_bound_tokens_per_chip(name) == pytest.approx(expected, rel=1e-12)


def test_the_scaling_books_own_figures_give_its_2550():
    """With the Scaling Book's v5p inputs (C = 4.59e14, W_ici = 2 * 9e10 per link) the function
    gives its quoted 2550 (`4.59e14 / 1.8e11` is 2550 exactly)."""
    v5p = get_chip("v5p")
    as_the_scaling_book = dataclasses.replace(
        v5p,
        peak_bf16_flops_per_second=4.59e14,
        interconnect_bytes_per_second=v5p.ici_ports_per_chip * 1.8e11,
    )
    assert fsdp_compute_bound_tokens_per_chip(as_the_scaling_book) == pytest.approx(
        SCALING_BOOK_V5P_TOKENS, rel=1e-12
    )
    # "less than 2550 / M_X": all three axes of a v5p pod, 850 tokens per chip.
    assert fsdp_compute_bound_tokens_per_chip(as_the_scaling_book, axes=3) == pytest.approx(850)


def test_the_books_v5p_threshold_is_the_scaling_books_times_180_over_200():
    """The book's v5p value is 10 % under 2550, and only because of the link figure: the vendor's
    1.2 TB/s over 6 links is 200 GB/s a link, the Scaling Book's is 180 GB/s; both take a peak
    of 459 TFLOP/s. So the ratio is 180 / 200 to rounding, not a loose tolerance."""
    value = fsdp_compute_bound_tokens_per_chip("v5p")
    assert value / SCALING_BOOK_V5P_TOKENS == pytest.approx(180e9 / 200e9, rel=1e-12)


@pytest.mark.parametrize("chip", TORUS_CHIPS, ids=lambda chip: chip.name)
def test_the_threshold_is_peak_over_link_bandwidth_per_axis(chip):
    for axes in range(1, chip.torus_dimensions + 1):
        expected = chip.peak_bf16_flops_per_second / (axes * chip.ici_link_bytes_per_second)
        assert fsdp_compute_bound_tokens_per_chip(chip, axes=axes) == pytest.approx(expected)
        assert fsdp_compute_bound_tokens_per_chip(
            chip, axes=axes, wraparound=False
        ) == pytest.approx(2 * expected)


@given(
    chip=st.sampled_from(TORUS_CHIPS),
    peak_scale=st.floats(0.01, 100),
    bandwidth_scale=st.floats(0.01, 100),
)
def test_the_threshold_scales_with_peak_over_bandwidth(chip, peak_scale, bandwidth_scale):
    scaled = dataclasses.replace(
        chip,
        peak_bf16_flops_per_second=chip.peak_bf16_flops_per_second * peak_scale,
        interconnect_bytes_per_second=chip.interconnect_bytes_per_second * bandwidth_scale,
    )
    assert fsdp_compute_bound_tokens_per_chip(scaled) == pytest.approx(
        fsdp_compute_bound_tokens_per_chip(chip) * peak_scale / bandwidth_scale, rel=1e-9
    )


@given(chip=st.sampled_from(TORUS_CHIPS), data=st.data())
def test_more_axes_divide_the_threshold(chip, data):
    axes = data.draw(st.integers(1, chip.torus_dimensions))
    one_axis = fsdp_compute_bound_tokens_per_chip(chip)
    assert fsdp_compute_bound_tokens_per_chip(chip, axes=axes) == pytest.approx(one_axis / axes)


@given(
    chip=st.sampled_from(TORUS_CHIPS),
    tokens=st.lists(st.floats(1e-3, 1e7), min_size=2, max_size=2, unique=True),
)
def test_more_tokens_never_make_fsdp_comm_bound(chip, tokens):
    fewer, more = sorted(tokens)
    if fsdp_is_compute_bound(fewer, chip):
        assert fsdp_is_compute_bound(more, chip)
    threshold = fsdp_compute_bound_tokens_per_chip(chip)
    assert fsdp_is_compute_bound(more, chip) == (more > threshold)


def test_at_the_threshold_compute_and_communication_tie():
    threshold = fsdp_compute_bound_tokens_per_chip("v6e")
    assert not fsdp_is_compute_bound(threshold, "v6e")
    assert fsdp_is_compute_bound(math.nextafter(threshold, math.inf), "v6e")
    assert not fsdp_is_compute_bound(5000, "v6e", axes=1, wraparound=False)
    assert fsdp_is_compute_bound(5000, "v6e", axes=2)


@pytest.mark.parametrize("wraps", [True, False])
@pytest.mark.parametrize("name", ["v5e", "v6e", "v5p", "v7"])
@pytest.mark.parametrize("chips_on_axis", [4, 16])
def test_the_threshold_is_where_ici_prices_the_gather_like_the_matmuls(name, chips_on_axis, wraps):
    """The rule agrees with `tpuready.calc.ici`'s ring model: per layer with `P` bf16 weights,
    the forward matmuls take `2 * tokens * P / C` and the all-gather of `2 * P` bytes takes
    `(N - 1) / N * 2 * P / W` on a ring of N chips (twice that on a line). The two tie at the
    threshold times (N - 1) / N (the Scaling Book drops that factor, N being large)."""
    chip = get_chip(name)
    params = 1e9
    layout = ici.AxisLayout((ici.TorusPiece(chips_on_axis, wraps),), chip.ici_link_bytes_per_second)
    gather_seconds = ici.collective_seconds("all-gather", 2 * params, layout)
    tokens = fsdp_compute_bound_tokens_per_chip(chip, wraparound=wraps) * (
        (chips_on_axis - 1) / chips_on_axis
    )
    matmul_seconds = 2 * tokens * params / chip.peak_bf16_flops_per_second
    assert matmul_seconds == pytest.approx(gather_seconds, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: fsdp_compute_bound_tokens_per_chip("v99"), UnknownChipError, "unknown chip"),
        (
            lambda: fsdp_compute_bound_tokens_per_chip("v4"),
            CommBoundError,
            "chip 'TPU v4' has no per-link ICI bandwidth",
        ),
        (
            lambda: fsdp_compute_bound_tokens_per_chip("h100"),
            CommBoundError,
            "chip 'H100 SXM' has no per-link ICI bandwidth",
        ),
        (
            lambda: fsdp_compute_bound_tokens_per_chip("v6e", axes=3),
            CommBoundError,
            "axes must be at most 2, got 3: a TPU v6e slice is a 2D torus",
        ),
        (
            lambda: fsdp_compute_bound_tokens_per_chip("v5p", axes=0),
            CommBoundError,
            "axes must be at least 1, got 0",
        ),
        (
            lambda: fsdp_compute_bound_tokens_per_chip("v5p", wraparound=1),
            CommBoundError,
            "wraparound must be True (rings) or False (lines), got 1",
        ),
        (
            lambda: fsdp_is_compute_bound(-5, "v5e"),
            CommBoundError,
            "tokens_per_chip must be a finite number above zero, got -5",
        ),
        (
            lambda: fsdp_is_compute_bound("4096", "v5e"),
            CommBoundError,
            "tokens_per_chip must be a number, got '4096'",
        ),
    ],
)
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)
