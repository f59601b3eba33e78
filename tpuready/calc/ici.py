"""How long a collective takes on a TPU slice: mesh axes laid on the torus, priced per link.

Taught in chapter 8 (step "What changes on a TPU"), used by chapter 11's tensor-parallel model,
chapter 14's planner and `tpuready.calc.plan`. The model follows the Scaling Book ("How to Scale
Your Model", parts 2 and 3): a slice is a 2D or 3D torus of chips, every link between neighbours
carries `W` bytes per second (both directions summed, `Chip.ici_link_bytes_per_second`), and a
mesh axis is a set of rings (a torus dimension with its wraparound link) or lines (without).
Where an axis shares a dimension with an axis laid before it, its chips sit `stride` apart:
every hop crosses `stride` links, and the `stride` groups of the axis share each of them, so
it runs at `W / stride` a hop.
All formulas are bandwidth terms; latency and per-hop costs are left out, so the times are lower
bounds for large arrays.

For an array of `V` bytes (the gathered array of an all-gather, the unreduced array of a
reduce-scatter or all-reduce, the whole array of an all-to-all) over an axis of `N` chips:

- all-gather and reduce-scatter: each chip receives `(N - 1) / N * V` through its links on the
  axis, two per ring dimension and, at the ends of a line, one:
  `T = (N - 1) / N * V / (sum of c_d * W / 2)` with `c_d` 2 on a ring and 1 on a line. On one
  ring this is about `V / W` whatever `N` is; without the wraparound it is twice that.
- all-reduce: a reduce-scatter and an all-gather, twice that.
- all-to-all: each chip sends `V / N**2` to every other; the busiest link sets the time. On a
  ring of `a` chips every link carries the same, `T = V * floor(a**2 / 4) / (a * N * W)`, about
  `V / (4 W)` on one ring: a quarter of an all-gather of the same bytes. On a line the middle
  link carries the traffic between the halves, twice a ring's. Dimensions run in parallel, so
  over several the slowest sets the time.

A mesh maps onto the torus with its last axis (the busiest, JAX's and TorchTPU's convention)
on the last torus dimensions: `layout_mesh`, or with each axis's extent along every dimension
stated (`axis_shapes`, a topology-aware layout). An axis that takes only part of a dimension
gets a contiguous segment of it (a line); the next axis gets the rest, chips a segment apart,
which still form a ring when the dimension wraps. Across slices (multi-slice), the outermost axis
crosses the data-centre network: each chip sends over its share of the hosts' network cards
(`Chip.dcn_bytes_per_second`), hierarchically after or before the ICI part of that axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from tpuready.calc.hardware import Chip, as_chip
from tpuready.validate import InputError, number, one_of, whole_number

__all__ = [
    "COLLECTIVES",
    "REDISTRIBUTIONS",
    "AxisLayout",
    "IciModelError",
    "TorusPiece",
    "bytes_received",
    "bytes_received_formula",
    "check_total_bytes",
    "collective_seconds",
    "default_slice_shape",
    "layout_mesh",
]

COLLECTIVES: tuple[str, ...] = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
"""The collectives the model prices, named as `CommDebugMode` and chapter 8 name them."""


class IciModelError(InputError):
    """Raised for a collective, slice or mesh the model cannot price; the message says why."""


@dataclass(frozen=True)
class TorusPiece:
    """Part of one torus dimension that a mesh axis runs along: `size` chips in a ring
    (`wraps`) or a line, `stride` chips apart (each hop crosses `stride` links, which the
    `stride` groups of the axis along this dimension all share)."""

    size: int
    wraps: bool
    stride: int = 1

    def __post_init__(self) -> None:
        for name in ("size", "stride"):
            whole_number(
                f"TorusPiece {name}", getattr(self, name), fix="count chips", error=IciModelError
            )
        if not isinstance(self.wraps, bool):
            raise IciModelError(
                f"TorusPiece wraps must be True (a ring) or False (a line), got {self.wraps!r}"
            )

    def describe(self) -> str:
        """'16 (ring)', '4 (line)', '4 (ring, stride 4)'."""
        kind = "ring" if self.wraps else "line"
        return f"{self.size} ({kind}{f', stride {self.stride}' if self.stride > 1 else ''})"


@dataclass(frozen=True)
class AxisLayout:
    """One mesh axis on the hardware: its torus pieces, the link bandwidth, and how many slices
    it spans over the data-centre network (1: within one slice)."""

    pieces: tuple[TorusPiece, ...]
    link_bytes_per_second: float
    slices: int = 1
    dcn_bytes_per_second: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pieces, tuple) or not all(
            isinstance(piece, TorusPiece) for piece in self.pieces
        ):
            raise IciModelError(f"pieces must be a tuple of TorusPiece, got {self.pieces!r}")
        whole_number("slices", self.slices, fix="pass 1 for one slice", error=IciModelError)
        number(
            "link_bytes_per_second",
            self.link_bytes_per_second,
            fix=(
                "pass one link's bandwidth, both directions summed "
                "(`Chip.ici_link_bytes_per_second`)"
            ),
            error=IciModelError,
        )
        if self.dcn_bytes_per_second is not None:
            number(
                "dcn_bytes_per_second",
                self.dcn_bytes_per_second,
                fix="pass one chip's data-centre network bandwidth, or None",
                error=IciModelError,
            )
        if self.slices > 1 and not (self.dcn_bytes_per_second or 0) > 0:
            raise IciModelError(
                f"an axis over {self.slices} slices needs a positive dcn_bytes_per_second, "
                f"got {self.dcn_bytes_per_second!r}: nothing to price the data-centre network "
                "with (`tpuready.calc.hardware` states no DCN figure for some chips)"
            )

    @property
    def ici_size(self) -> int:
        """Chips of the axis within one slice."""
        return math.prod(piece.size for piece in self.pieces)

    @property
    def size(self) -> int:
        """Chips of the axis in all: the ICI part times the slices."""
        return self.ici_size * self.slices

    def describe(self) -> str:
        """'16 (ring) x 4 (line)', '2 slices over DCN' or '4 (ring) + 2 slices over DCN'."""
        text = " x ".join(piece.describe() for piece in self.pieces if piece.size > 1)
        if self.slices == 1:
            return text or "1"
        dcn = f"{self.slices} slices over DCN"
        return f"{text} + {dcn}" if text else dcn


def check_total_bytes(total_bytes: float) -> float:
    """`total_bytes` as a float, after refusing anything but a finite number >= 0."""
    return number(
        "total_bytes",
        total_bytes,
        fix="pass the bytes of the whole array",
        allow_zero=True,
        error=IciModelError,
    )


def _check_kind(kind: str) -> None:
    """Refuse a collective the model does not price, naming the ones it does."""
    one_of("kind", kind, COLLECTIVES, error=IciModelError)


def _ici_gather_seconds(total_bytes: float, layout: AxisLayout) -> float:
    """All-gather of `total_bytes` (the gathered array) within one slice."""
    n = layout.ici_size
    if n == 1:
        return 0.0
    # Links into a chip on the axis, each shared by the `stride` groups that cross it.
    channels = sum(
        (2 if piece.wraps else 1) / piece.stride for piece in layout.pieces if piece.size > 1
    )
    return (n - 1) / n * total_bytes / (channels * layout.link_bytes_per_second / 2)


def _ici_all_to_all_seconds(total_bytes: float, layout: AxisLayout) -> float:
    """All-to-all of `total_bytes` (the whole array) within one slice: the busiest dimension."""
    n = layout.ici_size
    w = layout.link_bytes_per_second
    times = [0.0]
    for piece in layout.pieces:
        a = piece.size
        if a == 1:
            continue
        if piece.wraps:
            load = total_bytes * (a * a // 4) / (a * n * w)
        else:  # the middle link of each line carries the traffic between its halves
            load = 2 * total_bytes * (a // 2) * ((a + 1) // 2) / (a * n * w)
        times.append(load * piece.stride)  # each hop crosses `stride` shared links
    return max(times)


def collective_seconds(kind: str, total_bytes: float, layout: AxisLayout) -> float:
    """Seconds a collective of `total_bytes` takes over one mesh axis (formulas: module
    docstring). `total_bytes` is the whole array: gathered, unreduced, or all-to-all'd."""
    _check_kind(kind)
    total = check_total_bytes(total_bytes)
    if not isinstance(layout, AxisLayout):
        raise IciModelError(
            f"layout must be an AxisLayout, got {layout!r}: take one from layout_mesh(...)[axis]"
        )
    if kind == "all-reduce":
        return 2 * collective_seconds("all-gather", total, layout)
    s = layout.slices
    if kind == "all-to-all":
        ici = _ici_all_to_all_seconds(total / s, layout)  # each slice's share, ICI first
        dcn = 0.0
        if s > 1:  # then each chip sends (s - 1) / s of its own data to other slices
            dcn = (s - 1) / s * total / layout.size / _dcn_speed(layout)
        return ici + dcn
    # All-gather (reduce-scatter runs the same steps in reverse): DCN between the slices on
    # each chip's 1 / ici_size of the array, then ICI within each slice.
    dcn = 0.0
    if s > 1:
        dcn = (s - 1) / s * total / layout.ici_size / _dcn_speed(layout)
    return dcn + _ici_gather_seconds(total, layout)


