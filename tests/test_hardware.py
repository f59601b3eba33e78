"""The accelerator table the book quotes: units, derived figures, sources, names, rendering.

The range checks are there to catch a figure typed in the wrong unit (197 instead of 197e12, or
819 GB/s entered as 819e6): such a figure lands orders of magnitude outside the range. What
`Chip.__post_init__` already refuses at import (a figure without an https source, a negative
figure, an unknown unit) is tested by building a bad chip and expecting the error, not by
re-reading the table.
"""

from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch
from conftest import unpadded
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc import hardware
from tpuready.calc.hardware import (
    BYTES_PER_GB,
    BYTES_PER_GIB,
    CHIPS,
    FIGURE_FIELDS,
    Chip,
    NoPeakFigureError,
    UnknownChipError,
    all_chips,
    chip_for_device_name,
    device_peak_flops_per_second,
    get_chip,
    known_names,
)
from tpuready.pages.hardware import interconnect_markdown_table, markdown_table, notes_markdown

NBSP = "\N{NO-BREAK SPACE}"

TERA = 1e12
GIGA = 1e9
CHIP_IDS = [chip.name for chip in CHIPS]


def every_chip(test):
    return pytest.mark.parametrize("chip", CHIPS, ids=CHIP_IDS)(test)


# --- units: every figure in base SI units, inside a range no wrong unit can reach ----------


@every_chip
def test_peak_is_in_flops_per_second(chip: Chip) -> None:
    assert 1e14 <= chip.peak_bf16_flops_per_second <= 1e16


@every_chip
def test_hbm_capacity_is_in_bytes(chip: Chip) -> None:
    assert 8 * BYTES_PER_GIB <= chip.hbm_bytes <= 512 * BYTES_PER_GIB


@pytest.mark.parametrize(
    ("name", "stated", "unit", "hbm_bytes"),
    [
        ("v5e", 16, "GB", 16_000_000_000),
        ("v6e", 32, "GiB", 34_359_738_368),
        ("v7", 192, "GiB", 206_158_430_208),
        ("h200", 141, "GB", 141_000_000_000),
    ],
)
def test_hbm_capacity_converts_between_bytes_and_the_stated_unit(
    name, stated, unit, hbm_bytes
) -> None:
    chip = get_chip(name)
    assert (chip.hbm_bytes, chip.hbm_capacity_unit) == (hbm_bytes, unit)
    assert chip.hbm_capacity_in_stated_unit == stated


@given(count=st.integers(min_value=1, max_value=4096), unit=st.sampled_from(["GB", "GiB"]))
def test_a_capacity_in_either_unit_reads_back_as_stated(count, unit) -> None:
    bytes_per_unit = {"GB": BYTES_PER_GB, "GiB": BYTES_PER_GIB}[unit]
    chip = dataclasses.replace(
        get_chip("v5e"), hbm_bytes=count * bytes_per_unit, hbm_capacity_unit=unit
    )
    assert chip.hbm_capacity_in_stated_unit == count
    assert f"| {count:,}{NBSP}{unit} |" in unpadded(markdown_table((chip,)))


@every_chip
def test_bandwidths_are_in_bytes_per_second(chip: Chip) -> None:
    assert 1e11 <= chip.hbm_bytes_per_second <= 2e13
    if chip.interconnect_bytes_per_second is not None:
        assert 1e11 <= chip.interconnect_bytes_per_second <= 2e13


@every_chip
def test_ridge_point_is_plausible(chip: Chip) -> None:
    # Every accelerator in the table needs 100 to 1,000 FLOPs per HBM byte to be compute-bound.
    assert 100 <= chip.ridge_point_flops_per_byte <= 1000


@pytest.mark.parametrize(
    ("name", "tflops", "hbm_gigabytes_per_second"),
    [("v5e", 197, 819), ("v6e", 918, 1638), ("v7", 2307, 7380), ("h100", 989.5, 3350)],
)
def test_ridge_point_is_peak_over_bandwidth_from_the_stated_figures(
    name, tflops, hbm_gigabytes_per_second
) -> None:
    expected = tflops * TERA / (hbm_gigabytes_per_second * GIGA)
    assert get_chip(name).ridge_point_flops_per_byte == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("name", "one_way_gigabytes_per_second"),
    [("v5e", 200), ("v6e", 400), ("v7", 600), ("h100", 450), ("b200", 900), ("v4", None)],
)
def test_one_way_interconnect_is_half_a_bidirectional_figure(
    name, one_way_gigabytes_per_second
) -> None:
    one_way = get_chip(name).interconnect_one_way_bytes_per_second
    if one_way_gigabytes_per_second is None:
        assert one_way is None
    else:
        assert one_way == pytest.approx(one_way_gigabytes_per_second * GIGA)


