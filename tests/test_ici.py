"""The collective time model: worked examples by hand, properties, layouts and bad input."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from conftest import unpadded
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc.hardware import all_chips, get_chip
from tpuready.calc.ici import (
    COLLECTIVES,
    REDISTRIBUTIONS,
    AxisLayout,
    IciModelError,
    TorusPiece,
    bytes_received,
    collective_seconds,
    default_slice_shape,
    layout_mesh,
)
from tpuready.pages.ici import redistribution_markdown, ring_times_markdown

GIB = 2**30
W = 1e11  # a round per-link bandwidth for the hand calculations


def ring(*sizes: int, wraps: bool = True, link: float = W) -> AxisLayout:
    return AxisLayout(tuple(TorusPiece(size, wraps) for size in sizes), link)


def test_all_gather_on_one_ring_is_about_v_over_w_whatever_n():
    for n in (4, 16, 64):
        assert collective_seconds("all-gather", GIB, ring(n)) == pytest.approx(
            (n - 1) / n * GIB / W
        )


def test_a_line_takes_twice_a_ring():
    for kind in COLLECTIVES:
        line = collective_seconds(kind, GIB, ring(16, wraps=False))
        assert line == pytest.approx(2 * collective_seconds(kind, GIB, ring(16)))


def test_all_to_all_on_a_ring_is_a_quarter_of_v_over_w():
    assert collective_seconds("all-to-all", GIB, ring(16)) == pytest.approx(GIB / (4 * W))


def test_all_reduce_is_a_reduce_scatter_and_an_all_gather():
    layout = ring(4, 8)
    assert collective_seconds("all-reduce", GIB, layout) == pytest.approx(
        collective_seconds("reduce-scatter", GIB, layout)
        + collective_seconds("all-gather", GIB, layout)
    )


def test_two_rings_give_an_all_gather_twice_the_links():
    # 4 links into each chip instead of 2: half the time for the same (n - 1) / n V.
    assert collective_seconds("all-gather", GIB, ring(16, 16)) == pytest.approx(
        255 / 256 * GIB / (2 * W)
    )


def test_a_strided_ring_shares_its_links_with_the_other_groups():
    # A ring of 16 split 4 x 4: the outer axis's groups are chips 4 apart, each hop crosses 4
    # links and all 4 groups use every link, so each chip gets W / 4 in on each side. Every
    # chip must receive 3/4 V: (3/4) V / (2 * W / 2 / 4) = 3 V / W.
    layouts = layout_mesh("v7", {"outer": 4, "inner": 4, "rest": 16}, (4, 4, 16))
    assert layouts["rest"].describe() == "16 (ring)"
    link = get_chip("v7").ici_link_bytes_per_second
    outer = AxisLayout((TorusPiece(4, True, stride=4),), link)
    assert collective_seconds("all-gather", GIB, outer) == pytest.approx(3 * GIB / link)
    inner_ring = AxisLayout((TorusPiece(4, True),), link)
    assert collective_seconds("all-to-all", GIB, outer) == pytest.approx(
        4 * collective_seconds("all-to-all", GIB, inner_ring)
    )


def test_a_ring_and_a_line_give_three_links_in():
    layout = AxisLayout((TorusPiece(8, True), TorusPiece(4, False)), W)
    assert collective_seconds("all-gather", GIB, layout) == pytest.approx(
        31 / 32 * GIB / (3 * W / 2)
    )


def test_all_to_all_over_two_dimensions_is_set_by_the_busier():
    # 4 (line) x 32 (ring), N = 128: the line's middle link carries 2 V * 2 * 2 / (4 N W),
    # the ring's links V * 256 / (32 N W); the ring's is the larger.
    layout = AxisLayout((TorusPiece(4, False), TorusPiece(32, True)), W)
    line = 2 * GIB * 2 * 2 / (4 * 128 * W)
    ring32 = GIB * 256 / (32 * 128 * W)
    assert ring32 > line
    assert collective_seconds("all-to-all", GIB, layout) == pytest.approx(ring32)


def test_multi_slice_all_to_all_adds_the_dcn_share():
    # 2 slices of a ring of 16: each slice's all-to-all on its half of V, then every chip sends
    # half of its V / 32 to the other slice over its DCN share.
    layout = AxisLayout((TorusPiece(16, True),), W, slices=2, dcn_bytes_per_second=1e9)
    expected = (GIB / 2) / (4 * W) + 0.5 * GIB / 32 / 1e9
    assert collective_seconds("all-to-all", GIB, layout) == pytest.approx(expected)
    assert layout.describe() == "16 (ring) + 2 slices over DCN"
    assert AxisLayout((), W, slices=2, dcn_bytes_per_second=1e9).describe() == ("2 slices over DCN")


def test_chapter_8_example_one_gib_over_a_2x2_v5e_slice():
    # v5e: 400 GB/s per chip over 4 ports, 100 GB/s a link; a 2x2 slice has no wraparound,
    # so each chip receives 3/4 GiB through one link per dimension, 2 * 50 GB/s inwards.
    (layout,) = layout_mesh("v5e", {"x": 4}, (2, 2)).values()
    assert layout.describe() == "2 (line) x 2 (line)"
    assert collective_seconds("all-gather", GIB, layout) == pytest.approx(0.75 * GIB / 1e11)


def test_bytes_received_is_chapter_8s_table():
    assert bytes_received("all-gather", 512, 4) == 384
    assert bytes_received("reduce-scatter", 512, 4) == 384
    assert bytes_received("all-reduce", 512, 4) == 768
    assert bytes_received("all-to-all", 512, 4) == 96


pieces = st.lists(st.builds(TorusPiece, st.integers(1, 32), st.booleans()), min_size=1, max_size=3)
bandwidths = st.floats(1e9, 1e12)
sizes = st.floats(1.0, 1e12)


@given(pieces, bandwidths, sizes, st.sampled_from(COLLECTIVES), st.floats(1.01, 10))
def test_time_grows_when_bandwidth_falls(parts, link, total, kind, factor):
    fast = AxisLayout(tuple(parts), link)
    slow = dataclasses.replace(fast, link_bytes_per_second=link / factor)
    assert collective_seconds(kind, total, slow) >= collective_seconds(kind, total, fast)
    if fast.ici_size > 1:
        assert collective_seconds(kind, total, slow) > collective_seconds(kind, total, fast)


@given(pieces, bandwidths, sizes)
def test_all_to_all_never_costs_more_than_an_all_gather_of_the_same_bytes(parts, link, total):
    layout = AxisLayout(tuple(parts), link)
    all_to_all = collective_seconds("all-to-all", total, layout)
    assert all_to_all <= collective_seconds("all-gather", total, layout) * (1 + 1e-12)


@given(pieces, bandwidths, sizes, st.sampled_from(COLLECTIVES))
def test_wraparound_never_slows_a_collective(parts, link, total, kind):
    line = AxisLayout(tuple(TorusPiece(p.size, False) for p in parts), link)
    torus = AxisLayout(tuple(TorusPiece(p.size, True) for p in parts), link)
    assert collective_seconds(kind, total, torus) <= collective_seconds(kind, total, line)


@given(st.integers(1, 64), st.sampled_from(COLLECTIVES))
def test_time_is_linear_in_the_bytes(n, kind):
    layout = ring(n)
    assert collective_seconds(kind, 2 * GIB, layout) == pytest.approx(
        2 * collective_seconds(kind, GIB, layout)
    )


def test_a_mesh_lays_its_last_axis_on_the_last_dimension():
    layouts = layout_mesh("v7", {"fsdp": 64, "expert": 128}, (16, 16, 32))
    assert layouts["expert"].describe() == "4 (line) x 32 (ring)"
    assert layouts["fsdp"].describe() == "16 (ring) x 4 (ring, stride 4)"
    assert {name: layout.size for name, layout in layouts.items()} == {"fsdp": 64, "expert": 128}


def test_axis_shapes_spread_the_busiest_axis_over_a_cube():
    # expert on a 4x4x4 block, fsdp across the blocks: the expert all-to-all is bound by lines
    # of 4, not by the slice's side of 32; fsdp's rings hop 4 chips at a time.
    shapes = {"fsdp": (4, 4, 8), "expert": (4, 4, 4)}
    layouts = layout_mesh("v7", {"fsdp": 128, "expert": 64}, (16, 16, 32), axis_shapes=shapes)
    assert layouts["expert"].describe() == "4 (line) x 4 (line) x 4 (line)"
    assert layouts["fsdp"].describe() == (
        "4 (ring, stride 4) x 4 (ring, stride 4) x 8 (ring, stride 4)"
    )
    default = layout_mesh("v7", {"fsdp": 128, "expert": 64}, (16, 16, 32))
    assert default["expert"].describe() == "2 (line) x 32 (ring)"
    cube = collective_seconds("all-to-all", GIB, layouts["expert"])
    assert cube < collective_seconds("all-to-all", GIB, default["expert"]) / 2


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"fsdp": (4, 4, 8), "expert": (4, 4, 2)}, "product is the axis's 64 chips"),
        ({"fsdp": (8, 4, 4), "expert": (4, 4, 4)}, "32 chips along dimension 0"),
        ({"fsdp": (4, 4, 8), "expert": (4, 4, 4), "tensor": (1, 1, 1)}, "\\['tensor'\\]"),
    ],
)
def test_bad_axis_shapes_fail_naming_the_axis(shapes, match):
    with pytest.raises(IciModelError, match=match):
        layout_mesh("v7", {"fsdp": 128, "expert": 64}, (16, 16, 32), axis_shapes=shapes)


def test_size_one_axes_take_no_links():
    layouts = layout_mesh("v7", {"data": 1, "fsdp": 64}, (4, 4, 4))
    assert layouts["data"].pieces == () and layouts["data"].size == 1
    assert collective_seconds("all-reduce", GIB, layouts["data"]) == 0


def test_multi_slice_puts_the_first_axis_over_dcn():
    v5p = get_chip("v5p")
    layouts = layout_mesh(v5p, {"data": 2, "fsdp": 64}, (4, 4, 4), slices=2)
    assert layouts["data"].slices == 2 and layouts["data"].pieces == ()
    # Each chip's half of the gradient crosses once: (2 - 1) / 2 * V over the chip's DCN share.
    expected = 2 * 0.5 * GIB / v5p.dcn_bytes_per_second
    assert collective_seconds("all-reduce", GIB, layouts["data"]) == pytest.approx(expected)
    fsdp = collective_seconds("all-gather", GIB, layouts["fsdp"])
    # 6.25 GB/s of DCN per chip against 6 links of 100 GB/s inwards: about 49 times slower.
    assert collective_seconds("all-gather", GIB, layouts["data"]) > 40 * fsdp


def test_dcn_without_a_figure_fails_naming_it():
    with pytest.raises(IciModelError, match="dcn_bytes_per_second, got None"):
        layout_mesh("v7", {"data": 2, "fsdp": 64}, (4, 4, 4), slices=2)


@pytest.mark.parametrize(
    ("chip", "chips", "shape"),
    [
        ("v7", 8192, (16, 16, 32)),
        ("v5e", 256, (16, 16)),
        ("v5p", 4, (1, 2, 2)),
        ("v7", 16, (2, 2, 4)),
        ("v5p", 128, (4, 4, 8)),
    ],
)
def test_default_slice_shapes(chip, chips, shape):
    assert default_slice_shape(chip, chips) == shape


def test_of_equally_long_slices_the_one_whose_sides_wrap_wins():
    # 128 v5p chips: (4, 4, 8) and (2, 8, 8) both have 8 as their longest side, but a v5p
    # slice wraps only when it is whole 4x4x4 cubes, so (4, 4, 8) gets three rings.
    assert get_chip("v5p").slice_wraps((4, 4, 8)) == (True, True, True)
    assert get_chip("v5p").slice_wraps((2, 8, 8)) == (False, False, False)
    assert default_slice_shape("v5p", 128) == (4, 4, 8)


@given(st.sampled_from(["v5e", "v6e", "v5p", "v7"]), st.integers(1, 256))
def test_default_slice_shape_holds_every_chip(chip, chips):
    shape = default_slice_shape(chip, chips)
    assert math.prod(shape) == chips and list(shape) == sorted(shape)
    assert len(shape) == get_chip(chip).torus_dimensions


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: collective_seconds("broadcast", 1, ring(4)),
            "kind must be one of .*, got 'broadcast'",
        ),
        (lambda: collective_seconds("all-gather", -1, ring(4)), "got -1"),
        (lambda: collective_seconds("all-gather", "8", ring(4)), "got '8'"),
        (lambda: bytes_received("all-gather", 8, 0), "group_size .* got 0"),
        (lambda: layout_mesh("v7", {"x": 63}, (4, 4, 4)), "has 63 chips"),
        (lambda: layout_mesh("v7", {"x": 2, "y": 6}, (1, 3, 4)), "'y' of size 6 does not fit"),
        (
            lambda: layout_mesh("v7", {"x": True}, (1, 1, 1)),
            "mesh\\['x'\\] must be a whole number, got True",
        ),
        (lambda: layout_mesh("v7", {"x": 16}, (4, 4)), "slice_shape has 2 sides.*give 3 sides"),
        (lambda: layout_mesh("v4", {"x": 4}, (1, 2, 2)), "TPU v4 has no per-chip ICI"),
        (lambda: layout_mesh("h100", {"x": 8}, (8,)), "not a TPU on a torus"),
        (lambda: default_slice_shape("v6e", 512), "exceed a TPU v6e pod"),
        (lambda: TorusPiece(0, True), "TorusPiece size must be at least 1, got 0"),
        (lambda: TorusPiece(4, True, stride=0), "TorusPiece stride must be at least 1, got 0"),
        (lambda: AxisLayout((TorusPiece(4, True),), W, slices=0), "slices must be at least 1"),
        (lambda: AxisLayout([TorusPiece(4, True)], W), "tuple of TorusPiece"),
    ],
)
def test_bad_input_fails_naming_the_value(call, match):
    with pytest.raises(IciModelError, match=match):
        call()


# --- the reference page's tables ------------------------------------------------------------


def _tex_to_python(formula: str) -> str:
    """`2 \\frac{N-1}{N} B` as `2 * ((N-1)/(N)) * B`: enough TeX for the page's formulas."""
    formula = formula.strip("$")
    formula = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", formula)
    return re.sub(r"\s+", " * ", formula.strip()).replace("^", "**")


