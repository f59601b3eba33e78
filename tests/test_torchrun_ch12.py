"""Chapter 12's expert-parallel worker under torchrun gives what the notebook gets.

The notebook runs `notebooks/workers/ch12_expert_parallel.py` through
`tpuready.runtime.launch.run_workers`; the chapter tells readers to run the same file with
`torchrun`. Same code, same seeded weights and tokens, one torch thread per rank (the worker sets
it), the same gloo exchanges: the capacities, drops, bytes, received counts and host syncs must be
equal, and the outputs equal to the last bit (compared by a SHA-256 of their bytes).
"""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch
from conftest import NOTEBOOK_DIR, run_torchrun

from tpuready.runtime.launch import run_workers
from tpuready.runtime.tiny_models import tiny_qwen3_moe_config

# The notebook imports its workers as `workers.ch12_...` from notebooks/; so do we (the
# spawned ranks inherit this path).
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers import ch12_expert_parallel as worker

WORKER_FILE = NOTEBOOK_DIR / "workers" / "ch12_expert_parallel.py"
WORLD_SIZE = 4
# Importing torch and joining the group takes seconds per rank, far more on a busy machine.
LAUNCH_TIMEOUT_SECONDS = 240

pytestmark = pytest.mark.timeout(2 * LAUNCH_TIMEOUT_SECONDS + 60)


@pytest.fixture(scope="module")
def from_torchrun() -> dict:
    """Run the worker file with the standard launcher; return rank 0's JSON line."""
    return run_torchrun(WORKER_FILE, WORLD_SIZE, timeout_seconds=LAUNCH_TIMEOUT_SECONDS)


@pytest.fixture(scope="module")
def from_run_workers() -> list[dict]:
    """The ranks' results as the notebook gets them."""
    return run_workers(
        worker.expert_parallel_moe, WORLD_SIZE, timeout_seconds=LAUNCH_TIMEOUT_SECONDS
    )


def test_torchrun_gives_what_run_workers_gives(from_torchrun, from_run_workers) -> None:
    expected = json.loads(json.dumps(worker.summarize(from_run_workers)))
    assert from_torchrun == expected


def test_the_run_drops_tokens_and_sends_the_formula_bytes(from_torchrun) -> None:
    """Guards the comparison above against two launches that agree on a wrong run."""
    tokens_per_rank = worker.NUM_TOKENS // WORLD_SIZE
    capacity = worker.expert_capacity(
        tokens_per_rank, worker.TOP_K, worker.NUM_EXPERTS, worker.CAPACITY_FACTOR
    )
    buffer_bytes = worker.NUM_EXPERTS * capacity * worker.HIDDEN_SIZE * 4  # float32
    assert from_torchrun["world_size"] == WORLD_SIZE
    assert from_torchrun["capacity"] == [capacity] * WORLD_SIZE
    # Two all-to-alls per rank (dispatch, combine), each sending (N-1)/N of the buffer.
    per_call = buffer_bytes * (WORLD_SIZE - 1) // WORLD_SIZE
    assert from_torchrun["bytes_to_others"] == [[per_call, per_call]] * WORLD_SIZE
    # Fixed split sizes: no value is read on the host from routing to combine (chapter 12,
    # step 4; the dropless path of chapter 13, step 2, reads two).
    assert from_torchrun["host_syncs"] == [0] * WORLD_SIZE
    # The chosen data overflows some expert at this capacity factor, and each expert
    # processes every assignment routed to it except the dropped ones.
    dropped = sum(from_torchrun["dropped"])
    assert dropped > 0
    received = sum(sum(counts) for counts in from_torchrun["tokens_per_local_expert"])
    assert received + dropped == worker.NUM_TOKENS * worker.TOP_K


def test_kept_tokens_match_transformers_layer(from_run_workers) -> None:
    """The notebook's claim: tokens that kept every choice get transformers' output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = tiny_qwen3_moe_config(  # renormalised top-k, eager experts: chapter 12's layer
        hidden_size=worker.HIDDEN_SIZE,
        num_experts=worker.NUM_EXPERTS,
        num_experts_per_tok=worker.TOP_K,
        moe_intermediate_size=worker.EXPERT_SIZE,
    )
    layer = Qwen3MoeSparseMoeBlock(config)
    layer.load_state_dict(worker.moe_weights(worker.SEED))
    tokens = worker.make_tokens(worker.SEED, worker.NUM_TOKENS)
    with torch.no_grad():
        reference = layer(tokens.unsqueeze(0)).squeeze(0)
    output = torch.tensor([row for result in from_run_workers for row in result["output"]])
    kept = torch.tensor([pair for result in from_run_workers for pair in result["kept"]])
    all_kept = kept.all(dim=1)
    assert 0 < int(all_kept.sum()) < len(tokens)
    torch.testing.assert_close(output[all_kept], reference[all_kept])
    assert not torch.allclose(output[~all_kept], reference[~all_kept], atol=1e-3)


def test_bad_sizes_fail_clearly() -> None:
    with pytest.raises(ValueError, match="world_size 3 must divide"):
        worker.expert_parallel_moe(0, 3)
    with pytest.raises(ValueError, match="capacity_factor must be positive, got 0"):
        worker.expert_capacity(64, 2, 8, 0)
