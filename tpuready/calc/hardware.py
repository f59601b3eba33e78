"""Accelerator figures the whole book quotes: one table, every figure with its vendor source.

The reference page `notebooks/reference_hardware.ipynb` ("Hardware figures") renders this table.
Part I's chapters quote none of these figures; the chapters of Parts II and III (sharding, shape
tuning, rooflines) are to take every peak FLOP/s, HBM size and bandwidth from here, so the book
and the code never drift. Figures come from the vendors' own pages (Google Cloud TPU
documentation, NVIDIA product pages), date retrieved: 2026-12. Each figure carries the URL it came
from; where a page is ambiguous or a figure is derived, a note says so.

Units: every figure is stored in base SI units and the unit is in the field name
(`peak_bf16_flops_per_second`, `hbm_bytes`, `hbm_bytes_per_second`,
`interconnect_bytes_per_second`), so no figure can silently live in TFLOP/s or GB/s. Capacities
keep the unit the vendor states (`hbm_capacity_unit`, "GB" = 10**9 bytes or "GiB" = 2**30 bytes)
and are converted exactly. Peaks are dense (no 2:4 sparsity), per chip.

Per-device figures are derived, not stated by a vendor: `per_device_*` divides a per-chip figure
by the number of devices a framework sees per chip (2 on TPU v7, 1 elsewhere). For HBM capacity
Google states the split (each TPU v7 chiplet owns half the HBM); for HBM bandwidth no vendor
figure per device exists, so `per_device_hbm_bytes_per_second_even_split` assumes an even split
between the devices of a chip, and its name says so.

`device_peak_flops_per_second(device)` finds the row of the device a notebook runs on (the name
CUDA or TorchTPU reports) and gives its per-device peak, the divisor of an MFU. A CPU has no
row: its peak is measured, as chapter 21 does.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tpuready.validate import InputError

if TYPE_CHECKING:  # torch is imported where it is used: the emulated TPU reads this table
    import torch  # while `import torch` itself is still running

__all__ = [
    "BYTES_PER_GB",
    "BYTES_PER_GIB",
    "CHIPS",
    "FIELD_LABELS",
    "FIGURE_FIELDS",
    "RETRIEVED",
    "TPU_RANKS_PER_HOST",
    "Chip",
    "NoPeakFigureError",
    "UnknownChipError",
    "all_chips",
    "as_chip",
    "chip_for_device_name",
    "device_peak_flops_per_second",
    "get_chip",
    "known_names",
    "tpu_ranks_per_host",
]

# How many ranks (one per device) TorchTPU 0.2.0 starts on one host of each TPU generation;
# any other count fails with "No TPU topology found for count: N" (TorchTPU's topology table,
# shared/reference/torchtpu-0.2.0.md). A v7 chip is two devices, one per TensorCore.
TPU_RANKS_PER_HOST: dict[str, tuple[int, ...]] = {
    "v4": (1, 2, 4, 8),
    "v5p": (1, 2, 4, 8),
    "v5e": (1, 4, 8),
    "v6e": (1, 4, 8),
    "v7": (2, 4, 8),
}

RETRIEVED = "2026-12"

BYTES_PER_GB = 10**9
BYTES_PER_GIB = 2**30
CapacityUnit = Literal["GB", "GiB"]
TorusTopology = Literal["2D torus", "3D torus"]
TORUS_DIMENSIONS: dict[str, int] = {"2D torus": 2, "3D torus": 3}

# The fields that hold vendor figures; each non-None one needs a source URL in `Chip.sources`.
FIGURE_FIELDS: tuple[str, ...] = (
    "peak_bf16_flops_per_second",
    "hbm_bytes",
    "hbm_bytes_per_second",
    "interconnect_bytes_per_second",
    "matrix_unit_shape",
    "chips_per_pod",
    "tensor_cores_per_chip",
    "devices_per_chip",
    "ici_topology",
    "ici_ports_per_chip",
    "ici_wraparound_multiple",
    "dcn_bytes_per_second",
)

# Short names for the figures, used in the sources list and the notes.
FIELD_LABELS: dict[str, str] = {
    "peak_bf16_flops_per_second": "peak bf16",
    "hbm_bytes": "HBM capacity",
    "hbm_bytes_per_second": "HBM bandwidth",
    "interconnect_bytes_per_second": "interconnect",
    "matrix_unit_shape": "matrix unit",
    "chips_per_pod": "chips per pod",
    "tensor_cores_per_chip": "TensorCores per chip",
    "devices_per_chip": "devices per chip",
    "ici_topology": "ICI topology",
    "ici_ports_per_chip": "ICI ports",
    "ici_wraparound_multiple": "torus wraparound",
    "dcn_bytes_per_second": "DCN",
    "general": "general",
}


class UnknownChipError(InputError):
    """Raised by `get_chip` for a name that is neither a canonical name nor an alias."""


class NoPeakFigureError(InputError):
    """Raised by `device_peak_flops_per_second` for a device the table holds no peak for (an
    `InputError`, so a `ValueError`: the device or dtype given has no figure here)."""


@dataclass(frozen=True)
class Chip:
    """One accelerator's figures, per chip, in base SI units, with a source URL per figure."""

    name: str
    vendor: str
    configuration: str
    aliases: tuple[str, ...]
    peak_bf16_flops_per_second: float
    hbm_bytes: int
    hbm_capacity_unit: CapacityUnit
    hbm_bytes_per_second: float
    interconnect_name: str
    interconnect_bytes_per_second: float | None
    interconnect_is_bidirectional: bool | None
    matrix_unit_shape: tuple[int, int] | None
    chips_per_pod: int | None
    tensor_cores_per_chip: int | None
    devices_per_chip: int
    sources: Mapping[str, str] = field(hash=False, compare=False)
    notes: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    ici_topology: TorusTopology | None = None
    ici_ports_per_chip: int | None = None
    ici_wraparound_multiple: int | None = None
    dcn_bytes_per_second: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", types.MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "notes", types.MappingProxyType(dict(self.notes)))
        for figure in FIGURE_FIELDS:
            if getattr(self, figure) is None:
                continue
            url = self.sources.get(figure, "")
            if not url.startswith("https://"):
                raise ValueError(
                    f"{self.name}: figure {figure!r} needs an https source URL in `sources`, "
                    f"got {url!r}; add the vendor page it came from"
                )
        unknown_keys = sorted(set(self.sources) - set(FIGURE_FIELDS))
        if unknown_keys:
            raise ValueError(
                f"{self.name}: `sources` has keys that are not figures: {unknown_keys}; "
                f"use one of {list(FIGURE_FIELDS)}"
            )
        unknown_note_keys = sorted(set(self.notes) - set(FIELD_LABELS))
        if unknown_note_keys:
            raise ValueError(
                f"{self.name}: `notes` has unknown keys {unknown_note_keys}; "
                f"use one of {list(FIELD_LABELS)}"
            )
        for figure in FIGURE_FIELDS:
            value = getattr(self, figure)
            numbers = value if isinstance(value, tuple) else (value,)
            if isinstance(value, str):
                continue
            if value is not None and not all(number > 0 for number in numbers):
                raise ValueError(f"{self.name}: {figure} must be positive, got {value!r}")
        if not isinstance(self.hbm_bytes, int):
            raise ValueError(
                f"{self.name}: hbm_bytes must be a whole number of bytes, got {self.hbm_bytes!r}"
            )
        if self.hbm_capacity_unit not in ("GB", "GiB"):
            raise ValueError(
                f"{self.name}: hbm_capacity_unit must be 'GB' or 'GiB', "
                f"got {self.hbm_capacity_unit!r}"
            )
        if (self.interconnect_bytes_per_second is None) != (
            self.interconnect_is_bidirectional is None
        ):
            raise ValueError(
                f"{self.name}: give interconnect_is_bidirectional exactly when "
                "interconnect_bytes_per_second is given"
            )
        if self.ici_topology is not None and self.ici_topology not in TORUS_DIMENSIONS:
            raise ValueError(
                f"{self.name}: ici_topology must be one of {list(TORUS_DIMENSIONS)}, "
                f"got {self.ici_topology!r}"
            )
        torus_fields = (self.ici_topology, self.ici_ports_per_chip, self.ici_wraparound_multiple)
        if len({value is None for value in torus_fields}) != 1:
            raise ValueError(
                f"{self.name}: give ici_topology, ici_ports_per_chip and "
                "ici_wraparound_multiple together, or none of them"
            )
        dimensions = self.torus_dimensions  # None exactly when ici_topology is None
        if dimensions is not None and self.ici_ports_per_chip != 2 * dimensions:
            raise ValueError(
                f"{self.name}: a {self.ici_topology} has 2 links per dimension, so "
                f"ici_ports_per_chip must be {2 * dimensions}, "
                f"got {self.ici_ports_per_chip}"
            )
        if self.devices_per_chip < 1 or self.hbm_bytes % self.devices_per_chip:
            raise ValueError(
                f"{self.name}: devices_per_chip must be >= 1 and divide hbm_bytes evenly, "
                f"got {self.devices_per_chip}"
            )

    @property
    def hbm_capacity_in_stated_unit(self) -> float:
        """The HBM capacity in the unit the vendor states (e.g. 95 for "95 GiB")."""
        return self.hbm_bytes / (BYTES_PER_GIB if self.hbm_capacity_unit == "GiB" else BYTES_PER_GB)

    @property
    def ridge_point_flops_per_byte(self) -> float:
        """Peak FLOP/s over HBM bytes/s: the roofline knee. Below it a kernel is memory-bound."""
        return self.peak_bf16_flops_per_second / self.hbm_bytes_per_second

    @property
    def interconnect_one_way_bytes_per_second(self) -> float | None:
        """The per-chip interconnect figure in one direction (half of a bidirectional figure)."""
        if self.interconnect_bytes_per_second is None:
            return None
        if self.interconnect_is_bidirectional:
            return self.interconnect_bytes_per_second / 2
        return self.interconnect_bytes_per_second

    @property
    def torus_dimensions(self) -> int | None:
        """2 for a 2D torus (v5e, v6e), 3 for a 3D torus (v4, v5p, v7), None off a torus."""
        return None if self.ici_topology is None else TORUS_DIMENSIONS[self.ici_topology]

    @property
    def ici_link_bytes_per_second(self) -> float | None:
        """Derived, not a vendor figure: one ICI link's bandwidth, both directions summed, as
        the chip's bidirectional ICI figure over its ports. None where either is not stated."""
        if self.interconnect_bytes_per_second is None or self.ici_ports_per_chip is None:
            return None
        return self.interconnect_bytes_per_second / self.ici_ports_per_chip

    def slice_wraps(self, slice_shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Which dimensions of a slice of this shape close into rings (a model rule from the
        Scaling Book): on v4, v5p and v7 all of them when the slice is whole 4x4x4 cubes,
        none otherwise; on v5e and v6e each full side of 16."""
        if self.ici_wraparound_multiple is None:
            raise ValueError(f"{self.name} is not on a torus; it has no wraparound links")
        multiple = self.ici_wraparound_multiple
        if self.ici_topology == "3D torus":
            whole_cubes = all(side % multiple == 0 for side in slice_shape)
            return tuple(whole_cubes for _ in slice_shape)
        return tuple(side % multiple == 0 for side in slice_shape)

    @property
    def per_device_peak_bf16_flops_per_second(self) -> float:
        """Derived: the chip's peak bf16 FLOP/s over its devices (a TensorCore on TPU v7, the
        chip elsewhere), since each device has its own matrix units."""
        return self.peak_bf16_flops_per_second / self.devices_per_chip

    @property
    def per_device_hbm_bytes(self) -> int:
        """Derived: the chip's HBM bytes over its devices (v7: each chiplet owns half)."""
        return self.hbm_bytes // self.devices_per_chip

    @property
    def per_device_hbm_bytes_per_second_even_split(self) -> float:
        """Derived, not a vendor figure: the chip's HBM bandwidth split evenly between its
        devices, an assumption that matches each device owning an equal share of the HBM."""
        return self.hbm_bytes_per_second / self.devices_per_chip


