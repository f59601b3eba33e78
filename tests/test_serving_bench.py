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
    return {"tokens": tokens, "threads": 1, "model": "2 layers", "version": "0.32.0", **seconds}


def test_the_report_divides_the_tokens_by_the_median_times() -> None:
    tokens = [[1, 2]] * 16
    hf = _measured(
        tokens,
        first_token_seconds=[0.05, 0.04, 0.06],
        generate_seconds=[2.0, 1.0, 3.0],  # median 2.0 s
        single_seconds=[20.0, 10.0, 30.0],
    )
    vllm = _measured(tokens, first_token_seconds=[0.02] * 3, generate_seconds=[0.5, 0.5, 0.4]) | {
        "import_seconds": 9.0,
        "start_seconds": 2.5,
    }
    report = bench.serving_report(hf, vllm, num_prompts=16, runs=3)
    generated = 16 * bench.NEW_TOKENS
    assert f"| vLLM 0.32.0, offline `LLM` | {generated / 0.5:,.0f} | 20 | 1 |" in report
    assert f"| transformers `generate`, batched | {generated / 2.0:,.0f} | 50 | 1 |" in report
    assert f"one prompt at a time | {generated / 20.0:,.0f} | n/a | 1 |" in report
    assert "throughput was 4.00 times transformers'" in report
    assert "made transformers 10.0 times" in report
    assert "9.0 s to import and\n2.5 s more" in report


def test_the_report_refuses_different_tokens() -> None:
    hf = _measured([[1, 2]], first_token_seconds=[1.0], generate_seconds=[1.0])
    vllm = _measured([[1, 3]], first_token_seconds=[1.0], generate_seconds=[1.0])
    with pytest.raises(ValueError, match="tokens differ"):
        bench.serving_report(hf | {"single_seconds": [1.0]}, vllm, num_prompts=1, runs=1)
