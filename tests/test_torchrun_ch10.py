"""Chapter 10's worker under the standard launcher gives what the notebook gets.

`notebooks/10_fsdp2_training_script.ipynb` runs `notebooks/workers/ch10_fsdp_practice.py`
through `tpuready.runtime.launch.run_workers`; readers run the same file with `torchrun`. The
test runs it both ways on two CPU ranks and compares what rank 0 reports: same code, same data,
same gloo sums in the same order, one torch thread per rank (the tests' environment), so the
numbers must be equal, with no tolerance.
"""

from __future__ import annotations

import math
import sys

import pytest
from conftest import NOTEBOOK_DIR
from conftest import run_torchrun as run_torchrun_with_timeout

from tpuready.runtime.launch import run_workers

# The notebook imports its workers as `workers.ch10_...` from notebooks/; so do we (the
# spawned ranks inherit this path).
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers.ch09_fsdp import CONFIG, TinyTransformer
from workers.ch10_fsdp_practice import MAX_NORM, practice_worker

# Importing torch and joining the group takes seconds per rank, far more on a busy machine.
TORCHRUN_TIMEOUT_SECONDS = 300


def test_practice_worker_under_torchrun_matches_run_workers() -> None:
    printed = run_torchrun_with_timeout(
        NOTEBOOK_DIR / "workers" / "ch10_fsdp_practice.py",
        2,
        timeout_seconds=TORCHRUN_TIMEOUT_SECONDS,
    )
    expected = run_workers(practice_worker, 2, timeout_seconds=TORCHRUN_TIMEOUT_SECONDS)[0]
    if expected["device_type"] != "cpu":
        # The exact comparisons below hold for CPU ranks (the module docstring); accelerator
        # ranks get the notebook's per-device tolerances, which run there with it.
        pytest.skip(f"exact comparisons are for CPU ranks, these ran on {expected['device_type']}")
    keys = ("plain_losses", "bf16_losses", "prefetch_losses", "compiled_losses", "clipped")
    for key in (*keys, "qwen3_loss"):
        assert printed[key] == expected[key], key
    # What chapter 10 teaches, as the worker measured it. bfloat16 parameters move the losses
    # (step 1), by less than the notebook's upper bound.
    difference = max(
        abs(a - b) for a, b in zip(expected["plain_losses"], expected["bf16_losses"], strict=True)
    )
    assert 0.0 < difference < 0.1
    # Resharded after forward, a rank holds its half of the blocks; kept, the whole blocks.
    full_block_bytes = 4 * sum(p.numel() for p in TinyTransformer(**CONFIG).blocks.parameters())
    held = expected["block_bytes_after_forward"]
    assert (held[True] * 2, held[False]) == (full_block_bytes, full_block_bytes)
    # JSON turns the settings (dictionary keys) into strings.
    assert printed["block_bytes_after_forward"] == {"true": held[True], "false": held[False]}
    assert expected["clipped"]["returns"] == "DTensor"
    assert expected["clipped_unsharded"]["returns"] == "Tensor"
    assert expected["clipped"]["before"] > expected["clipped"]["after"]
    # The sharded norm is the one-process norm of the same step (the squares are summed shard
    # by shard, then across ranks: float32 rounding apart), and clipping leaves the limit.
    assert math.isclose(
        expected["clipped"]["before"], expected["clipped_unsharded"]["before"], rel_tol=1e-5
    )
    assert expected["clipped"]["before"] > MAX_NORM
    assert math.isclose(expected["clipped"]["after"], MAX_NORM, rel_tol=1e-5)
    assert math.isclose(expected["clipped_unsharded"]["after"], MAX_NORM, rel_tol=1e-5)
    assert expected["compiled_graphs"] == 1 and expected["compiled_graph_breaks"] == {}
    assert expected["qwen3_layers"] == 2 and expected["qwen3_tied"]
    assert expected["qwen3_checkpointed_saved_bytes"] < expected["qwen3_saved_bytes"] / 2
    # Checkpointing recomputes the same ops: bit for bit on CPU ranks.
    assert expected["device_type"] == printed["device_type"] == "cpu"
    assert expected["qwen3_gradient_difference"] == 0.0
    assert expected["qwen3_largest_gradient"] > 0.0
    assert math.isclose(expected["qwen3_loss"], expected["qwen3_reference_loss"], rel_tol=1e-5)