def test_a_one_way_figure_is_not_halved() -> None:
    one_way = dataclasses.replace(get_chip("v5e"), interconnect_is_bidirectional=False)
    assert one_way.interconnect_one_way_bytes_per_second == 400 * GIGA


def test_a_direction_without_a_figure_is_refused() -> None:
    with pytest.raises(ValueError, match="interconnect_is_bidirectional"):
        dataclasses.replace(get_chip("v4"), interconnect_is_bidirectional=True)


# --- sources: every figure carries the vendor page it came from ------------------------------


@every_chip
def test_every_missing_figure_says_why(chip: Chip) -> None:
    missing = [figure for figure in FIGURE_FIELDS if getattr(chip, figure) is None]
    assert [figure for figure in missing if figure not in chip.notes] == []


@every_chip
def test_nvidia_figures_come_from_nvidia_and_tpu_figures_from_google(chip: Chip) -> None:
    hosts = {"NVIDIA": ("https://www.nvidia.com/",), "Google": ("https://cloud.google.com/",)}
    for figure in ("peak_bf16_flops_per_second", "hbm_bytes", "hbm_bytes_per_second"):
        assert chip.sources[figure].startswith(hosts[chip.vendor]), (chip.name, figure)


def test_a_figure_without_a_source_is_refused() -> None:
    sources = dict(get_chip("v5e").sources)
    del sources["hbm_bytes_per_second"]
    with pytest.raises(ValueError, match="TPU v5e: figure 'hbm_bytes_per_second'"):
        dataclasses.replace(get_chip("v5e"), sources=sources)


def test_a_plain_http_source_is_refused() -> None:
    sources = dict(get_chip("v5e").sources)
    sources["chips_per_pod"] = "http://cloud.google.com/tpu/docs/v5e"
    with pytest.raises(ValueError, match="https"):
        dataclasses.replace(get_chip("v5e"), sources=sources)


def test_a_fractional_byte_count_is_refused() -> None:
    with pytest.raises(ValueError, match="whole number of bytes"):
        dataclasses.replace(get_chip("v5e"), hbm_bytes=16e9)


def test_an_unknown_capacity_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="'GB' or 'GiB', got 'TB'"):
        dataclasses.replace(get_chip("v5e"), hbm_capacity_unit="TB")


def test_a_negative_figure_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="hbm_bytes_per_second must be positive, got -1"):
        dataclasses.replace(get_chip("v5e"), hbm_bytes_per_second=-1)


def test_a_source_for_a_field_that_is_no_figure_is_refused() -> None:
    sources = {**get_chip("v5e").sources, "hbm_speed": "https://cloud.google.com/tpu/docs/v5e"}
    with pytest.raises(ValueError, match="hbm_speed"):
        dataclasses.replace(get_chip("v5e"), sources=sources)