def _dcn_speed(layout: AxisLayout) -> float:
    """The DCN bandwidth of an axis over several slices (AxisLayout refuses one without it)."""
    return cast(float, layout.dcn_bytes_per_second)


def bytes_received(kind: str, total_bytes: float, group_size: int) -> float:
    """Bytes each of `group_size` ranks receives in a collective of `total_bytes` (the ring
    algorithms of chapter 8): the bill, independent of the topology."""
    _check_kind(kind)
    total = check_total_bytes(total_bytes)
    n = whole_number(
        "group_size", group_size, fix="pass the ranks of the group", error=IciModelError
    )
    return _RECEIVED[kind][0](n) * total


# Per collective: the share of the whole array each of n ranks receives, and the same as TeX.
_RECEIVED: dict[str, tuple[Callable[[int], float], str]] = {
    "all-gather": (lambda n: (n - 1) / n, r"\frac{N-1}{N} B"),
    "reduce-scatter": (lambda n: (n - 1) / n, r"\frac{N-1}{N} B"),
    "all-reduce": (lambda n: 2 * (n - 1) / n, r"2 \frac{N-1}{N} B"),
    "all-to-all": (lambda n: (n - 1) / n**2, r"\frac{N-1}{N^2} B"),
}

REDISTRIBUTIONS: tuple[tuple[str, str, str], ...] = (
    ("Shard(d)", "Replicate()", "all-gather"),
    ("Partial()", "Shard(d)", "reduce-scatter"),
    ("Partial()", "Replicate()", "all-reduce"),
    ("Shard(i)", "Shard(j)", "all-to-all"),
)
"""A placement change on one mesh axis and the collective it costs (chapter 8, step 4)."""