@given(st.integers(min_value=1, max_value=4096), st.floats(min_value=0, max_value=1e12))
def test_the_page_shows_the_bytes_formula_that_bytes_received_computes(n: int, b: float) -> None:
    rows = unpadded(redistribution_markdown()).splitlines()[2:]
    assert [row.split(" | ")[1] for row in rows] == [kind for *_, kind in REDISTRIBUTIONS]
    for row in rows:
        kind, formula = row.strip("| ").split(" | ")[1:]
        shown = eval(_tex_to_python(formula), {"N": n, "B": b})
        assert math.isclose(shown, bytes_received(kind, b, n), rel_tol=1e-12, abs_tol=1e-9)


def test_ring_times_are_the_models_and_a_line_takes_twice_a_ring() -> None:
    rows = [row.strip("| ").split(" | ") for row in unpadded(ring_times_markdown()).splitlines()]
    by_chip = {row[0]: row[1:] for row in rows[2:]}
    priced = [c.name for c in all_chips() if c.ici_topology and c.ici_link_bytes_per_second]
    assert list(by_chip) == priced and "TPU v4" not in by_chip  # v4 states no link figure
    v5e = get_chip("v5e")
    axis = ring(16, link=v5e.ici_link_bytes_per_second)
    link, gather, reduce, to_all, line = by_chip[v5e.name]
    assert link == "100"
    assert gather == f"{collective_seconds('all-gather', GIB, axis) * 1e3:.2f}"
    assert to_all == f"{collective_seconds('all-to-all', GIB, axis) * 1e3:.2f}"
    assert reduce == line
    assert math.isclose(float(line), 2 * float(gather), abs_tol=0.015)  # each to 0.005


def test_ring_times_refuse_a_count_that_is_not_chips() -> None:
    with pytest.raises(IciModelError, match="chips"):
        ring_times_markdown(chips=0)