def test_the_table_is_read_only() -> None:
    chip = get_chip("v5e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        chip.hbm_bytes = 0
    with pytest.raises(TypeError):
        chip.sources["hbm_bytes"] = "https://example.com"


# --- known values: the checked figures in shared/reference/torchtpu-0.2.0.md -----------------


@pytest.mark.parametrize(
    ("name", "tflops", "capacity", "unit"),
    [
        ("TPU v4", 275, 32, "GiB"),
        ("TPU v5e", 197, 16, "GB"),  # the v5e page says GB; TorchTPU's wheel holds GiB
        ("TPU v5p", 459, 95, "GiB"),
        ("TPU v6e", 918, 32, "GiB"),
        ("TPU v7", 2307, 192, "GiB"),
    ],
)
def test_tpu_peaks_and_capacities_match_the_reference(name, tflops, capacity, unit) -> None:
    chip = get_chip(name)
    assert chip.peak_bf16_flops_per_second == tflops * TERA
    assert chip.hbm_capacity_in_stated_unit == capacity
    assert chip.hbm_capacity_unit == unit


@pytest.mark.parametrize(
    ("name", "hbm_gigabytes_per_second", "ici_gigabytes_per_second", "chips_per_pod"),
    [
        ("TPU v5e", 819, 400, 256),
        ("TPU v5p", 2765, 1200, 8960),
        ("TPU v6e", 1638, 800, 256),
        ("TPU v7", 7380, 1200, 9216),
    ],
)
def test_tpu_bandwidths_and_pods_match_the_reference(
    name, hbm_gigabytes_per_second, ici_gigabytes_per_second, chips_per_pod
) -> None:
    chip = get_chip(name)
    assert chip.hbm_bytes_per_second == hbm_gigabytes_per_second * GIGA
    assert chip.interconnect_bytes_per_second == ici_gigabytes_per_second * GIGA
    assert chip.interconnect_is_bidirectional is True
    assert chip.chips_per_pod == chips_per_pod


@pytest.mark.parametrize(
    ("name", "dense_tflops", "capacity_gb", "hbm_terabytes_per_second", "nvlink_gb_per_second"),
    [
        ("H100 SXM", 989.5, 80, 3.35, 900),
        ("H200 SXM", 989.5, 141, 4.8, 900),
        ("B200", 2250, 180, 8.0, 1800),
    ],
)
def test_nvidia_figures(
    name, dense_tflops, capacity_gb, hbm_terabytes_per_second, nvlink_gb_per_second
) -> None:
    chip = get_chip(name)
    assert chip.peak_bf16_flops_per_second == pytest.approx(dense_tflops * TERA)
    assert (chip.hbm_capacity_in_stated_unit, chip.hbm_capacity_unit) == (capacity_gb, "GB")
    assert chip.hbm_bytes_per_second == pytest.approx(hbm_terabytes_per_second * TERA)
    assert chip.interconnect_bytes_per_second == pytest.approx(nvlink_gb_per_second * GIGA)
    assert chip.interconnect_name == "NVLink"
    assert chip.matrix_unit_shape is None


def test_h200_has_the_h100_compute_and_more_memory() -> None:
    h100, h200 = get_chip("h100"), get_chip("h200")
    assert h200.peak_bf16_flops_per_second == h100.peak_bf16_flops_per_second
    assert h200.hbm_bytes > h100.hbm_bytes
    assert h200.ridge_point_flops_per_byte < h100.ridge_point_flops_per_byte


@pytest.mark.parametrize(
    ("name", "side"),
    [("TPU v4", 128), ("TPU v5e", 128), ("TPU v5p", 128), ("TPU v6e", 256), ("TPU v7", 256)],
)
def test_mxu_tiles(name, side) -> None:
    assert get_chip(name).matrix_unit_shape == (side, side)


# --- per-device figures: TPU v7 shows two devices per chip -----------------------------------


def test_v7_per_device_is_half_the_chip() -> None:
    chip = get_chip("v7")
    assert chip.devices_per_chip == 2
    assert chip.per_device_peak_bf16_flops_per_second == 1153.5 * TERA
    assert chip.per_device_hbm_bytes == 96 * BYTES_PER_GIB
    # Derived, not a vendor figure: the chip's 7,380 GB/s split evenly.
    assert chip.per_device_hbm_bytes_per_second_even_split == 3690 * GIGA


def test_the_v6e_capacity_and_its_note_name_the_same_source_pages() -> None:
    # The module takes 32 GiB from the TPU7x page's comparison table; its note must say that
    # the v6e page itself states 32 GB, so the reference page can tell the reader both.
    chip = get_chip("v6e")
    assert (chip.hbm_capacity_in_stated_unit, chip.hbm_capacity_unit) == (32, "GiB")
    assert chip.sources["hbm_bytes"] == hardware.TPU_7X
    assert "'32 GB'" in chip.notes["hbm_bytes"] and "GiB" in chip.notes["hbm_bytes"]


@every_chip
def test_only_v7_splits_a_chip_into_devices(chip: Chip) -> None:
    assert chip.devices_per_chip == (2 if chip.name == "TPU v7" else 1)


@every_chip
def test_per_device_times_devices_is_the_chip(chip: Chip) -> None:
    devices = chip.devices_per_chip
    assert chip.per_device_peak_bf16_flops_per_second * devices == chip.peak_bf16_flops_per_second
    assert chip.per_device_hbm_bytes * devices == chip.hbm_bytes
    assert chip.per_device_hbm_bytes_per_second_even_split * devices == chip.hbm_bytes_per_second
    # Dividing both numerator and denominator leaves the ridge point of one device unchanged.
    per_device_ridge = chip.per_device_peak_bf16_flops_per_second / (
        chip.per_device_hbm_bytes_per_second_even_split
    )
    assert per_device_ridge == pytest.approx(chip.ridge_point_flops_per_byte)


# --- names: canonical names, aliases, errors -------------------------------------------------


def test_all_chips_keeps_a_stable_order() -> None:
    assert known_names() == (
        "TPU v4",
        "TPU v5e",
        "TPU v5p",
        "TPU v6e",
        "TPU v7",
        "H100 SXM",
        "H200 SXM",
        "B200",
    )
    assert [chip.name for chip in all_chips()] == list(known_names())


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("v7", "TPU v7"),
        ("tpu7x", "TPU v7"),
        ("TPU7x", "TPU v7"),
        ("ironwood", "TPU v7"),
        ("Ironwood", "TPU v7"),
        ("TPU v7x", "TPU v7"),
        ("TPU v5e", "TPU v5e"),
        ("v5litepod", "TPU v5e"),
        ("trillium", "TPU v6e"),
        ("v5p", "TPU v5p"),
        ("tpu-v4", "TPU v4"),
        ("h100", "H100 SXM"),
        ("H100-SXM5", "H100 SXM"),
        ("h200", "H200 SXM"),
        ("dgx b200", "B200"),
    ],
)
def test_aliases_resolve(alias, name) -> None:
    assert get_chip(alias).name == name


