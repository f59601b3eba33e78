"""`tpuready.runtime.tiny_decoder`: chapter 21's model and step, as chapter 22 rebuilds them."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tpuready.runtime.tiny_decoder import TinyDecoder, TinyDecoderError, TinyTrainingStep


def test_a_step_counts_six_n_per_token_plus_attention_as_chapter_21_does() -> None:
    torch.manual_seed(0)
    step = TinyTrainingStep(torch.device("cpu"), batch_size=2, seq_len=16)
    with FlopCounterMode(display=False) as counter:
        step()
    model = step.model
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    tokens, hidden_size, num_layers = 2 * 16, 128, len(model.blocks)
    attention = 12 * num_layers * 16 * hidden_size * tokens
    assert counter.get_total_flops() == 6 * matmul_weights * tokens + attention


def test_steps_lower_the_loss_on_the_fixed_batch() -> None:
    torch.manual_seed(0)
    step = TinyTrainingStep(torch.device("cpu"), batch_size=2, seq_len=16)
    losses = [float(step()) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_attention_is_causal() -> None:
    # A later token cannot change an earlier position's logits.
    torch.manual_seed(0)
    model = TinyDecoder(seq_len=8).eval()
    tokens = torch.randint(0, 512, (1, 8))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 512
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[0, :-1], model(changed)[0, :-1])


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: TinyDecoder(num_layers=0), "num_layers"),
        (lambda: TinyDecoder(hidden_size=100, num_heads=3), "num_heads=3"),
        (lambda: TinyTrainingStep(torch.device("cpu"), batch_size=1.5), "batch_size"),
    ],
)
def test_bad_sizes_name_the_argument(build, argument) -> None:
    with pytest.raises(TinyDecoderError, match=argument):
        build()