# Vendor pages. Google Cloud also serves these under docs.cloud.google.com.
_TPU_V4 = "https://cloud.google.com/tpu/docs/v4"
_TPU_V5E = "https://cloud.google.com/tpu/docs/v5e"
_TPU_V5P = "https://cloud.google.com/tpu/docs/v5p"
_TPU_V6E = "https://cloud.google.com/tpu/docs/v6e"
TPU_7X = "https://cloud.google.com/tpu/docs/tpu7x"
_TPU_ARCHITECTURE = "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm"
_JAX_CHIP_VERSIONS = (
    "https://docs.jax.dev/en/latest/_autosummary/jax.experimental.pallas.tpu.ChipVersion.html"
)
_MAXTEXT_IRONWOOD = (
    "https://maxtext.readthedocs.io/en/latest/guides/optimization/"
    "optimizing_frontier_model_training_on_tpu_v7x.html"
)
_SCALING_BOOK_TPUS = "https://jax-ml.github.io/scaling-book/tpus/"
_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_DGX_B200 = "https://www.nvidia.com/en-us/data-center/dgx-b200/"
_NVIDIA_HGX = "https://www.nvidia.com/en-us/data-center/hgx/"

_TPU_MXU_128_NOTE = (
    "The TPU architecture page: 'An MXU is composed of 128 x 128 multiply-accumulators in a "
    "systolic array'; Google's MaxText tuning guide also names v4, v5e and v5p as 128x128."
)
_WRAPAROUND_CUBE_NOTE = (
    "Not a vendor figure: the Scaling Book's rule ('How to Think About TPUs'). Optical "
    "switches join whole 4x4x4 cubes, so a dimension of a multiple of 4 chips wraps around; "
    "smaller slices (2x2x1, 2x2x2, 2x4x4) have no wraparound links."
)
_WRAPAROUND_SIDE_NOTE = (
    "Not a vendor figure: the Scaling Book's rule ('How to Think About TPUs'). A dimension "
    "wraps around only at the pod's full side of 16 chips; smaller slices are 2D meshes "
    "along their shorter sides."
)
_PORTS_3D_NOTE = (
    "Derived, not stated: the page gives the topology, a 3D torus, which links each chip to 2 "
    "neighbours per dimension, 6 ports; the source link is the page that states the "
    "topology. One link, both directions, is then the per-chip figure over 6."
)
_PORTS_3D_V5P_NOTE = _PORTS_3D_NOTE + (
    " The Scaling Book quotes its own per-link figure for v5p, 180 GB/s, about 10 % lower."
)
_PORTS_2D_NOTE = (
    "'ICI ports per chip 4' in the v6e page's table (v5e and v6e columns). One link, both "
    "directions, is then the per-chip figure over 4 (the Scaling Book quotes 90 GB/s on v5e "
    "and 180 GB/s on v6e, about 10 % lower)."
)
_NVIDIA_TORUS_NOTE = (
    "None: NVLink joins the GPUs of a board through switches, not as a torus of links; "
    "`tpuready.calc.ici` models TPU slices only."
)
_NVIDIA_DCN_NOTE = "None: the network between boards depends on the cluster, not the GPU."
_NVIDIA_MATRIX_UNIT_NOTE = (
    "None: NVIDIA's product pages state no single matrix-unit tile; tensor-core instruction "
    "shapes vary by instruction and precision."
)
_NVIDIA_TENSOR_CORE_NOTE = (
    "None: NVIDIA's 'Tensor Cores' are per-SM units, not comparable to a TPU TensorCore."
)
_NVIDIA_POD_NOTE = "None: no pod; an HGX/DGX board puts 8 GPUs in one NVLink domain."
_NVIDIA_SOURCING_NOTE = (
    "NVIDIA figures were checked against several public quotations of the product page, "
    "not a stored copy of the page itself."
)