def test_unknown_name_lists_the_known_names() -> None:
    with pytest.raises(ValueError, match="unknown chip 'tpu v9'") as error:
        get_chip("tpu v9")
    for name in known_names():
        assert name in str(error.value)


def test_non_string_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="string"):
        get_chip(5)


def test_an_alias_that_names_two_chips_is_refused() -> None:
    clash = dataclasses.replace(get_chip("h200"), aliases=("H-100",))
    with pytest.raises(ValueError, match="names both"):
        hardware.build_index((get_chip("h100"), clash))


ALL_SPELLINGS = [(spelling, chip.name) for chip in CHIPS for spelling in (chip.name, *chip.aliases)]
SEPARATORS = st.sampled_from(["", "", " ", "  ", "-", "_", "\t"])


@given(
    pair=st.sampled_from(ALL_SPELLINGS),
    upper=st.lists(st.booleans(), min_size=40, max_size=40),
    separators=st.lists(SEPARATORS, min_size=41, max_size=41),
)
def test_any_case_and_spacing_of_a_known_name_resolves(pair, upper, separators) -> None:
    spelling, name = pair
    compact = spelling.replace(" ", "").replace("-", "")
    cased = [c.upper() if up else c.lower() for c, up in zip(compact, upper, strict=False)]
    variant = "".join(sep + char for sep, char in zip(separators, cased, strict=False))
    variant += separators[len(cased)]
    assert get_chip(variant).name == name


KNOWN_KEYS = {hardware.normalized_name(spelling) for spelling, _ in ALL_SPELLINGS}


@given(st.text(max_size=12))
def test_any_other_text_raises_a_clear_error(text) -> None:
    if hardware.normalized_name(text) in KNOWN_KEYS:
        return
    with pytest.raises(UnknownChipError, match="known chips: TPU v4"):
        get_chip(text)


# --- derived figures scale the way their definitions say -------------------------------------

POSITIVE_FACTOR = st.floats(min_value=0.01, max_value=100, allow_nan=False)


@given(chip=st.sampled_from(CHIPS), compute_factor=POSITIVE_FACTOR, memory_factor=POSITIVE_FACTOR)
def test_ridge_point_scales_with_compute_and_inversely_with_bandwidth(
    chip, compute_factor, memory_factor
) -> None:
    scaled = dataclasses.replace(
        chip,
        peak_bf16_flops_per_second=chip.peak_bf16_flops_per_second * compute_factor,
        hbm_bytes_per_second=chip.hbm_bytes_per_second * memory_factor,
    )
    expected = chip.ridge_point_flops_per_byte * compute_factor / memory_factor
    assert scaled.ridge_point_flops_per_byte == pytest.approx(expected, rel=1e-12)


