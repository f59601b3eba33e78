"""tpuready.calc.serving: the bucket lists tpu-inference 0.32.0 builds, and what they compile.

The worked examples are the ones its wheel's own functions give (read and run by hand from
`tpu_inference/runner/utils.py`; the package is not installed here); the properties hold for
any setting.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc.serving import (
    KV_PAGE_SIZE,
    MIN_NUM_SEQS,
    PROMPT_RANGE,
    EngineBuckets,
    Request,
    ServingBucketError,
    attention_request_buckets,
    lognormal_stream,
    request_buckets,
    schedule,
    token_buckets,
)

POWERS_TO_16384 = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (512, POWERS_TO_16384[:6]),
        (8192, POWERS_TO_16384[:10]),
        (16384, POWERS_TO_16384),
        (16640, (*POWERS_TO_16384, 16640)),  # the budget, not 32768, is the last bucket
        (5000, (*POWERS_TO_16384[:9], 5008)),  # the budget rounded up to a multiple of 16
        (10, (16,)),
    ],
)
def test_token_buckets_double_from_16_and_end_at_the_budget(budget: int, expected) -> None:
    assert token_buckets(budget) == expected


def test_a_padding_gap_stops_the_doubling_and_steps_by_the_gap() -> None:
    buckets = token_buckets(8192, padding_gap=512)
    assert buckets[:6] == (16, 32, 64, 128, 256, 512)
    assert buckets[6:] == tuple(range(1024, 8193, 512))
    assert len(buckets) == 21


def test_compilation_sizes_are_added_as_given() -> None:
    assert token_buckets(512, compilation_sizes=[48, 512, 700]) == (
        16, 32, 48, 64, 128, 256, 512, 700,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [(256, (8, 16, 32, 64, 128, 256)), (100, (8, 16, 32, 64, 100)), (1, (8,)), (8, (8,))],
)
def test_request_buckets_double_from_8_and_end_at_max_num_seqs(max_num_seqs, expected) -> None:
    assert request_buckets(max_num_seqs) == expected


def test_attention_compiles_one_request_shape_unless_bucketized() -> None:
    assert attention_request_buckets(256) == (256,)
    assert attention_request_buckets(4) == (4,)  # attention takes max_num_seqs as it is
    assert attention_request_buckets(256, bucketized=True) == request_buckets(256)
    assert attention_request_buckets(256, bucketized=True, custom=[64, 8, 64]) == (8, 64, 256)
    assert attention_request_buckets(256, custom=[64]) == (256,)  # custom needs bucketized


@given(
    budget=st.integers(min_value=1, max_value=70_000),
    smallest=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    gap=st.sampled_from([0, 0, 16, 100, 512, 1000]),
)
def test_every_step_up_to_the_budget_has_a_bucket_that_never_passes_the_rounded_budget(
    budget: int, smallest: int, gap: int
) -> None:
    buckets = token_buckets(budget, min_bucket=smallest, padding_gap=gap)
    rounded = math.ceil(budget / smallest) * smallest
    assert list(buckets) == sorted(set(buckets))
    assert buckets[-1] == rounded
    if gap == 0 or gap >= smallest:  # a gap below the smallest bucket starts under it
        assert buckets[0] == min(smallest, rounded)
    if gap == 0:  # powers of two, then the budget
        assert all(size & (size - 1) == 0 for size in buckets[:-1])
    else:  # above the gap, buckets step by the gap until the rounded budget ends them
        above = [size for size in buckets if size > gap][:-1]
        assert all(b - a == gap for a, b in itertools.pairwise(above))


@given(st.integers(min_value=1, max_value=5000))
def test_request_buckets_cover_every_request_count(max_num_seqs: int) -> None:
    buckets = request_buckets(max_num_seqs)
    assert buckets[0] == MIN_NUM_SEQS and buckets[-1] == max(max_num_seqs, MIN_NUM_SEQS)
    assert all(b == 2 * a for a, b in itertools.pairwise(buckets[:-1]))


def test_an_engine_compiles_a_model_graph_per_token_bucket_by_default() -> None:
    engine = EngineBuckets.from_settings(max_num_batched_tokens=16384, max_num_seqs=256)
    # select: each request bucket (8 to 256) with each token bucket at least as large.
    select = 2 + 3 + 4 + 5 + 7 * 6
    assert engine.compiled_graphs() == {
        "model": 11,
        "logits": 6,
        "sampling": 24,
        "select": select,
    }
    bucketized = EngineBuckets.from_settings(16384, 256, {"ATTN_BUCKETIZED_NUM_REQS": "1"})
    assert bucketized.compiled_graphs()["model"] == 11 * 6


def test_environment_variables_change_the_buckets_as_the_engine_reads_them() -> None:
    engine = EngineBuckets.from_settings(
        8192,
        64,
        {
            "MIN_TOKEN_BUCKET": "64",
            "VLLM_TPU_BUCKET_PADDING_GAP": "2048",
            "ATTN_BUCKETIZED_NUM_REQS": "True",
            "ATTN_CUSTOM_NUM_REQS_BUCKETS": "8, 32",
        },
    )
    assert engine.tokens == (64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192)
    assert engine.attention_requests == (8, 32, 64)
    unset = EngineBuckets.from_settings(8192, 64, {"MIN_TOKEN_BUCKET": ""})  # `or "16"`
    assert unset.tokens[0] == 16


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({"MIN_TOKEN_BUCKET": "24"}, "power of two, got 24"),
        ({"MIN_TOKEN_BUCKET": "sixteen"}, "MIN_TOKEN_BUCKET='sixteen'"),
        ({"VLLM_TPU_BUCKET_PADDING_GAP": "-8"}, "got -8"),
        ({"VLLM_TPU_BUCKET_PADDING_GAP": ""}, "VLLM_TPU_BUCKET_PADDING_GAP=''"),
        ({"ATTN_BUCKETIZED_NUM_REQS": "yes"}, "ATTN_BUCKETIZED_NUM_REQS='yes'"),
        ({"ATTN_BUCKETIZED_NUM_REQS": " 1"}, "ATTN_BUCKETIZED_NUM_REQS=' 1'"),
        ({"ATTN_CUSTOM_NUM_REQS_BUCKETS": "8;32"}, "'8;32'"),
    ],
)
def test_a_setting_the_engine_refuses_is_named_with_its_value(environment, named) -> None:
    with pytest.raises(ServingBucketError, match=named):
        EngineBuckets.from_settings(8192, 64, environment)


def test_a_step_runs_at_the_first_bucket_at_or_above_each_count() -> None:
    engine = EngineBuckets.from_settings(16640, 256)
    assert engine.padded_step(1, 1) == (16, 8)  # one decode token
    assert engine.padded_step(200, 100) == (256, 128)
    assert engine.padded_step(16500, 3) == (16640, 8)  # a chunked prefill at the budget
    with pytest.raises(ServingBucketError, match="above the largest bucket, 16640"):
        engine.padded_step(20000, 8)
    with pytest.raises(ServingBucketError, match="9 requests cannot share 4 tokens"):
        engine.padded_step(4, 9)


def test_schedule_chunks_prompts_and_admits_first_come_first_served() -> None:
    """Worked by hand: a budget of 16 tokens and at most 2 running requests."""
    requests = [Request(0, 5, 3), Request(0, 40, 2), Request(1, 10, 1), Request(10, 4, 2)]
    ran = schedule(requests, max_num_batched_tokens=16, max_num_seqs=2)
    # Step 0: prompt 0 whole (5) and 11 of prompt 1. Step 1: a decode and 15 more of prompt 1.
    # Step 2: a decode and prompt 1's last 14; request 2 waits (2 running). Step 3: request 1's
    # decode and prompt 2. The engine idles until request 3 arrives at step 10.
    assert ran.step_tokens.tolist() == [16, 16, 15, 11, 4, 1]
    assert ran.step_requests.tolist() == [2, 2, 2, 2, 1, 1]
    assert ran.step_index.tolist() == [0, 1, 2, 3, 10, 11]
    assert ran.first_token_step.tolist() == [0, 2, 3, 10]
    assert ran.finish_step.tolist() == [2, 3, 3, 11]
    # The cache: step 0 holds 5 + 11 prompt tokens; step 1 request 0's first output fed back
    # and 15 more of prompt 1; step 2 its second output and prompt 1 whole; step 3 request 1's
    # first output and prompt 2; then request 3's prompt, and its first output.
    assert ran.step_kv_tokens.tolist() == [16, 32, 47, 51, 4, 5]


def test_decoding_requests_take_one_token_each() -> None:
    ran = schedule([Request(0, 1, 5)] * 4, max_num_batched_tokens=16, max_num_seqs=8)
    assert ran.step_tokens.tolist() == [4] * 5
    assert ran.finish_step.tolist() == [4] * 4


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 20), st.integers(1, 300), st.integers(1, 30)
    ),  # (arrival gap, prompt, output)
    min_size=1,
    max_size=40,
)


@given(
    raw=requests_strategy,
    budget=st.integers(1, 512),
    most_running=st.integers(1, 64),
)
def test_schedule_respects_its_limits_and_computes_every_token(
    raw: list[tuple[int, int, int]], budget: int, most_running: int
) -> None:
    most_running = min(most_running, budget)  # vLLM refuses a budget below it
    arrivals = list(itertools.accumulate(gap for gap, _, _ in raw))
    requests = [
        Request(arrival, prompt, output)
        for arrival, (_, prompt, output) in zip(arrivals, raw, strict=True)
    ]
    ran = schedule(requests, budget, most_running)
    assert ((ran.step_tokens >= 1) & (ran.step_tokens <= budget)).all()
    assert (ran.step_requests <= np.minimum(ran.step_tokens, most_running)).all()
    assert (np.diff(ran.step_index) > 0).all()
    # Every prompt token once, and one token per output after the first.
    assert ran.step_tokens.sum() == sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    first, finish = ran.first_token_step, ran.finish_step
    assert (first >= np.array(arrivals)).all()
    assert (finish - first >= np.array([r.output_tokens - 1 for r in requests])).all()
    assert (np.diff(first) >= 0).all(), "first come, first served"
    assert finish.max() == ran.step_index[-1]
    # The cache holds at least the step's tokens and at most every running request whole.
    longest = max(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    assert (ran.step_tokens <= ran.step_kv_tokens).all()
    assert (ran.step_kv_tokens <= most_running * longest).all()


def test_a_lognormal_stream_is_sorted_bounded_and_centred_on_its_medians() -> None:
    stream = lognormal_stream(4000, 0.5, 256, 128, seed=1)
    arrivals = [r.arrival_step for r in stream]
    prompts = np.array([r.prompt_tokens for r in stream])
    outputs = np.array([r.output_tokens for r in stream])
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] == pytest.approx(4000 / 0.5, rel=0.05)  # Poisson at 0.5 a step
    assert PROMPT_RANGE[0] <= prompts.min() and prompts.max() <= PROMPT_RANGE[1]
    assert np.median(prompts) == pytest.approx(256, rel=0.1)
    assert np.median(outputs) == pytest.approx(128, rel=0.1)
    assert lognormal_stream(4000, 0.5, 256, 128, seed=1) == stream  # the seed fixes it
    with pytest.raises(ServingBucketError, match="rate must be"):
        lognormal_stream(10, 0, 256, 128)


def test_schedule_names_what_it_cannot_use() -> None:
    with pytest.raises(ServingBucketError, match="sorted by arrival_step"):
        schedule([Request(5, 4, 1), Request(0, 4, 1)], 16, 4)
    with pytest.raises(ServingBucketError, match=r"request 1 is \(0, 4, 1\)"):
        schedule([Request(0, 4, 1), (0, 4, 1)], 16, 4)
    with pytest.raises(ServingBucketError, match="request 0: output_tokens must be"):
        schedule([Request(0, 4, 0)], 16, 4)
    with pytest.raises(ServingBucketError, match="max_num_seqs"):
        schedule([Request(0, 4, 1)], 16, 0)
    assert schedule([], 16, 4).step_tokens.size == 0


def test_a_budget_below_max_num_seqs_is_refused_as_vllm_refuses_it() -> None:
    """vLLM's SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs."""
    with pytest.raises(
        ServingBucketError, match=r"max_num_batched_tokens \(512\) must be at least"
    ):
        EngineBuckets.from_settings(512, 1024)
    with pytest.raises(ServingBucketError, match="max_num_seqs \\(8\\)"):
        schedule([Request(0, 4, 1)], 4, 8)
    assert EngineBuckets.from_settings(512, 512).requests[-1] == 512


