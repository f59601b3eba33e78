"""A recompile budget for a training step, as a test for your project.

From chapter 16 of TPU-ready PyTorch. TorchTPU compiles with static shapes:
every batch shape a step has not seen is a new XLA compilation, seconds to
minutes each. This test names every graph Dynamo captures in one epoch, on
the device `torch.accelerator` picks (the CPU where there is none), with
`dynamic=False` (as TorchTPU) and the cheap `aot_eager` backend, and fails
on a graph it does not expect (naming it), on an expected graph that never
compiled, or when a second epoch would compile anything at all.

To adopt it, replace `make_model`, `make_optimizer`, `make_loader` and
`train_step` with yours, and list the graphs you allow in EXPECTED_GRAPHS.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from recompile_model import TRAIN_LENGTHS, TokenModel, make_loader

# The graphs one epoch may compile, each named by the function and the line
# its first op comes from (GraphRecorder), with how many of each: the forward
# pass and the loss once per batch shape (the loader makes 2), and AdamW's
# update once ("step: adam(", the call in torch/optim/adam.py's Adam.step),
# between the two graph breaks torch.optim puts around it. The backward pass
# is no graph of Dynamo's: AOTAutograd derives it from the forward graph.
# Checked on a CPU and on the book's emulated TPU, where these names and
# counts hold (the update's op count differs: AdamW's foreach path on a
# TPU). Rerun it on your device: on CUDA, Dynamo also sets AdamW's
# capturable=True itself, and a real TPU's graphs have not been checked.
EXPECTED_GRAPHS = Counter(
    {
        "train_step: logits = model(tokens)": 2,
        "step: adam(": 1,
    }
)
PAD_TO_MULTIPLE_OF = 32
# The accelerator this process may use, else the CPU (chapter 1's choice).
DEVICE = torch.accelerator.current_accelerator(check_available=True)
DEVICE = DEVICE or torch.device("cpu")

# torch 2.13's Dynamo calls a deprecated torch.jit API inside its own code:
# the warning is about torch, not about your step.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TokenModel().to(DEVICE)


def make_optimizer(
    model: torch.nn.Module, lr: float | torch.Tensor = 1e-2
) -> torch.optim.Optimizer:
    options = {}
    # TorchTPU needs a compiled AdamW's step count on the device; on CUDA a
    # tensor lr needs it for AdamW's foreach path. A CPU optimizer refuses it.
    if DEVICE.type == "tpu" or (
        DEVICE.type == "cuda" and isinstance(lr, torch.Tensor)
    ):
        options["capturable"] = True
    return torch.optim.AdamW(model.parameters(), lr=lr, **options)


def batches(loader):
    """The loader's batches, on DEVICE."""
    for tokens, targets in loader:
        yield tokens.to(DEVICE), targets.to(DEVICE)


def train_step(model, optimizer, tokens, targets) -> torch.Tensor:
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    # Detach before backward(), in the forward graph: after the graph breaks
    # of backward(), optimizer.step() and zero_grad() the detach would be a
    # graph of its own, "torch_dynamo_resume_in_train_step_at_N".
    loss_value = loss.detach()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value


class GraphRecorder:
    """A torch.compile backend that names each graph, then runs aot_eager."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, str]] = []  # (name, where it compiled)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        ops = [node for node in gm.graph.nodes if node.op.startswith("call")]
        # stack_trace: the frames that made the op, outermost first:
        # 'File "...", line 5, in train_step', then that line's source.
        trace = (ops[0].stack_trace or "") if ops else ""
        lines = trace.strip().splitlines()
        name = "a graph without a stack trace"
        if len(lines) >= 2 and " in " in lines[0]:
            name = f"{lines[0].rsplit(' in ', 1)[1]}: {lines[1].strip()}"
        compile_id = torch._guards.CompileContext.current_compile_id()
        inputs = [  # all but the parameters: for a forward graph, the batch
            list(t.shape)
            for t in example_inputs
            if isinstance(t, torch.Tensor)
            and not isinstance(t, torch.nn.Parameter)
        ]
        shown = ", ".join(map(str, inputs[:3])) + ", ..." * (len(inputs) > 3)
        self.graphs.append((name, f"graph {compile_id}, inputs {shown}"))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def surprises(self, expected: Counter) -> list[str]:
        """Each graph past its name's count in `expected`, and each missing."""
        seen: Counter = Counter()
        found = []
        for name, where in self.graphs:
            seen[name] += 1
            if seen[name] > expected[name]:
                found.append(f"unexpected: {name} ({where})")
        for name, count in (expected - seen).items():
            found.append(
                f"expected {count} more of {name}: did it run eagerly, "
                "or is EXPECTED_GRAPHS out of date?"
            )
        return found


def compile_step(recorder: GraphRecorder):
    torch._dynamo.reset()
    return torch.compile(train_step, backend=recorder, dynamic=False)


def test_training_compiles_the_expected_graphs() -> None:
    recorder = GraphRecorder()
    step = compile_step(recorder)
    model = make_model()
    optimizer = make_optimizer(model)
    loader = make_loader(TRAIN_LENGTHS, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)

    # Past recompile_limit Dynamo would run eagerly, unrecorded: make it fail.
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for tokens, targets in batches(loader):  # the warm-up epoch
            step(model, optimizer, tokens, targets)
    surprises = recorder.surprises(EXPECTED_GRAPHS)
    assert not surprises, "\n".join(["one epoch's graphs:", *surprises])

    # After the warm-up any new graph is an error: a second epoch must
    # reuse every graph of the first.
    with torch.compiler.set_stance("fail_on_recompile"):
        for tokens, targets in batches(loader):
            step(model, optimizer, tokens, targets)
        # The check is live: a shape the loader never makes is refused.
        with pytest.raises(RuntimeError, match="fail_on_recompile"):
            step(model, optimizer, tokens[:, :-1], targets[:, :-1])


def test_a_learning_rate_schedule_compiles_nothing_new() -> None:
    # A Python float learning rate is a constant in the graph: every value
    # a scheduler sets is a new guard, a new optimizer graph, each step. As
    # a tensor it is an input, and the graphs of the first epoch serve every
    # later learning rate (make_optimizer sets capturable where needed).
    recorder = GraphRecorder()
    step = compile_step(recorder)
    model = make_model()
    optimizer = make_optimizer(model, lr=torch.tensor(1e-2, device=DEVICE))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 / (1 + step)
    )
    loader = make_loader(TRAIN_LENGTHS, pad_to_multiple_of=PAD_TO_MULTIPLE_OF)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for tokens, targets in batches(loader):
            step(model, optimizer, tokens, targets)
            schedule.step()
    surprises = recorder.surprises(EXPECTED_GRAPHS)
    assert not surprises, "\n".join(["one epoch's graphs:", *surprises])
    with torch.compiler.set_stance("fail_on_recompile"):
        for tokens, targets in batches(loader):
            step(model, optimizer, tokens, targets)
            schedule.step()