@given(chip=st.sampled_from(CHIPS), devices=st.sampled_from([1, 2, 4, 8]))
def test_per_device_figures_divide_by_the_device_count(chip, devices) -> None:
    split = dataclasses.replace(chip, devices_per_chip=devices)
    assert split.per_device_peak_bf16_flops_per_second * devices == pytest.approx(
        chip.peak_bf16_flops_per_second
    )
    assert split.per_device_hbm_bytes * devices == chip.hbm_bytes
    assert split.per_device_hbm_bytes_per_second_even_split * devices == pytest.approx(
        chip.hbm_bytes_per_second
    )


def test_a_device_count_that_does_not_divide_the_memory_is_refused() -> None:
    odd_memory = dataclasses.replace(get_chip("h200"), hbm_bytes=141 * BYTES_PER_GB + 1)
    with pytest.raises(ValueError, match="divide hbm_bytes"):
        dataclasses.replace(odd_memory, devices_per_chip=2)


# --- rendering: the reference page's table --------------------------------------------------


def test_markdown_table_has_one_row_per_chip_and_every_source() -> None:
    table = unpadded(markdown_table())
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(CHIPS)  # the header plus one row per chip
    for row, chip in zip(rows[1:], CHIPS, strict=True):
        assert row.startswith(f"| {chip.name} ({chip.configuration}) |"), row
        for url in chip.sources.values():
            assert f"]({url})" in table
    assert hardware.RETRIEVED in table


def test_markdown_table_rows_have_every_cell() -> None:
    rows = [line for line in unpadded(markdown_table()).splitlines() if line.startswith("| ")]
    for row in rows:
        cells = row.strip("|").split(" | ")
        assert len(cells) == 8 and all(cell.strip() for cell in cells), row


@pytest.mark.parametrize(
    "cell",
    [
        f"| 2,307 | 192{NBSP}GiB | 7,380 |",  # TPU v7, in TFLOP/s, GiB as Google states, GB/s
        f"| 197 | 16{NBSP}GB | 819 |",  # TPU v5e: the page states GB
        f"| 989.5 | 80{NBSP}GB | 3,350 |",  # H100 SXM, dense
        "| ICI 1,200 |",
        "| NVLink 1,800 |",
        "ICI: not stated",
        "| 256x256 |",
    ],
)
def test_markdown_table_uses_human_units(cell) -> None:
    assert cell in unpadded(markdown_table())


def test_markdown_table_marks_a_one_way_interconnect_figure() -> None:
    one_way = dataclasses.replace(get_chip("v5e"), interconnect_is_bidirectional=False)
    assert "| ICI 400 (one way) |" in unpadded(markdown_table((one_way,)))


def test_markdown_table_renders_a_subset() -> None:
    table = markdown_table((get_chip("v5e"),))
    assert "TPU v5e" in table and "TPU v7" not in table


def test_notes_cover_every_chip_with_a_derived_or_missing_figure() -> None:
    notes = notes_markdown()
    for name in ("TPU v4", "H100 SXM", "B200"):
        assert f"**{name}**" in notes
    assert "With sparsity" in notes


def test_a_note_shared_by_several_chips_is_written_once() -> None:
    notes = notes_markdown()
    assert notes.count("not comparable to a TPU TensorCore") == 1
    assert "**H100 SXM, H200 SXM, B200**, TensorCores per chip:" in notes


# --- the peak of the device a notebook runs on -----------------------------------------------


@pytest.mark.parametrize(
    ("reported", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_a_cuda_device_name_finds_its_sxm_row(reported, name) -> None:
    assert chip_for_device_name("cuda", reported).name == name


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA H100 PCIe",  # another form factor: lower clocks, another peak
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA GH200 480GB",  # contains "H200", but is another product
        "NVIDIA GB200",
        "NVIDIA A100-SXM4-80GB",
        "Tesla T4",
    ],
)
def test_a_gpu_without_its_own_row_is_refused_by_name(reported) -> None:
    with pytest.raises(NoPeakFigureError, match=re.escape(f"matches the GPU {reported!r}")):
        chip_for_device_name("cuda", reported)


@pytest.mark.parametrize(
    ("reported", "name"),
    [
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6e", "TPU v6e"),
        ("TPU v6 lite", "TPU v6e"),
        ("TPU7x", "TPU v7"),
        ("TPU v4", "TPU v4"),
    ],
)
def test_a_tpu_device_name_finds_its_row(reported, name) -> None:
    assert chip_for_device_name("tpu", reported).name == name