def bytes_received_formula(kind: str) -> str:
    """The LaTeX of what `bytes_received` computes for `kind`, in B bytes over N ranks."""
    _check_kind(kind)
    return _RECEIVED[kind][1]


def _resolve(chip: Chip | str) -> Chip:
    """The chip, by name or as given, after checking it is a TPU with a per-link figure."""
    chip = as_chip(chip, error=IciModelError)
    if chip.ici_topology is None:
        raise IciModelError(f"{chip.name} is not a TPU on a torus; the ICI model is for TPUs")
    if chip.ici_link_bytes_per_second is None:
        raise IciModelError(
            f"{chip.name} has no per-chip ICI figure in the table, so no per-link bandwidth"
        )
    return chip


def _check_shape(chip: Chip, slice_shape: Sequence[int]) -> tuple[int, ...]:
    """`slice_shape` as a tuple, after checking it has one positive side per dimension."""
    fix = f"a {chip.name} slice is a {chip.ici_topology}: give {chip.torus_dimensions} sides"
    if isinstance(slice_shape, str) or not isinstance(slice_shape, Sequence):
        raise IciModelError(f"slice_shape must be a sequence of sides, got {slice_shape!r}: {fix}")
    if len(slice_shape) != chip.torus_dimensions:
        raise IciModelError(f"slice_shape has {len(slice_shape)} sides, got {slice_shape!r}: {fix}")
    return tuple(
        whole_number(f"slice_shape[{index}]", side, fix=fix, error=IciModelError)
        for index, side in enumerate(slice_shape)
    )


