"""The book's tiny Qwen3 models, spelled once: named sizes and the configs built from them.

A tiny model runs on a laptop's CPU in milliseconds and needs no download, so the chapters,
workers, tests and scripts build one from a config instead of loading weights. Each preset is
a plain mapping (readable in a notebook, comparable in a test); the functions return a
`transformers` config of those sizes, with `overrides` on top. `transformers` is imported
inside the functions: importing `tpuready` does not import it.

- `TINY_QWEN3`: the smallest dense Qwen3 (vocabulary 128, 2 layers of width 32): the set-up
  check and chapter 4's first forward pass (`tpuready.runtime.setup_check`), chapter 3's
  dispatcher tour, chapter 10's FSDP2 training script (`notebooks/workers/ch10_fsdp_practice.py`).
- `TENSOR_PARALLEL_QWEN3`: 8 attention heads and 4 KV heads, so 2 or 4 ranks split both
  (`notebooks/workers/ch11_qwen3_tp_plan.py`, chapter 11).
- `SERVING_QWEN3`: chapter 25's served model, wide enough for vLLM's kernels (head size 32);
  its vocabulary and special tokens come from the tokenizer it is served with
  (`scripts/serving_bench.py`).
- `TINY_QWEN3_MOE`: a 3-layer mixture of experts (6 experts, 2 per token) with the router's
  probabilities renormalised and the experts run eagerly, as chapter 12's layer compares
  against (`tests/test_plan.py`, `tests/test_torchrun_ch12*.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tpuready.validate import InputError

if TYPE_CHECKING:  # transformers is imported where a config is built
    from transformers import Qwen3Config, Qwen3MoeConfig

__all__ = [
    "SERVING_QWEN3",
    "TENSOR_PARALLEL_QWEN3",
    "TINY_QWEN3",
    "TINY_QWEN3_MOE",
    "tiny_qwen3_config",
    "tiny_qwen3_moe_config",
]

TINY_QWEN3: Mapping[str, Any] = MappingProxyType(
    {
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
    }
)
TENSOR_PARALLEL_QWEN3: Mapping[str, Any] = MappingProxyType(
    {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 8,
        "max_position_embeddings": 64,
    }
)
SERVING_QWEN3: Mapping[str, Any] = MappingProxyType(
    {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
)
TINY_QWEN3_MOE: Mapping[str, Any] = MappingProxyType(
    {
        "vocab_size": 96,
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 12,
        "tie_word_embeddings": False,
        "norm_topk_prob": True,
        "experts_implementation": "eager",
    }
)
_QWEN3_PRESETS = {
    "tiny": TINY_QWEN3,
    "tensor-parallel": TENSOR_PARALLEL_QWEN3,
    "serving": SERVING_QWEN3,
}


def _checked(config_class: type, sizes: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """`config_class(**sizes, **overrides)`, refusing an override the config does not have
    (transformers would keep a misspelt field silently and build the default model)."""
    default = config_class()
    known = default.to_dict()
    for name in overrides:
        # attn_implementation and experts_implementation are kept as `_<name>` attributes.
        if name not in known and not hasattr(default, name) and not hasattr(default, f"_{name}"):
            raise InputError(
                f"{config_class.__name__} has no field {name!r}: check its spelling "
                f"(its fields include {', '.join(sorted(known)[:12])}, ...)"
            )
    return config_class(**{**sizes, **overrides})


def tiny_qwen3_config(preset: str = "tiny", **overrides: Any) -> Qwen3Config:
    """A `transformers.Qwen3Config` of `preset`'s sizes ("tiny", "tensor-parallel" or
    "serving": `TINY_QWEN3`, `TENSOR_PARALLEL_QWEN3`, `SERVING_QWEN3`) with `overrides`; the
    "serving" preset needs `vocab_size` (its tokenizer's)."""
    if preset not in _QWEN3_PRESETS:
        raise InputError(
            f"preset must be one of {list(_QWEN3_PRESETS)}, got {preset!r}: pick one, and "
            "give any other size as a keyword (tiny_qwen3_config(hidden_size=64))"
        )
    sizes = _QWEN3_PRESETS[preset]
    if preset == "serving" and "vocab_size" not in overrides:
        raise InputError(
            "the serving preset needs vocab_size: pass the tokenizer's "
            "(tiny_qwen3_config('serving', vocab_size=tokenizer.vocab_size, ...))"
        )
    with warnings.catch_warnings():
        # tqdm's note, in a kernel without ipywidgets, that progress bars fall back to text.
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import Qwen3Config

    return _checked(Qwen3Config, sizes, overrides)


def tiny_qwen3_moe_config(**overrides: Any) -> Qwen3MoeConfig:
    """A `transformers.Qwen3MoeConfig` of `TINY_QWEN3_MOE`'s sizes with `overrides` (chapter 12
    passes its own layer's width, expert count, top-k and expert size)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")  # as above
        from transformers import Qwen3MoeConfig

    return _checked(Qwen3MoeConfig, TINY_QWEN3_MOE, overrides)