@pytest.mark.parametrize("reported", ["TPU v3", "TPU v5", "NVIDIA H100 80GB HBM3", "h100"])
def test_a_tpu_name_outside_the_table_is_refused(reported) -> None:
    with pytest.raises(
        NoPeakFigureError, match=re.escape(f"no TPU of the table is called {reported!r}")
    ):
        chip_for_device_name("tpu", reported)


def test_the_peak_of_a_cuda_device_is_its_rows(monkeypatch) -> None:
    asked = []

    def device_name(device) -> str:
        asked.append(device)
        return "NVIDIA H200"

    monkeypatch.setattr(torch.cuda, "get_device_name", device_name)
    assert device_peak_flops_per_second(torch.device("cuda", 0)) == 989.5e12
    assert asked == [torch.device("cuda", 0)]  # the device asked about, not device 0 by default


def test_the_peak_of_a_tpu_v7_device_is_half_the_chips(monkeypatch) -> None:
    monkeypatch.setattr(
        torch, "tpu", types.SimpleNamespace(get_device_name=lambda: "TPU7x"), raising=False
    )
    tpu = types.SimpleNamespace(type="tpu", index=0)  # torch.device("tpu") needs TorchTPU
    assert device_peak_flops_per_second(tpu) == 2307e12 / 2


def test_a_cpu_has_no_peak_in_the_table() -> None:
    with pytest.raises(NoPeakFigureError, match="measure it with a large matmul, as chapter 21"):
        device_peak_flops_per_second(torch.device("cpu"))
    with pytest.raises(NoPeakFigureError, match="'mps' devices"):
        device_peak_flops_per_second("mps")


def test_only_the_bf16_peak_is_offered(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    with pytest.raises(NoPeakFigureError, match=r"bf16 peaks only, got dtype=torch\.float32"):
        device_peak_flops_per_second("cuda", dtype=torch.float32)


def test_interconnect_table_has_every_tpu_and_derives_the_link_figure() -> None:
    table = unpadded(interconnect_markdown_table())
    rows = [line for line in table.splitlines() if line.startswith("| TPU")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [
        chip.name for chip in CHIPS if chip.vendor == "Google"
    ]
    assert "| TPU v5e | 2D torus | 4 | 100 | a full side of 16 | 3.125 |" in rows
    assert (
        "| TPU v4 | 3D torus | 6 | not stated | every side a multiple of 4 (whole cubes) "
        "| not stated |"
    ) in rows
    assert "H100" not in table


def test_torus_fields_come_together_and_match_the_topology() -> None:
    v5e = get_chip("v5e")
    with pytest.raises(ValueError, match="ici_ports_per_chip must be 4, got 6"):
        dataclasses.replace(v5e, ici_ports_per_chip=6)
    with pytest.raises(ValueError, match="together, or none of them"):
        dataclasses.replace(v5e, ici_wraparound_multiple=None)
    with pytest.raises(ValueError, match="ici_topology must be one of"):
        dataclasses.replace(v5e, ici_topology="hypercube")
    assert v5e.slice_wraps((8, 16)) == (False, True)
    # 3D tori wrap only in slices of whole 4x4x4 cubes: 2x4x4 has no wraparound at all.
    assert get_chip("v7").slice_wraps((4, 4, 8)) == (True, True, True)
    assert get_chip("v7").slice_wraps((2, 4, 4)) == (False, False, False)
    with pytest.raises(ValueError, match="not on a torus"):
        get_chip("h100").slice_wraps((4,))


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("v4", (1, 2, 4, 8)),
        ("TPU v5p", (1, 2, 4, 8)),
        ("v5e", (1, 4, 8)),
        ("tpu-v6e", (1, 4, 8)),
        ("ironwood", (2, 4, 8)),
        ("h100", None),
    ],
)
def test_ranks_per_host_come_from_torchtpus_table(name, counts) -> None:
    assert hardware.tpu_ranks_per_host(name) == counts
    assert hardware.tpu_ranks_per_host(hardware.get_chip(name)) == counts


def test_every_tpu_has_rank_counts_per_host() -> None:
    for chip in CHIPS:
        if chip.vendor == "Google":
            assert hardware.tpu_ranks_per_host(chip) in hardware.TPU_RANKS_PER_HOST.values()