def layout_mesh(
    chip: Chip | str,
    mesh: Mapping[str, int],
    slice_shape: Sequence[int],
    *,
    slices: int = 1,
    axis_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, AxisLayout]:
    """Each mesh axis's place on `slices` slices of shape `slice_shape`. By default the last
    axis takes the last torus dimensions, a segment of a dimension where it is smaller than it;
    `axis_shapes` states instead how many chips each axis spans along every dimension (a
    topology-aware layout, such as a cube for the busiest axis). The first axis crosses the
    data-centre network when `slices` > 1, so it must be a multiple of it."""
    chip = _resolve(chip)
    shape = _check_shape(chip, slice_shape)
    sizes = dict(mesh)
    for name, size in sizes.items():
        sizes[name] = whole_number(
            f"mesh[{name!r}]", size, fix="pass a positive axis size", error=IciModelError
        )
    slices = whole_number("slices", slices, fix="pass 1 for one slice", error=IciModelError)
    chips = math.prod(shape) * slices
    if math.prod(sizes.values()) != chips:
        raise IciModelError(
            f"mesh {sizes} has {math.prod(sizes.values())} chips, but {slices} slice(s) of "
            f"{'x'.join(map(str, shape))} have {chips}"
        )
    names = list(sizes)
    if slices > 1 and (not names or sizes[names[0]] % slices):
        raise IciModelError(
            f"the first mesh axis crosses the {slices} slices over DCN, so its size must be a "
            f"multiple of {slices}; got {sizes}"
        )
    within = {name: sizes[name] // (slices if i == 0 else 1) for i, name in enumerate(names)}
    if axis_shapes is None:
        extents = _default_extents(shape, within)
    else:
        extents = _checked_extents(shape, within, axis_shapes)
    # Per dimension, the axes from last to first: the first to take part of it gets a
    # contiguous segment, a ring only if it takes the whole wrapping dimension; the axes after
    # it get chips a segment apart (the stride), a ring when they take all that is left of a
    # wrapping one.
    wraps = chip.slice_wraps(shape)
    left = list(shape)
    pieces: dict[str, list[TorusPiece]] = {name: [] for name in names}
    for name in reversed(names):
        for dim, extent in enumerate(extents[name]):
            if extent > 1:
                stride = shape[dim] // left[dim]
                ring = wraps[dim] and extent == left[dim]
                pieces[name].append(TorusPiece(extent, ring, stride))
                left[dim] //= extent
    return {
        name: AxisLayout(
            pieces=tuple(pieces[name]),
            # _resolve refused a chip without one
            link_bytes_per_second=cast(float, chip.ici_link_bytes_per_second),
            slices=slices if index == 0 else 1,
            dcn_bytes_per_second=chip.dcn_bytes_per_second,
        )
        for index, name in enumerate(names)
    }


def _default_extents(shape: tuple[int, ...], sizes: dict[str, int]) -> dict[str, list[int]]:
    """The last axis on the last dimensions: whole dimensions while it is a multiple of them,
    then a factor of the next one; the axis before it goes on from there."""
    left = list(shape)
    extents: dict[str, list[int]] = {}
    dim = len(shape) - 1
    for name in reversed(list(sizes)):
        remaining = sizes[name]
        extents[name] = [1] * len(shape)
        while remaining > 1:
            while left[dim] == 1:
                dim -= 1
            if remaining % left[dim] == 0:
                take = left[dim]
            elif left[dim] % remaining == 0:
                take = remaining
            else:
                raise IciModelError(
                    f"mesh axis {name!r} of size {sizes[name]} does not fit the torus "
                    f"dimension of {left[dim]} it reaches on {'x'.join(map(str, shape))}; "
                    "choose axis sizes that divide or are multiples of the slice's sides, "
                    "or give axis_shapes"
                )
            extents[name][dim] *= take
            left[dim] //= take
            remaining //= take
    return extents


def _checked_extents(
    shape: tuple[int, ...], sizes: dict[str, int], axis_shapes: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """`axis_shapes` after checking that it places every axis and fills the slice exactly."""
    extents: dict[str, list[int]] = {}
    for name, size in sizes.items():
        given = [
            whole_number(
                f"axis_shapes[{name!r}][{dim}]", extent, fix="count chips", error=IciModelError
            )
            for dim, extent in enumerate(axis_shapes.get(name, [1] * len(shape)))
        ]
        if len(given) != len(shape) or math.prod(given) != size:
            raise IciModelError(
                f"axis_shapes[{name!r}] = {given} must give {len(shape)} extents whose product "
                f"is the axis's {size} chips in a slice"
            )
        extents[name] = given
    unknown = sorted(set(axis_shapes) - set(sizes))
    if unknown:
        raise IciModelError(f"axis_shapes names axes {unknown} that the mesh does not have")
    for dim, side in enumerate(shape):
        used = math.prod(extents[name][dim] for name in sizes)
        if used != side:
            raise IciModelError(
                f"axis_shapes spans {used} chips along dimension {dim}, but the slice's side "
                f"there is {side}"
            )
    return extents


def default_slice_shape(chip: Chip | str, num_chips: int) -> tuple[int, ...]:
    """The most nearly square (2D) or cubic (3D) slice of `num_chips`, with sides that wrap
    around where the chip allows it: a modelling choice, not the shape a scheduler gives."""
    chip = _resolve(chip)
    num_chips = whole_number(
        "num_chips", num_chips, fix="pass the chips of one slice", error=IciModelError
    )
    if chip.chips_per_pod is not None and num_chips > chip.chips_per_pod:
        raise IciModelError(
            f"{num_chips} chips exceed a {chip.name} pod ({chip.chips_per_pod}); plan several "
            "slices with `slices=` and a slice shape that fits a pod"
        )
    dims = cast(int, chip.torus_dimensions)  # _resolve refused a chip off a torus

    def shapes(count: int, left: int, smallest: int) -> list[tuple[int, ...]]:
        if left == 1:
            return [(count,)] if count >= smallest else []
        found = []
        for side in range(smallest, round(count ** (1 / left)) + 2):
            if count % side == 0:
                found += [(side, *rest) for rest in shapes(count // side, left - 1, side)]
        return found

    candidates = shapes(num_chips, dims, 1)
    if not candidates:
        raise IciModelError(f"no {dims}D slice shape has {num_chips} chips")

    def score(shape: tuple[int, ...]) -> tuple[int, int, int]:
        return (max(shape), -sum(chip.slice_wraps(shape)), -min(shape))

    return min(candidates, key=score)