def _gib(count: int) -> int:
    return count * BYTES_PER_GIB


def _gb(count: int) -> int:
    return count * BYTES_PER_GB


CHIPS: tuple[Chip, ...] = (
    Chip(
        name="TPU v4",
        vendor="Google",
        configuration="2 TensorCores as 1 device",
        aliases=("v4", "tpu v4", "tpu-v4"),
        peak_bf16_flops_per_second=275e12,
        hbm_bytes=_gib(32),
        hbm_capacity_unit="GiB",
        hbm_bytes_per_second=1200e9,
        interconnect_name="ICI",
        interconnect_bytes_per_second=None,
        interconnect_is_bidirectional=None,
        matrix_unit_shape=(128, 128),
        chips_per_pod=4096,
        tensor_cores_per_chip=2,
        devices_per_chip=1,
        ici_topology="3D torus",
        ici_ports_per_chip=6,
        ici_wraparound_multiple=4,
        sources={
            "ici_topology": _TPU_V4,
            "ici_ports_per_chip": _TPU_V4,
            "ici_wraparound_multiple": _SCALING_BOOK_TPUS,
            "peak_bf16_flops_per_second": _TPU_V4,
            "hbm_bytes": _TPU_V4,
            "hbm_bytes_per_second": _TPU_V4,
            "matrix_unit_shape": _TPU_ARCHITECTURE,
            "chips_per_pod": _TPU_V4,
            "tensor_cores_per_chip": _TPU_V4,
            "devices_per_chip": _JAX_CHIP_VERSIONS,
        },
        notes={
            "ici_ports_per_chip": _PORTS_3D_NOTE,
            "ici_wraparound_multiple": _WRAPAROUND_CUBE_NOTE,
            "dcn_bytes_per_second": (
                "None: the Cloud TPU v4 page states no data-centre network figure per chip."
            ),
            "peak_bf16_flops_per_second": "The page states '275 teraflops (bf16 or int8)'.",
            "matrix_unit_shape": _TPU_MXU_128_NOTE,
            "interconnect_bytes_per_second": (
                "None: the Cloud TPU v4 page states pod-level all-reduce (1.1 PB/s) and "
                "bisection (24 TB/s) bandwidth, but no per-chip ICI figure."
            ),
            "devices_per_chip": (
                "The two TensorCores run as one megacore device by default (JAX's ChipVersion "
                "table: v4 supports megacore)."
            ),
        },
    ),
    Chip(
        name="TPU v5e",
        vendor="Google",
        configuration="1 TensorCore",
        aliases=("v5e", "tpu v5e", "v5 lite", "tpu v5 lite", "v5litepod"),
        peak_bf16_flops_per_second=197e12,
        hbm_bytes=_gb(16),
        hbm_capacity_unit="GB",
        hbm_bytes_per_second=819e9,
        interconnect_name="ICI",
        interconnect_bytes_per_second=400e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=(128, 128),
        chips_per_pod=256,
        tensor_cores_per_chip=1,
        devices_per_chip=1,
        ici_topology="2D torus",
        ici_ports_per_chip=4,
        ici_wraparound_multiple=16,
        dcn_bytes_per_second=25e9 / 8,
        sources={
            "ici_topology": _TPU_V5E,
            "ici_ports_per_chip": _TPU_V6E,
            "ici_wraparound_multiple": _SCALING_BOOK_TPUS,
            "dcn_bytes_per_second": _TPU_V6E,
            "peak_bf16_flops_per_second": _TPU_V5E,
            "hbm_bytes": _TPU_V5E,
            "hbm_bytes_per_second": _TPU_V5E,
            "interconnect_bytes_per_second": _TPU_V5E,
            "matrix_unit_shape": _TPU_ARCHITECTURE,
            "chips_per_pod": _TPU_V5E,
            "tensor_cores_per_chip": _TPU_V5E,
            "devices_per_chip": _TPU_V5E,
        },
        notes={
            "ici_ports_per_chip": _PORTS_2D_NOTE,
            "ici_wraparound_multiple": _WRAPAROUND_SIDE_NOTE,
            "dcn_bytes_per_second": (
                "Derived: the v6e page's table gives v5e a 'Per-host NIC configuration 2 x 100 "
                "Gbps NIC' and 8 chips per host, 25 Gbps (3.125 GB/s) per chip."
            ),
            "matrix_unit_shape": _TPU_MXU_128_NOTE,
            "hbm_bytes": (
                "The v5e page states '16 GB'; TorchTPU 0.2.0's hardware table holds 16 GiB. "
                "This table keeps the vendor's unit: 16 GB = 16e9 bytes."
            ),
            "hbm_bytes_per_second": (
                "'819 GBps' on the page's chip table; one version of the page prints "
                "'800 GiBps' instead, which does not convert to 819 GB/s."
            ),
            "interconnect_bytes_per_second": (
                "'Bidirectional ICI bandwidth (per chip) 400 GBps'; older versions of the page "
                "printed 'Interchip Interconnect BW 1600 Gbps' instead."
            ),
        },
    ),
    Chip(
        name="TPU v5p",
        vendor="Google",
        configuration="2 TensorCores as 1 device",
        aliases=("v5p", "tpu v5p"),
        peak_bf16_flops_per_second=459e12,
        hbm_bytes=_gib(95),
        hbm_capacity_unit="GiB",
        hbm_bytes_per_second=2765e9,
        interconnect_name="ICI",
        interconnect_bytes_per_second=1200e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=(128, 128),
        chips_per_pod=8960,
        tensor_cores_per_chip=2,
        devices_per_chip=1,
        ici_topology="3D torus",
        ici_ports_per_chip=6,
        ici_wraparound_multiple=4,
        dcn_bytes_per_second=50e9 / 8,
        sources={
            "ici_topology": _TPU_V5P,
            "ici_ports_per_chip": _TPU_V5P,
            "ici_wraparound_multiple": _SCALING_BOOK_TPUS,
            "dcn_bytes_per_second": _TPU_V5P,
            "peak_bf16_flops_per_second": _TPU_V5P,
            "hbm_bytes": _TPU_V5P,
            "hbm_bytes_per_second": _TPU_V5P,
            "interconnect_bytes_per_second": _TPU_V5P,
            "matrix_unit_shape": _TPU_ARCHITECTURE,
            "chips_per_pod": _TPU_V5P,
            "tensor_cores_per_chip": _TPU_V5P,
            "devices_per_chip": _JAX_CHIP_VERSIONS,
        },
        notes={
            "ici_ports_per_chip": _PORTS_3D_V5P_NOTE,
            "ici_wraparound_multiple": _WRAPAROUND_CUBE_NOTE,
            "dcn_bytes_per_second": (
                "'Data center network (DCN) bandwidth per chip (Gbps) 50': 6.25 GB/s."
            ),
            "hbm_bytes": (
                "'HBM capacity per chip (GiB) 95' on the v5p and TPU7x pages; older versions "
                "of the v5p page printed '95 GB'."
            ),
            "hbm_bytes_per_second": (
                "'2765 GBps'; one version prints '2575 GiBps', which is the same rate."
            ),
            "matrix_unit_shape": _TPU_MXU_128_NOTE,
            "devices_per_chip": "The two TensorCores run as one megacore device by default.",
        },
    ),
    Chip(
        name="TPU v6e",
        vendor="Google",
        configuration="Trillium, 1 TensorCore",
        aliases=("v6e", "tpu v6e", "trillium", "v6 lite", "tpu v6 lite"),
        peak_bf16_flops_per_second=918e12,
        hbm_bytes=_gib(32),
        hbm_capacity_unit="GiB",
        hbm_bytes_per_second=1638e9,
        interconnect_name="ICI",
        interconnect_bytes_per_second=800e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=(256, 256),
        chips_per_pod=256,
        tensor_cores_per_chip=1,
        devices_per_chip=1,
        ici_topology="2D torus",
        ici_ports_per_chip=4,
        ici_wraparound_multiple=16,
        dcn_bytes_per_second=100e9 / 8,
        sources={
            "ici_topology": _TPU_V6E,
            "ici_ports_per_chip": _TPU_V6E,
            "ici_wraparound_multiple": _SCALING_BOOK_TPUS,
            "dcn_bytes_per_second": _TPU_V6E,
            "peak_bf16_flops_per_second": _TPU_V6E,
            "hbm_bytes": TPU_7X,
            "hbm_bytes_per_second": _TPU_V6E,
            "interconnect_bytes_per_second": _TPU_V6E,
            "matrix_unit_shape": _TPU_V6E,
            "chips_per_pod": _TPU_V6E,
            "tensor_cores_per_chip": _TPU_V6E,
            "devices_per_chip": _TPU_V6E,
        },
        notes={
            "ici_ports_per_chip": _PORTS_2D_NOTE,
            "ici_wraparound_multiple": _WRAPAROUND_SIDE_NOTE,
            "dcn_bytes_per_second": (
                "Derived: 'Per-host NIC configuration 4 x 200 Gbps NIC' and 8 chips per host, "
                "100 Gbps (12.5 GB/s) per chip."
            ),
            "hbm_bytes": (
                "The TPU7x page's comparison table states 32 GiB; the v6e page itself states "
                "'32 GB'. This table uses the explicit GiB column."
            ),
            "matrix_unit_shape": "The v6e page: 'two 256x256 matrix-multiply units (MXU)'.",
        },
    ),
    Chip(
        name="TPU v7",
        vendor="Google",
        configuration="Ironwood (TPU7x), 2 TensorCores as 2 devices",
        aliases=(
            "v7",
            "v7x",
            "tpu v7",
            "tpu v7x",
            "tpu7",
            "tpu7x",
            "ironwood",
        ),
        peak_bf16_flops_per_second=2307e12,
        hbm_bytes=_gib(192),
        hbm_capacity_unit="GiB",
        hbm_bytes_per_second=7380e9,
        interconnect_name="ICI",
        interconnect_bytes_per_second=1200e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=(256, 256),
        chips_per_pod=9216,
        tensor_cores_per_chip=2,
        devices_per_chip=2,
        ici_topology="3D torus",
        ici_ports_per_chip=6,
        ici_wraparound_multiple=4,
        sources={
            "ici_topology": TPU_7X,
            "ici_ports_per_chip": TPU_7X,
            "ici_wraparound_multiple": _SCALING_BOOK_TPUS,
            "peak_bf16_flops_per_second": TPU_7X,
            "hbm_bytes": TPU_7X,
            "hbm_bytes_per_second": TPU_7X,
            "interconnect_bytes_per_second": TPU_7X,
            "matrix_unit_shape": _MAXTEXT_IRONWOOD,
            "chips_per_pod": TPU_7X,
            "tensor_cores_per_chip": TPU_7X,
            "devices_per_chip": TPU_7X,
        },
        notes={
            "ici_topology": (
                "Inferred, not stated on the page: the TPU7x page compares TPU7x with v5p, whose "
                "page states a '3D torus', and Google's "
                "Ironwood announcements describe 4x4x4 cubes joined by optical switches."
            ),
            "ici_ports_per_chip": _PORTS_3D_NOTE,
            "ici_wraparound_multiple": _WRAPAROUND_CUBE_NOTE,
            "dcn_bytes_per_second": (
                "None: the TPU7x page the table cites states no data-centre network figure "
                "per chip."
            ),
            "peak_bf16_flops_per_second": "FP8 peak on the same page: 4614 TFLOP/s per chip.",
            "hbm_bytes": "Google's MaxText Ironwood guide writes '192 GB' for the same memory.",
            "matrix_unit_shape": (
                "The Cloud TPU7x page does not state the MXU size; Google's MaxText Ironwood "
                "guide does: 'The Ironwood MXU is a 256x256 systolic array'."
            ),
            "devices_per_chip": (
                "Dual-chiplet design: frameworks see two devices per chip, one per TensorCore, "
                "each with half the chip's HBM. Per-device figures divide by 2."
            ),
        },
    ),
    Chip(
        name="H100 SXM",
        vendor="NVIDIA",
        configuration="SXM5, HGX/DGX H100",
        aliases=("h100", "h100 sxm", "h100 sxm5", "nvidia h100"),
        peak_bf16_flops_per_second=1979e12 / 2,
        hbm_bytes=_gb(80),
        hbm_capacity_unit="GB",
        hbm_bytes_per_second=3.35e12,
        interconnect_name="NVLink",
        interconnect_bytes_per_second=900e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=None,
        chips_per_pod=None,
        tensor_cores_per_chip=None,
        devices_per_chip=1,
        sources={
            "peak_bf16_flops_per_second": _NVIDIA_H100,
            "hbm_bytes": _NVIDIA_H100,
            "hbm_bytes_per_second": _NVIDIA_H100,
            "interconnect_bytes_per_second": _NVIDIA_H100,
            "devices_per_chip": _NVIDIA_H100,
        },
        notes={
            "ici_topology": _NVIDIA_TORUS_NOTE,
            "ici_ports_per_chip": _NVIDIA_TORUS_NOTE,
            "ici_wraparound_multiple": _NVIDIA_TORUS_NOTE,
            "dcn_bytes_per_second": _NVIDIA_DCN_NOTE,
            "general": _NVIDIA_SOURCING_NOTE,
            "peak_bf16_flops_per_second": (
                "Derived: the page lists 'BFLOAT16 Tensor Core 1,979 teraFLOPS' with the "
                "footnote 'With sparsity'; dense is half, 989.5 TFLOP/s."
            ),
            "interconnect_bytes_per_second": (
                "'NVLink: 900GB/s' is the total over the GPU's 18 NVLink links, both directions "
                "summed (450 GB/s each way)."
            ),
            "matrix_unit_shape": _NVIDIA_MATRIX_UNIT_NOTE,
            "chips_per_pod": _NVIDIA_POD_NOTE,
            "tensor_cores_per_chip": _NVIDIA_TENSOR_CORE_NOTE,
        },
    ),
    Chip(
        name="H200 SXM",
        vendor="NVIDIA",
        configuration="SXM, HGX/DGX H200",
        aliases=("h200", "h200 sxm", "nvidia h200"),
        peak_bf16_flops_per_second=1979e12 / 2,
        hbm_bytes=_gb(141),
        hbm_capacity_unit="GB",
        hbm_bytes_per_second=4.8e12,
        interconnect_name="NVLink",
        interconnect_bytes_per_second=900e9,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=None,
        chips_per_pod=None,
        tensor_cores_per_chip=None,
        devices_per_chip=1,
        sources={
            "peak_bf16_flops_per_second": _NVIDIA_H200,
            "hbm_bytes": _NVIDIA_H200,
            "hbm_bytes_per_second": _NVIDIA_H200,
            "interconnect_bytes_per_second": _NVIDIA_H200,
            "devices_per_chip": _NVIDIA_H200,
        },
        notes={
            "ici_topology": _NVIDIA_TORUS_NOTE,
            "ici_ports_per_chip": _NVIDIA_TORUS_NOTE,
            "ici_wraparound_multiple": _NVIDIA_TORUS_NOTE,
            "dcn_bytes_per_second": _NVIDIA_DCN_NOTE,
            "general": _NVIDIA_SOURCING_NOTE,
            "peak_bf16_flops_per_second": (
                "Derived: the page lists BF16 Tensor Core 1,979 TFLOPS 'with sparsity' (the "
                "same compute as H100 SXM); dense is half, 989.5 TFLOP/s."
            ),
            "interconnect_bytes_per_second": (
                "'NVLink: 900GB/s', both directions summed (450 GB/s each way)."
            ),
            "matrix_unit_shape": _NVIDIA_MATRIX_UNIT_NOTE,
            "chips_per_pod": _NVIDIA_POD_NOTE,
            "tensor_cores_per_chip": _NVIDIA_TENSOR_CORE_NOTE,
        },
    ),
    Chip(
        name="B200",
        vendor="NVIDIA",
        configuration="HGX/DGX B200 board, not GB200",
        aliases=("b200", "b200 sxm", "hgx b200", "dgx b200", "nvidia b200"),
        peak_bf16_flops_per_second=36e15 / 2 / 8,
        hbm_bytes=_gb(1440 // 8),
        hbm_capacity_unit="GB",
        hbm_bytes_per_second=64e12 / 8,
        interconnect_name="NVLink",
        interconnect_bytes_per_second=14.4e12 / 8,
        interconnect_is_bidirectional=True,
        matrix_unit_shape=None,
        chips_per_pod=None,
        tensor_cores_per_chip=None,
        devices_per_chip=1,
        sources={
            "peak_bf16_flops_per_second": _NVIDIA_HGX,
            "hbm_bytes": _NVIDIA_DGX_B200,
            "hbm_bytes_per_second": _NVIDIA_DGX_B200,
            "interconnect_bytes_per_second": _NVIDIA_DGX_B200,
            "devices_per_chip": _NVIDIA_DGX_B200,
        },
        notes={
            "ici_topology": _NVIDIA_TORUS_NOTE,
            "ici_ports_per_chip": _NVIDIA_TORUS_NOTE,
            "ici_wraparound_multiple": _NVIDIA_TORUS_NOTE,
            "dcn_bytes_per_second": _NVIDIA_DCN_NOTE,
            "general": (
                "Per-GPU figures are NVIDIA's 8-GPU system figures divided by 8. Vendor pages "
                "differ between configurations: the B200 GPUs inside a GB200 NVL72 rack have "
                "other per-GPU figures and are not this row. " + _NVIDIA_SOURCING_NOTE
            ),
            "peak_bf16_flops_per_second": (
                "Not confirmed against a per-GPU datasheet. Derived: the HGX page lists "
                "'FP16/BF16 Tensor Core 36 PFLOPS' per 8-GPU HGX B200; its sparse/dense "
                "footnotes are inconsistent between page versions, and 36 PFLOPS is read as "
                "the with-sparsity figure (so 72 PFLOPS FP8 is half of 144 PFLOPS FP4, as "
                "it must be). Dense per GPU: 36 / 2 / 8 = 2.25 PFLOP/s."
            ),
            "hbm_bytes": "'1,440GB total GPU memory' for 8 GPUs: 180 GB per GPU.",
            "hbm_bytes_per_second": "'64TB/s HBM3e bandwidth' for 8 GPUs: 8 TB/s per GPU.",
            "interconnect_bytes_per_second": (
                "'14.4TB/s aggregate NVLink bandwidth' for 8 GPUs: 1.8 TB/s per GPU, both "
                "directions summed (fifth-generation NVLink, 900 GB/s each way)."
            ),
            "matrix_unit_shape": _NVIDIA_MATRIX_UNIT_NOTE,
            "chips_per_pod": _NVIDIA_POD_NOTE,
            "tensor_cores_per_chip": _NVIDIA_TENSOR_CORE_NOTE,
        },
    ),
)


def normalized_name(name: str) -> str:
    """Case-folded, with spaces, hyphens and underscores removed: 'TPU v5e' -> 'tpuv5e'."""
    return re.sub(r"[\s_\-]+", "", name.casefold())


def build_index(chips: tuple[Chip, ...]) -> dict[str, Chip]:
    index: dict[str, Chip] = {}
    for chip in chips:
        for spelling in (chip.name, *chip.aliases):
            key = normalized_name(spelling)
            if key in index and index[key] is not chip:
                raise ValueError(f"alias {spelling!r} names both {index[key].name} and {chip.name}")
            index[key] = chip
    return index


_INDEX: dict[str, Chip] = build_index(CHIPS)


def all_chips() -> tuple[Chip, ...]:
    """Every chip in the table, in a stable order: TPUs oldest first, then NVIDIA GPUs."""
    return CHIPS


def known_names() -> tuple[str, ...]:
    """The canonical chip names, in table order."""
    return tuple(chip.name for chip in CHIPS)


def get_chip(name: str) -> Chip:
    """The chip called `name`: a canonical name or alias ('v7', 'tpu7x', 'Ironwood', 'TPU v5e',
    'h100', ...), ignoring case, spaces, hyphens and underscores."""
    if not isinstance(name, str):
        raise TypeError(f"chip name must be a string such as 'TPU v5e', got {name!r}")
    chip = _INDEX.get(normalized_name(name))
    if chip is None:
        raise UnknownChipError(
            f"unknown chip {name!r}; known chips: {', '.join(known_names())} "
            "(aliases such as 'v5e', 'tpu7x', 'ironwood' and 'h100' work too)"
        )
    return chip


def as_chip(
    chip: object, *, argument: str = "chip", error: type[InputError] = UnknownChipError
) -> Chip:
    """`chip` if it is a `Chip`, the chip it names if it is a name (`get_chip`, whose
    `UnknownChipError` is an `InputError` too), else `error` naming the argument: how the
    calculators take a chip."""
    if isinstance(chip, Chip):
        return chip
    if not isinstance(chip, str):
        raise error(
            f"{argument} must be a tpuready.calc.hardware.Chip or a chip name such as 'v5e', got "
            f"{chip!r} ({type(chip).__name__}): pass one of tpuready.calc.hardware.known_names()"
        )
    return get_chip(chip)


def tpu_ranks_per_host(chip: object) -> tuple[int, ...] | None:
    """The rank counts TorchTPU starts on one host of `chip`'s TPU generation, read from
    `TPU_RANKS_PER_HOST` (`chip` a `Chip` or a name, as `as_chip` takes it); None for a chip
    with no TorchTPU counts there (a GPU, where the launcher takes any count)."""
    resolved = as_chip(chip)
    if resolved.vendor != "Google":
        return None
    return TPU_RANKS_PER_HOST.get(resolved.name.removeprefix("TPU "))


# The NVIDIA rows are the SXM boards; a name with one of these words is another form factor
# (PCIe card, NVL), with other clocks and power and so another peak than the row's.
_NVIDIA_ROWS = {"H100": "H100 SXM", "H200": "H200 SXM", "B200": "B200"}
_NVIDIA_OTHER_FORMS = {"PCIE", "NVL"}


def chip_for_device_name(device_type: str, device_name: str) -> Chip:
    """The table's chip for the name a runtime reports: `torch.cuda.get_device_name()` on
    "cuda" ("NVIDIA H100 80GB HBM3"), `torch.tpu.get_device_name()` on "tpu" ("TPU v6e")."""
    for argument, value, example in (
        ("device_type", device_type, "'cuda'"),
        ("device_name", device_name, "'NVIDIA H100 80GB HBM3'"),
    ):
        if not isinstance(value, str):
            raise NoPeakFigureError(
                f"{argument} must be a string such as {example}, got {value!r} "
                f"({type(value).__name__}): pass what torch reports for the device"
            )
    if device_type == "cuda":
        words = set(re.split(r"[\s_\-]+", device_name.upper()))
        rows = sorted(words & set(_NVIDIA_ROWS))
        if len(rows) == 1 and not words & _NVIDIA_OTHER_FORMS:
            return get_chip(_NVIDIA_ROWS[rows[0]])
        raise NoPeakFigureError(
            f"no row of the table matches the GPU {device_name!r}: it holds the SXM boards "
            f"{', '.join(_NVIDIA_ROWS.values())} only (PCIe and NVL cards, GH200 and GB200 have "
            "other peaks); measure this GPU's peak with a large bf16 matmul, as chapter 21 "
            "does for a CPU"
        )
    if device_type == "tpu":
        try:
            chip = get_chip(device_name)
        except UnknownChipError:
            chip = None
        if chip is not None and chip.vendor == "Google":
            return chip
        raise NoPeakFigureError(
            f"no TPU of the table is called {device_name!r}; known chips: "
            f"{', '.join(c.name for c in CHIPS if c.vendor == 'Google')}"
        )
    raise NoPeakFigureError(
        f"device_type {device_type!r}: the table holds no {device_type!r} devices, only 'cuda' "
        "and 'tpu' ones; measure the peak with a large matmul, as chapter 21 does in step 2"
    )


def device_peak_flops_per_second(
    device: torch.device | str, dtype: torch.dtype | None = None
) -> float:
    """Peak dense FLOP/s of the device a notebook runs on, from this table: the divisor of its
    MFU. Per device, not per chip (half a TPU v7 chip); bf16 only, the table's one precision.

    A CPU has no row (its peak depends on the model, the cores and the threads used), so it
    raises `NoPeakFigureError` rather than return a guess: measure the CPU's peak with a large
    matmul, as chapter 21 does in step 2.
    """
    import torch

    dtype = torch.bfloat16 if dtype is None else dtype
    device = torch.device(device) if isinstance(device, str) else device
    if not isinstance(getattr(device, "type", None), str):  # a torch.device, or one like it
        raise NoPeakFigureError(
            f"device must be a torch.device or a name such as 'cuda', got {device!r} "
            f"({type(device).__name__}): pass the device the model runs on"
        )
    if not isinstance(dtype, torch.dtype):
        raise NoPeakFigureError(
            f"dtype must be a torch.dtype, got {dtype!r} ({type(dtype).__name__}): pass "
            "torch.bfloat16 or leave it out"
        )
    if dtype != torch.bfloat16:
        raise NoPeakFigureError(
            f"the table holds dense bf16 peaks only, got dtype={dtype}; a {dtype} matmul runs "
            "at another rate (on a TPU, float32 matmuls run as bf16 passes)"
        )
    if device.type == "cpu":
        raise NoPeakFigureError(
            "a CPU has no peak in the table: measure it with a large matmul, as chapter 21 does "
            "in step 2, and divide by that"
        )
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)  # tpuready: ignore[torch-cuda-call]
    elif device.type == "tpu":
        name = torch.tpu.get_device_name()  # type: ignore[attr-defined]  # TorchTPU's module
    else:
        raise NoPeakFigureError(
            f"the table holds no {device.type!r} devices, only 'cuda' and 'tpu' ones; measure "
            "the peak with a large matmul, as chapter 21 does in step 2"
        )
    return chip_for_device_name(device.type, name).per_device_peak_bf16_flops_per_second
