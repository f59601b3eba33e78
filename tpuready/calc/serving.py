"""The shapes a TPU serving engine compiles: vLLM's token and request buckets, modelled.

A TPU compiles one program per input shape, so vLLM's TPU runner pads each step's scheduled
tokens and its number of requests up to a few bucket sizes and compiles every bucket at start-up.
This module rebuilds those bucket lists, in our own code, from the rules of the released
`tpu-inference` 0.32.0 package (the runner that `vllm-tpu` 0.32.0 installs; vLLM-TorchTPU
0.29.0 follows the same scheme), so a reader can count the graphs an engine will compile and the
padding a request stream will pay without a TPU:

- Token buckets (`tpu_inference/runner/utils.py`, `build_token_paddings`): powers of two from
  `MIN_TOKEN_BUCKET` (16) up to the step's token budget, `max_num_batched_tokens`, and the budget
  itself (rounded up to a multiple of the smallest bucket), so no step is padded past the budget.
  With `VLLM_TPU_BUCKET_PADDING_GAP=g` the doubling stops at `g` and the buckets then grow by `g`.
  Sizes given as `additional_config={"compilation_sizes": [...]}` are added as they are.
- Request buckets (`get_req_paddings`): powers of two from 8 (`MIN_NUM_SEQS`) up to
  `max_num_seqs`, which is always the last; they shape sampling and the logits.
- Attention request buckets (`get_attn_req_paddings`): only `max_num_seqs` by default;
  `ATTN_BUCKETIZED_NUM_REQS=1` uses the request buckets, `ATTN_CUSTOM_NUM_REQS_BUCKETS=a,b` a list
  of its own (with `max_num_seqs` added).
- Precompilation (`runner/compilation_manager.py`): one model graph per token bucket and
  attention request bucket, one logits graph per request bucket, four sampling graphs per
  request bucket (with and without sampling, with and without log-probabilities), and one
  `select_from_array` graph (the gather of each request's last hidden state before the logits)
  per token bucket and request bucket no larger than it. Prefill and decode share the model
  graphs: the ragged paged attention kernel splits a mixed batch at run time. The other helpers
  (log-probability gathers, structured decoding, async scheduling's token substitution,
  speculative decoding), whose number depends on the release and the features on, are not
  counted here, so the count is a lower bound.

- The steps a stream of requests makes (`schedule`): vLLM's V1 scheduler (`vllm/v1/core/sched/
  scheduler.py`, 0.32.0) first gives each running request its next tokens (one while decoding,
  the rest of its prompt while prefilling), then admits waiting requests first come, first
  served, while token budget is left and fewer than `max_num_seqs` run; a prompt longer than
  what is left is split across steps (chunked prefill). The last prompt chunk's step samples the
  first output token, and each later step one more. Each step's KV cache holds every running
  request's computed prompt tokens and the outputs fed back so far (`step_kv_tokens`), and the
  pages they fill: the cache is allocated in pages (blocks) of `page_size` tokens, each request's
  tokens rounded up to whole pages (`step_kv_pages`; `KV_PAGE_SIZE`, 16 by default).
- A modelled stream (`lognormal_stream`): Poisson arrivals, log-normal prompt and output lengths.

The model is for one data-parallel rank (`dp_size` 1). Read from the wheels, not run on a TPU:
a later release may change any of it. The schedule leaves out prefix caching, speculative
decoding and preemption (it assumes the KV cache holds every admitted request).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tpuready.validate import InputError, number, whole_number

__all__ = [
    "KV_PAGE_SIZE",
    "MIN_NUM_SEQS",
    "MIN_TOKEN_BUCKET",
    "OUTPUT_RANGE",
    "OUTPUT_SIGMA",
    "PROMPT_RANGE",
    "PROMPT_SIGMA",
    "EngineBuckets",
    "Request",
    "Schedule",
    "ServingBucketError",
    "attention_request_buckets",
    "lognormal_stream",
    "request_buckets",
    "schedule",
    "token_buckets",
]

MIN_TOKEN_BUCKET = 16
"""tpu-inference 0.32.0's default smallest token bucket (`MIN_TOKEN_BUCKET`, envs.py)."""

MIN_NUM_SEQS = 8
"""tpu-inference 0.32.0's smallest request bucket (`MIN_NUM_SEQS`, runner/utils.py)."""

