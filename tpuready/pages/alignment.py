"""The hardware-alignment cheat sheet page, generated from `tpuready.calc.alignment`.

`python -m tpuready.pages.alignment` prints the page; `book/hardware-alignment-cheat-sheet.md`
is exactly that output, so every figure on it has one source.
"""

from __future__ import annotations

from tpuready.calc import hardware
from tpuready.calc.alignment import (
    COMMON_DIMENSIONS,
    LANES,
    RULES_OF_THUMB,
    STREAMED_ROWS,
    matmul_tile_utilization,
    recommend_padding,
    round_up,
    streamed_utilization,
    tile_utilization,
)
from tpuready.calc.roofline import Roofline
from tpuready.pages import markdown

__all__ = ["CHEAT_SHEET_COMMAND", "cheat_sheet_markdown"]

CHEAT_SHEET_COMMAND = "python -m tpuready.pages.alignment > book/hardware-alignment-cheat-sheet.md"

_TILES = (128, 256)


def _tile_table() -> str:
    rows = []
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is None:
            cell = "—"
            source = f"not stated by {chip.vendor}"
        else:
            cell = "x".join(map(str, chip.matrix_unit_shape))
            source = f"[{chip.vendor}]({chip.sources['matrix_unit_shape']})"
        rows.append((chip.name, chip.configuration, cell, source))
    return markdown.table(("Chip", "Configuration", "MXU tile", "Source"), rows)


def _percent(value: float) -> str:
    """Two decimals, but never a rounded 100.00 % for a value below 1; a no-break space
    before the sign keeps "100.00 %" on one line in a narrow table column."""
    text = f"{value:.2%}"
    if value < 1 and text == "100.00%":
        text = ">99.99%"
    return text.replace("%", "\N{NO-BREAK SPACE}%")


_STREAMED_KINDS = ("tokens per device",)
_VLLM_TPU_ATTENTION = "https://docs.vllm.ai/en/v0.10.0/api/vllm/v1/attention/backends/pallas.html"


def _advice(kind: str, size: int) -> str:
    """What to do with a dimension of this kind and size, for the cheat sheet's last column."""
    padded = round_up(size, 256)
    if kind in _STREAMED_KINDS:
        rows = (
            f"streams as {round_up(size, STREAMED_ROWS):,} rows"
            if size % STREAMED_ROWS
            else "fills the streamed rows"
        )
        fewest = [
            Roofline.from_chip(chip).min_tokens_for_compute_bound(8_192, 8_192)
            for chip in hardware.all_chips()
            if chip.matrix_unit_shape is not None
        ]
        if size < min(fewest):
            return f"{rows}; memory-bound on every TPU"
        if size >= max(fewest):
            return f"{rows}; compute-bound on every TPU"
        return f"{rows}; compute-bound only where it clears the ridge point"
    if kind == "head dim":
        if size % LANES:
            return (
                f"keep it; the 128-lane layout stores it as {round_up(size, LANES)} "
                "(vLLM's TPU KV cache pads it the same way)"
            )
        if size % 256:
            return "keep it: padding to 256 adds only zeros to compute"
        return "fills both"
    if padded == size:
        return "fills both"
    if kind == "vocabulary":
        return f"pad in the weights to {padded:,}"
    return f"compiler pads to {padded:,} (same tiles); a multiple of 256 for a new model"


def _dimension_table() -> str:
    rows = []
    for kind, size, example in COMMON_DIMENSIONS:
        if kind in _STREAMED_KINDS:
            held = f"streamed, {STREAMED_ROWS} rows a push"
            cells = [_percent(streamed_utilization(size))] * len(_TILES)
        elif kind == "head dim":
            held = "k of the scores, whole tiles"
            cells = [_percent(tile_utilization(size, tile)) for tile in _TILES]
        else:
            held = "weight, whole tiles"
            cells = [_percent(tile_utilization(size, tile)) for tile in _TILES]
        rows.append((kind, f"{size:,}", example, held, *cells, _advice(kind, size)))
    header = ("Dimension", "Size", "Example", "Held as")
    tiles = tuple(f"On a {tile} MXU" for tile in _TILES)
    return markdown.table((*header, *tiles, "Advice"), rows)


