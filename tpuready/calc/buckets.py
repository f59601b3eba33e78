"""Pad variable-length sequences to a few fixed lengths (buckets), chosen to waste the least.

Taught in `notebooks/17_padding_and_bucketing.ipynb` ("Pad and bucket sequences for static
shapes"). A compiler that specialises on shapes (TorchTPU compiles with `dynamic=False`) builds
one graph per distinct sequence length it sees; padding every sequence up to one of `k` bucket
lengths bounds the compiles at `k` and costs the padded tokens. `optimal_buckets` finds the `k`
lengths that minimise those padded tokens, exactly:

- Sort the distinct lengths `v_1 < ... < v_m` (counts `c_i`). An optimal bucket set only uses
  lengths that occur (lowering a bucket to the longest length it holds never adds padding), and
  each bucket holds a contiguous run of them, so covering `v_{i+1} .. v_j` with bucket `v_j` costs
  `v_j (C_j - C_i) - (S_j - S_i)` with prefix counts `C` and prefix token sums `S`.
- `f_t[j]`, the least padding for the `j` shortest distinct lengths with at most `t` buckets, is
  `min_i f_{t-1}[i] + cost(i, j)`. Its cost matrix is Monge (the term `-v_j C_i` has the sign
  pattern of one), so the best `i` never decreases with `j`, and each of the `k` rounds is solved
  by divide and conquer, one vectorised numpy pass per recursion level: `O(k m log m)` in exact
  integer arithmetic, after an `O(n log n)` sort of the `n` lengths.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tpuready.validate import InputError, one_of, whole_number

__all__ = [
    "BucketError",
    "PaddingStats",
    "bucket_for",
    "optimal_buckets",
    "pad_to_bucket",
    "padded_tokens",
    "padding_stats",
    "token_row",
]


class BucketError(InputError):
    """Raised for lengths, buckets or sequences that cannot be padded to buckets."""


@dataclass(frozen=True)
class PaddingStats:
    """What a set of buckets costs on a list of lengths.

    `num_shapes` is the number of buckets the lengths actually use: under `dynamic=False`, the
    number of graphs a compiler builds for them.
    """

    num_sequences: int
    real_tokens: int
    padded_tokens: int
    num_shapes: int

    @property
    def total_tokens(self) -> int:
        """Tokens the model computes on: real plus padding."""
        return self.real_tokens + self.padded_tokens

    @property
    def waste(self) -> float:
        """The share of computed tokens that are padding (0 means none)."""
        return self.padded_tokens / self.total_tokens


def _as_lengths(lengths: Iterable[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """Validated int64 array of positive sequence lengths."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    if not isinstance(lengths, np.ndarray):
        lengths = _as_list("lengths", lengths, "pass one length per sequence, such as [3, 9, 40]")
        for index, value in enumerate(lengths):
            if isinstance(value, bool | np.bool_):  # numpy would read True as the length 1
                whole_number(f"lengths[{index}]", value, fix="pass token counts", error=BucketError)
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise BucketError(
            f"lengths must be one-dimensional (one length per sequence), got shape {array.shape}"
        )
    if array.size == 0:
        raise BucketError("lengths is empty: pass at least one sequence length")
    if array.dtype.kind not in "iu":
        raise BucketError(
            f"lengths must be integers (token counts), got dtype {array.dtype}: "
            "convert them with int() or .astype(int)"
        )
    array = array.astype(np.int64, copy=False)
    smallest = int(array.min())
    if smallest < 1:
        raise BucketError(
            f"every length must be positive, got {smallest}: drop empty sequences first"
        )
    return array


def _as_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    """Validated buckets: positive integers in strictly increasing order."""
    values = tuple(_as_list("buckets", buckets, "pass bucket lengths, such as (128, 256)"))
    if not values:
        raise BucketError("buckets is empty: pass at least one bucket length")
    for index, value in enumerate(values):
        _check_positive_int(f"buckets[{index}]", value, "use whole token counts such as 128")
    if any(later <= earlier for earlier, later in itertools.pairwise(values)):
        raise BucketError(
            f"buckets must be strictly increasing, got {values}: pass sorted(set(buckets))"
        )
    return tuple(int(value) for value in values)