def test_the_cache_is_counted_in_whole_pages_per_request() -> None:
    """The hand-worked schedule above, in pages: each request rounded up on its own."""
    requests = [Request(0, 5, 3), Request(0, 40, 2), Request(1, 10, 1), Request(10, 4, 2)]
    ran = schedule(requests, max_num_batched_tokens=16, max_num_seqs=2, page_size=16)
    # Step 2 holds 7 tokens of request 0 and 40 of request 1: 1 + 3 pages, not ceil(47/16) = 3.
    assert ran.step_kv_pages.tolist() == [2, 3, 4, 4, 1, 1]
    assert KV_PAGE_SIZE == 16  # vLLM 0.32.0's CacheConfig.DEFAULT_BLOCK_SIZE
    assert schedule(requests, 16, 2).step_kv_pages.tolist() == ran.step_kv_pages.tolist()
    one_token_pages = schedule(requests, 16, 2, page_size=1)
    assert one_token_pages.step_kv_pages.tolist() == one_token_pages.step_kv_tokens.tolist()


@given(raw=requests_strategy, page_size=st.integers(1, 512))
def test_pages_hold_the_tokens_and_waste_under_a_page_per_running_request(
    raw: list[tuple[int, int, int]], page_size: int
) -> None:
    arrivals = list(itertools.accumulate(gap for gap, _, _ in raw))
    requests = [
        Request(arrival, prompt, output)
        for arrival, (_, prompt, output) in zip(arrivals, raw, strict=True)
    ]
    ran = schedule(requests, 512, 16, page_size=page_size)
    slots = ran.step_kv_pages * page_size
    assert (slots >= ran.step_kv_tokens).all()
    assert (slots - ran.step_kv_tokens < page_size * 16).all()  # under a page per request
