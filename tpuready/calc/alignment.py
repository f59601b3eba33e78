"""How well a matmul's dimensions fill a TPU's matrix unit (MXU), and the Hardware Alignment
Cheat Sheet.

Taught in `notebooks/13_hardware_friendly_dimensions.ipynb`. The MXU is a square systolic array
(`Chip.matrix_unit_shape` in `tpuready.calc.hardware`: 128x128 up to v5, 256x256 on v6e and v7).
For a matmul (m, k) @ (k, n) it holds a tile of the weight (k rows, n columns) and streams the
m rows of activations through it, 8 rows at a time: the Scaling Book ("How to Think About
TPUs") describes one bf16[8, 128] @ bf16[128, 128] -> f32[8, 128] product every 8 cycles.

The utilisation model, then:

- a weight dimension (k or n) is padded to whole tiles: `dim / (ceil(dim / tile) * tile)`
  (`tile_utilization`);
- the streamed dimension (m, the tokens) is padded to whole groups of 8 rows
  (`streamed_utilization`): 100 tokens stream as 104 rows, 96 % useful;
- a matmul multiplies the three (`matmul_tile_utilization`).

That is a model of the tile work, not a measured MXU utilisation: which operand the compiler
(XLA) holds in the array is its choice, and a step with few tokens is limited by memory
bandwidth long before the tiles matter (`tpuready.calc.roofline`; chapter 15). Arrays are also laid
out in memory in tiles of 8 x 128 32-bit values, the last dimension on 128 lanes and the
second-to-last on 8 sublanes (`layout_padded_shape`); a dimension that is not a multiple takes
the padded size in HBM too.

`tpuready.pages.alignment` renders these figures as the cheat sheet page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpuready.calc import hardware
from tpuready.validate import InputError, whole_number

__all__ = [
    "COMMON_DIMENSIONS",
    "LANES",
    "RULES_OF_THUMB",
    "STREAMED_ROWS",
    "SUBLANES",
    "AlignmentError",
    "PaddingAdvice",
    "layout_padded_shape",
    "layout_utilization",
    "matmul_tile_utilization",
    "mxu_tile",
    "padded_dims",
    "recommend_padding",
    "round_up",
    "streamed_utilization",
    "tile_utilization",
]

_SCALING_BOOK_TPUS = "https://jax-ml.github.io/scaling-book/tpus/"
_PALLAS_TPU_DETAILS = "https://docs.jax.dev/en/latest/pallas/tpu/details.html"

STREAMED_ROWS = 8
"""Rows of activations the MXU takes per step: one bf16[8, 128] @ bf16[128, 128] product every
8 cycles (the Scaling Book, "How to Think About TPUs", `_SCALING_BOOK_TPUS`). bf16 arrays are
laid out 16 rows to a memory tile (two per sublane, `layout_padded_shape`), so a multiple of 16
rows fills both the streamed rows and the layout."""

SUBLANES, LANES = 8, 128
"""A TPU vector register and memory tile: 8 sublanes x 128 lanes of 32-bit values, so an
array's last two dimensions are padded to multiples of 8 and 128 (JAX's Pallas TPU guide,
`_PALLAS_TPU_DETAILS`). Narrower dtypes pack several rows into a sublane (bf16: two)."""


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


def streamed_utilization(rows: int) -> float:
    """The useful share of `rows` activations streamed through the MXU in groups of
    `STREAMED_ROWS` (8): rows / (ceil(rows / 8) * 8); 100 tokens stream as 104 rows."""
    _check_positive_int("rows", rows, "pass the tokens (rows) of a matmul, such as 100")
    return rows / round_up(rows, STREAMED_ROWS)


def matmul_tile_utilization(m: int, k: int, n: int, tile: int) -> float:
    """Model: the useful share of the MXU work of an (m, k) @ (k, n) matmul on a square tile.

    The weight (k, n) sits in the array in whole tiles and the m rows stream through it in
    groups of 8: streamed_utilization(m) * tile_utilization(k) * tile_utilization(n). Which
    operand XLA holds in the array is its choice; this model holds the weight, as for a layer.
    """
    for name, value in (("m", m), ("k", k), ("n", n)):
        _check_positive_int(name, value, "pass a matmul dimension such as 4096")
    return streamed_utilization(m) * tile_utilization(k, tile) * tile_utilization(n, tile)


def layout_padded_shape(rows: int, columns: int, rows_per_sublane: int = 1) -> tuple[int, int]:
    """The last two dimensions of an array as a TPU lays them out: columns on 128 lanes,
    rows on 8 sublanes (`rows_per_sublane` 2 for bf16, which packs two rows per sublane)."""
    _check_positive_int("rows", rows, "pass the second-to-last dimension")
    _check_positive_int("columns", columns, "pass the last dimension")
    _check_positive_int("rows_per_sublane", rows_per_sublane, "1 for 32-bit values, 2 for bf16")
    return round_up(rows, SUBLANES * rows_per_sublane), round_up(columns, LANES)


def layout_utilization(rows: int, columns: int, rows_per_sublane: int = 1) -> float:
    """The share of its laid-out memory an array's last two dimensions use: a [.., 100, 64]
    float32 array occupies [.., 104, 128], 48 % useful."""
    padded_rows, padded_columns = layout_padded_shape(rows, columns, rows_per_sublane)
    return rows * columns / (padded_rows * padded_columns)


def mxu_tile(chip_name: str) -> int:
    """The side of `chip_name`'s square MXU tile from `tpuready.calc.hardware` (128 or 256)."""
    chip = hardware.as_chip(chip_name, argument="chip_name", error=AlignmentError)
    shape = chip.matrix_unit_shape
    if shape is None:
        raise AlignmentError(
            f"{chip.name} has no MXU tile in tpuready.calc.hardware "
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
    if not isinstance(dims, Mapping):
        raise AlignmentError(
            f"dims must map names to sizes, got {dims!r}: pass e.g. {{'vocab': 151936}}"
        )
    padded = {}
    for name, size in dims.items():
        _check_positive_int(f"dims[{name!r}]", size, "pass a dimension size such as 4096")
        padded[name] = round_up(size, multiple)
    return padded


@dataclass(frozen=True)
class PaddingAdvice:
    """What padding one dimension to a multiple costs. In the tile model it gains no useful
    work (the compiler pads to the same tiles anyway); it makes the padded shape explicit,
    so the compiler need not pad at every step, and lets the dimension shard evenly."""

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
        tiles = self.padded // self.multiple
        return (
            f"pad {self.dim:,} -> {self.padded:,} (+{self.extra:,}), multiple of "
            f"{self.multiple}: same {tiles:,} tiles, {self.utilization_before:.2%} useful"
        )


def recommend_padding(dim: int, multiple: int) -> PaddingAdvice:
    """The advice for one dimension: 'pad 151,936 -> 152,064 (+128), multiple of 256: same 594
    tiles, 99.92% useful' (useful either way: padding moves no tile boundary)."""
    dim = _check_positive_int("dim", dim, "pass a dimension size such as 151936")
    multiple = _check_positive_int("multiple", multiple, "pass a tile size such as 128 or 256")
    return PaddingAdvice(
        dim=dim,
        multiple=multiple,
        padded=round_up(dim, multiple),
        utilization_before=tile_utilization(dim, multiple),
    )


# ---------------------------------------------------------------------------------------------
# The cheat sheet page. Every figure on it is computed here or read from `tpuready.calc.hardware`.

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
    ("tokens per device", 100, "decoding 100 sequences, one token each"),
    ("tokens per device", 4_096, "8 sequences of 512"),
    ("tokens per device", 8_000, "8 sequences of 1,000"),
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
        "Make the weight dimensions you choose (hidden size, FFN width, heads x head dim) "
        "multiples of 128, the MXU tile up to v5; a multiple of 256 fills the 256x256 tile of "
        "v6e and v7 as well. TorchTPU's guide also says to pad token counts to multiples of "
        "128. In a forward matmul the MXU streams tokens 8 rows at a time, but training's "
        "backward pass computes each weight's gradient as X^T dY, a matmul that contracts "
        "over the tokens, which then pad to whole tiles; a sequence length is also the last "
        "dimension of attention scores, on the 128 lanes, and the unit of bounded dynamism's "
        "buckets. So for training, make tokens per device a multiple of 128 (256 on v6e and "
        "v7); for inference a multiple of 8 (16 in bf16) fills the streamed rows.",
        "TorchTPU 0.2.0 documentation, shapes and alignment",
        _TORCHTPU_DOCS,
    ),
    (
        "The MXU holds a weight tile and streams activations through it, one bf16[8, 128] @ "
        "bf16[128, 128] product every 8 cycles: a token count that is a multiple of 8 fills "
        "the streamed rows. An array's last two dimensions are laid out on 8 sublanes x 128 "
        "lanes (32-bit values), so a last dimension of 64 takes the memory of 128.",
        "How to Scale Your Model (the Scaling Book), 'How to Think About TPUs'; JAX, Pallas "
        "TPU guide",
        _SCALING_BOOK_TPUS,
    ),
    (
        "Give each device at least its ridge point in tokens per matmul (the table above): "
        "below it a step is memory-bound, its time the weight bytes over the HBM bandwidth, "
        "and a fuller tile does not make it faster. Decoding a few sequences is always there; "
        "batch more sequences per device, not wider tiles.",
        "How to Scale Your Model (the Scaling Book), 'All About Rooflines'",
        "https://jax-ml.github.io/scaling-book/roofline/",
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
        "Keep float64 off the TPU. The MXU multiplies bf16; XLA runs 64-bit types on a TPU by "
        "rewriting them into 32-bit operations, which is slow, and fails to compile an "
        "operation it has no rewrite for (JAX issues 11831, sort, and 30629, nextafter). It "
        "usually arrives from NumPy (`torch.from_numpy` of a float64 array).",
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
