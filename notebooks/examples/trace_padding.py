"""A masked mean compiled over a stream of batches, padded one way: to trace.

Chapter 17 runs it twice under `TORCH_TRACE` and reads each compilation
back with `tpuready.inspection.compile_trace.read_compilations`:

    TORCH_TRACE=traces/naive python examples/trace_padding.py naive
    TORCH_TRACE=traces/buckets python examples/trace_padding.py buckets

"naive" pads each batch to its longest sequence, "buckets" to one of three
bucket lengths. The stream's batches have ten different longest lengths,
more than Dynamo's default `recompile_limit` of 8, so the naive run shows
what the limit does: the ninth width's attempt fails, and from then on new
widths run eagerly (widths already compiled keep their graphs).
"""

from __future__ import annotations

import sys

import torch

from tpuready.calc.buckets import pad_to_bucket

# Sequence lengths of the stream's batches, two sequences each.
LENGTH_STREAM = [
    (5, 9),
    (12, 21),
    (30, 2),
    (7, 16),
    (40, 33),
    (11, 3),
    (25, 4),
    (6, 27),
    (13, 8),
    (35, 19),
]
BUCKETS = (16, 32, 48)


def masked_mean(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The mean token id over real tokens: a stand-in for a loss."""
    mask = attention_mask.float()
    return (input_ids.float() * mask).sum() / mask.sum()


def run(strategy: str) -> None:
    """Compile `masked_mean` with dynamic=False, as TorchTPU does, and feed
    it the stream padded by `strategy`."""
    if strategy not in ("naive", "buckets"):
        raise SystemExit(
            f"strategy must be 'naive' or 'buckets', got {strategy!r}"
        )
    compiled = torch.compile(masked_mean, backend="aot_eager", dynamic=False)
    for lengths in LENGTH_STREAM:
        sequences = [torch.arange(1, length + 1) for length in lengths]
        buckets = (max(lengths),) if strategy == "naive" else BUCKETS
        compiled(*pad_to_bucket(sequences, buckets))


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "buckets")