# The weights whose minimum tokens the cheat sheet lists: (label, k, n).
_TOKEN_WEIGHTS: tuple[tuple[str, int, int], ...] = (
    ("tokens per device, 8,192 x 8,192 weight", 8_192, 8_192),
    ("rows per expert, 4,096 x 1,536 (one Qwen3-235B-A22B expert)", 4_096, 1_536),
)


def _token_table() -> str:
    """Per TPU: the ridge point and the fewest tokens (rows) per bf16 matmul that reach it."""
    rows = []
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is None:
            continue
        line = Roofline.from_chip(chip)
        cells = [f"{line.min_tokens_for_compute_bound(k, n):,}" for _, k, n in _TOKEN_WEIGHTS]
        rows.append((chip.name, f"{line.ridge_point_flops_per_byte:,.0f}", *cells))
    header = ("Chip", "Ridge point (FLOPs per byte)", *(label for label, _, _ in _TOKEN_WEIGHTS))
    return markdown.table(header, rows)


def _chips_by_tile() -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for chip in hardware.all_chips():
        if chip.matrix_unit_shape is not None:
            grouped.setdefault(chip.matrix_unit_shape[0], []).append(chip.name)
    return grouped


def cheat_sheet_markdown() -> str:
    """The whole cheat sheet page as MyST markdown, generated from `tpuready.calc.hardware`."""
    by_tile = _chips_by_tile()
    tile_summary = "; ".join(
        f"{tile}x{tile} on {', '.join(names)}" for tile, names in sorted(by_tile.items())
    )
    qwen_advice = recommend_padding(151_936, 256)
    gpt2_advice = recommend_padding(50_257, 256)
    head_64 = matmul_tile_utilization(4_096, 64, 4_096, 256)
    decode = streamed_utilization(100)
    lines = [
        # A comment for maintainers, which MyST leaves out of the page a reader sees.
        "% Generated from tpuready.calc.hardware and tpuready.calc.alignment by",
        "% tpuready.pages.alignment, so its numbers have one source. Regenerate it with",
        f"% `{CHEAT_SHEET_COMMAND}`; do not edit it by hand.",
        "",
        "# Hardware alignment cheat sheet",
        "",
        "A TPU's matrix unit (MXU) is a square systolic array: "
        f"{tile_summary}. It holds a tile of a weight and streams the activations through it "
        f"{STREAMED_ROWS} rows at a time, whatever their dtype. A weight dimension that is not "
        "a whole number of tiles is padded, and a token count that is not a multiple of "
        f"{STREAMED_ROWS} streams padded rows; the padding is computed for nothing. This page "
        "gives each chip's tile, the share of the work that common model dimensions make "
        "useful, how many tokens per device a matmul needs to be compute-bound at all, and the "
        "rules of thumb with their sources. "
        "[Chapter 18](../notebooks/18_hardware_friendly_dimensions.ipynb) teaches all of it "
        "but the dtype rules, which "
        "[chapter 5](../notebooks/05_bfloat16_and_float32_matmuls.ipynb) teaches; "
        "the chips' other figures are on the "
        "[hardware figures](../notebooks/reference_hardware.ipynb) page.",
        "",
        "## The MXU tile of each chip",
        "",
        _tile_table(),
        "",
        f"Figures retrieved {hardware.RETRIEVED}. NVIDIA GPUs have no single tile to align to: "
        "their tensor-core instruction shapes vary by instruction and precision.",
        "",
        "## The utilisation model",
        "",
        "A weight dimension $d$ (the $k$ or $n$ of a matmul $(m, k) \\times (k, n)$) padded "
        "to whole tiles of side $T$, and the $m$ streamed rows padded to whole pushes of "
        f"{STREAMED_ROWS} rows:",
        "",
        "$$u(d, T) = \\frac{d}{\\lceil d / T \\rceil \\, T}, \\qquad "
        f"u_{STREAMED_ROWS}(m) = \\frac{{m}}{{\\lceil m / {STREAMED_ROWS} \\rceil \\, "
        f"{STREAMED_ROWS}}}$$",
        "",
        "and for the matmul, with the weight held in the array, "
        f"$u_{STREAMED_ROWS}(m)\\,u(k, T)\\,u(n, T)$. "
        "This is a model, not a measurement: which operand the compiler (XLA) holds in the "
        "array is its choice. Decoding 100 sequences streams "
        f"{round_up(100, STREAMED_ROWS)} rows, {decode:.0%} useful, and is still slow: it is "
        "memory-bound (next section). Attention scores with a head dim of 64 contract over 64 "
        "of a 256 array's rows: "
        f"`matmul_tile_utilization(4096, 64, 4096, 256)` = {head_64:.0%} in the model.",
        "",
        "```python",
        "from tpuready.calc.alignment import (",
        "    recommend_padding,",
        "    streamed_utilization,",
        "    tile_utilization,",
        ")",
        "",
        f"tile_utilization(50_257, 256)  # {tile_utilization(50_257, 256):.4f}",
        f"streamed_utilization(100)  # {decode:.4f}: {round_up(100, STREAMED_ROWS)} rows",
        "print(recommend_padding(151_936, 256))",
        f"# {qwen_advice}",
        "print(recommend_padding(50_257, 256))",
        f"# {gpt2_advice}",
        "```",
        "",
        "## Tokens per device for a compute-bound matmul",
        "",
        "A bf16 matmul of $m$ tokens with a $(k, n)$ weight does $2mkn$ FLOPs and moves "
        "$2(mk + kn + mn)$ bytes; it is compute-bound once that ratio reaches the chip's ridge "
        "point (peak bf16 FLOP/s over HBM bandwidth, from the hardware table). For a large "
        "weight the ratio is about $m$, so the fewest tokens per device is about the ridge point "
        "itself. Below it the step is memory-bound, whatever the tiles: "
        "`Roofline.from_chip(chip).min_tokens_for_compute_bound(k, n)` computes it, and "
        "[chapter 21](../notebooks/21_rooflines_and_mfu.ipynb) draws the rooflines. "
        "The count is per device, the unit that runs the matmul: a TPU v7 chip is two devices, "
        "each with half the chip's peak and bandwidth, so the same ridge point, and each "
        "needs that many rows. An expert's matmul sees only the rows routed to it, about "
        "tokens x k / E of a device's tokens times the expert-parallel degree (chapter 12): "
        "for Qwen3-235B-A22B (k = 8 of E = 128 experts) without expert parallelism, 16 times "
        "the expert column in tokens per device.",
        "",
        _token_table(),
        "",
        "## Common dimensions on 128 and 256 tiles",
        "",
        "Model figures from each model's published `config.json`. A vocabulary is set by the "
        "tokenizer: padding it adds rows that no real token uses (mask their logits), and in "
        "the model the tile work stays the same; what padding buys is a shape the compiler "
        "need not pad at every step and one that shards evenly. Padding a weight dimension "
        "never adds useful work: the tile count is the same. A head dim is a model's design; "
        "padding 128 to 256 would double the attention FLOPs and the KV cache with zeros. "
        f"Tokens are streamed, so their rows count in pushes of {STREAMED_ROWS} on every "
        "chip in a forward matmul (whole tiles in the weight-gradient matmul of training).",
        "",
        _dimension_table(),
        "",
        f"vLLM's TPU attention backend pads the head size of its KV cache to 128 "
        f"(`TPU_HEAD_SIZE_ALIGNMENT`, [vLLM]({_VLLM_TPU_ATTENTION})).",
        "",
        "## Rules of thumb",
        "",
        *[f"- {rule} Source: [{title}]({url})." for rule, title, url in RULES_OF_THUMB],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(cheat_sheet_markdown(), end="")
