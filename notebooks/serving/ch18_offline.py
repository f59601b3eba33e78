"""Chapter 18's offline generation, run with the vLLM venv's Python.

    python ch18_offline.py MODEL_DIR MAX_TOKENS PROMPT_IDS_JSON

Loads the saved model with vLLM's offline `LLM`, decodes each prompt
greedily for exactly MAX_TOKENS tokens, and prints one JSON line: the
generated token ids of each prompt. vLLM's log goes to standard error.
"""

import json
import sys

from vllm import LLM, SamplingParams


def main() -> None:
    model_dir = sys.argv[1]
    max_tokens = int(sys.argv[2])
    prompt_ids = json.loads(sys.argv[3])
    llm = LLM(
        model=model_dir,
        dtype="float32",  # as saved; "auto" would run bf16 on this CPU
        # vLLM's sampling defaults, not the folder's generation_config.json
        generation_config="vllm",
        max_model_len=256,
        enforce_eager=True,  # no torch.compile warm-up: a faster start
        seed=0,
    )
    greedy = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True
    )
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    generated = [list(output.outputs[0].token_ids) for output in outputs]
    print(json.dumps(generated))


if __name__ == "__main__":
    main()
