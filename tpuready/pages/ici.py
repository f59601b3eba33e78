"""The sharding reference page's tables: redistributions and ring times from `tpuready.calc.ici`."""

from __future__ import annotations

from tpuready.calc import hardware
from tpuready.calc.ici import (
    REDISTRIBUTIONS,
    AxisLayout,
    IciModelError,
    TorusPiece,
    bytes_received_formula,
    check_total_bytes,
    collective_seconds,
)
from tpuready.pages import markdown
from tpuready.validate import whole_number

__all__ = ["redistribution_markdown", "ring_times_markdown"]


def redistribution_markdown() -> str:
    """Each placement change with its collective and the bytes each rank receives, as a table;
    the formulas are the ones `bytes_received` computes."""
    rows = [
        (f"`{old}` → `{new}`", kind, f"${bytes_received_formula(kind)}$")
        for old, new, kind in REDISTRIBUTIONS
    ]
    return markdown.table(
        ("From → to, on one axis", "Collective", "Bytes each rank receives"), rows
    )


def ring_times_markdown(total_bytes: float = 2**30, chips: int = 16) -> str:
    """Milliseconds for each collective of `total_bytes` over `chips` chips of one torus
    dimension, as a ring (with the wraparound link) and as a line, on every TPU with a link
    figure: `collective_seconds` on the hardware table."""
    total = check_total_bytes(total_bytes)
    size = whole_number("chips", chips, fix="pass the chips of the axis", error=IciModelError)
    columns = [
        ("all-gather", True),
        ("all-reduce", True),
        ("all-to-all", True),
        ("all-gather", False),
    ]
    rows = []
    for chip in hardware.all_chips():
        link = chip.ici_link_bytes_per_second
        if chip.ici_topology is None or link is None:
            continue
        times = [
            collective_seconds(kind, total, AxisLayout((TorusPiece(size, wraps),), link))
            for kind, wraps in columns
        ]
        rows.append((chip.name, f"{link / 1e9:g}", *(f"{t * 1e3:.2f}" for t in times)))
    header = (
        "Chip", "One link, both ways (GB/s)", "All-gather or reduce-scatter, ring (ms)",
        "All-reduce, ring (ms)", "All-to-all, ring (ms)", "All-gather, line (ms)",
    )  # fmt: skip
    return markdown.table(header, rows)
