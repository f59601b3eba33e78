"""A recompile budget for a training step, as a test for your project.

From chapter 11 of TPU-ready PyTorch. TorchTPU compiles with static shapes:
every batch shape a step has not seen is a new XLA compilation, seconds to
minutes each. This test counts the graphs Dynamo captures for one epoch, on
a CPU with the cheap `aot_eager` backend and `dynamic=False` (as TorchTPU),
and fails when they exceed the budget or when a second epoch would compile
anything at all.

To adopt it, replace `make_model`, `make_optimizer`, `make_loader` and
`train_step` with yours, and set RECOMPILE_BUDGET to the graphs you allow.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from recompile_model import TRAIN_LENGTHS, TokenModel, make_loader
from torch._dynamo.utils import counters

# One graph per batch shape (the loader makes 2) for the forward pass and
# the loss, plus 2 for the optimizer step, whatever the shapes.
RECOMPILE_BUDGET = 4
PAD_TO_MULTIPLE_OF = 32

# torch 2.13's Dynamo calls a deprecated torch.jit API inside its own code:
# the warning is about torch, not about your step.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TokenModel()


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, optimizer, tokens, targets) -> torch.Tensor:
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def test_training_stays_within_the_recompile_budget() -> None:
    torch._dynamo.reset()
    counters.clear()
    model = make_model()
    optimizer = make_optimizer(model)
    step = torch.compile(train_step, backend="aot_eager", dynamic=False)
    loader = make_loader(TRAIN_LENGTHS, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)

    # Past recompile_limit Dynamo would run eagerly, uncounted: make it fail.
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for tokens, targets in loader:  # the first epoch is the warm-up
            step(model, optimizer, tokens, targets)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs <= RECOMPILE_BUDGET, (
        f"one epoch compiled {graphs} graphs, budget {RECOMPILE_BUDGET}"
    )

    # After the warm-up any new graph is an error: a second epoch must
    # reuse every graph of the first.
    with torch.compiler.set_stance("fail_on_recompile"):
        for tokens, targets in loader:
            step(model, optimizer, tokens, targets)
        # The check is live: a shape the loader never makes is refused.
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            step(model, optimizer, tokens[:, :-1], targets[:, :-1])


def test_a_learning_rate_schedule_compiles_nothing_new() -> None:
    # A Python float learning rate is a constant in the graph: every value
    # a scheduler sets is a new guard, a new graph, each step. As a tensor
    # it is an input, and the graphs of the first epoch serve every later
    # learning rate. (On CUDA, where AdamW defaults to foreach=True, a
    # tensor lr also needs capturable=True; TorchTPU needs it anyway.)
    torch._dynamo.reset()
    counters.clear()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 / (1 + step)
    )
    step = torch.compile(train_step, backend="aot_eager", dynamic=False)
    loader = make_loader(TRAIN_LENGTHS, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for tokens, targets in loader:
            step(model, optimizer, tokens, targets)
            schedule.step()
    assert counters["stats"]["unique_graphs"] <= RECOMPILE_BUDGET
    with torch.compiler.set_stance("fail_on_recompile"):
        for tokens, targets in loader:
            step(model, optimizer, tokens, targets)
            schedule.step()