def _as_list(name: str, values: object, fix: str) -> list:
    """`values` as a list if it is a collection of values (not a str or a lone number), else a
    `BucketError` naming `name`, the value and `fix`."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise BucketError(
            f"{name} must be a sequence, got {values!r} ({type(values).__name__}): {fix}"
        )
    return list(values)


def _check_positive_int(name: str, value: int, fix: str) -> int:
    """`value` as an int if it is a whole number >= 1, else a `BucketError` naming it."""
    return whole_number(name, value, fix=fix, error=BucketError)


def _round_up(array: np.ndarray, multiple_of: int) -> np.ndarray:
    return -(-array // multiple_of) * multiple_of


def _leftmost_row_minima(
    intercepts: np.ndarray, slopes: np.ndarray, xs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each row r, min over columns i of `intercepts[i] - xs[r] * slopes[i]`, and its i.

    Valid when the leftmost minimising column never decreases with the row (a Monge matrix:
    `xs` increasing, `slopes` increasing). Divide and conquer, all subproblems of one recursion
    level evaluated in one vectorised pass, each level touching O(rows + columns) entries.
    """
    num_rows = xs.size
    best_column = np.empty(num_rows, dtype=np.int64)
    best_value = np.empty(num_rows, dtype=np.int64)
    row_lo = np.array([0], dtype=np.int64)
    row_hi = np.array([num_rows - 1], dtype=np.int64)
    col_lo = np.array([0], dtype=np.int64)
    col_hi = np.array([intercepts.size - 1], dtype=np.int64)
    while row_lo.size:
        mid = (row_lo + row_hi) // 2
        widths = col_hi - col_lo + 1
        starts = np.zeros(widths.size, dtype=np.int64)
        np.cumsum(widths[:-1], out=starts[1:])
        task = np.repeat(np.arange(widths.size), widths)
        columns = col_lo[task] + np.arange(int(widths.sum())) - starts[task]
        values = intercepts[columns] - xs[mid[task]] * slopes[columns]
        minima = np.minimum.reduceat(values, starts)
        # The first position in each task that reaches the task's minimum.
        hits = np.flatnonzero(values == minima[task])
        first_hit = hits[np.searchsorted(hits, starts)]
        chosen = columns[first_hit]
        best_column[mid] = chosen
        best_value[mid] = minima
        left = mid > row_lo
        right = mid < row_hi
        row_lo, row_hi, col_lo, col_hi = (
            np.concatenate([row_lo[left], mid[right] + 1]),
            np.concatenate([mid[left] - 1, row_hi[right]]),
            np.concatenate([col_lo[left], chosen[right]]),
            np.concatenate([chosen[left], col_hi[right]]),
        )
    return best_value, best_column


