"""tpuready.calc.inference.serving_latency: time to first token, inter-token latency, tokens/s."""

from __future__ import annotations

import pytest
from conftest import QWEN3_235B
from hypothesis import given
from hypothesis import strategies as st

from tpuready.calc.inference import InferenceError, decode_step, serving_latency
from tpuready.calc.plan import ModelConfig
from tpuready.validate import InputError

# Llama-3.1-8B from its config.json (chapter 24's model).
LLAMA_8B = ModelConfig(
    name="Llama-3.1-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
    head_dim=128, num_experts=1, experts_per_token=1, expert_ffn_size=14336, vocab_size=128256,
)  # fmt: skip
CHIPS = st.sampled_from(["v5e", "v5p", "v6e", "v7"])
PROMPTS = st.integers(min_value=1, max_value=16_384)
CONTEXTS = st.integers(min_value=1, max_value=32_768)


def latency(chip: str, prompt: int, budget: int, seqs: int, context: int = 4096, **kw: int):
    return serving_latency(
        LLAMA_8B, chip, prompt_tokens=prompt, max_num_batched_tokens=budget,
        max_num_seqs=seqs, context_len=context, **kw,
    )  # fmt: skip


def test_one_request_alone_prefills_at_the_matmuls_or_the_weights_read() -> None:
    """With no other request running, a prompt that fits one chunk takes one step: the larger
    of the weights' read and 2 x parameters x prompt FLOPs, decode_step's own terms."""
    alone = latency("v6e", 2048, 8192, 1)
    terms = decode_step(LLAMA_8B, "v6e", 2048, 1)
    assert len(alone.prefill_steps) == 1 and alone.chunk_tokens == 8192
    assert alone.ttft_seconds == pytest.approx(max(terms.weight_seconds, terms.compute_seconds))
    assert terms.bound == "compute"  # a 2,048-token prefill is past v6e's ridge


def test_the_prompt_is_split_in_chunks_of_the_budget_left_after_the_decodes() -> None:
    split = latency("v6e", 1000, 300, 45)  # 44 decodes leave 256 prompt tokens a step
    assert split.chunk_tokens == 256
    assert [step.batch for step in split.prefill_steps] == [44] * 4
    assert split.decode.batch == 45
    assert split.tokens_per_second == pytest.approx(45 / split.itl_seconds)


@given(chip=CHIPS, seqs=st.integers(min_value=1, max_value=1024), context=CONTEXTS)
def test_the_inter_token_latency_grows_with_the_request_limit(
    chip: str, seqs: int, context: int
) -> None:
    fewer = latency(chip, 512, 4096, seqs, context)
    more = latency(chip, 512, 4096, seqs + 1, context)
    assert more.itl_seconds > fewer.itl_seconds


@given(chip=CHIPS, seqs=st.integers(min_value=1, max_value=4096), context=CONTEXTS)
def test_throughput_rises_with_the_request_limit_until_compute_binds(
    chip: str, seqs: int, context: int
) -> None:
    """More requests per step never lower tokens per second; they raise it while the weights'
    read outlasts the matmuls, and leave it flat (to rounding) once compute binds."""
    fewer = latency(chip, 512, 8192, seqs, context)
    more = latency(chip, 512, 8192, seqs + 1, context)
    assert more.tokens_per_second >= fewer.tokens_per_second * (1 - 1e-12)
    if more.decode.bound == "memory":
        assert more.tokens_per_second > fewer.tokens_per_second


@given(
    chip=CHIPS, prompt=PROMPTS, seqs=st.integers(min_value=1, max_value=256),
    chunk=st.integers(min_value=1, max_value=4096), times=st.integers(min_value=2, max_value=8),
)  # fmt: skip
def test_a_budget_whose_chunk_is_a_multiple_prefills_no_slower(
    chip: str, prompt: int, seqs: int, chunk: int, times: int
) -> None:
    """Chunks `times` larger merge whole chunks: fewer steps, each paying the decodes' reads
    once, so the time to first token falls or stays; a budget that holds the whole prompt beside
    the decodes is the fastest of all."""
    decodes = seqs - 1
    small = latency(chip, prompt, decodes + chunk, seqs)
    large = latency(chip, prompt, decodes + times * chunk, seqs)
    whole = latency(chip, prompt, decodes + prompt, seqs)
    assert large.ttft_seconds <= small.ttft_seconds * (1 + 1e-12)
    assert whole.ttft_seconds <= large.ttft_seconds * (1 + 1e-12)


@given(
    chip=CHIPS, seqs=st.integers(min_value=1, max_value=256),
    budget=st.integers(min_value=256, max_value=16_384),
)  # fmt: skip
def test_a_larger_budget_costs_the_running_requests_a_longer_step(
    chip: str, seqs: int, budget: int
) -> None:
    """The other side of the trade: a full chunk's step is never shorter with a larger budget,
    and never shorter than the steady decode step less one request."""
    small = latency(chip, 16_384, budget, seqs)
    large = latency(chip, 16_384, 2 * budget, seqs)
    assert large.prefill_itl_seconds >= small.prefill_itl_seconds
    assert small.prefill_itl_seconds >= decode_step(LLAMA_8B, chip, seqs, 4096).seconds * (
        (seqs - 1) / seqs
    )


def test_a_mixture_of_experts_reads_more_experts_for_a_larger_prefill_chunk() -> None:
    """A chunk of 64 tokens routes to more experts than one of 8: more weight bytes a step."""
    quiet = serving_latency(
        QWEN3_235B, "v7", prompt_tokens=64, max_num_batched_tokens=8, max_num_seqs=1,
        context_len=4096, chips=4,
    )  # fmt: skip
    busy = serving_latency(
        QWEN3_235B, "v7", prompt_tokens=64, max_num_batched_tokens=64, max_num_seqs=1,
        context_len=4096, chips=4,
    )  # fmt: skip
    assert quiet.prefill_steps[0].weight_seconds < busy.prefill_steps[0].weight_seconds


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_num_batched_tokens": 8, "max_num_seqs": 16}, "must be at least max_num_seqs"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"max_num_seqs": True}, "max_num_seqs"),
        ({"max_num_batched_tokens": 2.5}, "max_num_batched_tokens"),
        ({"context_len": 0}, "context_len"),
        ({"chips": 3}, "tensor_parallel=3"),
    ],
)
def test_bad_settings_raise_a_named_error(settings: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "prompt_tokens": 128, "max_num_batched_tokens": 512, "max_num_seqs": 8,
        "context_len": 1024,
    }  # fmt: skip
    args.update(settings)
    with pytest.raises(InferenceError, match=match) as caught:
        serving_latency(LLAMA_8B, "v6e", **args)  # type: ignore[arg-type]
    assert isinstance(caught.value, InputError)
