"""The vLLM side of `make bench`'s serving comparison, run with the vLLM venv's Python.

    python serving_bench_vllm.py MODEL_DIR NEW_TOKENS RUNS PROMPT_IDS_JSON

Imports torch and vLLM and starts vLLM's offline engine on the saved model (both timed), then
`RUNS` times decodes every prompt greedily, once for one token (the prefill: the time to the
first token of the batch) and once for exactly NEW_TOKENS tokens (the throughput). Prefix
caching is off, so every run prefills its prompts; outputs stay token ids (no detokenizing,
as transformers' side returns ids). Prints one JSON line on standard output; the caller sends
vLLM's log to standard error (VLLM_LOGGING_STREAM).
"""

import time

BEGAN = time.perf_counter()  # before the imports, which take most of a start

import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402


def main() -> None:
    model_dir, new_tokens, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    prompts = [{"prompt_token_ids": ids} for ids in json.loads(sys.argv[4])]
    started = time.perf_counter()
    import_seconds = started - BEGAN
    llm = LLM(
        model=model_dir,
        dtype="float32",  # as saved, as transformers runs it
        generation_config="vllm",
        max_model_len=256,
        enforce_eager=True,  # chapter 25's settings: no compile warm-up
        enable_prefix_caching=False,  # every run prefills its prompts
        seed=0,
    )
    start_seconds = time.perf_counter() - started

    def timed(max_tokens: int) -> tuple[float, list[list[int]]]:
        greedy = SamplingParams(  # exactly max_tokens, as transformers' min = max
            temperature=0.0,
            max_tokens=max_tokens,
            min_tokens=max_tokens,
            ignore_eos=True,
            detokenize=False,
        )
        began = time.perf_counter()
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        return time.perf_counter() - began, [list(o.outputs[0].token_ids) for o in outputs]

    first_token, decode, tokens = [], [], None
    for _ in range(runs):
        first_token.append(timed(1)[0])
        seconds, tokens = timed(new_tokens)
        decode.append(seconds)
    print(
        json.dumps(
            {
                "import_seconds": import_seconds,
                "start_seconds": start_seconds,
                "first_token_seconds": first_token,
                "generate_seconds": decode,
                "tokens": tokens,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "kernels": torch.backends.cpu.get_cpu_capability(),
                "version": vllm.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
