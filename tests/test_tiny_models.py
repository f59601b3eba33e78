"""The book's tiny Qwen3 configs (tpuready.runtime.tiny_models): one source for every copy."""

from __future__ import annotations

import pytest
import torch

from tpuready.runtime import tiny_models
from tpuready.runtime.tiny_models import (
    SERVING_QWEN3,
    TENSOR_PARALLEL_QWEN3,
    TINY_QWEN3,
    tiny_qwen3_config,
    tiny_qwen3_moe_config,
)
from tpuready.validate import InputError

transformers = pytest.importorskip("transformers")


def test_the_tiny_preset_builds_a_model_that_runs_a_forward_pass() -> None:
    config = tiny_qwen3_config()
    assert isinstance(config, transformers.Qwen3Config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        logits = model(torch.arange(8).unsqueeze(0)).logits
    assert logits.shape == (1, 8, TINY_QWEN3["vocab_size"])
    # Tiny means tiny: under 50,000 parameters (26,816), so a laptop builds it at once.
    assert sum(p.numel() for p in model.parameters()) < 50_000


@pytest.mark.parametrize(
    ("preset", "sizes", "extra"),
    [
        ("tiny", TINY_QWEN3, {}),
        ("tensor-parallel", TENSOR_PARALLEL_QWEN3, {}),
        ("serving", SERVING_QWEN3, {"vocab_size": 300}),
    ],
)
def test_each_preset_is_the_config_spelled_out(preset: str, sizes: dict, extra: dict) -> None:
    expected = transformers.Qwen3Config(**sizes, **extra).to_dict()
    assert tiny_qwen3_config(preset, **extra).to_dict() == expected


def test_overrides_win_and_leave_the_other_sizes() -> None:
    config = tiny_qwen3_config(max_position_embeddings=64, tie_word_embeddings=True)
    assert (config.max_position_embeddings, config.tie_word_embeddings) == (64, True)
    assert config.hidden_size == TINY_QWEN3["hidden_size"]
    assert tiny_qwen3_config("tensor-parallel", vocab_size=512).num_attention_heads == 8


def test_heads_split_over_two_and_four_ranks_in_the_tensor_parallel_preset() -> None:
    config = tiny_qwen3_config("tensor-parallel")
    for ranks in (2, 4):
        assert config.num_attention_heads % ranks == 0
        assert config.num_key_value_heads % ranks == 0


def test_the_moe_config_renormalises_top_k_and_runs_experts_eagerly() -> None:
    config = tiny_qwen3_moe_config(hidden_size=16, num_experts=8)
    assert isinstance(config, transformers.Qwen3MoeConfig)
    assert (config.hidden_size, config.num_experts) == (16, 8)
    assert config.norm_topk_prob is True
    expected = transformers.Qwen3MoeConfig(
        **{**tiny_models.TINY_QWEN3_MOE, "hidden_size": 16, "num_experts": 8}
    )
    assert config.to_dict() == expected.to_dict()


def test_a_misspelt_field_is_refused_by_name() -> None:
    with pytest.raises(InputError, match=r"no field 'hiden_size'.*spelling"):
        tiny_qwen3_config(hiden_size=64)
    with pytest.raises(InputError, match=r"Qwen3MoeConfig has no field 'num_expert'"):
        tiny_qwen3_moe_config(num_expert=4)


def test_an_unknown_preset_and_a_serving_config_without_a_vocabulary_are_refused() -> None:
    with pytest.raises(InputError, match=r"preset must be one of .*'huge'"):
        tiny_qwen3_config("huge")
    with pytest.raises(InputError, match="serving preset needs vocab_size"):
        tiny_qwen3_config("serving")


def test_the_presets_cannot_be_changed_in_place() -> None:
    with pytest.raises(TypeError):
        TINY_QWEN3["hidden_size"] = 64  # type: ignore[index]


def test_the_attention_and_expert_implementations_are_accepted_as_transformers_takes_them() -> None:
    assert tiny_qwen3_config(attn_implementation="eager")._attn_implementation == "eager"
    moe = tiny_qwen3_moe_config(experts_implementation="eager")
    assert moe._experts_implementation == "eager"
