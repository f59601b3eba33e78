"""How well a dimension fills a TPU's matrix unit (MXU), and the Hardware Alignment Cheat Sheet.

Taught in `notebooks/13_hardware_friendly_dimensions.ipynb`. The MXU multiplies in square tiles
(`Chip.matrix_unit_shape` in `tpuready.hardware`: 128x128 up to v5, 256x256 on v6e and v7), so a
dimension that is not a whole number of tiles is padded, and the padding is computed for nothing.

The utilisation model, per dimension: `dim / (ceil(dim / tile) * tile)`, the useful share of the
padded size. For a matmul (m, k) @ (k, n) on a square tile the model multiplies the three
per-dimension utilisations. That is a simplification: which dimensions the compiler (XLA) maps
onto the array, and how finely it pads the dimension it streams through the array, are its
choices, not this model's; read the figures as the share of tile work that is useful if every
dimension is padded to whole tiles, not as a measured MXU utilisation.

`python -m tpuready.alignment` prints the cheat sheet page; `book/hardware-alignment-cheat-sheet.md`
is exactly that output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpuready import hardware
from tpuready.validate import InputError, whole_number

__all__ = [
    "COMMON_DIMENSIONS",
    "RULES_OF_THUMB",
    "AlignmentError",
    "PaddingAdvice",
    "cheat_sheet_markdown",
    "matmul_tile_utilization",
    "mxu_tile",
    "padded_dims",
    "recommend_padding",
    "round_up",
    "tile_utilization",
]

CHEAT_SHEET_COMMAND = "python -m tpuready.alignment > book/hardware-alignment-cheat-sheet.md"


class AlignmentError(InputError):
    """Raised for a dimension, tile or chip the alignment model cannot use."""


def _check_positive_int(name: str, value: object, fix: str) -> int:
    """`value` as an int if it is a whole number >= 1, else an `AlignmentError` naming it."""
    return whole_number(name, value, fix=fix, error=AlignmentError)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value`: the size a padded dimension has."""
    _check_positive_int("value", value, "pass a dimension size such as 151936")
    _check_positive_int("multiple", multiple, "pass a tile size such as 128 or 256")
    return -(-value // multiple) * multiple


def tile_utilization(dim: int, tile: int) -> float:
    """The useful share of a dimension padded to whole tiles: dim / (ceil(dim / tile) * tile).

    1.0 exactly for a multiple of the tile; 0.25 for a head dimension of 64 on a 256 tile.
    """
    _check_positive_int("dim", dim, "pass a dimension size such as 151936")
    _check_positive_int("tile", tile, "pass a tile size such as 128 or 256")
    return dim / round_up(dim, tile)


def matmul_tile_utilization(m: int, k: int, n: int, tile: int) -> float:
    """Model: the useful share of the tile work of an (m, k) @ (k, n) matmul on a square tile.

    The product of the three per-dimension utilisations, as if the compiler padded every
    dimension to whole tiles. A simplification: a real compiler chooses which dimensions map
    onto the array and may pad the streamed one more finely, so treat it as a model.
    """
    for name, value in (("m", m), ("k", k), ("n", n)):
        _check_positive_int(name, value, "pass a matmul dimension such as 4096")
    return tile_utilization(m, tile) * tile_utilization(k, tile) * tile_utilization(n, tile)


def mxu_tile(chip_name: str) -> int:
    """The side of `chip_name`'s square MXU tile from `tpuready.hardware` (128 or 256)."""
    chip = hardware.as_chip(chip_name, argument="chip_name", error=AlignmentError)
    shape = chip.matrix_unit_shape
    if shape is None:
        raise AlignmentError(
            f"{chip.name} has no MXU tile in tpuready.hardware "
            f"({chip.notes.get('matrix_unit_shape', 'no figure')}); pass a TPU such as 'v5e' "
            "or 'v7'"
        )
    rows, columns = shape
    if rows != columns:
        raise AlignmentError(f"{chip.name}: expected a square MXU, got {rows}x{columns}")
    return rows


def padded_dims(dims: Mapping[str, int], multiple: int) -> dict[str, int]:
    """Every named dimension rounded up to a multiple of `multiple`, in the given order."""
    _check_positive_int("multiple", multiple, "pass a tile size such as 128 or 256")
    padded = {}
    for name, size in dims.items():
        _check_positive_int(f"dims[{name!r}]", size, "pass a dimension size such as 4096")
        padded[name] = round_up(size, multiple)
    return padded


@dataclass(frozen=True)
class PaddingAdvice:
    """What padding one dimension to a multiple costs and what the model says it gains."""

    dim: int
    multiple: int
    padded: int
    utilization_before: float

    @property
    def extra(self) -> int:
        """How many padding entries (rows, tokens, columns) the padded size adds."""
        return self.padded - self.dim

    @property
    def extra_fraction(self) -> float:
        """The padding as a share of the original size (the memory a padded table adds)."""
        return self.extra / self.dim

    def __str__(self) -> str:
        if self.extra == 0:
            return f"{self.dim:,} is already a multiple of {self.multiple}: keep it"
        return (
            f"pad {self.dim:,} to a multiple of {self.multiple} -> {self.padded:,} "
            f"(+{self.extra:,}); utilisation {self.utilization_before:.2%} -> 100%"
        )


def recommend_padding(dim: int, multiple: int) -> PaddingAdvice:
    """The advice for one dimension: 'pad 151,936 to a multiple of 256 -> 152,064 (+128); ...'."""
    dim = _check_positive_int("dim", dim, "pass a dimension size such as 151936")
    multiple = _check_positive_int("multiple", multiple, "pass a tile size such as 128 or 256")
    return PaddingAdvice(
        dim=dim,
        multiple=multiple,
        padded=round_up(dim, multiple),
        utilization_before=tile_utilization(dim, multiple),
    )


# ---------------------------------------------------------------------------------------------
# The cheat sheet page. Every figure on it is computed here or read from `tpuready.hardware`.

# (kind, value, where it comes from). Model figures: each model's published config.json.
COMMON_DIMENSIONS: tuple[tuple[str, int, str], ...] = (
    ("vocabulary", 32_000, "Llama 2"),
    ("vocabulary", 50_257, "GPT-2"),
    ("vocabulary", 128_256, "Llama 3"),
    ("vocabulary", 151_936, "Qwen3"),
    ("head dim", 64, "GPT-2, Qwen2.5-0.5B"),
    ("head dim", 128, "Llama 2 and 3, Qwen3"),
    ("hidden size", 768, "GPT-2 small"),
    ("hidden size", 896, "Qwen2.5-0.5B"),
    ("hidden size", 4_096, "Llama 2 7B, Qwen3-235B-A22B"),
    ("FFN width", 1_536, "one Qwen3-235B-A22B expert"),
    ("FFN width", 11_008, "Llama 2 7B"),
    ("FFN width", 14_336, "Llama 3 8B"),
    ("tokens per batch", 100, "decoding 100 sequences, one token each"),
    ("tokens per batch", 4_096, "8 sequences of 512"),
    ("tokens per batch", 8_000, "8 sequences of 1,000"),
)

_TORCHTPU_DOCS = "https://torchtpu.readthedocs.io/"
_BFLOAT16_BLOG = (
    "https://cloud.google.com/blog/products/ai-machine-learning/"
    "bfloat16-the-secret-to-high-performance-on-cloud-tpus"
)
_JAX_FLOAT64_ISSUE = "https://github.com/jax-ml/jax/issues/19769"
_RESIZE_DOCS = (
    "https://huggingface.co/docs/transformers/main_classes/model"
    "#transformers.PreTrainedModel.resize_token_embeddings"
)

# (rule, source title, source URL).
RULES_OF_THUMB: tuple[tuple[str, str, str], ...] = (
    (
        "Make every dimension you choose (hidden size, FFN width, head dim x heads, tokens per "
        "batch) a multiple of 128, the MXU tile up to v5; a multiple of 256 fills the 256x256 "
        "tile of v6e and v7 as well.",
        "TorchTPU 0.2.0 documentation, shapes and alignment",
        _TORCHTPU_DOCS,
    ),
    (
        "Aim for more than 60 % MXU utilisation in the profiler; when it is low, pad dimensions "
        "to multiples of 128. The model on this page bounds the share of tile work that is "
        "useful; the profiler measures the rest (memory stalls, host gaps).",
        "TorchTPU 0.2.0 documentation, performance guidance ('low MXU utilization -> pad "
        "dimensions to multiples of 128')",
        _TORCHTPU_DOCS,
    ),
    (
        "Keep matmul inputs in bfloat16 and accumulate in float32: the MXU multiplies bf16 and "
        "accumulates in fp32. On TorchTPU a float32 matmul runs as one bf16 pass by default, and "
        '`torch.amp.autocast("tpu")` defaults to bfloat16.',
        "Google Cloud blog, 'BFloat16: The secret to high performance on Cloud TPUs'",
        _BFLOAT16_BLOG,
    ),
    (
        "Keep float64 off the TPU: the MXU multiplies bf16, and TPUs do not support many 64-bit "
        "operations. It usually arrives from NumPy (`torch.from_numpy` of a float64 array).",
        "JAX issue 19769, a JAX maintainer: 'TPU does not have support for many 64-bit operations'",
        _JAX_FLOAT64_ISSUE,
    ),
    (
        "Pad a vocabulary once, in the weights: "
        "`model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=256)`, then mask "
        "the padding logits to -inf (or slice them off) before sampling or the loss.",
        "transformers, `PreTrainedModel.resize_token_embeddings`",
        _RESIZE_DOCS,
    ),
    (
        "Pad sequence lengths to buckets that are multiples of 128 (chapter 12); TorchTPU's "
        "bounded dynamism pads to buckets of 128 by default (`bucket_size`), and its splash "
        "attention works in blocks of 512 by default.",
        "TorchTPU 0.2.0 documentation, torch.compile options and ops",
        _TORCHTPU_DOCS,
    ),
)

_TILES = (128, 256)


def _tile_rows() -> list[str]:
    rows = ["| Chip | Configuration | MXU tile | Source |", "|---|---|---|---|"]
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is None:
            cell = "—"
            source = f"not stated by {chip.vendor}"
        else:
            cell = "x".join(map(str, chip.matrix_unit_shape))
            source = f"[{chip.vendor}]({chip.sources['matrix_unit_shape']})"
        rows.append(f"| {chip.name} | {chip.configuration} | {cell} | {source} |")
    return rows


def _percent(value: float) -> str:
    """Two decimals, but never a rounded 100.00 % for a value below 1."""
    text = f"{value:.2%}"
    if value < 1 and text == "100.00%":
        text = ">99.99%"
    return text.replace("%", " %")


def _dimension_rows() -> list[str]:
    rows = [
        "| Dimension | Size | Example | On a 128 tile | On a 256 tile | Size padded to 256 |",
        "|---|---|---|---|---|---|",
    ]
    for kind, size, example in COMMON_DIMENSIONS:
        cells = [_percent(tile_utilization(size, tile)) for tile in _TILES]
        padded = round_up(size, 256)
        padded_cell = "already a multiple" if padded == size else f"{padded:,}"
        rows.append(f"| {kind} | {size:,} | {example} | {' | '.join(cells)} | {padded_cell} |")
    return rows


def _chips_by_tile() -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is not None:
            grouped.setdefault(chip.matrix_unit_shape[0], []).append(chip.name)
    return grouped


def cheat_sheet_markdown() -> str:
    """The whole cheat sheet page as MyST markdown, generated from `tpuready.hardware`."""
    by_tile = _chips_by_tile()
    tile_summary = "; ".join(
        f"{tile}x{tile} on {', '.join(names)}" for tile, names in sorted(by_tile.items())
    )
    qwen_advice = recommend_padding(151_936, 256)
    gpt2_advice = recommend_padding(50_257, 256)
    head_64 = matmul_tile_utilization(4_096, 64, 4_096, 256)
    lines = [
        "# Hardware alignment cheat sheet",
        "",
        "A TPU's matrix unit (MXU) multiplies in square tiles: "
        f"{tile_summary}. A dimension that is not a whole number of tiles is padded, and the "
        "padding is computed for nothing. This page gives each chip's tile, the share of tile "
        "work that common model dimensions make useful, and the rules of thumb with their "
        "sources. [Chapter 13](../notebooks/13_hardware_friendly_dimensions.ipynb) teaches "
        "all of it; the chips' other figures are on the "
        "[hardware figures](../notebooks/reference_hardware.ipynb) page.",
        "",
        "```{note}",
        "This page is generated from `tpuready.hardware` by `tpuready.alignment`, so its "
        f"numbers have one source. Regenerate it with `{CHEAT_SHEET_COMMAND}`; do not edit it "
        "by hand.",
        "```",
        "",
        "## The MXU tile of each chip",
        "",
        *_tile_rows(),
        "",
        f"Figures retrieved {hardware.RETRIEVED}. NVIDIA GPUs have no single tile to align to: "
        "their tensor-core instruction shapes vary by instruction and precision.",
        "",
        "## The utilisation model",
        "",
        "For one dimension padded to whole tiles:",
        "",
        "$$\\text{utilisation}(d, T) = \\frac{d}{\\lceil d / T \\rceil \\, T}$$",
        "",
        "and for a matmul $(m, k) \\times (k, n)$ on a $T \\times T$ tile, the model multiplies "
        "the three: $u(m, T)\\,u(k, T)\\,u(n, T)$. This is a model, not a measurement: which "
        "dimensions the compiler maps onto the array, and how finely it pads the dimension it "
        "streams through it, are XLA's choices. Read it as the share of tile work that is "
        f"useful if every dimension is padded to whole tiles. For example, attention scores "
        f"with a head dim of 64 contract over 64 of a 256 tile's rows: "
        f"`matmul_tile_utilization(4096, 64, 4096, 256)` = {head_64:.0%}, unless the compiler "
        "packs several heads into one tile.",
        "",
        "```python",
        "from tpuready.alignment import recommend_padding, tile_utilization",
        "",
        f"tile_utilization(50_257, 256)  # {tile_utilization(50_257, 256):.4f}",
        "print(recommend_padding(151_936, 256))",
        f"# {qwen_advice}",
        "print(recommend_padding(50_257, 256))",
        f"# {gpt2_advice}",
        "```",
        "",
        "## Common dimensions on 128 and 256 tiles",
        "",
        "Model figures from each model's published `config.json`. A vocabulary is set by the "
        "tokenizer: padding it adds rows that no real token uses (mask their logits), and in "
        "the model the tile work stays the same; what padding buys is a shape the compiler "
        "need not pad at every step and one that shards evenly. The dimensions you choose "
        "(hidden size, FFN width, tokens per batch) turn the padding into useful work when "
        "they are multiples. The head-dim rows are the worst case: a compiler can place "
        "several heads side by side in one tile, so change a head dim only when you design a "
        "model.",
        "",
        *_dimension_rows(),
        "",
        "## Rules of thumb",
        "",
        *[f"- {rule} Source: [{title}]({url})." for rule, title, url in RULES_OF_THUMB],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(cheat_sheet_markdown(), end="")
