"""`make bench`'s serving comparison (scripts/serving_bench.py): its prompts and its report.

The measurement itself runs vLLM in its venv and is `make bench`'s (about 20 s); these tests
hold the prompts and the arithmetic of the page's section to what it states.
"""

from __future__ import annotations

import pytest
from conftest import load_script

bench = load_script("serving_bench")


def test_prompts_are_distinct_short_openings_of_the_corpus() -> None:
    prompts = bench.prompts()
    assert len(prompts) == bench.NUM_PROMPTS == len(set(prompts))
    assert all(1 <= len(p.split()) <= bench.PROMPT_WORDS for p in prompts)
    assert len({len(p) for p in prompts}) > 1  # lengths differ: batching pads
    corpus = " ".join(bench.CORPUS.read_text().split())
    assert all(p in corpus for p in prompts)


def _measured(tokens: list[list[int]], **seconds: list[float]) -> dict[str, object]:
    return {
        "tokens": tokens,
        "threads": 1,
        "torch": "2.13.0+cpu",
        "kernels": "AVX512",
        "model": "2 layers",
        "version": "0.32.0",
        **seconds,
    }


TOKENS = [[7] * 32] * 16  # exactly NEW_TOKENS for each prompt


def test_the_report_gives_medians_ranges_and_ratios_of_one_run() -> None:
    hf = _measured(
        TOKENS,
        first_token_seconds=[0.05, 0.04, 0.08],  # median 50 ms
        generate_seconds=[2.0, 1.0, 4.0],  # median 2.0 s
        single_seconds=[20.0, 10.0, 90.0],  # median 20 s; mean 40 s
    )
    vllm = _measured(
        TOKENS, first_token_seconds=[0.02, 0.03, 0.025], generate_seconds=[0.5, 0.4, 0.8]
    ) | {"import_seconds": 9.0, "start_seconds": 2.5}
    report = bench.serving_report(hf, vllm, num_prompts=16, runs=3)
    assert bench.NEW_TOKENS == 32
    # 512 tokens over 0.5 s (0.8 to 0.4 s), and 25 ms (20 to 30) to the first token.
    assert "| vLLM 0.32.0, offline `LLM` | 1,024 (640 to 1,280) | 25.0 (20.0 to 30.0) |" in report
    assert "| transformers `generate`, batched | 256 (128 to 512) | 50.0 (40.0 to 80.0) |" in report
    assert "one prompt at a time | 25.6 (5.7 to 51.2) | n/a |" in report
    prose = " ".join(report.split())
    assert "throughput was 4.00 times" in prose and "first token 0.50 times" in prose
    assert "the two throughput ranges do not overlap" in prose  # 640 to 1,280 against 128 to 512
    assert "transformers 10.0 times faster than one prompt at a time" in prose  # medians
    assert "torch 2.13.0+cpu with its AVX512 CPU kernels in both venvs" in prose


def test_the_report_says_when_the_ranges_overlap() -> None:
    hf = _measured(TOKENS, first_token_seconds=[1.0], generate_seconds=[1.0, 2.0])
    vllm = _measured(TOKENS, first_token_seconds=[1.0], generate_seconds=[1.5, 3.0])
    report = bench.serving_report(
        hf | {"single_seconds": [9.0]},
        vllm | {"import_seconds": 1.0, "start_seconds": 1.0},
        num_prompts=16,
        runs=2,
    )
    assert "the two throughput ranges overlap, so" in " ".join(report.split())


@pytest.mark.parametrize(
    ("vllm_change", "hf_tokens", "needle"),
    [
        ({"tokens": [[7] * 31 + [8]] * 16}, TOKENS, "tokens differ"),
        ({"tokens": [[7] * 31] * 16}, [[7] * 31] * 16, "expected 32 tokens"),
        ({"threads": 2}, TOKENS, "vLLM ran 2 torch threads, transformers 1"),
    ],
)
def test_the_report_refuses_an_unfair_comparison(vllm_change, hf_tokens, needle) -> None:
    hf = _measured(
        hf_tokens, first_token_seconds=[1.0], generate_seconds=[1.0], single_seconds=[1.0]
    )
    vllm = _measured(TOKENS, first_token_seconds=[1.0], generate_seconds=[1.0]) | vllm_change
    with pytest.raises(ValueError, match=needle):
        bench.serving_report(hf, vllm, num_prompts=16, runs=1)
