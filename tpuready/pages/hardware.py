"""The hardware reference page's tables, rendered from `tpuready.calc.hardware`'s rows.

Every figure comes from the table; this module only writes it in human units (TFLOP/s, GB or
GiB as the vendor states, GB/s) with its sources and notes.
"""

from __future__ import annotations

from tpuready.calc.hardware import CHIPS, FIELD_LABELS, FIGURE_FIELDS, RETRIEVED, Chip
from tpuready.pages import markdown

__all__ = ["interconnect_markdown_table", "markdown_table", "notes_markdown"]


def _trimmed(value: float, decimals: int = 1) -> str:
    """Thousands separators, at most `decimals` decimals, no trailing zeros: 989.5, 2,307."""
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _interconnect_cell(chip: Chip) -> str:
    if chip.interconnect_bytes_per_second is None:
        return f"{chip.interconnect_name}: not stated"
    gigabytes = _trimmed(chip.interconnect_bytes_per_second / 1e9)
    one_way = "" if chip.interconnect_is_bidirectional else " (one way)"
    return f"{chip.interconnect_name} {gigabytes}{one_way}"


def _optional(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _sources_line(chip: Chip) -> str:
    """'**TPU v5e**: [peak bf16, HBM capacity, ...](url); [matrix unit](url2)'."""
    fields_by_url: dict[str, list[str]] = {}
    for figure in FIGURE_FIELDS:
        if figure in chip.sources:
            fields_by_url.setdefault(chip.sources[figure], []).append(FIELD_LABELS[figure])
    links = "; ".join(f"[{', '.join(labels)}]({url})" for url, labels in fields_by_url.items())
    return f"- **{chip.name}**: {links}"


_NBSP = "\N{NO-BREAK SPACE}"  # keeps "192 GiB" on one line in a narrow column


def markdown_table(chips: tuple[Chip, ...] | None = None) -> str:
    """The table in human units (TFLOP/s, GB or GiB as the vendor states, GB/s) and its sources."""
    chips = CHIPS if chips is None else chips
    header = (
        "Chip", "bf16 dense (TFLOP/s)", "HBM", "HBM (GB/s)", "ICI or NVLink, both ways (GB/s)",
        "MXU", "Chips per pod", "Ridge (FLOP/ byte)",
    )  # fmt: skip
    rows = [
        (
            f"{chip.name} ({chip.configuration})",
            _trimmed(chip.peak_bf16_flops_per_second / 1e12),
            f"{_trimmed(chip.hbm_capacity_in_stated_unit)}{_NBSP}{chip.hbm_capacity_unit}",
            _trimmed(chip.hbm_bytes_per_second / 1e9),
            _interconnect_cell(chip),
            "—" if chip.matrix_unit_shape is None else "x".join(map(str, chip.matrix_unit_shape)),
            _optional(chip.chips_per_pod),
            f"{chip.ridge_point_flops_per_byte:,.0f}",
        )
        for chip in chips
    ]
    lines = [markdown.table(header, rows)]
    lines += [
        "",
        f"**Sources** (vendor documentation, retrieved {RETRIEVED}; the wraparound rule from "
        "the Scaling Book):",
        "",
    ]
    lines += [_sources_line(chip) for chip in chips]
    return "\n".join(lines)


def _wrap_rule(chip: Chip) -> str:
    if chip.ici_topology == "3D torus":
        return f"every side a multiple of {chip.ici_wraparound_multiple} (whole cubes)"
    return f"a full side of {chip.ici_wraparound_multiple}"


def interconnect_markdown_table(chips: tuple[Chip, ...] | None = None) -> str:
    """The TPUs' torus facts in human units: topology, ports, one link's GB/s (derived), the
    wraparound rule and the data-centre network per chip; what `tpuready.calc.ici` prices with."""
    chips = tuple(c for c in (CHIPS if chips is None else chips) if c.ici_topology is not None)
    header = (
        "Chip", "Topology", "ICI ports", "One link, both ways (GB/s, derived)",
        "A dimension wraps around at", "DCN per chip (GB/s; derived for v5e, v6e)",
    )  # fmt: skip
    rows = []
    for chip in chips:
        link = chip.ici_link_bytes_per_second
        dcn = chip.dcn_bytes_per_second
        rows.append(
            (
                chip.name,
                chip.ici_topology,
                chip.ici_ports_per_chip,
                "not stated" if link is None else _trimmed(link / 1e9),
                _wrap_rule(chip),
                "not stated" if dcn is None else _trimmed(dcn / 1e9, 3),
            )
        )
    return markdown.table(header, rows)


def notes_markdown(chips: tuple[Chip, ...] | None = None) -> str:
    """The notes on ambiguous, derived or missing figures, one bullet per note; a note shared by
    several chips (the same figure, the same words) is written once, naming all of them."""
    chips = CHIPS if chips is None else chips
    chips_by_note: dict[tuple[str, str], list[str]] = {}
    for chip in chips:
        for figure, note in chip.notes.items():
            chips_by_note.setdefault((figure, note), []).append(chip.name)
    return "\n".join(
        f"- **{', '.join(names)}**, {FIELD_LABELS[figure]}: {note}"
        for (figure, note), names in chips_by_note.items()
    )
