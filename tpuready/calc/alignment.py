"""How well a matmul's dimensions fill a TPU's matrix unit (MXU), and the Hardware Alignment
Cheat Sheet.

Taught in `notebooks/18_hardware_friendly_dimensions.ipynb`. The MXU is a square systolic array
(`Chip.matrix_unit_shape` in `tpuready.calc.hardware`: 128x128 up to v5, 256x256 on v6e and v7).
For a matmul (m, k) @ (k, n) it holds a tile of the weight (k rows, n columns) and streams the
m rows of activations through it, `STREAMED_ROWS` (8) rows at a time, whatever the dtype: the
Scaling Book ("How to Think About TPUs") describes one bf16[8, 128] @ bf16[128, 128] -> f32[8,
128] product every 8 cycles.

The utilisation model, then:

- a weight dimension (k or n) is padded to whole tiles: `dim / (ceil(dim / tile) * tile)`
  (`tile_utilization`);
- the streamed dimension (m, the tokens) is padded to whole pushes of 8 rows
  (`streamed_utilization`): 100 tokens stream as 104 rows, 96 % useful;
- a matmul multiplies the three (`matmul_tile_utilization`).

That is a model of the tile work, not a measured MXU utilisation: which operand the compiler
(XLA) holds in the array is its choice, and a step with few tokens is limited by memory
bandwidth long before the tiles matter (`tpuready.calc.roofline`; chapter 21).

An array lies in HBM in XLA's TPU tiles of 8 x 128 elements of its last two dimensions, for
32-bit types (8,128), for bf16 (8,128)(2,1) and for int8 (8,128)(4,1), whose second tiling
packs two or four rows' values into one 32-bit word (XLA's "Tiled layout"). A dimension that is
not a multiple of its tile takes the padded size in HBM too (`layout_padded_shape`): a
[.., 100, 64] array occupies [.., 104, 128].

A layout fact that the model leaves alone: a vector register is 8 sublanes x 128 lanes of
32-bit words, so with that packing it holds 16 rows of bf16 (`rows_per_register`). The MXU
still takes 8 rows per push in this model. 64-bit types (float64, int64) have no packing: a
TPU computes in 32-bit words, and XLA rewrites 64-bit operations into several 32-bit ones
(`rows_per_register` refuses them and says so).

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
    "rows_per_register",
    "streamed_utilization",
    "tile_utilization",
]

_SCALING_BOOK_TPUS = "https://jax-ml.github.io/scaling-book/tpus/"
_PALLAS_TPU_DETAILS = "https://docs.jax.dev/en/latest/pallas/tpu/details.html"
_XLA_TILED_LAYOUT = "https://github.com/openxla/xla/blob/main/docs/tiled_layout.md"

STREAMED_ROWS = 8
"""Rows of activations the MXU takes per push, for every dtype in this model: one
bf16[8, 128] @ bf16[128, 128] -> f32[8, 128] product every 8 cycles (the Scaling Book, "How to
Think About TPUs", `_SCALING_BOOK_TPUS`). A token count that is a multiple of 8 fills them."""

SUBLANES, LANES = 8, 128
"""A TPU vector register: 8 sublanes x 128 lanes of 32-bit words (the Scaling Book; JAX's Pallas
TPU guide, `_PALLAS_TPU_DETAILS`). XLA lays an array out in HBM in tiles of 8 x 128 elements of
its last two dimensions, the last on the lanes, for every dtype this book uses (XLA's "Tiled
layout", `_XLA_TILED_LAYOUT`: (8,128), (8,128)(2,1) for bf16, (8,128)(4,1) for int8)."""

# Bytes per value -> values packed into one 32-bit word, from rows next to each other (XLA's
# "Tiled layout": the (2,1) and (4,1) second tilings of bf16 and int8).
_VALUES_PER_WORD = {4: 1, 2: 2, 1: 4}


class AlignmentError(InputError):
    """Raised for a dimension, tile or chip the alignment model cannot use."""


def _check_positive_int(name: str, value: object, fix: str) -> int:
    """`value` as an int if it is a whole number >= 1, else an `AlignmentError` naming it."""
    return whole_number(name, value, fix=fix, error=AlignmentError)


def rows_per_register(itemsize: int) -> int:
    """A layout fact, not the MXU's row count: rows of a dtype one vector register holds, its 8
    sublanes of 32-bit words packed (8 float32, 16 bf16, 32 int8), by bytes per value (a torch
    dtype's `itemsize`). The MXU still takes `STREAMED_ROWS` (8) per push. 8-byte values raise."""
    size = _check_positive_int(
        "itemsize", itemsize, "pass a dtype's itemsize: 2 for bf16, 4 for float32, 1 for int8"
    )
    if size == 8:
        raise AlignmentError(
            "itemsize 8 (float64, int64) does not pack into a TPU register: a TPU computes in "
            "32-bit words and XLA rewrites each 64-bit operation into several 32-bit ones; keep "
            "float64 off the device and int64 to the index tensors PyTorch requires it for"
        )
    if size not in _VALUES_PER_WORD:
        raise AlignmentError(
            f"itemsize must be one of {sorted(_VALUES_PER_WORD)}, got {size}: "
            "pass a dtype's itemsize: 2 for bf16, 4 for float32, 1 for int8"
        )
    return SUBLANES * _VALUES_PER_WORD[size]


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
    """The useful share of `rows` activations streamed through the MXU in pushes of
    `STREAMED_ROWS` (8), whatever the dtype: rows / (ceil(rows / 8) * 8); 100 tokens stream as
    104 rows."""
    _check_positive_int("rows", rows, "pass the tokens (rows) of a matmul, such as 100")
    return rows / round_up(rows, STREAMED_ROWS)


def matmul_tile_utilization(m: int, k: int, n: int, tile: int) -> float:
    """Model: the useful share of the MXU work of an (m, k) @ (k, n) matmul on a square tile.

    The weight (k, n) sits in the array in whole tiles and the m rows stream through it in
    pushes of 8: streamed_utilization(m) * tile_utilization(k) * tile_utilization(n). Which
    operand XLA holds in the array is its choice; this model holds the weight, as for a layer.
    """
    for name, value in (("m", m), ("k", k), ("n", n)):
        _check_positive_int(name, value, "pass a matmul dimension such as 4096")
    return streamed_utilization(m) * tile_utilization(k, tile) * tile_utilization(n, tile)


def layout_padded_shape(rows: int, columns: int) -> tuple[int, int]:
    """The last two dimensions of an array as XLA lays them out on a TPU: rows padded to the 8
    rows and columns to the 128 lanes of its (8, 128) tiles, for float32, bf16 and int8 alike
    (XLA tiles a second-to-last dimension of at most 4 by 2x128 or 4x128 instead)."""
    _check_positive_int("rows", rows, "pass the second-to-last dimension")
    _check_positive_int("columns", columns, "pass the last dimension")
    return round_up(rows, SUBLANES), round_up(columns, LANES)


def layout_utilization(rows: int, columns: int) -> float:
    """The share of its laid-out memory an array's last two dimensions use: a [.., 100, 64]
    array occupies [.., 104, 128], 48 % useful."""
    padded_rows, padded_columns = layout_padded_shape(rows, columns)
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
_TORCH_XLA_TROUBLESHOOTING = "https://github.com/pytorch/xla/blob/master/TROUBLESHOOTING.md"
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
        "128. In a forward matmul the MXU streams the tokens "
        f"{STREAMED_ROWS} rows at a time, but training's backward pass computes each weight's "
        "gradient as X^T dY, a matmul that contracts over the tokens, which then pad to whole "
        "tiles; a sequence length is also the last dimension of attention scores, on the 128 "
        "lanes, and the unit of bounded dynamism's buckets. So for training, make tokens per "
        "device a multiple of 128 (256 on v6e and v7); for inference a multiple of "
        f"{STREAMED_ROWS} fills the streamed rows.",
        "TorchTPU 0.2.0 documentation, shapes and alignment",
        _TORCHTPU_DOCS,
    ),
    (
        "The MXU holds a weight tile and streams the activations through it "
        f"{STREAMED_ROWS} rows at a time, whatever their dtype: one bf16[8, 128] @ "
        "bf16[128, 128] product every 8 cycles.",
        "How to Scale Your Model (the Scaling Book), 'How to Think About TPUs'",
        _SCALING_BOOK_TPUS,
    ),
    (
        "An array is laid out in HBM in tiles of "
        f"{SUBLANES} x {LANES} elements of its last two dimensions, its last dimension on the "
        f"{LANES} lanes, for float32, bf16 and int8 alike; bf16's tiling (8,128)(2,1) packs "
        "the values of two rows into each 32-bit word. So a last dimension of 64 takes the "
        f"memory of {LANES}. A layout fact that does not change the MXU's {STREAMED_ROWS} "
        f"rows per push: a vector register, {SUBLANES} sublanes of packed 32-bit words, holds "
        f"{rows_per_register(2)} rows of bf16.",
        "XLA documentation, 'Tiled layout' (TPU tile format, TPU 16 bit tile format)",
        _XLA_TILED_LAYOUT,
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
        "Keep int64 to the index tensors PyTorch requires it for. PyTorch makes token ids, "
        "`arange`, `argmax` and `randint` int64, and on CPU and CUDA `cross_entropy` takes "
        "class indices only as int64 (or uint8; it also takes float probabilities) and "
        "`one_hot` only as int64 (TorchTPU may lower them differently: try int32 on the "
        "device). On a TPU, 64-bit integer arithmetic is rewritten into 32-bit operations and "
        "is expensive. Index tensors are small beside the activations: leave them. Store the "
        "large integer tensors you build and compute on (token datasets, position or slot "
        "tables) as int32 when every value fits below 2**31, and keep int64 for counts that "
        "may pass it.",
        "PyTorch/XLA troubleshooting guide, `XLA_USE_32BIT_LONG`: 'On the versions of the TPU "
        "HW at the time of writing, 64bit integer computations are expensive'",
        _TORCH_XLA_TROUBLESHOOTING,
    ),
    (
        "Pad a vocabulary once, in the weights: "
        "`model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=256)`, then mask "
        "the padding logits to -inf (or slice them off) before sampling or the loss.",
        "transformers, `PreTrainedModel.resize_token_embeddings`",
        _RESIZE_DOCS,
    ),
    (
        "Pad sequence lengths to buckets that are multiples of 128 (chapter 17); TorchTPU's "
        "bounded dynamism pads to buckets of 128 by default (`bucket_size`), and its splash "
        "attention works in blocks of 512 by default.",
        "TorchTPU 0.2.0 documentation, torch.compile options and ops",
        _TORCHTPU_DOCS,
    ),
)
