"""Chapter 25's offline generation, run with the vLLM venv's Python.

    python ch25_offline.py MODEL_DIR MAX_TOKENS PROMPT_IDS_JSON

Loads the saved model with vLLM's offline `LLM`, decodes each prompt
greedily for exactly MAX_TOKENS tokens, and prints one JSON line: the
generated token ids of each prompt ("tokens") and the log-probability
vLLM gave each chosen token ("logprobs"). vLLM's log goes to standard
error.
"""

import json
import os
import sys

# For this CPU only; not for a TPU server. enforce_eager=True below already
# turns off vLLM's compilation of the model. What is left: vLLM ranks every
# log-probability it returns with a function it compiles with torch.compile
# (Inductor's C++ code on a CPU; its random sampler too, which greedy never
# calls): seconds of compiling for a dozen tokens, and a build that fails
# under the book's portable kernels (ATEN_CPU_CAPABILITY=default). With
# compiling off they run eagerly; the numbers they return are the same.
os.environ["TORCH_COMPILE_DISABLE"] = "1"

from vllm import LLM, SamplingParams  # after the setting above


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
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        logprobs=0,  # no runners-up: only the chosen token's log-probability
    )
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    tokens, logprobs = [], []
    for output in outputs:
        completion = output.outputs[0]
        tokens.append(list(completion.token_ids))
        # One {token id: Logprob} per step, from the raw logits (vLLM's
        # default logprobs_mode, "raw_logprobs"): before sampling settings.
        logprobs.append(
            [
                step[token].logprob
                for step, token in zip(
                    completion.logprobs, completion.token_ids, strict=True
                )
            ]
        )
    print(json.dumps({"tokens": tokens, "logprobs": logprobs}))


if __name__ == "__main__":
    main()
