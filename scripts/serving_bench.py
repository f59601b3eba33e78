"""`make bench`'s serving comparison: vLLM on this CPU against transformers' `generate`.

Both serve chapter 18's tiny Qwen3 (built from a config, float32, a tokenizer trained on the
book's corpus) the same 16 prompts, greedily, for exactly `NEW_TOKENS` tokens each, in the same
run. transformers runs in this process, batched (left padding) and one prompt at a time; vLLM
runs its offline engine in the vLLM venv (`scripts/serving_bench_vllm.py`). Each side is timed
the same way, by wall clock around a call that returns the tokens: one token for the time to
the first token of the batch, `NEW_TOKENS` tokens for the throughput. vLLM's engine start is
reported apart. The greedy tokens must agree, or the comparison is refused.
"""

from __future__ import annotations

import datetime
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
CORPUS = REPOSITORY / "notebooks" / "data" / "tiny_corpus.txt"
VLLM_PYTHON = REPOSITORY / ".venv-vllm" / "bin" / "python"
VLLM_WORKER = REPOSITORY / "scripts" / "serving_bench_vllm.py"
NUM_PROMPTS, PROMPT_WORDS, NEW_TOKENS = 16, 6, 32
# vLLM's CPU settings, as in chapter 18: a 1 GiB KV cache, the engine in this process.
VLLM_SETTINGS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
}


def prompts() -> list[str]:
    """The first words of the corpus's first sentences: prompts of different lengths."""
    sentences = re.split(r"(?<=[.!?])\s+", CORPUS.read_text())
    return [" ".join(s.split()[:PROMPT_WORDS]) for s in sentences if s.strip()][:NUM_PROMPTS]


def save_tiny_qwen3(model_dir: Path):  # -> (model, tokenizer); imports are heavy, so local
    """Chapter 18's tiny Qwen3 and its tokenizer, saved to `model_dir` for vLLM."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config
    from transformers.utils import logging as transformers_logging

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|pad|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([CORPUS.read_text()], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|endoftext|>"
    )
    config = Qwen3Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    transformers_logging.disable_progress_bar()  # saving draws one on stderr
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model, tokenizer


def transformers_side(model, tokenizer, texts: list[str], runs: int) -> dict[str, object]:
    """Times of transformers' greedy `generate`, batched and one prompt at a time."""
    import torch

    def generate(batch: list[str], new_tokens: int) -> list[list[int]]:
        inputs = tokenizer(batch, return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
            )
        return out[:, inputs.input_ids.shape[1] :].tolist()

    def timed(call, *arguments):
        began = time.perf_counter()
        result = call(*arguments)
        return time.perf_counter() - began, result

    shape = model.config
    result: dict[str, object] = {
        "threads": torch.get_num_threads(),
        "model": f"{shape.num_hidden_layers} layers, hidden size {shape.hidden_size}",
    }
    first, batched, single, tokens = [], [], [], None
    for _ in range(runs):
        first.append(timed(generate, texts, 1)[0])
        seconds, tokens = timed(generate, texts, NEW_TOKENS)
        batched.append(seconds)
        single.append(timed(lambda: [generate([t], NEW_TOKENS)[0] for t in texts])[0])
    one_at_a_time = [generate([t], NEW_TOKENS)[0] for t in texts]
    if tokens != one_at_a_time:
        raise SystemExit("transformers' batched tokens differ from one prompt at a time")
    result.update(first_token_seconds=first, generate_seconds=batched, single_seconds=single)
    result["tokens"] = tokens
    return result


def vllm_side(model_dir: Path, prompt_ids: list[list[int]], runs: int) -> dict[str, object]:
    """vLLM's engine start and times, from its own venv (a guarded subprocess)."""
    from tpuready.background import run_guarded
    from tpuready.offline import environment_for_another_python

    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} is missing: run `make vllm-venv` (x86-64 Linux only)")
    command = [str(VLLM_PYTHON), str(VLLM_WORKER), str(model_dir), str(NEW_TOKENS), str(runs)]
    printed = run_guarded(
        [*command, json.dumps(prompt_ids)],
        timeout_seconds=600,
        env=environment_for_another_python() | VLLM_SETTINGS,
    )
    return json.loads(printed.splitlines()[-1])


def serving_section(runs: int = 3) -> str:
    """The page's section: tokens per second, time to the first token and vLLM's start."""
    texts = prompts()
    with tempfile.TemporaryDirectory(prefix="bench-tiny-qwen3-") as folder:
        model, tokenizer = save_tiny_qwen3(Path(folder))
        hf = transformers_side(model, tokenizer, texts, runs)
        prompt_ids = [tokenizer(text).input_ids for text in texts]
        vllm = vllm_side(Path(folder), prompt_ids, runs)
    return serving_report(hf, vllm, num_prompts=len(texts), runs=runs)


def serving_report(hf: dict, vllm: dict, *, num_prompts: int, runs: int) -> str:
    """The section's Markdown from both sides' measurements; refused if their tokens differ."""
    if vllm["tokens"] != hf["tokens"]:
        raise ValueError("vLLM's greedy tokens differ from transformers': no comparison")
    generated = num_prompts * NEW_TOKENS
    median = {
        (side, key): statistics.median(values[key])
        for side, values in (("hf", hf), ("vllm", vllm))
        for key in ("first_token_seconds", "generate_seconds")
    }
    single = statistics.median(hf["single_seconds"])
    rows = [
        (f"vLLM {vllm['version']}, offline `LLM`", median["vllm", "generate_seconds"],
         median["vllm", "first_token_seconds"], vllm["threads"]),
        ("transformers `generate`, batched", median["hf", "generate_seconds"],
         median["hf", "first_token_seconds"], hf["threads"]),
        ("transformers `generate`, one prompt at a time", single, None, hf["threads"]),
    ]  # fmt: skip
    table = "\n".join(
        f"| {name} | {generated / seconds:,.0f} | "
        + (f"{first * 1e3:,.0f}" if first is not None else "n/a")
        + f" | {threads} |"
        for name, seconds, first, threads in rows
    )
    speedup = median["hf", "generate_seconds"] / median["vllm", "generate_seconds"]
    batching_gain = single / median["hf", "generate_seconds"]
    return f"""Timed on {datetime.date.today().isoformat()}, on the machine above, in one run.
Chapter 18's tiny Qwen3 ({hf["model"]}, float32, from a config) answers
{num_prompts} prompts of {PROMPT_WORDS} words from the book's corpus, greedily, with exactly
{NEW_TOKENS} new tokens each ({generated} tokens); vLLM's tokens equal transformers' (checked).
Medians of {runs} runs, with the page's settings (one torch thread in each engine). Tokens per
second is the {generated} tokens over the time of the call that returns them; the time to the
first token is a call for one token per prompt: the whole batch's prefill and first step. vLLM
runs with chapter 18's settings (`enforce_eager`; no prefix caching, so each run prefills
again).

| Engine | Tokens/s | First token (ms) | Torch threads |
|---|---|---|---|
{table}

Not counted above: vLLM took {vllm["import_seconds"]:.1f} s to import and
{vllm["start_seconds"]:.1f} s more to start its engine (load the model, profile memory,
allocate the KV cache). Once started, its throughput was {speedup:.2f} times transformers'
batched `generate` on this CPU, and batching alone made transformers {batching_gain:.1f} times
faster than one prompt at a time. What carries over to a TPU is the method, not these speeds:
the same prompts, the same tokens checked, the start timed apart. On a TPU, vLLM's start also
compiles its buckets (chapter 16), and its speed comes from those compiled shapes and its
paged KV cache, which a model this small cannot show.
"""
