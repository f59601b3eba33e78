"""Chapters 12 and 13's workers (training, dropless) under torchrun, against transformers' layer.

`notebooks/workers/ch12_trainable_ep.py` runs one training step's backward pass with each
all-to-all and a dropless forward pass. Under the standard launcher, on 4 CPU ranks: the
autograd all-to-all must give transformers' gradients for the tokens, the router and every
expert, and compile with `fullgraph=True`; `dist.all_to_all_single` must give the experts none;
and the dropless layer must equal transformers' layer for every token, with two host syncs per
rank.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from conftest import NOTEBOOK_DIR, run_torchrun

if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers import ch12_expert_parallel as layer_worker
from workers import ch12_trainable_ep as worker

from tpuready.runtime.tiny_models import tiny_qwen3_moe_config

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import (
        Qwen3MoeSparseMoeBlock,
        load_balancing_loss_func,
    )

WORKER_FILE = NOTEBOOK_DIR / "workers" / "ch12_trainable_ep.py"
WORLD_SIZE = 4
LAUNCH_TIMEOUT_SECONDS = 240

pytestmark = pytest.mark.timeout(LAUNCH_TIMEOUT_SECONDS + 60)


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Rank 0's JSON line: every rank's results, in rank order."""
    return run_torchrun(WORKER_FILE, WORLD_SIZE, timeout_seconds=LAUNCH_TIMEOUT_SECONDS)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """transformers' layer on one process: the output and one step's gradients."""
    config = tiny_qwen3_moe_config(  # renormalised top-k, eager experts: chapter 12's layer
        hidden_size=layer_worker.HIDDEN_SIZE,
        num_experts=layer_worker.NUM_EXPERTS,
        num_experts_per_tok=layer_worker.TOP_K,
        moe_intermediate_size=layer_worker.EXPERT_SIZE,
    )
    layer = Qwen3MoeSparseMoeBlock(config)
    layer.load_state_dict(layer_worker.moe_weights())
    tokens = layer_worker.make_tokens().requires_grad_()
    output = layer(tokens.unsqueeze(0)).squeeze(0)
    logits, _, _ = layer.gate(tokens)
    aux = load_balancing_loss_func((logits,), layer_worker.NUM_EXPERTS, layer_worker.TOP_K)
    (output.pow(2).mean() + worker.AUX_LOSS_COEF * aux).backward()
    return {
        "output": output.detach(),
        "tokens": tokens.grad,
        "router": layer.gate.weight.grad,
        "gate_up": layer.experts.gate_up_proj.grad,
        "down": layer.experts.down_proj.grad,
        "aux": aux.detach(),
    }


def _stacked(ranks: list[dict], way: str, field: str) -> torch.Tensor:
    return torch.cat([torch.tensor(rank["gradients"][way][field]) for rank in ranks])


def test_the_autograd_all_to_all_gives_transformers_gradients(ranks, reference) -> None:
    way = "autograd"
    torch.testing.assert_close(_stacked(ranks, way, "token_gradients"), reference["tokens"])
    torch.testing.assert_close(_stacked(ranks, way, "gate_up_gradient"), reference["gate_up"])
    torch.testing.assert_close(_stacked(ranks, way, "down_gradient"), reference["down"])
    for rank in ranks:  # the router's gradient, summed over the ranks, on every rank
        router = torch.tensor(rank["gradients"][way]["router_gradient"])
        torch.testing.assert_close(router, reference["router"])
        assert rank["gradients"][way]["aux_loss"] == pytest.approx(reference["aux"].item())
        assert rank["gradients"][way]["backward_all_to_alls"] == 2


def test_dist_all_to_all_single_leaves_the_experts_without_gradients(ranks, reference) -> None:
    way = "all_to_all_single"
    for rank in ranks:
        result = rank["gradients"][way]
        assert result["gate_up_gradient"] is None and result["down_gradient"] is None
        assert not result["exchange_has_grad_fn"] and result["backward_all_to_alls"] == 0
    gap = (_stacked(ranks, way, "token_gradients") - reference["tokens"]).abs().max()
    assert gap > 0.1 * reference["tokens"].abs().max()


def test_the_dropless_layer_equals_transformers_for_every_token(ranks, reference) -> None:
    runs = [rank["dropless"][0] for rank in ranks]
    output = torch.tensor([row for run in runs for row in run["output"]])
    torch.testing.assert_close(output, reference["output"])
    assert [run["host_syncs"] for run in runs] == [2] * WORLD_SIZE
    # Uneven splits: what each rank sends adds up to every (token, choice) pair.
    pairs = layer_worker.NUM_TOKENS // WORLD_SIZE * layer_worker.TOP_K
    assert all(sum(run["rows_sent"]) == pairs for run in runs)
    assert len({tuple(run["rows_sent"]) for run in runs}) > 1


def test_the_autograd_all_to_all_compiles_whole_with_its_gradient(ranks) -> None:
    assert all(rank["compiled"]["gradient_is_2x"] for rank in ranks)
