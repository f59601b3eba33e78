"""`make bench`'s serving comparison: vLLM on this CPU against transformers' `generate`.

Both serve chapter 25's tiny Qwen3 (built from a config, float32, a tokenizer trained on the
book's corpus) the same 16 prompts, greedily, for exactly `NEW_TOKENS` tokens each, in the same
run. transformers runs in this process, batched (left padding) and one prompt at a time; vLLM
runs its offline engine in the vLLM venv (`scripts/serving_bench_vllm.py`). Each side is timed
the same way, by wall clock around a call that takes token ids and returns token ids: one token
for the time to the first token of the batch (the prefill), `NEW_TOKENS` tokens for the
throughput. vLLM's import and engine start are reported apart. The comparison is refused
unless both sides give the same greedy tokens, exactly `NEW_TOKENS` of them, with the same
number of torch threads.
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
# vLLM's CPU settings, as in chapter 25: a 1 GiB KV cache, the engine in this process; its log
# on standard error, so that standard output holds only the worker's JSON line.
VLLM_SETTINGS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
    "HF_HUB_OFFLINE": "1",
}


def prompts() -> list[str]:
    """The first words of the corpus's first sentences: prompts of different lengths."""
    sentences = re.split(r"(?<=[.!?])\s+", CORPUS.read_text())
    return [" ".join(s.split()[:PROMPT_WORDS]) for s in sentences if s.strip()][:NUM_PROMPTS]


def save_tiny_qwen3(model_dir: Path):  # -> (model, tokenizer); imports are heavy, so local
    """Chapter 25's tiny Qwen3 and its tokenizer, saved to `model_dir` for vLLM."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as transformers_logging

    from tpuready.runtime.tiny_models import tiny_qwen3_config

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
    config = tiny_qwen3_config(  # chapter 25's sizes (SERVING_QWEN3), this tokenizer's ids
        "serving",
        vocab_size=tokenizer.vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    transformers_logging.disable_progress_bar()  # saving draws one on stderr
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model, tokenizer


def transformers_side(model, tokenizer, texts: list[str], runs: int) -> dict[str, object]:
    """Times of transformers' greedy `generate`, batched and one prompt at a time; the prompts
    are tokenized before the clock starts, as vLLM's side gets token ids."""
    import torch

    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    singles = [tokenizer([text], return_tensors="pt") for text in texts]

    def generate(inputs, new_tokens: int) -> list[list[int]]:
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # exactly new_tokens, as vLLM's min = max
                do_sample=False,
            )
        return out[:, inputs.input_ids.shape[1] :].tolist()

    def timed(call, *arguments):
        began = time.perf_counter()
        result = call(*arguments)
        return time.perf_counter() - began, result

    def one_at_a_time() -> list[list[int]]:
        return [generate(inputs, NEW_TOKENS)[0] for inputs in singles]

    first, batched, single, tokens, alone = [], [], [], None, None
    for _ in range(runs):
        first.append(timed(generate, batch, 1)[0])
        seconds, tokens = timed(generate, batch, NEW_TOKENS)
        batched.append(seconds)
        seconds, alone = timed(one_at_a_time)
        single.append(seconds)
    if tokens != alone:
        raise ValueError("transformers' batched tokens differ from one prompt at a time")
    shape = model.config
    return {
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "model": f"{shape.num_hidden_layers} layers, hidden size {shape.hidden_size}",
        "first_token_seconds": first,
        "generate_seconds": batched,
        "single_seconds": single,
        "tokens": tokens,
    }


def vllm_side(model_dir: Path, prompt_ids: list[list[int]], runs: int) -> dict[str, object]:
    """vLLM's engine start and times, from its own venv (a guarded subprocess)."""
    from tpuready.runtime.background import run_guarded
    from tpuready.runtime.offline import environment_for_another_python

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


def _spread(values: list[float]) -> str:
    """`values`' median with its range, for the page: `4,951 (4,800 to 5,100)`."""
    low, high = min(values), max(values)
    decimals = 0 if high >= 100 else 1
    return (
        f"{statistics.median(values):,.{decimals}f} ({low:,.{decimals}f} to {high:,.{decimals}f})"
    )


