"""The MXU utilisation model, the padding advice and the generated cheat sheet page."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from fractions import Fraction

import pytest
from conftest import REPOSITORY, unpadded
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc import hardware
from tpuready.calc.alignment import (
    COMMON_DIMENSIONS,
    LANES,
    RULES_OF_THUMB,
    STREAMED_ROWS,
    SUBLANES,
    AlignmentError,
    layout_padded_shape,
    layout_utilization,
    matmul_tile_utilization,
    mxu_tile,
    padded_dims,
    recommend_padding,
    round_up,
    rows_per_register,
    streamed_utilization,
    tile_utilization,
)
from tpuready.calc.roofline import Roofline
from tpuready.pages.alignment import cheat_sheet_markdown

CHEAT_SHEET = REPOSITORY / "book" / "hardware-alignment-cheat-sheet.md"
sizes = st.integers(min_value=1, max_value=10**7)
tiles = st.integers(min_value=1, max_value=1024)


# --- hand-worked cases -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "multiple", "expected"),
    [
        (151_936, 256, 152_064),  # 593.5 tiles of 256 -> 594
        (151_936, 128, 151_936),  # 1,187 tiles of 128 exactly
        (50_257, 256, 50_432),  # 196.3 -> 197 tiles
        (1, 128, 128),
        (128, 128, 128),
        (129, 128, 256),
        (7, 1, 7),
    ],
)
def test_round_up_by_hand(value: int, multiple: int, expected: int) -> None:
    assert round_up(value, multiple) == expected


@pytest.mark.parametrize(
    ("dim", "tile", "expected"),
    [
        (64, 256, 0.25),
        (64, 128, 0.5),
        (128, 256, 0.5),
        (896, 256, 0.875),  # 896 / 1024
        (100, 128, 100 / 128),
        (151_936, 256, 151_936 / 152_064),
        (257, 256, 257 / 512),
        (4096, 256, 1.0),
    ],
)
def test_tile_utilization_by_hand(dim: int, tile: int, expected: float) -> None:
    assert tile_utilization(dim, tile) == pytest.approx(expected, rel=1e-15)


def test_matmul_utilization_streams_m_in_pushes_of_8_and_tiles_k_and_n() -> None:
    # Attention scores with head dim 64 on a 256 tile: 4096 x 64 x 4096 -> 1 * 1/4 * 1.
    assert matmul_tile_utilization(4096, 64, 4096, 256) == 0.25
    # 257 on every side of a 256 tile: 257 rows stream as 264, k and n take two tiles.
    assert matmul_tile_utilization(257, 257, 257, 256) == pytest.approx(
        (257 / 264) * (257 / 512) ** 2
    )
    assert f"{matmul_tile_utilization(257, 257, 257, 256):.1%}" == "24.5%"
    # Decoding 100 tokens: 104 rows, whatever the tile.
    assert matmul_tile_utilization(100, 256, 512, 128) == pytest.approx(100 / 104)
    assert matmul_tile_utilization(100, 256, 512, 256) == pytest.approx(100 / 104)


def test_the_mxu_streams_8_rows_a_push() -> None:
    # The Scaling Book: one bf16[8, 128] @ bf16[128, 128] product every 8 cycles.
    assert STREAMED_ROWS == 8
    assert streamed_utilization(8) == streamed_utilization(16) == streamed_utilization(4096) == 1.0
    assert streamed_utilization(100) == 100 / 104
    assert streamed_utilization(1000) == 1.0  # 1000 rows, a multiple of 8 (not 1008)
    assert streamed_utilization(1) == 1 / 8
    assert streamed_utilization(12) == 12 / 16


@pytest.mark.parametrize(
    ("itemsize", "rows"),
    [(4, 8), (2, 16), (1, 32)],  # float32, bf16, int8
)
def test_a_register_packs_rows_into_32_bit_words(itemsize: int, rows: int) -> None:
    # A layout fact: 8 sublanes x 128 lanes of 32-bit words, bf16 and int8 packed two or four
    # rows to a word (XLA's (8,128)(2,1) and (8,128)(4,1)). The MXU's push stays 8 rows.
    assert (SUBLANES, LANES) == (8, 128)
    assert rows_per_register(itemsize) == rows
    assert rows * itemsize == SUBLANES * 4


@pytest.mark.parametrize("itemsize", [8, 3, 16])
def test_no_packing_for_64_bit_or_odd_sizes(itemsize: int) -> None:
    with pytest.raises(AlignmentError, match=f"itemsize.*{itemsize}"):
        rows_per_register(itemsize)


def test_64_bit_values_are_refused_with_the_advice() -> None:
    with pytest.raises(AlignmentError, match=r"float64, int64.*32-bit words"):
        rows_per_register(8)


def test_layout_pads_rows_to_8_and_columns_to_128_lanes_for_every_dtype() -> None:
    # XLA's TPU tiles are 8 x 128 elements for float32, bf16 (8,128)(2,1) and int8 (8,128)(4,1).
    assert layout_padded_shape(100, 64) == (104, 128)
    assert layout_padded_shape(1000, 64) == (1000, 128)
    assert layout_padded_shape(1000, 128) == (1000, 128)
    assert layout_utilization(8, 128) == 1.0
    assert layout_utilization(1000, 64) == 0.5
    assert layout_utilization(100, 64) == pytest.approx(100 * 64 / (104 * 128))


def test_recommend_padding_for_qwen3_vocabulary_on_v7() -> None:
    advice = recommend_padding(151_936, mxu_tile("v7"))
    assert (advice.padded, advice.extra, advice.multiple) == (152_064, 128, 256)
    assert advice.extra_fraction == pytest.approx(128 / 151_936)
    assert str(advice) == (
        "pad 151,936 -> 152,064 (+128), multiple of 256: same 594 tiles, 99.92% useful"
    )


def test_recommend_padding_says_keep_for_a_multiple() -> None:
    advice = recommend_padding(32_000, 256)
    assert advice.extra == 0 and advice.utilization_before == 1.0
    assert str(advice) == "32,000 is already a multiple of 256: keep it"


def test_padded_dims_keeps_names_and_order() -> None:
    dims = {"vocab": 50_257, "hidden": 896, "head_dim": 128}
    assert padded_dims(dims, 256) == {"vocab": 50_432, "hidden": 1024, "head_dim": 256}
    assert list(padded_dims(dims, 128)) == ["vocab", "hidden", "head_dim"]


@pytest.mark.parametrize(
    ("name", "tile"), [("v4", 128), ("TPU v5e", 128), ("v5p", 128), ("trillium", 256), ("v7", 256)]
)
def test_mxu_tile_reads_the_hardware_table(name: str, tile: int) -> None:
    assert mxu_tile(name) == tile


# --- properties ------------------------------------------------------------------------------


@given(sizes, tiles)
def test_round_up_is_the_smallest_multiple_at_least_value(value: int, multiple: int) -> None:
    padded = round_up(value, multiple)
    assert padded % multiple == 0
    assert padded >= value
    assert padded - multiple < value  # one multiple less would be too small


@given(sizes, tiles)
def test_utilization_is_in_zero_one(dim: int, tile: int) -> None:
    assert 0 < tile_utilization(dim, tile) <= 1
    # Exactly the fraction dim / padded size, with no rounding beyond one float division.
    assert tile_utilization(dim, tile) == float(Fraction(dim, round_up(dim, tile)))


@given(st.integers(min_value=1, max_value=10**5), tiles)
def test_utilization_is_exactly_one_for_multiples(count: int, tile: int) -> None:
    assert tile_utilization(count * tile, tile) == 1.0


@given(sizes, tiles)
def test_utilization_is_below_one_off_the_multiples(dim: int, tile: int) -> None:
    if dim % tile:
        assert tile_utilization(dim, tile) < 1


@given(sizes, sizes, sizes, tiles)
def test_matmul_utilization_is_at_most_each_factor(m: int, k: int, n: int, tile: int) -> None:
    whole = matmul_tile_utilization(m, k, n, tile)
    factors = (streamed_utilization(m), tile_utilization(k, tile), tile_utilization(n, tile))
    assert 0 < whole <= min(factors)
    assert whole == pytest.approx(math.prod(factors))
    # Streaming in pushes of 8 is padding m to a multiple of 8, and never wastes more than
    # padding m to a whole MXU tile (a multiple of 8).
    assert streamed_utilization(m) == tile_utilization(m, STREAMED_ROWS)
    if tile % STREAMED_ROWS == 0:
        assert streamed_utilization(m) >= tile_utilization(m, tile)


@given(sizes, tiles)
def test_advice_pads_to_full_utilization(dim: int, multiple: int) -> None:
    advice = recommend_padding(dim, multiple)
    assert tile_utilization(advice.padded, multiple) == 1.0
    assert 0 <= advice.extra < multiple
    assert math.isclose(advice.utilization_before, dim / advice.padded)


# --- bad input: clear errors naming the value ------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (lambda: round_up(0, 128), ValueError, "value must be at least 1, got 0"),
        (lambda: round_up(10, 0), ValueError, "multiple must be at least 1, got 0"),
        (lambda: round_up(10, -128), ValueError, "got -128"),
        (lambda: tile_utilization(100.5, 128), ValueError, "dim must be a whole number, got 100.5"),
        (lambda: tile_utilization(True, 128), ValueError, "got True"),
        (lambda: tile_utilization(64, "256"), ValueError, "tile must be a whole number, got '256'"),
        (lambda: matmul_tile_utilization(4096, 0, 4096, 256), ValueError, "got 0"),
        (lambda: padded_dims({"vocab": -3}, 256), ValueError, "dims['vocab']"),
        (lambda: padded_dims({"vocab": 3}, 0), ValueError, "multiple must be at least 1"),
    ],
)
def test_bad_values_are_named(call, error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=named.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_a_gpu_has_no_mxu_tile() -> None:
    with pytest.raises(ValueError, match="H100 SXM has no MXU tile"):
        mxu_tile("h100")


def test_an_unknown_chip_is_refused_by_name() -> None:
    with pytest.raises(hardware.UnknownChipError, match="'v9'"):
        mxu_tile("v9")


# --- the cheat sheet page --------------------------------------------------------------------


def test_cheat_sheet_page_is_generated_from_the_table() -> None:
    committed = CHEAT_SHEET.read_text(encoding="utf-8")
    assert committed == cheat_sheet_markdown(), (
        "book/hardware-alignment-cheat-sheet.md is not the output of tpuready.pages.alignment: "
        "regenerate it with "
        "`python -m tpuready.pages.alignment > book/hardware-alignment-cheat-sheet.md`"
    )


def test_module_prints_the_page() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "tpuready.pages.alignment"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert printed.stdout == cheat_sheet_markdown()
    assert printed.stderr == ""


def test_cheat_sheet_lists_every_tpu_tile_with_its_source() -> None:
    page = unpadded(cheat_sheet_markdown())
    assert "\n# Hardware alignment cheat sheet\n" in page
    # The note for maintainers is a MyST comment: a reader (and a printout) never sees it.
    above_title = page.split("# Hardware alignment cheat sheet", 1)[0]
    assert all(line.startswith("%") for line in above_title.strip().splitlines())
    assert "Regenerate" not in page.split("# Hardware alignment cheat sheet", 1)[1]
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is None:
            continue
        side = chip.matrix_unit_shape[0]
        assert f"| {chip.name} | {chip.configuration} | {side}x{side} |" in page
        assert chip.sources["matrix_unit_shape"] in page


def test_cheat_sheet_follows_the_table_when_a_tile_changes(monkeypatch) -> None:
    # One source: a (hypothetical) change in tpuready.calc.hardware reaches the page.
    v7 = hardware.get_chip("v7")
    changed = dataclasses.replace(
        v7, matrix_unit_shape=(512, 512), sources=dict(v7.sources), notes=dict(v7.notes)
    )
    chips = tuple(changed if chip is v7 else chip for chip in hardware.all_chips())
    monkeypatch.setattr(hardware, "all_chips", lambda: chips)
    assert f"| {v7.name} | {v7.configuration} | 512x512 |" in unpadded(cheat_sheet_markdown())


def test_cheat_sheet_shows_each_common_dimension_with_its_utilisation() -> None:
    page = unpadded(cheat_sheet_markdown())
    for kind, size, example in COMMON_DIMENSIONS:
        share = streamed_utilization(size) if kind == "tokens per device" else None
        on_256 = f"{share or tile_utilization(size, 256):.2%}".replace("%", "\N{NO-BREAK SPACE}%")
        if on_256 == "100.00\N{NO-BREAK SPACE}%" and share is None and size % 256:
            on_256 = ">99.99\N{NO-BREAK SPACE}%"
        assert f"| {kind} | {size:,} | {example} |" in page
        row = next(line for line in page.splitlines() if f"| {size:,} | {example} |" in line)
        assert on_256 in row
    assert (
        "| vocabulary | 151,936 | Qwen3 | weight, whole tiles | 100.00\N{NO-BREAK SPACE}% | "
        "99.92\N{NO-BREAK SPACE}% | "
        "pad in the weights to 152,064 |"
    ) in page
    decode = next(line for line in page.splitlines() if "| decoding 100 sequences" in line)
    assert "| 96.15\N{NO-BREAK SPACE}% | 96.15\N{NO-BREAK SPACE}% |" in decode  # 100 / 104
    assert "streams as 104 rows" in decode
    assert "memory-bound on every TPU" in decode
    # No head-dim row advises padding a head dim: 128 to 256 would only add zeros.
    for line in page.splitlines():
        if line.startswith("| head dim |"):
            assert "keep it" in line and "pad in the weights" not in line, line


def test_cheat_sheet_lists_the_fewest_tokens_per_chip_from_each_ridge_point() -> None:
    page = unpadded(cheat_sheet_markdown())
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is None:
            assert f"| {chip.name} | {chip.ridge_point_flops_per_byte:,.0f} |" not in page
            continue
        fewest = Roofline.from_chip(chip).min_tokens_for_compute_bound(8_192, 8_192)
        assert f"| {chip.name} | {chip.ridge_point_flops_per_byte:,.0f} | {fewest:,} |" in page


def test_every_rule_of_thumb_has_an_https_source_on_the_page() -> None:
    page = cheat_sheet_markdown()
    for _rule, title, url in RULES_OF_THUMB:
        assert url.startswith("https://")
        assert f"[{title}]({url})" in page
    for topic in ("multiples of 128", "60 %", "accumulate in float32", "float64", "int64"):
        assert topic in page, topic


def test_the_page_states_the_streamed_rows_one_way() -> None:
    # One fact, STREAMED_ROWS: the MXU takes 8 rows a push for every dtype. bf16's 16 rows in a
    # register appear once, labelled as a layout fact that leaves the 8 alone.
    page = cheat_sheet_markdown()
    assert "streams the activations through it 8 rows at a time, whatever their dtype" in page
    assert "a multiple of 8 fills the streamed rows" in page
    assert page.count("16 rows of bf16") == 1
    assert "A layout fact that does not change the MXU's 8 rows per push" in page
    for stale in ("row tile", "bf16 rows", "multiple of 16", "112 rows", "u_r", "rows_per_tile"):
        assert stale not in page, stale


def test_cheat_sheet_links_to_pages_that_exist() -> None:
    page = cheat_sheet_markdown()
    for target in (
        "../notebooks/18_hardware_friendly_dimensions.ipynb",
        "../notebooks/05_bfloat16_and_float32_matmuls.ipynb",
        "../notebooks/reference_hardware.ipynb",
    ):
        assert f"]({target})" in page
        assert (CHEAT_SHEET.parent / target).resolve().is_file(), target
