"""`tpuready.calc.buckets`: optimal bucket lengths, the padding they cost, the collate helper.

The property tests check what a reader relies on when choosing buckets: no other set of at most
`k` boundaries pads less (brute force on small inputs, random rivals on larger ones), every
length fits its bucket, enough buckets waste nothing, and more buckets never waste more.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.calc.buckets import (
    PaddingStats,
    bucket_for,
    optimal_buckets,
    pad_to_bucket,
    padded_tokens,
    padding_stats,
)

property_settings = settings(max_examples=150)

small_lengths = st.lists(st.integers(1, 40), min_size=1, max_size=12)
large_lengths = st.lists(st.integers(1, 2_000), min_size=1, max_size=400)


def brute_force_padding(lengths: list[int], k: int, multiple_of: int = 1) -> int:
    """The least padding over every set of at most k buckets drawn from the rounded lengths."""
    rounded = sorted({-(-length // multiple_of) * multiple_of for length in lengths})
    best = None
    for extra in range(min(k, len(rounded))):
        for chosen in itertools.combinations(rounded[:-1], extra):
            cost = padded_tokens(lengths, (*chosen, rounded[-1]))
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


# --- hand-worked cases --------------------------------------------------------------------------


def test_two_buckets_split_short_from_long() -> None:
    # Lengths 1, 2, 9, 10: buckets (2, 10) pad 1 + 1 = 2 tokens; (1, 10) would pad 8 + 1 = 9.
    assert optimal_buckets([1, 2, 9, 10], 2) == (2, 10)
    assert padded_tokens([1, 2, 9, 10], (2, 10)) == 2


def test_counts_weigh_in() -> None:
    # Five sequences of 3 and one of 4 with one bucket: all pad to 4, 5 tokens. With two:
    # (3, 4) pads nothing.
    assert optimal_buckets([3, 3, 3, 3, 3, 4], 1) == (4,)
    assert padded_tokens([3, 3, 3, 3, 3, 4], (4,)) == 5
    assert optimal_buckets([3, 3, 3, 3, 3, 4], 2) == (3, 4)


def test_a_crowd_pulls_the_middle_bucket() -> None:
    # Lengths 10, 20 (x10), 30, 100 with two buckets: the candidates are 10, 20 and 30 under 100;
    # 20 pads 10 + 0 + 70 + ... : bucket 20 -> 10 (the 10) + 70 (the 30) = 80,
    # bucket 30 -> 20 + 10 * 10 = 120, bucket 10 -> 10 * 80 + 70 = 870.
    lengths = [10, *[20] * 10, 30, 100]
    assert optimal_buckets(lengths, 2) == (20, 100)
    assert padded_tokens(lengths, (20, 100)) == 80


def test_multiple_of_rounds_up_first() -> None:
    # 100 and 130 round to 128 and 256; one bucket of 256 pads 156 + 126 tokens.
    assert optimal_buckets([100, 130], 1, multiple_of=128) == (256,)
    assert optimal_buckets([100, 130], 2, multiple_of=128) == (128, 256)
    assert padded_tokens([100, 130], (256,)) == 282


def test_one_length_one_bucket() -> None:
    assert optimal_buckets([7], 3) == (7,)
    assert optimal_buckets(np.array([5, 5, 5]), 1) == (5,)


def test_accepts_numpy_and_torch_and_returns_python_ints() -> None:
    from_numpy = optimal_buckets(np.array([4, 8, 8, 16], dtype=np.int32), 2)
    from_torch = optimal_buckets(torch.tensor([4, 8, 8, 16]), 2)
    assert from_numpy == from_torch == (8, 16)
    assert all(type(bucket) is int for bucket in from_numpy)


def test_bucket_for_picks_the_smallest_that_fits() -> None:
    assert bucket_for(1, (4, 8)) == 4
    assert bucket_for(4, (4, 8)) == 4
    assert bucket_for(5, (4, 8)) == 8
    assert bucket_for(8, (4, 8)) == 8


def test_padding_stats_counts_tokens_waste_and_shapes() -> None:
    stats = padding_stats([1, 3, 4, 8], (4, 8, 16))
    assert stats == PaddingStats(num_sequences=4, real_tokens=16, padded_tokens=4, num_shapes=2)
    assert stats.total_tokens == 20
    assert stats.waste == pytest.approx(0.2)


def test_pad_to_bucket_pads_right_and_masks() -> None:
    input_ids, attention_mask = pad_to_bucket([[5, 6, 7], [8]], (2, 4, 8), pad_value=0)
    assert input_ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert attention_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert input_ids.dtype == attention_mask.dtype == torch.long


def test_pad_to_bucket_pads_left_for_generation() -> None:
    input_ids, attention_mask = pad_to_bucket(
        [torch.tensor([5, 6]), torch.tensor([7])], (2, 4), pad_value=9, padding_side="left"
    )
    assert input_ids.tolist() == [[5, 6], [9, 7]]
    assert attention_mask.tolist() == [[1, 1], [0, 1]]


def test_pad_to_bucket_works_as_a_collate_fn() -> None:
    import functools

    from torch.utils.data import DataLoader

    sequences = [[1] * length for length in (3, 5, 2, 9, 4, 1)]
    collate = functools.partial(pad_to_bucket, buckets=(4, 8, 16), pad_value=0)
    loader = DataLoader(sequences, batch_size=2, collate_fn=collate)
    shapes = [tuple(input_ids.shape) for input_ids, _ in loader]
    assert shapes == [(2, 8), (2, 16), (2, 4)]


# --- errors that name the bad value --------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: optimal_buckets([1, 2], 0), "k must be at least 1, got 0"),
        (lambda: optimal_buckets([], 2), "lengths is empty"),
        (lambda: optimal_buckets([3, 0, 2], 2), "every length must be positive, got 0"),
        (lambda: optimal_buckets([3, -4], 2), "got -4"),
        (lambda: optimal_buckets([3, 4], 2, multiple_of=0), "multiple_of must be at least 1"),
        (lambda: optimal_buckets([1.5, 2.0], 1), "must be integers"),
        (lambda: optimal_buckets([[1, 2]], 1), "one-dimensional"),
        (lambda: optimal_buckets([1, 2], 1.0), "k must be a whole number, got 1.0"),
        (lambda: bucket_for(9, (4, 8)), "length 9 exceeds the largest bucket 8"),
        (lambda: bucket_for(0, (4, 8)), "length must be at least 1, got 0"),
        (lambda: bucket_for(3, (8, 4)), "strictly increasing"),
        (lambda: bucket_for(3, ()), "buckets is empty"),
        (lambda: padded_tokens([3, 12], (4, 8)), "length 12 exceeds the largest bucket 8"),
        (lambda: padding_stats([3, 12], (4, 8)), "truncate sequences to 8 tokens"),
        (lambda: pad_to_bucket([[1] * 9], (4, 8)), "length 9 exceeds the largest bucket 8"),
        (lambda: pad_to_bucket([], (4, 8)), "sequences is empty"),
        (lambda: pad_to_bucket([[1]], (4,), padding_side="middle"), "'middle'"),
    ],
)
def test_bad_input_raises_a_clear_error(call, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# --- properties ------------------------------------------------------------------------------


@property_settings
@given(small_lengths, st.integers(1, 5), st.sampled_from([1, 1, 2, 5]))
def test_no_set_of_k_boundaries_pads_less_than_the_optimum(
    lengths: list[int], k: int, multiple_of: int
) -> None:
    buckets = optimal_buckets(lengths, k, multiple_of=multiple_of)
    assert padded_tokens(lengths, buckets) == brute_force_padding(lengths, k, multiple_of)


@property_settings
@given(large_lengths, st.integers(1, 10), st.randoms(use_true_random=False))
def test_random_rival_boundaries_never_pad_less(
    lengths: list[int], k: int, rng: random.Random
) -> None:
    best = padded_tokens(lengths, optimal_buckets(lengths, k))
    longest = max(lengths)
    for _ in range(20):
        # Rivals: any k - 1 cut points (lengths that occur or not), plus the longest length.
        inner = {rng.randint(1, longest) for _ in range(k - 1)} | {longest}
        drawn = rng.sample(lengths, min(k - 1, len(lengths)))
        for rival in (sorted(inner), sorted(set(drawn) | {longest})):
            assert padded_tokens(lengths, rival) >= best, (rival, best)


@property_settings
@given(large_lengths, st.integers(1, 12), st.sampled_from([1, 8, 128]))
def test_every_length_fits_and_buckets_are_valid(
    lengths: list[int], k: int, multiple_of: int
) -> None:
    buckets = optimal_buckets(lengths, k, multiple_of=multiple_of)
    assert 1 <= len(buckets) <= k
    assert list(buckets) == sorted(set(buckets))
    assert all(bucket % multiple_of == 0 for bucket in buckets)
    assert buckets[-1] == -(-max(lengths) // multiple_of) * multiple_of
    for length in lengths:
        assert length <= bucket_for(length, buckets) < length + buckets[-1]


@property_settings
@given(large_lengths)
def test_enough_buckets_waste_nothing(lengths: list[int]) -> None:
    num_distinct = len(set(lengths))
    for k in (num_distinct, num_distinct + 3):
        buckets = optimal_buckets(lengths, k)
        assert buckets == tuple(sorted(set(lengths)))
        assert padded_tokens(lengths, buckets) == 0


@property_settings
@given(large_lengths, st.sampled_from([1, 16]))
def test_more_buckets_never_waste_more(lengths: list[int], multiple_of: int) -> None:
    wastes = [
        padded_tokens(lengths, optimal_buckets(lengths, k, multiple_of=multiple_of))
        for k in range(1, 10)
    ]
    assert all(later <= earlier for earlier, later in itertools.pairwise(wastes)), wastes


@property_settings
@given(large_lengths, st.lists(st.integers(1, 3_000), min_size=1, max_size=8))
def test_padding_stats_agree_with_bucket_for(lengths: list[int], extra: list[int]) -> None:
    buckets = tuple(sorted(set(extra) | {max(lengths)}))
    stats = padding_stats(lengths, buckets)
    used = {bucket_for(length, buckets) for length in lengths}
    assert stats.padded_tokens == sum(bucket_for(n, buckets) - n for n in lengths)
    assert stats.padded_tokens == padded_tokens(lengths, buckets)
    assert stats.real_tokens == sum(lengths)
    assert stats.num_shapes == len(used)
    assert 0 <= stats.waste < 1


def test_a_million_lengths_give_the_same_answer_as_a_histogram() -> None:
    # The solver works on distinct lengths and counts: repeating every length 1,000 times
    # (1e6 lengths in all, the benchmark's size) must not move the buckets.
    rng = np.random.default_rng(0)
    distinct = rng.integers(1, 5_000, size=1_000)
    assert optimal_buckets(np.repeat(distinct, 1_000), 8) == optimal_buckets(distinct, 8)