def serving_report(hf: dict, vllm: dict, *, num_prompts: int, runs: int) -> str:
    """The section's Markdown from both sides' measurements; refused unless both gave the same
    greedy tokens, `NEW_TOKENS` a prompt, with the same number of torch threads."""
    if vllm["tokens"] != hf["tokens"]:
        raise ValueError("vLLM's greedy tokens differ from transformers': no comparison")
    counts = sorted({len(tokens) for tokens in hf["tokens"]})
    if len(hf["tokens"]) != num_prompts or counts != [NEW_TOKENS]:
        raise ValueError(
            f"expected {NEW_TOKENS} tokens for each of {num_prompts} prompts, got "
            f"{len(hf['tokens'])} prompts with {counts} tokens: no comparison"
        )
    if vllm["threads"] != hf["threads"]:
        raise ValueError(
            f"vLLM ran {vllm['threads']} torch threads, transformers {hf['threads']}: run both "
            "with the same OMP_NUM_THREADS (make bench sets 1)"
        )
    generated = num_prompts * NEW_TOKENS
    rates = {
        "vllm": [generated / seconds for seconds in vllm["generate_seconds"]],
        "hf": [generated / seconds for seconds in hf["generate_seconds"]],
        "single": [generated / seconds for seconds in hf["single_seconds"]],
    }
    first_ms = {
        side: [s * 1e3 for s in d["first_token_seconds"]]
        for side, d in (("vllm", vllm), ("hf", hf))
    }
    vllm_name = f"vLLM {vllm['version']}, offline `LLM`"
    rows = [
        (vllm_name, _spread(rates["vllm"]), _spread(first_ms["vllm"])),
        ("transformers `generate`, batched", _spread(rates["hf"]), _spread(first_ms["hf"])),
        ("transformers `generate`, one prompt at a time", _spread(rates["single"]), "n/a"),
    ]
    table = "\n".join(f"| {name} | {rate} | {first} |" for name, rate, first in rows)
    median = statistics.median
    throughput = median(rates["vllm"]) / median(rates["hf"])
    first_token = median(first_ms["vllm"]) / median(first_ms["hf"])
    batching_gain = median(rates["hf"]) / median(rates["single"])
    overlap = min(rates["vllm"]) <= max(rates["hf"]) and min(rates["hf"]) <= max(rates["vllm"])
    verdict = (
        "the two throughput ranges overlap, so at this size, on this CPU, neither engine is "
        "measurably faster"
        if overlap
        else "the two throughput ranges do not overlap"
    )
    same_torch = vllm["torch"] == hf["torch"] and vllm["kernels"] == hf["kernels"]
    kernels = (
        f"torch {hf['torch']} with its {hf['kernels']} CPU kernels in both venvs"
        if same_torch
        else f"torch {hf['torch']} ({hf['kernels']}) for transformers, "
        f"{vllm['torch']} ({vllm['kernels']}) for vLLM"
    )
    return f"""Timed on {datetime.date.today().isoformat()}, on the machine above, in one run.
Chapter 25's tiny Qwen3 ({hf["model"]}, float32, from a config) answers {num_prompts} prompts of
{PROMPT_WORDS} words from the book's corpus, greedily, with exactly {NEW_TOKENS} new tokens each
({generated} tokens); vLLM's tokens equal transformers' (checked). Each side ran {runs} times, the
transformers runs first, with {hf["threads"]} torch thread each and {kernels}. Each call takes
token ids and returns token ids (tokenizing is outside the clock, and vLLM does not
detokenize). Tokens per second is the {generated} tokens over the time of the call; the time to
the first token is a call for one token per prompt, the batch's prefill. vLLM runs with
chapter 25's settings: `enforce_eager`, its engine in the same process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so that it keeps the one thread; vLLM's CPU backend
otherwise starts a worker process with threads bound to cores, not measured here), and no
prefix caching, so each run prefills again.

| Engine | Tokens/s: median (range) | First token, ms: median (range) |
|---|---|---|
{table}

Not counted above: vLLM took {vllm["import_seconds"]:.1f} s to import torch and vLLM, and
{vllm["start_seconds"]:.1f} s more to start its engine (load the model, allocate the KV cache).
Its median throughput was {throughput:.2f} times transformers' batched `generate`, and its
median time to the first token {first_token:.2f} times; {verdict}. Batching alone made
transformers {batching_gain:.1f} times faster than one prompt at a time. None of these speeds
carries over to a TPU; the method does: the same prompts, the same tokens checked, the start
timed apart. On a TPU, vLLM's start also compiles its buckets (chapter 23).
"""