KV_PAGE_SIZE = 16
"""vLLM 0.32.0's default KV cache block size in tokens (`CacheConfig.DEFAULT_BLOCK_SIZE`,
vllm/config/cache.py). A platform may pick another, and tpu-inference may choose differently:
read the block size from the server's configuration log, or set it with `--block-size`."""

SAMPLING_GRAPHS_PER_REQUEST_BUCKET = 4
"""Sampling compiles with and without sampling, each with and without log-probabilities."""


class ServingBucketError(InputError):
    """A bucket setting the engine would refuse or cannot use; the message names the value."""


def _power_of_two(name: str, value: object, fix: str) -> int:
    number = whole_number(name, value, fix=fix, error=ServingBucketError)
    if number & (number - 1):
        raise ServingBucketError(f"{name} must be a power of two, got {number}: {fix}")
    return number


def token_buckets(
    max_num_batched_tokens: int,
    *,
    min_bucket: int = MIN_TOKEN_BUCKET,
    padding_gap: int = 0,
    compilation_sizes: Iterable[int] = (),
) -> tuple[int, ...]:
    """The token counts a step is padded to, smallest first, as tpu-inference 0.32.0 builds them
    from the budget, `MIN_TOKEN_BUCKET`, `VLLM_TPU_BUCKET_PADDING_GAP` and `compilation_sizes`."""
    budget_in = whole_number(
        "max_num_batched_tokens",
        max_num_batched_tokens,
        fix="pass the engine's --max-num-batched-tokens",
        error=ServingBucketError,
    )
    smallest = _power_of_two(
        "min_bucket (MIN_TOKEN_BUCKET)", min_bucket, "the engine asserts it; 16 is the default"
    )
    gap = whole_number(
        "padding_gap (VLLM_TPU_BUCKET_PADDING_GAP)",
        padding_gap,
        fix="0 for powers of two, or the step between buckets",
        minimum=0,
        error=ServingBucketError,
    )
    extra = {
        whole_number(
            "compilation_sizes entry", size, fix="list token counts", error=ServingBucketError
        )
        for size in compilation_sizes
    }
    generated = []
    size = smallest
    if gap == 0:
        while True:
            generated.append(size)
            if size >= budget_in:
                break
            size *= 2
    else:
        while size <= gap:
            generated.append(size)
            size *= 2
        size //= 2
        while size < budget_in:
            size += gap
            generated.append(size)
    budget = -(-budget_in // smallest) * smallest  # rounded up to a multiple of the smallest
    return tuple(sorted({s for s in generated if s <= budget} | {budget} | extra))


def _request_ladder(most: int) -> list[int]:
    """Powers of two from 8, capped at `most`, which ends the list (tpu-inference's
    `get_req_paddings` with the smallest bucket at 8); empty when `most` is below 8."""
    ladder: list[int] = []
    size = MIN_NUM_SEQS
    while size <= most and (not ladder or ladder[-1] != size):
        ladder.append(size)
        size = min(1 << size.bit_length(), most)  # the next power of two, capped
    return ladder


def _max_num_seqs(value: object) -> int:
    return whole_number(
        "max_num_seqs", value, fix="pass the engine's --max-num-seqs", error=ServingBucketError
    )


def request_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The request counts a step is padded to for sampling and the logits: powers of two from 8
    up to `max(max_num_seqs, 8)`, which is always the last."""
    return tuple(_request_ladder(max(_max_num_seqs(max_num_seqs), MIN_NUM_SEQS)))


def attention_request_buckets(
    max_num_seqs: int, *, bucketized: bool = False, custom: Sequence[int] = ()
) -> tuple[int, ...]:
    """The request counts attention compiles for: `max_num_seqs` alone by default; with
    `ATTN_BUCKETIZED_NUM_REQS=1`, powers of two from 8 or the `custom` list
    (`ATTN_CUSTOM_NUM_REQS_BUCKETS`, read only then), with `max_num_seqs` always added. A size
    listed twice counts once."""
    most = _max_num_seqs(max_num_seqs)
    if not bucketized:
        return (most,)
    sizes = {
        whole_number(
            "ATTN_CUSTOM_NUM_REQS_BUCKETS entry",
            size,
            fix="list request counts, such as 8,64",
            error=ServingBucketError,
        )
        for size in custom
    }
    return tuple(sorted((sizes or set(_request_ladder(most))) | {most}))


def _check_budget_holds_the_requests(budget: int, most: int) -> None:
    if budget < most:
        raise ServingBucketError(
            f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({most}): vLLM "
            "refuses a budget that cannot give every running request a token; raise "
            "--max-num-batched-tokens or lower --max-num-seqs"
        )


def _bucket_above(buckets: Sequence[int], count: int, what: str) -> int:
    index = bisect.bisect_left(buckets, count)
    if index == len(buckets):
        raise ServingBucketError(
            f"a step of {count} {what} is above the largest bucket, {buckets[-1]}: the engine's "
            "scheduler never schedules more than its budget"
        )
    return buckets[index]


@dataclass(frozen=True)
class EngineBuckets:
    """Every bucket list of one engine configuration, and what it compiles."""

    tokens: tuple[int, ...]
    requests: tuple[int, ...]
    attention_requests: tuple[int, ...]

    @classmethod
    def from_settings(
        cls,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        environment: Mapping[str, str] | None = None,
        compilation_sizes: Iterable[int] = (),
    ) -> EngineBuckets:
        """The buckets an engine started with these flags and environment variables builds."""
        _check_budget_holds_the_requests(
            whole_number(
                "max_num_batched_tokens",
                max_num_batched_tokens,
                fix="pass the engine's --max-num-batched-tokens",
                error=ServingBucketError,
            ),
            _max_num_seqs(max_num_seqs),
        )
        env = dict(environment or {})

        def integer(name: str, default: int, *, empty_is_default: bool) -> int:
            text = env.get(name)
            if text is None or (empty_is_default and text == ""):
                return default
            try:
                return int(text)
            except ValueError:
                raise ServingBucketError(
                    f"{name}={text!r} is not an integer: the engine reads it with int()"
                ) from None

        bucketized = env.get("ATTN_BUCKETIZED_NUM_REQS", "")
        if bucketized.lower() not in ("", "0", "1", "true", "false"):
            raise ServingBucketError(
                f"ATTN_BUCKETIZED_NUM_REQS={bucketized!r}: the engine accepts 0, 1, true or "
                "false (any case)"
            )
        custom_text = env.get("ATTN_CUSTOM_NUM_REQS_BUCKETS", "")
        try:
            custom = [int(part.strip()) for part in custom_text.split(",")] if custom_text else []
        except ValueError:
            raise ServingBucketError(
                f"ATTN_CUSTOM_NUM_REQS_BUCKETS={custom_text!r}: give integers separated by "
                "commas, such as 8,64"
            ) from None
        return cls(
            tokens=token_buckets(
                max_num_batched_tokens,
                # The engine reads `os.getenv("MIN_TOKEN_BUCKET") or "16"` but
                # `int(os.getenv("VLLM_TPU_BUCKET_PADDING_GAP", "0"))`: empty differs.
                min_bucket=integer("MIN_TOKEN_BUCKET", MIN_TOKEN_BUCKET, empty_is_default=True),
                padding_gap=integer("VLLM_TPU_BUCKET_PADDING_GAP", 0, empty_is_default=False),
                compilation_sizes=compilation_sizes,
            ),
            requests=request_buckets(max_num_seqs),
            attention_requests=attention_request_buckets(
                max_num_seqs, bucketized=bucketized.lower() in ("1", "true"), custom=custom
            ),
        )

    def compiled_graphs(self) -> dict[str, int]:
        """How many graphs precompilation builds, by kind: the model (one per token and
        attention request bucket), the logits (one per request bucket), sampling (four per
        request bucket) and the last-token gather (one per token bucket and request bucket no
        larger than it). Other helpers are not counted: a lower bound."""
        return {
            "model": len(self.tokens) * len(self.attention_requests),
            "logits": len(self.requests),
            "sampling": SAMPLING_GRAPHS_PER_REQUEST_BUCKET * len(self.requests),
            "select": sum(
                requests <= tokens for tokens in self.tokens for requests in self.requests
            ),
        }

    def padded_step(self, num_tokens: int, num_requests: int) -> tuple[int, int]:
        """The (tokens, requests) shape a step of `num_tokens` scheduled tokens from
        `num_requests` requests runs as: each padded to its first bucket at or above it
        (tpu-inference's `get_padded_token_len`)."""
        tokens = whole_number(
            "num_tokens", num_tokens, fix="count the step's tokens", error=ServingBucketError
        )
        requests = whole_number(
            "num_requests", num_requests, fix="count the step's requests", error=ServingBucketError
        )
        if requests > tokens:
            raise ServingBucketError(
                f"{requests} requests cannot share {tokens} tokens: each scheduled request has "
                "at least one token in the step"
            )
        return (
            _bucket_above(self.tokens, tokens, "tokens"),
            _bucket_above(self.requests, requests, "requests"),
        )


@dataclass(frozen=True)
class Request:
    """One request of a stream: when it arrives (in engine steps), its prompt and output tokens."""

    arrival_step: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Schedule:
    """What the scheduler ran: each step's tokens and requests, and each request's milestones."""

    step_tokens: np.ndarray
    """Scheduled tokens of each step that ran (prompt chunks plus one per decoding request)."""
    step_requests: np.ndarray
    """Requests in each step that ran."""
    step_index: np.ndarray
    """The clock step at which each step ran (idle clock steps run nothing)."""
    first_token_step: np.ndarray
    """For each request, the clock step whose step sampled its first output token."""
    finish_step: np.ndarray
    """For each request, the clock step whose step sampled its last output token."""
    step_kv_tokens: np.ndarray
    """Tokens in the KV cache during each step that ran: every running request's computed prompt
    tokens and the outputs fed back so far (each sampled token but the last is fed back)."""
    step_kv_pages: np.ndarray
    """Cache pages the running requests hold during each step that ran: each request's cache
    tokens rounded up to whole pages of `page_size` tokens."""


def _checked_request(index: int, request: Request) -> tuple[int, int, int]:
    fix = f"request {index} must be Request(arrival_step, prompt_tokens, output_tokens)"
    if not isinstance(request, Request):
        raise ServingBucketError(f"request {index} is {request!r}: {fix}")
    return (
        whole_number(
            f"request {index}: arrival_step",
            request.arrival_step,
            fix=fix,
            minimum=0,
            error=ServingBucketError,
        ),
        whole_number(
            f"request {index}: prompt_tokens",
            request.prompt_tokens,
            fix=fix,
            error=ServingBucketError,
        ),
        whole_number(
            f"request {index}: output_tokens",
            request.output_tokens,
            fix=fix,
            error=ServingBucketError,
        ),
    )


def schedule(
    requests: Sequence[Request],
    max_num_batched_tokens: int,
    max_num_seqs: int,
    *,
    page_size: int = KV_PAGE_SIZE,
) -> Schedule:
    """The steps vLLM's V1 scheduler runs for `requests` (sorted by arrival), with chunked
    prefill at the token budget, at most `max_num_seqs` running requests and the cache in pages
    of `page_size` tokens."""
    page = whole_number(
        "page_size",
        page_size,
        fix=f"the KV cache block size in tokens (--block-size; vLLM's default is {KV_PAGE_SIZE})",
        error=ServingBucketError,
    )
    budget = whole_number(
        "max_num_batched_tokens",
        max_num_batched_tokens,
        fix="pass the engine's --max-num-batched-tokens",
        error=ServingBucketError,
    )
    most_running = _max_num_seqs(max_num_seqs)
    _check_budget_holds_the_requests(budget, most_running)
    checked = [_checked_request(index, request) for index, request in enumerate(requests)]
    arrivals = [arrival for arrival, _, _ in checked]
    if arrivals != sorted(arrivals):
        raise ServingBucketError(
            "requests must be sorted by arrival_step: the scheduler serves them first come, "
            "first served; sort them with key=lambda r: r.arrival_step"
        )
    count = len(checked)
    computed = [0] * count  # prompt tokens computed so far
    produced = [0] * count  # output tokens sampled so far
    first_token = np.full(count, -1, dtype=np.int64)
    finish = np.full(count, -1, dtype=np.int64)
    waiting: deque[int] = deque()
    running: list[int] = []
    step_tokens: list[int] = []
    step_requests: list[int] = []
    step_index: list[int] = []
    step_kv: list[int] = []
    step_pages: list[int] = []
    next_arrival = 0
    clock = 0
    while next_arrival < count or waiting or running:
        if not waiting and not running:
            clock = max(clock, checked[next_arrival][0])  # idle until the next arrival
        while next_arrival < count and checked[next_arrival][0] <= clock:
            waiting.append(next_arrival)
            next_arrival += 1
        left = budget
        scheduled: list[tuple[int, int]] = []
        for index in running:
            if left == 0:
                break
            prompt = checked[index][1]
            wanted = prompt - computed[index] if computed[index] < prompt else 1
            tokens = min(wanted, left)
            scheduled.append((index, tokens))
            left -= tokens
        while waiting and left > 0 and len(running) < most_running:
            index = waiting.popleft()
            tokens = min(checked[index][1], left)
            running.append(index)
            scheduled.append((index, tokens))
            left -= tokens
        if scheduled:
            step_tokens.append(budget - left)
            step_requests.append(len(scheduled))
            step_index.append(clock)
        for index, tokens in scheduled:
            prompt, outputs = checked[index][1], checked[index][2]
            if computed[index] < prompt:
                computed[index] += tokens
                if computed[index] < prompt:
                    continue  # a prompt chunk: nothing sampled yet
                first_token[index] = clock
            produced[index] += 1
            if produced[index] == outputs:
                finish[index] = clock
        if scheduled:
            held = [computed[index] + max(produced[index] - 1, 0) for index in running]
            step_kv.append(sum(held))
            step_pages.append(sum(-(-tokens // page) for tokens in held))
        running = [index for index in running if finish[index] < 0]
        clock += 1
    return Schedule(
        step_tokens=np.asarray(step_tokens, dtype=np.int64),
        step_requests=np.asarray(step_requests, dtype=np.int64),
        step_index=np.asarray(step_index, dtype=np.int64),
        first_token_step=first_token,
        finish_step=finish,
        step_kv_tokens=np.asarray(step_kv, dtype=np.int64),
        step_kv_pages=np.asarray(step_pages, dtype=np.int64),
    )


PROMPT_SIGMA, OUTPUT_SIGMA = 1.0, 0.8
"""The spread of `lognormal_stream`'s lengths: the standard deviations of their logarithms."""
PROMPT_RANGE, OUTPUT_RANGE = (4, 4096), (1, 1024)
"""The shortest and longest prompt and output `lognormal_stream` draws (longer ones are cut)."""


def lognormal_stream(
    num_requests: int, rate: float, prompt_median: int, output_median: int, *, seed: int = 0
) -> list[Request]:
    """A modelled stream, sorted by arrival: Poisson arrivals at `rate` requests per engine
    step, prompt and output lengths log-normal around their medians (`PROMPT_SIGMA`,
    `OUTPUT_SIGMA`), cut to `PROMPT_RANGE` and `OUTPUT_RANGE`. Taught in
    `notebooks/23_shapes_a_tpu_server_compiles.ipynb`; a server's logged lengths replace it."""
    count = whole_number(
        "num_requests", num_requests, fix="how many requests to draw", error=ServingBucketError
    )
    per_step = number(
        "rate", rate, fix="requests per engine step, such as 0.4", error=ServingBucketError
    )
    prompt = whole_number(
        "prompt_median", prompt_median, fix="tokens, such as 256", error=ServingBucketError
    )
    output = whole_number(
        "output_median", output_median, fix="tokens, such as 128", error=ServingBucketError
    )
    seeded = whole_number(
        "seed", seed, fix="a seed for numpy's default_rng", minimum=0, error=ServingBucketError
    )
    rng = np.random.default_rng(seeded)
    arrivals = np.floor(np.cumsum(rng.exponential(1 / per_step, count)))
    prompts = np.ceil(rng.lognormal(np.log(prompt), PROMPT_SIGMA, count))
    outputs = np.ceil(rng.lognormal(np.log(output), OUTPUT_SIGMA, count))
    return [
        Request(int(a), int(p), int(o))
        for a, p, o in zip(
            arrivals,
            np.clip(prompts, *PROMPT_RANGE),
            np.clip(outputs, *OUTPUT_RANGE),
            strict=True,
        )
    ]