def optimal_buckets(
    lengths: Iterable[int] | np.ndarray | torch.Tensor, k: int, multiple_of: int = 1
) -> tuple[int, ...]:
    """The at most `k` bucket lengths that minimise the padded tokens of `lengths`, exactly.

    Every length is padded to the smallest bucket that holds it; the largest bucket is the
    longest length, so all fit. With `multiple_of`, lengths are first rounded up to a multiple of
    it (e.g. 128, the MXU's tile), so every bucket is one too. Returns the buckets in increasing
    order; fewer than `k` when fewer distinct (rounded) lengths exist.
    """
    _check_positive_int("k", k, "ask for at least one bucket")
    _check_positive_int("multiple_of", multiple_of, "use 1 for no rounding, or e.g. 128")
    array = _round_up(_as_lengths(lengths), int(multiple_of))
    values, counts = np.unique(array, return_counts=True)
    num_distinct = values.size
    if k >= num_distinct:
        return tuple(int(value) for value in values)
    prefix_counts = np.concatenate([[0], np.cumsum(counts)])
    prefix_sums = np.concatenate([[0], np.cumsum(counts * values)])
    # One bucket: f_1[j] = v_j C_j - S_j. Index j = 0 is the empty prefix (cost 0).
    cost = np.concatenate([[0], values * prefix_counts[1:] - prefix_sums[1:]])
    choices = []
    for _ in range(k - 1):
        # f_t[j] = v_j C_j - S_j + min_i (f_{t-1}[i] + S_i - v_j C_i). Every i, not only i < j:
        # i = j means "no new bucket" (at most t buckets), and i > j always costs more.
        minima, previous = _leftmost_row_minima(cost + prefix_sums, prefix_counts, values)
        cost = np.concatenate([[0], values * prefix_counts[1:] - prefix_sums[1:] + minima])
        choices.append(np.concatenate([[0], previous]))
    buckets = [int(values[-1])]
    end = num_distinct
    for previous in reversed(choices):
        start = int(previous[end])
        if start == 0:
            break
        if start < end:  # start == end: this round added no bucket
            buckets.append(int(values[start - 1]))
            end = start
    return tuple(sorted(buckets))


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `length` tokens."""
    _check_positive_int("length", length, "sequences must hold at least one token")
    checked = _as_buckets(buckets)
    index = bisect.bisect_left(checked, int(length))
    if index == len(checked):
        raise BucketError(
            f"length {length} exceeds the largest bucket {checked[-1]}: add a bucket of at "
            f"least {length} or truncate sequences to {checked[-1]} tokens"
        )
    return checked[index]


def _bucket_of_each(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
    longest = int(lengths.max())
    if longest > buckets[-1]:
        raise BucketError(
            f"length {longest} exceeds the largest bucket {buckets[-1]}: add a bucket of at "
            f"least {longest} or truncate sequences to {buckets[-1]} tokens"
        )
    table = np.asarray(buckets, dtype=np.int64)
    return table[np.searchsorted(table, lengths, side="left")]


def padded_tokens(
    lengths: Iterable[int] | np.ndarray | torch.Tensor, buckets: Sequence[int]
) -> int:
    """Padding tokens added when each length is padded to its bucket (`bucket_for`)."""
    array = _as_lengths(lengths)
    return int((_bucket_of_each(array, _as_buckets(buckets)) - array).sum())


def padding_stats(
    lengths: Iterable[int] | np.ndarray | torch.Tensor, buckets: Sequence[int]
) -> PaddingStats:
    """Real tokens, padding tokens, waste and the number of shapes (buckets used)."""
    array = _as_lengths(lengths)
    assigned = _bucket_of_each(array, _as_buckets(buckets))
    return PaddingStats(
        num_sequences=int(array.size),
        real_tokens=int(array.sum()),
        padded_tokens=int((assigned - array).sum()),
        num_shapes=int(np.unique(assigned).size),
    )


def token_row(name: str, row: object, error: type[InputError] = BucketError) -> torch.Tensor:
    """`row` as a 1-D long tensor of token ids, or `error` naming `name`: a float id would be
    truncated and a 2-D batch flattened into one long sequence, so both are refused."""
    try:
        ids = torch.as_tensor(row)
    except (TypeError, ValueError, RuntimeError) as failure:
        raise error(f"{name} must be a row of token ids, got {row!r}: {failure}") from None
    if ids.ndim != 1:
        raise error(
            f"{name} must be one row of token ids, got shape {tuple(ids.shape)}: "
            "pass a list of 1-D rows (iterate over the rows of a 2-D batch)"
        )
    if ids.numel() and (
        ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool
    ):
        raise error(
            f"{name} must hold integer token ids, got dtype {ids.dtype}: "
            "token ids are whole numbers (convert with .long() only if they really are)"
        )
    return ids.to(torch.long)


def pad_to_bucket(
    sequences: Sequence[Sequence[int] | torch.Tensor],
    buckets: Sequence[int],
    pad_value: int = 0,
    padding_side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token sequences into `[batch, bucket]`, padded to the bucket of the longest.

    Returns `(input_ids, attention_mask)`, the mask 1 on real tokens and 0 on padding, so the
    batch has one of `len(buckets)` shapes. Use it as a DataLoader `collate_fn` with
    `functools.partial(pad_to_bucket, buckets=..., pad_value=...)`.
    """
    one_of("padding_side", padding_side, ("right", "left"), error=BucketError)
    whole_number("pad_value", pad_value, minimum=0, fix="pass a token id", error=BucketError)
    if len(sequences) == 0:
        raise BucketError("sequences is empty: a batch needs at least one sequence")
    rows = [token_row(f"sequences[{index}]", sequence) for index, sequence in enumerate(sequences)]
    longest = max(row.numel() for row in rows)
    if longest == 0:
        raise BucketError("every sequence is empty: a batch needs at least one token")
    width = bucket_for(longest, buckets)
    input_ids = torch.full((len(rows), width), pad_value, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        span = (
            slice(0, row.numel()) if padding_side == "right" else slice(width - row.numel(), width)
        )
        input_ids[index, span] = row
        attention_mask[index, span] = 1
    return input_ids, attention_mask
